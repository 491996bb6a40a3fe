"""Where an ``http_get`` may go: a grant's ``hosts`` entries, ports and addresses. Pure.

A ``hosts`` entry is a host and an optional port:

- ``docs.python.org``: that host exactly; ``*.example.com``: any subdomain of it, at any
  depth, never ``example.com`` itself;
- an IP address (``192.168.1.5``, ``::1``) matches a URL that names the address;
- ``:port`` (``example.com:8443``, ``[::1]:8080``) allows that port only; without it
  only the scheme's own port (80 for http, 443 for https).

The address brokerd connects to is checked too, after resolving the name (once: the
connection goes to the address checked). Loopback, private (RFC 1918, fc00::/7),
link-local, unspecified, multicast and every other address that is not global unicast
are refused unless the grant names that very address (and port) as an entry: naming a
host is not enough, because whoever controls the host's DNS records chooses where it
points. An IPv6 address that embeds an IPv4 one (mapped, 6to4, NAT64, Teredo) is judged
by both.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Final

import attrs

DEFAULT_PORTS: Final = {"http": 80, "https": 443}
"""The port a URL without one reaches, by scheme; a grant entry without a port allows
only this one."""

_NAME: Final = re.compile(r"(?:\*\.)?[a-z0-9_](?:[a-z0-9_.-]*[a-z0-9_])?")
_LABEL: Final = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
_HOST_NAME: Final = re.compile(rf"(?:{_LABEL}\.)*{_LABEL}")
"""A URL's host name: labels of letters, digits, ``-`` and ``_`` (at most 63 each, no
``-`` at either end) joined by single dots; no glob character, escape or trailing dot."""
MAX_HOST_NAME: Final = 253
"""The longest host name DNS can carry, in characters."""
_PORT: Final = re.compile(r"[0-9]{1,5}")
_NAT64: Final = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def _address(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def canonical_host(host: str) -> str:
    """A lower-cased host, an IP address in its one standard spelling (``::1``)."""
    address = _address(host)
    return host.lower() if address is None else str(address)


@attrs.frozen
class Destination:
    """What an http_get URL reaches as far as grants are concerned."""

    scheme: str
    host: str
    """Lower-cased; an IP address in its standard spelling."""
    port: int
    """The URL's port, or its scheme's default."""
    entry_ports: tuple[int | None, ...] = attrs.field(init=False, eq=False, repr=False)
    """The ports an entry may name to cover this URL: its own, and None (no port) when
    it is the scheme's default."""
    entry_keys: tuple[tuple[str, int | None], ...] = attrs.field(init=False, eq=False, repr=False)
    """``(host, port)`` of each exact entry that covers this URL."""

    @entry_ports.default
    def _entry_ports(self) -> tuple[int | None, ...]:
        if self.port == DEFAULT_PORTS[self.scheme]:
            return (self.port, None)
        return (self.port,)

    @classmethod
    def of_url(cls, url: str) -> Destination | None:
        """None for anything but an http(s) URL with a host and a valid port.

        >>> Destination.of_url("HTTPS://Docs.Python.org/3/")
        Destination(scheme='https', host='docs.python.org', port=443)
        >>> Destination.of_url("http://[0:0::1]:8080/")
        Destination(scheme='http', host='::1', port=8080)
        """
        try:
            parts = urllib.parse.urlsplit(url)
            port = parts.port
        except ValueError:
            return None
        scheme = parts.scheme.lower()
        host = parts.hostname
        if scheme not in DEFAULT_PORTS or not host:
            return None
        return cls(scheme, canonical_host(host), DEFAULT_PORTS[scheme] if port is None else port)


def url_host_problem(host: str, *, bracketed: bool) -> str | None:
    """Why ``host`` (a URL's, lower-cased, its brackets taken off) is not one exact host:
    a host name, an IPv4 address in dotted decimal, or, ``bracketed``, an IPv6 address
    without a zone. None when it is one. Only such a host is what a grant that names it
    means, and what an exact approve-always may write. A numeric spelling of an address
    (``2130706433``, ``0x7f.1``) is a name here; the address it resolves to is judged
    when the call runs (:func:`address_problem`).

    >>> url_host_problem("docs.python.org", bracketed=False) is None
    True
    >>> [url_host_problem(h, bracketed=False) for h in ("*.a.org", "%2a.a.org", "a.org.")]
    ['it has glob characters or escapes', 'it has glob characters or escapes', 'it ends in a dot']
    >>> url_host_problem("v1.fe", bracketed=True), url_host_problem("::1", bracketed=True)
    ('in brackets, it is not an IPv6 address without a zone', None)
    """
    if bracketed:
        if "%" in host or not isinstance(_address(host), ipaddress.IPv6Address):
            return "in brackets, it is not an IPv6 address without a zone"
        return None
    if len(host) > MAX_HOST_NAME:  # first: a longer host costs no parsing at all
        return f"it is longer than {MAX_HOST_NAME} characters"
    if isinstance(_address(host), ipaddress.IPv4Address):
        return None
    if not _HOST_NAME.fullmatch(host):
        if host.endswith(".") and _HOST_NAME.fullmatch(host[:-1]):
            return "it ends in a dot"
        if any(char in host for char in "*?[]%"):
            return "it has glob characters or escapes"
        return "a host name is labels of letters, digits, '-' and '_', joined by dots"
    return None


def host_matches(pattern: str, host: str) -> bool:
    """``pattern`` is an entry's host (exact or ``*.suffix``); ``host`` a URL's.

    >>> host_matches("docs.python.org", "docs.python.org")
    True
    >>> host_matches("*.example.com", "a.b.example.com")
    True
    >>> host_matches("*.example.com", "example.com")
    False
    >>> host_matches("*.example.com", "badexample.com")
    False
    """
    if pattern.startswith("*."):
        return host.endswith(pattern[1:])
    return host == pattern


@attrs.frozen
class HostRule:
    """One ``hosts`` entry: build with :meth:`parse`."""

    host: str
    """Lower-cased name, ``*.suffix``, or an IP address in its standard spelling."""
    port: int | None = None
    """None: the scheme's default port only."""

    @classmethod
    def parse(cls, entry: str) -> HostRule | str:
        """The rule, or why ``entry`` is not one (a grants.toml problem).

        >>> HostRule.parse("Example.com:8443"), HostRule.parse("[::1]:8080")
        (HostRule(host='example.com', port=8443), HostRule(host='::1', port=8080))
        >>> HostRule.parse("::1"), HostRule.parse("*.example.com")
        (HostRule(host='::1', port=None), HostRule(host='*.example.com', port=None))
        >>> HostRule.parse("https://example.com")
        'expected a host name, *.suffix or IP address, with an optional :port (no scheme or path)'
        """
        text = entry.lower()
        port_text: str | None = None
        if text.startswith("["):
            host, bracket, rest = text[1:].partition("]")
            if not bracket or _address(host) is None or ":" not in host:
                return _ENTRY_PROBLEM
            if rest:
                if not rest.startswith(":"):
                    return _ENTRY_PROBLEM
                port_text = rest[1:]
        elif text.count(":") == 1:
            host, _, port_text = text.partition(":")
        else:
            host = text
        address = _address(host)
        if address is None and not _NAME.fullmatch(host):
            return _ENTRY_PROBLEM
        canonical = host if address is None else str(address)
        if port_text is None:
            return cls(canonical)
        if not _PORT.fullmatch(port_text):
            return _ENTRY_PROBLEM
        if not 1 <= int(port_text) <= 65535:
            return f"port {port_text}: expected a number from 1 to 65535"
        return cls(canonical, int(port_text))

    def allows(self, destination: Destination) -> bool:
        """Does this entry cover the URL's host and port?"""
        if self.port is None:
            if destination.port != DEFAULT_PORTS[destination.scheme]:
                return False
        elif destination.port != self.port:
            return False
        return host_matches(self.host, destination.host)


_ENTRY_PROBLEM: Final = (
    "expected a host name, *.suffix or IP address, with an optional :port (no scheme or path)"
)


def host_rules(entries: Iterable[str]) -> tuple[HostRule, ...]:
    """The rules of a grant's (already validated) entries; a bad one is left out."""
    rules = (HostRule.parse(entry) for entry in entries)
    return tuple(rule for rule in rules if isinstance(rule, HostRule))


@attrs.frozen
class HostSet:
    """A grant's rules indexed for decide(): the same answer as any rule's
    :meth:`HostRule.allows`, mostly in one dict lookup and one ``endswith``
    (tools/bench_decide.py)."""

    rules: tuple[HostRule, ...]
    _exact: Mapping[str, frozenset[int | None]] = attrs.field(init=False, repr=False)
    """Exact host → the ports its entries name (None: the scheme's default)."""
    _suffix_rules: tuple[tuple[str, int | None], ...] = attrs.field(init=False, repr=False)
    """``(".suffix", port)`` of each ``*.suffix`` entry."""
    _any_suffix: tuple[str, ...] = attrs.field(init=False, repr=False)

    @_exact.default
    def _index_exact(self) -> Mapping[str, frozenset[int | None]]:
        ports: dict[str, set[int | None]] = {}
        for rule in self.rules:
            if not rule.host.startswith("*."):
                ports.setdefault(rule.host, set()).add(rule.port)
        return {host: frozenset(named) for host, named in ports.items()}

    @_suffix_rules.default
    def _index_suffixes(self) -> tuple[tuple[str, int | None], ...]:
        return tuple((r.host[1:], r.port) for r in self.rules if r.host.startswith("*."))

    @_any_suffix.default
    def _suffixes_only(self) -> tuple[str, ...]:
        return tuple(suffix for suffix, _ in self._suffix_rules)

    def allows(self, destination: Destination) -> bool:
        """Does any rule cover the URL's host and port?

        >>> hosts = HostSet(host_rules(["a.org", "*.b.org:8080"]))
        >>> [hosts.allows(Destination.of_url(u)) for u in ("https://a.org/", "http://x.b.org:8080/")]
        [True, True]
        >>> hosts.allows(Destination.of_url("http://a.org:8080/"))
        False
        """
        host = destination.host
        named = self._exact.get(host)
        if named is not None and not named.isdisjoint(destination.entry_ports):
            return True
        if not host.endswith(self._any_suffix):
            return False
        ports = destination.entry_ports
        return any(port in ports and host.endswith(suffix) for suffix, port in self._suffix_rules)


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if any(address in network for network in _NAT64):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def special_kind(address: IPAddress) -> str | None:
    """Why ``address`` is not an ordinary public one, or None when it is.

    >>> [special_kind(ipaddress.ip_address(a)) for a in ("127.0.0.1", "10.1.2.3", "8.8.8.8")]
    ['loopback', 'private', None]
    >>> special_kind(ipaddress.ip_address("::ffff:169.254.169.254"))
    'link-local'
    """
    if isinstance(address, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            kind = special_kind(embedded)
            if kind is not None:
                return kind
    if address.is_unspecified:
        return "unspecified"
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local"
    if address.is_multicast:
        return "multicast"
    if address.is_private:
        return "private"
    if not address.is_global or address.is_reserved:
        return "special-purpose"
    return None


def address_problem(
    rules: Iterable[HostRule], destination: Destination, addresses: Iterable[str]
) -> str | None:
    """Why connecting to one of ``addresses`` (what ``destination.host`` resolved to)
    is not allowed, or None. Every address is checked, not only the one connected to.

    >>> rules = (HostRule("example.com"), HostRule("127.0.0.1", 8080))
    >>> address_problem(rules, Destination("http", "example.com", 80), ["93.184.215.14"])
    >>> address_problem(rules, Destination("http", "127.0.0.1", 8080), ["127.0.0.1"])
    >>> print(address_problem(rules, Destination("http", "example.com", 80), ["10.0.0.7"]))
    example.com resolves to 10.0.0.7, a private address, which the grant does not name
    """
    rules = tuple(rules)
    for text in addresses:
        address = _address(text)
        if address is None:
            return f"{destination.host} resolves to {text!r}, not an IP address"
        kind = special_kind(address)
        if kind is None:
            continue
        named = Destination(destination.scheme, str(address), destination.port)
        if not any(rule.allows(named) and _address(rule.host) == address for rule in rules):
            return (
                f"{destination.host} resolves to {address}, a {kind} address, "
                "which the grant does not name"
            )
    return None
