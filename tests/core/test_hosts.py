"""http_get's hosts entries, ports and the addresses an entry must name (core/hosts.py)."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from boxmaker.core.hosts import (
    DEFAULT_PORTS,
    Destination,
    HostRule,
    HostSet,
    address_problem,
    host_matches,
    host_rules,
    special_kind,
    url_host_problem,
)

ENTRY_PROBLEM = (
    "expected a host name, *.suffix or IP address, with an optional :port (no scheme or path)"
)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://a.org/", Destination("http", "a.org", 80)),
        ("https://a.org/", Destination("https", "a.org", 443)),
        ("HTTPS://A.Org:8443/x?y", Destination("https", "a.org", 8443)),
        ("http://a.org:443/", Destination("http", "a.org", 443)),
        ("http://a.org:80/", Destination("http", "a.org", 80)),
        ("http://127.0.0.1:9/", Destination("http", "127.0.0.1", 9)),
        ("http://[::1]/", Destination("http", "::1", 80)),
        ("http://[0:0:0:0:0:0:0:1]:8/", Destination("http", "::1", 8)),
        ("http://[::FFFF:127.0.0.1]/", Destination("http", "::ffff:7f00:1", 80)),
        ("ftp://a.org/", None),
        ("a.org", None),
        ("https:///x", None),
        ("https://a.org:99999/", None),
        ("https://a.org:x/", None),
        ("https://[::1/", None),
    ],
)
def test_destination_of_url(url: str, expected: Destination | None) -> None:
    assert Destination.of_url(url) == expected


def test_default_ports() -> None:
    assert DEFAULT_PORTS == {"http": 80, "https": 443}


@pytest.mark.parametrize(
    ("pattern", "host", "expected"),
    [
        ("a.org", "a.org", True),
        ("a.org", "b.a.org", False),
        ("a.org", "a.or", False),
        ("*.a.org", "b.a.org", True),
        ("*.a.org", "c.b.a.org", True),
        ("*.a.org", "a.org", False),
        ("*.a.org", "ba.org", False),
        ("x*.a.org", "x.a.org", False),
    ],
)
def test_host_matches(pattern: str, host: str, expected: bool) -> None:
    assert host_matches(pattern, host) is expected


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ("a.org", HostRule("a.org")),
        ("A.Org", HostRule("a.org")),
        ("a.org:8443", HostRule("a.org", 8443)),
        ("a.org:1", HostRule("a.org", 1)),
        ("a.org:65535", HostRule("a.org", 65535)),
        ("a.org:08080", HostRule("a.org", 8080)),
        ("*.a.org", HostRule("*.a.org")),
        ("*.a.org:81", HostRule("*.a.org", 81)),
        ("localhost", HostRule("localhost")),
        ("_srv.a-b.org", HostRule("_srv.a-b.org")),
        ("x", HostRule("x")),
        ("127.0.0.1", HostRule("127.0.0.1")),
        ("127.0.0.1:9000", HostRule("127.0.0.1", 9000)),
        ("::1", HostRule("::1")),
        ("0:0::1", HostRule("::1")),
        ("FE80::1", HostRule("fe80::1")),
        ("[::1]", HostRule("::1")),
        ("[::1]:8080", HostRule("::1", 8080)),
        ("[0:0::1]:8080", HostRule("::1", 8080)),
        # Ambiguous without brackets, so read as the address it is.
        ("::1:8080", HostRule("::1:8080")),
    ],
)
def test_entries_parse(entry: str, expected: HostRule) -> None:
    assert HostRule.parse(entry) == expected


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ("https://a.org", ENTRY_PROBLEM),
        ("a.org/x", ENTRY_PROBLEM),
        ("a.org:", ENTRY_PROBLEM),
        ("a.org:http", ENTRY_PROBLEM),
        ("a.org:+80", ENTRY_PROBLEM),
        ("a.org:123456", ENTRY_PROBLEM),
        ("a.org:0", "port 0: expected a number from 1 to 65535"),
        ("a.org:65536", "port 65536: expected a number from 1 to 65535"),
        ("a.org:99999", "port 99999: expected a number from 1 to 65535"),
        (":80", ENTRY_PROBLEM),
        ("*", ENTRY_PROBLEM),
        ("*.", ENTRY_PROBLEM),
        ("a.*.org", ENTRY_PROBLEM),
        ("-a.org", ENTRY_PROBLEM),
        ("a.org.", ENTRY_PROBLEM),
        ("a b", ENTRY_PROBLEM),
        ("", ENTRY_PROBLEM),
        ("[::1", ENTRY_PROBLEM),
        ("[::1]8080", ENTRY_PROBLEM),
        ("[::1]:", ENTRY_PROBLEM),
        ("[::1]:0", "port 0: expected a number from 1 to 65535"),
        ("[127.0.0.1]", ENTRY_PROBLEM),
        ("[127.0.0.1]:80", ENTRY_PROBLEM),
        ("[a.org]:80", ENTRY_PROBLEM),
        ("[]", ENTRY_PROBLEM),
        ("::1:x", ENTRY_PROBLEM),
        ("a:b:c", ENTRY_PROBLEM),
        ("user@a.org", ENTRY_PROBLEM),
    ],
)
def test_bad_entries(entry: str, problem: str) -> None:
    assert HostRule.parse(entry) == problem


@pytest.mark.parametrize(
    ("rule", "url", "expected"),
    [
        (HostRule("a.org"), "http://a.org/", True),
        (HostRule("a.org"), "https://a.org/", True),
        (HostRule("a.org"), "http://a.org:80/", True),
        (HostRule("a.org"), "http://a.org:443/", False),
        (HostRule("a.org"), "https://a.org:80/", False),
        (HostRule("a.org"), "http://a.org:8080/", False),
        (HostRule("a.org", 8080), "http://a.org:8080/", True),
        (HostRule("a.org", 8080), "https://a.org:8080/", True),
        (HostRule("a.org", 8080), "http://a.org/", False),
        (HostRule("a.org", 443), "https://a.org/", True),
        (HostRule("a.org", 443), "http://a.org/", False),
        (HostRule("a.org", 8080), "http://b.org:8080/", False),
        (HostRule("*.a.org", 8080), "http://b.a.org:8080/", True),
        (HostRule("*.a.org", 8080), "http://a.org:8080/", False),
        (HostRule("::1", 8080), "http://[::1]:8080/", True),
    ],
)
def test_a_rule_allows_its_host_and_port(rule: HostRule, url: str, expected: bool) -> None:
    destination = Destination.of_url(url)
    assert destination is not None
    assert rule.allows(destination) is expected


def test_host_rules_keeps_the_valid_entries_in_order() -> None:
    assert host_rules(["b.org:81", "not a host", "A.org"]) == (
        HostRule("b.org", 81),
        HostRule("a.org"),
    )
    assert host_rules([]) == ()


def _teredo(client: str) -> ipaddress.IPv6Address:
    server = int(ipaddress.IPv4Address("65.54.227.120"))
    obfuscated = ~int(ipaddress.IPv4Address(client)) & 0xFFFFFFFF
    return ipaddress.IPv6Address((0x20010000 << 96) | (server << 64) | obfuscated)


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("8.8.8.8", None),
        ("93.184.215.14", None),
        ("2606:4700::1111", None),
        ("127.0.0.1", "loopback"),
        ("127.1.2.3", "loopback"),
        ("::1", "loopback"),
        ("10.0.0.1", "private"),
        ("172.16.0.1", "private"),
        ("172.31.255.255", "private"),
        ("192.168.1.1", "private"),
        ("fc00::1", "private"),
        ("fd12:3456::1", "private"),
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("224.0.1.1", "multicast"),
        ("239.255.255.250", "multicast"),
        ("ff02::1", "multicast"),
        ("ff0e::1", "multicast"),
        ("100.64.0.1", "special-purpose"),
        # IPv6 that embeds IPv4: judged by the IPv4 address too.
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:10.0.0.1", "private"),
        ("::ffff:169.254.169.254", "link-local"),
        ("2002:7f00:1::1", "loopback"),
        ("2002:a9fe:a9fe::1", "link-local"),
        ("64:ff9b::7f00:1", "loopback"),
        ("64:ff9b::a00:1", "private"),
        ("64:ff9b:1::a9fe:a9fe", "link-local"),
    ],
)
def test_special_kinds(address: str, kind: str | None) -> None:
    assert special_kind(ipaddress.ip_address(address)) == kind


@pytest.mark.parametrize(
    "address",
    [
        # Which of Python's predicates says so varies between patch releases; that
        # they are refused does not.
        "240.0.0.1",
        "255.255.255.255",
        "192.0.0.1",
        "192.0.2.1",
        "198.18.0.1",
        "2001:db8::1",
        "::ffff:8.8.8.8",
        "64:ff9b::808:808",
    ],
)
def test_other_special_purpose_addresses(address: str) -> None:
    assert special_kind(ipaddress.ip_address(address)) is not None


@pytest.mark.parametrize(
    ("client", "kind"),
    [("127.0.0.1", "loopback"), ("10.0.0.1", "private"), ("169.254.1.1", "link-local")],
)
def test_teredo_is_judged_by_its_client_address(client: str, kind: str) -> None:
    assert special_kind(_teredo(client)) == kind


HERE = Destination("http", "svc.test", 8080)


def test_a_public_address_needs_no_naming() -> None:
    assert address_problem([HostRule("svc.test", 8080)], HERE, ["93.184.215.14"]) is None
    assert address_problem([], HERE, []) is None


def test_a_special_address_must_be_named_with_the_port() -> None:
    named = [HostRule("svc.test", 8080), HostRule("127.0.0.1", 8080)]
    assert address_problem(named, HERE, ["127.0.0.1"]) is None
    assert address_problem(named, Destination("http", "svc.test", 8081), ["127.0.0.1"]) == (
        "svc.test resolves to 127.0.0.1, a loopback address, which the grant does not name"
    )
    # An entry without a port names the address at the scheme's port only.
    default = [HostRule("127.0.0.1")]
    assert address_problem(default, Destination("http", "svc.test", 80), ["127.0.0.1"]) is None
    assert address_problem(default, Destination("https", "svc.test", 443), ["127.0.0.1"]) is None
    assert address_problem(default, HERE, ["127.0.0.1"]) is not None


def test_naming_the_host_does_not_name_its_address() -> None:
    assert address_problem([HostRule("svc.test", 8080)], HERE, ["10.0.0.7"]) == (
        "svc.test resolves to 10.0.0.7, a private address, which the grant does not name"
    )
    # A *.suffix that happens to match the address as text names nothing.
    suffix = [HostRule("*.0.0.1", 8080)]
    destination = Destination("http", "127.0.0.1", 8080)
    assert suffix[0].allows(destination)
    assert address_problem(suffix, destination, ["127.0.0.1"]) == (
        "127.0.0.1 resolves to 127.0.0.1, a loopback address, which the grant does not name"
    )


def test_every_address_is_checked_and_spellings_compare_as_addresses() -> None:
    named = [HostRule("::1", 8080)]
    assert address_problem(named, HERE, ["0:0::1"]) is None
    assert address_problem(named, HERE, ["::1", "fe80::1"]) == (
        "svc.test resolves to fe80::1, a link-local address, which the grant does not name"
    )
    assert address_problem(named, HERE, ["8.8.8.8", "::1", "169.254.169.254"]) == (
        "svc.test resolves to 169.254.169.254, a link-local address, which the grant does not name"
    )
    assert address_problem(named, HERE, ["not-an-address"]) == (
        "svc.test resolves to 'not-an-address', not an IP address"
    )


@given(st.ip_addresses())
def test_special_kind_is_total_and_global_unicast_is_ordinary(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> None:
    kind = special_kind(address)
    assert kind in (
        None,
        "unspecified",
        "loopback",
        "link-local",
        "multicast",
        "private",
        "special-purpose",
    )
    if kind is None:
        assert address.is_global
        assert not address.is_multicast
        assert not address.is_reserved


entries = st.lists(
    st.sampled_from(["a.org", "b.a.org", "*.a.org", "*.org", "127.0.0.1", "::1", "x"]).flatmap(
        lambda host: st.sampled_from(
            [host, f"{host}:80", f"{host}:443", f"{host}:8080"]
            if ":" not in host
            else [host, f"[{host}]:80", f"[{host}]:8080"]
        )
    ),
    max_size=5,
)
urls = st.builds(
    "{}://{}{}/".format,
    st.sampled_from(["http", "https"]),
    st.sampled_from(["a.org", "b.a.org", "c.b.a.org", "org", "x", "127.0.0.1", "[::1]"]),
    st.sampled_from(["", ":80", ":443", ":8080", ":9"]),
)


@given(entries, urls)
def test_the_indexed_set_agrees_with_the_rules(hosts: list[str], url: str) -> None:
    rules = host_rules(hosts)
    destination = Destination.of_url(url)
    assert destination is not None
    expected = any(rule.allows(destination) for rule in rules)
    assert HostSet(rules).allows(destination) is expected


def destination(url: str) -> Destination:
    parsed = Destination.of_url(url)
    assert parsed is not None, url
    return parsed


def test_the_indexed_set() -> None:
    hosts = HostSet(host_rules(["a.org", "a.org:8080", "*.b.org", "*.c.org:9"]))
    allowed = ["http://a.org/", "https://a.org/", "http://a.org:8080/", "https://x.b.org/"]
    allowed += ["http://x.c.org:9/", "http://y.x.c.org:9/"]
    refused = ["http://a.org:9/", "http://b.org/", "http://x.b.org:9/", "http://x.c.org/"]
    refused += ["http://c.org:9/", "http://xa.org/", "http://x.b.org:8080/"]
    assert [u for u in allowed if not hosts.allows(destination(u))] == []
    assert [u for u in refused if hosts.allows(destination(u))] == []
    assert not HostSet(()).allows(Destination("http", "a.org", 80))


GLOB = "it has glob characters or escapes"
NOT_A_NAME = "a host name is labels of letters, digits, '-' and '_', joined by dots"
NOT_IPV6 = "in brackets, it is not an IPv6 address without a zone"


@pytest.mark.parametrize(
    "host",
    [
        "a",
        "docs.python.org",
        "a-b.c_d.org",
        "_dmarc.a.org",
        "xn--bcher-kva.example",
        "0.a.org",
        "a.1b",
        "1.2.3.4",
        # Numeric spellings are names here, judged by the address they resolve to.
        "2130706433",
        "0x7f.1",
        "017.0.0.1",
        "255.255.255.255",
        "a" * 63 + ".org",
        ".".join(["a" * 63] * 3 + ["b" * 61]),  # 253 characters
    ],
)
def test_a_url_host_that_is_one_exact_host(host: str) -> None:
    assert url_host_problem(host, bracketed=False) is None


@pytest.mark.parametrize(
    ("host", "problem"),
    [
        ("*.a.org", GLOB),
        ("*", GLOB),
        ("a*.org", GLOB),
        ("a?.org", GLOB),
        ("[a].org", GLOB),
        ("a].org", GLOB),
        ("%2a.a.org", GLOB),
        ("exa%6dple.com", GLOB),
        ("a.org.", "it ends in a dot"),
        ("a.", "it ends in a dot"),
        (".", NOT_A_NAME),
        ("a..org", NOT_A_NAME),
        ("..org.", NOT_A_NAME),
        (".a.org", NOT_A_NAME),
        ("-a.org", NOT_A_NAME),
        ("a-.org", NOT_A_NAME),
        ("a.org-", NOT_A_NAME),
        ("a" * 64 + ".org", NOT_A_NAME),
        ("a b", NOT_A_NAME),
        ("a+b", NOT_A_NAME),
        ("A.org", NOT_A_NAME),  # the caller lower-cases first
        ("X.org", NOT_A_NAME),
        ("a..b.", NOT_A_NAME),  # a trailing dot, and more wrong before it
        ("", NOT_A_NAME),
        (".".join(["a" * 63] * 3 + ["b" * 62]), "it is longer than 253 characters"),
    ],
)
def test_a_url_host_that_is_not_one_exact_host(host: str, problem: str) -> None:
    assert url_host_problem(host, bracketed=False) == problem


@pytest.mark.parametrize(
    ("host", "problem"),
    [
        ("::1", None),
        ("2001:db8::1", None),
        ("::ffff:1.2.3.4", None),
        ("fe80::1%eth0", NOT_IPV6),
        ("fe80::1%25eth0", NOT_IPV6),
        ("v1.fe", NOT_IPV6),
        ("1.2.3.4", NOT_IPV6),
        ("a.org", NOT_IPV6),
    ],
)
def test_a_bracketed_host_is_an_ipv6_address_without_a_zone(host: str, problem: str) -> None:
    assert url_host_problem(host, bracketed=True) == problem


def test_an_ipv6_address_is_no_host_without_brackets() -> None:
    assert url_host_problem("::1", bracketed=False) == NOT_A_NAME
