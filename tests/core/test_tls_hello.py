"""core/tls_hello.py: the server name of real ClientHellos (made by Python's ssl module
into memory, no network), every way a first record can be wrong, and that no bytes at
all make it raise."""

from __future__ import annotations

import ssl

import pytest
from hypothesis import given
from hypothesis import strategies as st

from boxmaker.core.tls_hello import (
    MAX_RECORD,
    RECORD_HEADER,
    Hello,
    NotHello,
    read_hello,
    record_size,
)


def client_hello(server_hostname: str | None, *, tls12: bool = False) -> bytes:
    """The first bytes a Python TLS client sends to ``server_hostname``."""
    context = ssl.create_default_context()
    if tls12:
        context.maximum_version = ssl.TLSVersion.TLSv1_2
    if server_hostname is None:
        context.check_hostname = False
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = context.wrap_bio(incoming, outgoing, server_hostname=server_hostname)
    with pytest.raises(ssl.SSLWantReadError):
        client.do_handshake()
    return outgoing.read()


def first_record(data: bytes) -> bytes:
    size = record_size(data)
    assert isinstance(size, int), size
    return data[:size]


def built_hello(extensions: bytes, *, body_extra: bytes = b"") -> bytes:
    """A minimal ClientHello with these raw extensions, in one record."""
    body = (
        b"\x03\x03"
        + bytes(32)
        + b"\x00"  # no session id
        + b"\x00\x02\x13\x01"  # one cipher suite
        + b"\x01\x00"  # null compression
        + len(extensions).to_bytes(2, "big")
        + extensions
        + body_extra
    )
    handshake = b"\x01" + len(body).to_bytes(3, "big") + body
    return b"\x16\x03\x01" + len(handshake).to_bytes(2, "big") + handshake


def sni(*names: tuple[int, bytes]) -> bytes:
    """A server_name extension listing ``(type, name)`` entries."""
    entries = b"".join(bytes([kind]) + len(n).to_bytes(2, "big") + n for kind, n in names)
    data = len(entries).to_bytes(2, "big") + entries
    return b"\x00\x00" + len(data).to_bytes(2, "big") + data


def extension(kind: int, data: bytes) -> bytes:
    return kind.to_bytes(2, "big") + len(data).to_bytes(2, "big") + data


@pytest.mark.parametrize("name", ["pypi.org", "files.pythonhosted.org", "xn--bcher-kva.example"])
@pytest.mark.parametrize("tls12", [False, True])
def test_a_real_client_hello_gives_its_server_name(name: str, *, tls12: bool) -> None:
    data = client_hello(name, tls12=tls12)
    assert read_hello(first_record(data)) == Hello(name)


def test_a_long_name_is_read_whole() -> None:
    name = ".".join(["a" * 63] * 3) + ".example"
    assert read_hello(first_record(client_hello(name))) == Hello(name)


@pytest.mark.parametrize("address", ["127.0.0.1", "::1"])
def test_a_hello_to_an_ip_address_has_no_server_name(address: str) -> None:
    assert read_hello(first_record(client_hello(address))) == Hello(None)


def test_a_hello_without_a_name_has_none() -> None:
    assert read_hello(first_record(client_hello(None))) == Hello(None)


def test_a_hello_without_any_extension_block_has_no_name() -> None:
    record = built_hello(b"")
    # Drop the (empty) extensions length too: TLS 1.2 lets a hello end after compression.
    body_end = record[:-2]
    handshake_len = len(body_end) - RECORD_HEADER - 4
    fixed = (
        b"\x16\x03\x01"
        + (handshake_len + 4).to_bytes(2, "big")
        + b"\x01"
        + handshake_len.to_bytes(3, "big")
        + body_end[RECORD_HEADER + 4 :]
    )
    assert read_hello(fixed) == Hello(None)


def test_every_cut_of_a_real_hello_is_refused() -> None:
    record = first_record(client_hello("pypi.org"))
    for cut in range(len(record)):
        assert isinstance(read_hello(record[:cut]), NotHello), cut


def test_the_record_size_comes_from_the_header() -> None:
    record = first_record(client_hello("pypi.org"))
    assert record_size(record[:RECORD_HEADER]) == len(record)
    assert record_size(record[:4]) == NotHello(
        "the first TLS record's header is cut short (4 bytes)"
    )


@pytest.mark.parametrize(
    ("data", "detail"),
    [
        (
            b"CONNECT evil.example:443 HTTP/1.1\r\n",
            "not a TLS handshake record (the first byte is 0x43)",
        ),
        (b"GET / HTTP/1.1\r\n", "not a TLS handshake record (the first byte is 0x47)"),
        (b"SSH-2.0-OpenSSH_9.6\r\n", "not a TLS handshake record (the first byte is 0x53)"),
        (
            b"\x17\x03\x03\x00\x10" + bytes(16),
            "not a TLS handshake record (the first byte is 0x17)",
        ),
        (b"\x16\x02\x00\x00\x10" + bytes(16), "not a TLS record (version 2.0)"),
        (b"\x16\x04\x05\x00\x10" + bytes(16), "not a TLS record (version 4.5)"),
        (b"\x16\x03\x01\x00\x00", "the first TLS record is empty"),
        (
            b"\x16\x03\x01\x40\x01",
            f"the first TLS record is {MAX_RECORD + 1} bytes long, over {MAX_RECORD}",
        ),
    ],
)
def test_what_is_not_a_hello_record_says_why(data: bytes, detail: str) -> None:
    assert read_hello(data) == NotHello(detail)


def test_a_record_of_exactly_the_largest_size_is_allowed() -> None:
    assert record_size(b"\x16\x03\x01\x40\x00") == RECORD_HEADER + MAX_RECORD


def test_a_record_longer_than_its_header_says_is_refused() -> None:
    record = first_record(client_hello("pypi.org"))
    assert read_hello(record + b"x") == NotHello(
        f"the first TLS record is {len(record) + 1} bytes, its header says {len(record)}"
    )


def test_a_server_hello_is_not_a_client_hello() -> None:
    record = bytearray(built_hello(sni((0, b"a.org"))))
    record[RECORD_HEADER] = 2
    assert read_hello(bytes(record)) == NotHello("the first handshake message is not a ClientHello")


def test_a_hello_split_over_two_records_is_refused() -> None:
    record = built_hello(sni((0, b"a.org")))
    # The handshake says it is longer than what this record holds: the rest would come
    # in a second record.
    split = bytearray(record)
    split[RECORD_HEADER + 3] += 1
    assert read_hello(bytes(split)) == NotHello(
        "the ClientHello's lengths do not add up (cut short, or split)"
    )


@pytest.mark.parametrize(
    ("extensions", "detail"),
    [
        (sni((0, b"a.org")) + sni((0, b"b.org")), "the ClientHello has extension 0 twice"),
        (sni((0, b"a.org"), (0, b"b.org")), "the server_name extension names two hosts"),
        (sni((0, b"")), "the server name is empty or not ASCII"),
        (sni((0, "bücher.example".encode())), "the server name is empty or not ASCII"),
        (sni((1, b"a.org")), "the server_name extension names no host"),
        (extension(0, b"\x00\x00"), "the server_name extension names no host"),
        (extension(0, b"\x00\x08\x00\x00\x05a.org!"), "bytes after the server_name list"),
    ],
)
def test_a_bad_server_name_extension_is_refused(extensions: bytes, detail: str) -> None:
    assert read_hello(built_hello(extensions)) == NotHello(detail)


def test_a_block_longer_than_the_block_around_it_is_refused() -> None:
    extensions = sni((0, b"a.org"))
    record = bytearray(built_hello(extensions))
    # The extensions' length follows header, type and length, version, random, session
    # id, cipher suites and compression; make it say one byte more than the hello holds.
    at = RECORD_HEADER + 4 + 2 + 32 + 1 + 4 + 2
    assert record[at : at + 2] == len(extensions).to_bytes(2, "big")
    record[at + 1] += 1
    assert read_hello(bytes(record)) == NotHello(
        "the ClientHello's lengths do not add up (cut short, or split)"
    )


def test_a_hello_too_short_for_its_version_is_refused() -> None:
    # One byte of body where the version takes two: refused, not an IndexError.
    record = b"\x16\x03\x01\x00\x05" + b"\x01\x00\x00\x01" + b"\x02"
    assert read_hello(record) == NotHello(
        "the ClientHello's lengths do not add up (cut short, or split)"
    )


def test_bytes_after_the_extensions_are_refused() -> None:
    record = built_hello(sni((0, b"a.org")), body_extra=b"!")
    assert read_hello(record) == NotHello("bytes after the ClientHello's extensions")


def test_other_name_types_and_extensions_are_passed_over() -> None:
    extensions = extension(10, b"\x00\x02\x00\x1d") + sni((1, b"x"), (0, b"A.Org"))
    assert read_hello(built_hello(extensions)) == Hello("A.Org")


def test_a_hello_of_another_protocol_version_is_refused() -> None:
    record = bytearray(built_hello(sni((0, b"a.org"))))
    record[RECORD_HEADER + 4] = 2
    assert read_hello(bytes(record)) == NotHello("a ClientHello of version 2.3")


@given(st.binary(max_size=600))
def test_no_bytes_make_it_raise(data: bytes) -> None:
    assert isinstance(read_hello(data), Hello | NotHello)
    assert isinstance(record_size(data), int | NotHello)


@given(st.binary(max_size=400))
def test_no_record_body_makes_it_raise(payload: bytes) -> None:
    data = b"\x16\x03\x01" + len(payload).to_bytes(2, "big") + payload
    assert isinstance(read_hello(data), Hello | NotHello)


_REAL = first_record(client_hello("files.pythonhosted.org"))


@given(st.integers(0, len(_REAL) - 1), st.integers(0, 255))
def test_a_real_hello_with_any_byte_changed_never_raises(index: int, value: int) -> None:
    changed = bytearray(_REAL)
    changed[index] = value
    result = read_hello(bytes(changed))
    assert isinstance(result, Hello | NotHello)
    if isinstance(result, Hello) and result.server_name is not None:
        assert result.server_name.isascii()
