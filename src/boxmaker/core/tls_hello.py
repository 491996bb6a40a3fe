"""The server name in a TLS ClientHello (RFC 8446 4.1.2, RFC 6066 3). Pure and total.

brokerd's egress proxy (:mod:`boxmaker.broker.egress`) reads the first TLS record a
sandboxed program sends through an opened tunnel and checks that the name the client
asks the server for is the host the tunnel was allowed to: a tunnel to an allowed host
cannot then carry a TLS session meant for another one behind the same address (nor
anything that is not TLS at all, such as a CONNECT relayed through it). Nothing is
intercepted or decrypted: the ClientHello is plain text and goes on to the server as
it came.

Only the first record is read, at most :data:`MAX_RECORD` bytes of payload (what TLS
allows a plaintext record): a ClientHello split over several records is refused, as is
any length that does not add up. Every client brokerd has to serve (OpenSSL, GnuTLS,
rustls, Go, NSS) sends its hello in one record; a larger hello than one record holds is
not one a client sends to a server it expects to answer.

:func:`record_size` says, from the record's 5-byte header, how many bytes the whole
record takes; :func:`read_hello` reads that record. Neither raises on any input (the
property tests in tests/core/test_tls_hello.py feed them every kind of bytes).

>>> read_hello(b"GET / HTTP/1.1\\r\\n")
NotHello(detail='not a TLS handshake record (the first byte is 0x47)')
"""

from __future__ import annotations

from typing import Final

import attrs

RECORD_HEADER: Final = 5
"""content type (1), legacy version (2), length (2)."""
MAX_RECORD: Final = 1 << 14
"""The largest payload of a TLS plaintext record (RFC 8446 5.1)."""
HANDSHAKE: Final = 22
CLIENT_HELLO: Final = 1
SERVER_NAME_EXTENSION: Final = 0
HOST_NAME_TYPE: Final = 0
RANDOM_BYTES: Final = 32


@attrs.frozen
class Hello:
    """A well-formed ClientHello, and the host name it asks for (None: no SNI)."""

    server_name: str | None


@attrs.frozen
class NotHello:
    """Why the bytes are not one well-formed ClientHello in one record."""

    detail: str


class _Short(Exception):
    """A length that runs past its enclosing block."""


class _Bad(Exception):
    """A value the hello must not have (its own words)."""


class _Reader:
    """A cursor over one block of bytes; every read past its end raises :class:`_Short`."""

    __slots__ = ("data", "end", "offset")

    def __init__(self, data: bytes, offset: int = 0, end: int | None = None) -> None:
        self.data = data
        self.offset = offset
        self.end = len(data) if end is None else end

    def take(self, size: int) -> bytes:
        if self.offset + size > self.end:
            raise _Short
        taken = self.data[self.offset : self.offset + size]
        self.offset += size
        return taken

    def number(self, size: int) -> int:
        return int.from_bytes(self.take(size), "big")

    def block(self, length_bytes: int) -> _Reader:
        """The block that follows its length (of ``length_bytes`` bytes), skipped here."""
        size = self.number(length_bytes)
        if self.offset + size > self.end:
            raise _Short
        inner = _Reader(self.data, self.offset, self.offset + size)
        self.offset += size
        return inner

    def take_rest(self) -> bytes:
        return self.take(self.left)

    @property
    def left(self) -> int:
        return self.end - self.offset


def record_size(header: bytes) -> int | NotHello:
    """The whole size (header included) of the record that ``header`` (its first
    :data:`RECORD_HEADER` bytes, or more) begins, when it may be a ClientHello's.

    >>> record_size(bytes([22, 3, 1, 0, 200]))
    205
    >>> record_size(bytes([22, 3, 1, 0x40, 1]))
    NotHello(detail='the first TLS record is 16385 bytes long, over 16384')
    """
    if len(header) < RECORD_HEADER:
        return NotHello(f"the first TLS record's header is cut short ({len(header)} bytes)")
    if header[0] != HANDSHAKE:
        return NotHello(f"not a TLS handshake record (the first byte is {header[0]:#04x})")
    if header[1] != 3:
        return NotHello(f"not a TLS record (version {header[1]}.{header[2]})")
    length = int.from_bytes(header[3:5], "big")
    if length == 0:
        return NotHello("the first TLS record is empty")
    if length > MAX_RECORD:
        return NotHello(f"the first TLS record is {length} bytes long, over {MAX_RECORD}")
    return RECORD_HEADER + length


def read_hello(record: bytes) -> Hello | NotHello:
    """The ClientHello in ``record`` (exactly one TLS record, header included) and its
    server name, or why it is not one. Never raises."""
    size = record_size(record)
    if isinstance(size, NotHello):
        return size
    if len(record) != size:
        return NotHello(f"the first TLS record is {len(record)} bytes, its header says {size}")
    try:
        return Hello(_client_hello(_Reader(record, RECORD_HEADER)))
    except _Short:
        return NotHello("the ClientHello's lengths do not add up (cut short, or split)")
    except _Bad as bad:
        return NotHello(str(bad))


def _client_hello(payload: _Reader) -> str | None:
    if payload.number(1) != CLIENT_HELLO:
        raise _Bad("the first handshake message is not a ClientHello")
    length = payload.number(3)
    if length != payload.left:
        raise _Short
    version = payload.take(2)
    if version[0] != 3:
        raise _Bad(f"a ClientHello of version {version[0]}.{version[1]}")
    payload.take(RANDOM_BYTES)
    payload.block(1)  # legacy_session_id
    payload.block(2)  # cipher_suites
    payload.block(1)  # legacy_compression_methods
    if payload.left == 0:
        return None  # no extensions at all (TLS 1.2 allows that): no server name
    extensions = payload.block(2)
    if payload.left:
        raise _Bad("bytes after the ClientHello's extensions")
    return _server_name(extensions)


def _server_name(extensions: _Reader) -> str | None:
    seen: set[int] = set()
    name: str | None = None
    while extensions.left:
        kind = extensions.number(2)
        data = extensions.block(2)
        if kind in seen:
            raise _Bad(f"the ClientHello has extension {kind} twice")
        seen.add(kind)
        if kind == SERVER_NAME_EXTENSION:
            name = _host_name(data)
    return name


def _host_name(extension: _Reader) -> str:
    names = extension.block(2)
    if extension.left:
        raise _Bad("bytes after the server_name list")
    host: str | None = None
    while names.left:
        kind = names.number(1)
        value = names.block(2).take_rest()
        if kind != HOST_NAME_TYPE:
            continue
        if host is not None:
            raise _Bad("the server_name extension names two hosts")
        if not value or not value.isascii():
            raise _Bad("the server name is empty or not ASCII")
        host = value.decode("ascii")
    if host is None:
        raise _Bad("the server_name extension names no host")
    return host
