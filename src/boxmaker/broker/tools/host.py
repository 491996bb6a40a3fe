"""What the tools ask of the machine besides opening files, as one value
(:class:`Host`) a test can replace; name resolution (:func:`resolve_addresses`) is one
of them."""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final, TypeAlias

import attrs
import trio

from boxmaker.broker.nowait import CachedFile, fd_real_path, read_cached_beneath
from boxmaker.broker.run_spec import HTTP_TIMEOUT
from boxmaker.broker.tools.file_walk import real_relative_inside


def is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


async def resolve_addresses(host: str, port: int) -> list[str]:
    """The IP addresses ``host`` resolves to, in the resolver's order, each once.

    An IP address resolves to itself without a lookup. This is the seam tests replace
    (no test resolves a real name or connects anywhere but 127.0.0.1).
    """
    if is_address(host):
        return [str(ipaddress.ip_address(host))]
    infos = await trio.socket.getaddrinfo(host, port, type=trio.socket.SOCK_STREAM)
    addresses: list[str] = []
    for _family, _type, _proto, _canonname, sockaddr in infos:
        address = str(sockaddr[0])
        if address not in addresses:
            addresses.append(address)
    return addresses


CachedReader: TypeAlias = Callable[[str, str, int], CachedFile | None]


@attrs.frozen
class Host:
    """What the tools ask of the machine besides opening files: how a path resolves,
    what an open descriptor names, the cached read, name resolution and http_get's
    time limit. :data:`REAL_HOST` is the machine's; a test passes its own to stand for
    a name swapped at the wrong moment, a resolver, or a shorter limit."""

    real_relative: Callable[[Path, str], tuple[str, str]] = real_relative_inside
    opened_path: Callable[[int], str | None] = fd_real_path
    read_cached: CachedReader = read_cached_beneath
    resolve: Callable[[str, int], Awaitable[list[str]]] = resolve_addresses
    http_timeout: float = HTTP_TIMEOUT


REAL_HOST: Final = Host()
