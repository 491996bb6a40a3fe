"""The egress proxy's HTTP: a request head read with h11 (never parsed by hand), what it
asks to reach, and the proxy's own answers (docs/egress.md).

A sandboxed program speaks to brokerd's proxy (:mod:`boxmaker.broker.egress`) as to any
HTTP proxy: ``CONNECT host:port`` for a tunnel, or an absolute-form request
(``GET http://host/path``) for plain HTTP. The head is read by h11 as the server role,
at most :data:`MAX_HEAD` bytes within :data:`HEAD_S` seconds (the caller's bound),
whatever the program sends: a longer head is refused ``431``, bytes that are not HTTP
``400``, and nothing is kept of them but h11's own buffer, itself bounded.
"""

from __future__ import annotations

import urllib.parse
from typing import Final

import attrs
import h11
import trio

MAX_HEAD: Final = 16 * 1024
"""The largest request head the proxy reads (h11's ``max_incomplete_event_size``)."""
HEAD_S: Final = 10.0
"""Seconds a connection has to send its whole head."""
READ_CHUNK: Final = 4096
"""Bytes read at a time while the head is incomplete: a head is small, and what is read
past it stays in h11's buffer for the tunnel."""
PROXY_AGENT: Final = "boxmaker-brokerd"


@attrs.frozen
class ProxyTarget:
    """What a request head asks the proxy to reach."""

    scheme: str
    """``https`` for a CONNECT tunnel, ``http`` for a plain-HTTP request."""
    host: str
    """As the request named it, lower-cased, an IPv6 address without its brackets."""
    port: int
    path: str = ""
    """A plain-HTTP request's origin-form target (``/path?query``); "" for a CONNECT."""


@attrs.frozen
class HeadRefused:
    """A head the proxy does not take: the status it answers and why."""

    status: int
    detail: str


@attrs.frozen(eq=False)
class ProxyHead:
    """A request head read, with its h11 connection (it holds what was sent past the
    head, and writes the proxy's answer)."""

    http: h11.Connection
    request: h11.Request
    size: int
    """Bytes the head took, as read."""


def new_http() -> h11.Connection:
    """The proxy's side of one connection: h11 as the server, its buffer bounded."""
    return h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)


async def read_head(
    stream: trio.abc.ReceiveStream, http: h11.Connection
) -> ProxyHead | HeadRefused | None:
    """The request head on ``stream`` read with ``http`` (:func:`new_http`), or why it
    is refused; None when the peer closed before sending a byte. Bounded in bytes
    (:data:`MAX_HEAD`), not in time: the caller bounds the wait (:data:`HEAD_S`)."""
    size = 0
    while True:
        try:
            event = http.next_event()
        except h11.RemoteProtocolError as exc:
            status = exc.error_status_hint
            return HeadRefused(status, f"the request head is not one the proxy takes: {exc}")
        if isinstance(event, h11.Request):
            return ProxyHead(http, event, size)
        if event is h11.NEED_DATA:
            data = await stream.receive_some(READ_CHUNK)
            if not data:
                return None if size == 0 else HeadRefused(400, "the request head was cut short")
            size += len(data)
            http.receive_data(bytes(data))
            continue
        # h11 gives nothing but a Request, NEED_DATA or an error before a head's end.
        return HeadRefused(400, f"unexpected {type(event).__name__} before a request")


def proxy_target(request: h11.Request) -> ProxyTarget | HeadRefused:
    """What ``request`` asks to reach: ``CONNECT host:port`` (authority-form), or an
    absolute-form ``http://`` request whose ``Host`` is the URL's; anything else is
    refused (an origin-form request is not for a proxy; an ``https://`` one must use
    CONNECT)."""
    target = request.target.decode("ascii", errors="replace")
    if request.method == b"CONNECT":
        return _authority(target)
    return _absolute(target, request)


def _split(netloc: str, default_port: int | None) -> tuple[str, int] | str:
    """``netloc``'s host (lower-cased, no brackets) and port, or why it is not one."""
    try:
        parts = urllib.parse.urlsplit(f"//{netloc}")
        port = parts.port
    except ValueError as exc:
        return f"{netloc!r} is not host:port ({exc})"
    host = parts.hostname
    if not host or parts.username is not None or parts.password is not None or parts.path:
        return f"{netloc!r} is not host:port"
    if port is None:
        if default_port is None:
            return f"{netloc!r} names no port"
        port = default_port
    if not 1 <= port <= 65535:
        return f"{netloc!r}: port {port} is out of range"
    return host, port


def _authority(target: str) -> ProxyTarget | HeadRefused:
    split = _split(target, None)
    if isinstance(split, str):
        return HeadRefused(400, f"CONNECT {split}")
    return ProxyTarget("https", *split)


def _absolute(target: str, request: h11.Request) -> ProxyTarget | HeadRefused:
    try:
        parts = urllib.parse.urlsplit(target)
    except ValueError:
        parts = urllib.parse.SplitResult("", "", "", "", "")
    scheme = parts.scheme.lower()
    if scheme == "https":
        return HeadRefused(400, "an https:// URL goes through CONNECT, not a plain request")
    if scheme != "http" or not parts.netloc:
        return HeadRefused(
            400, "the proxy takes CONNECT host:port, or a plain request for an http:// URL"
        )
    split = _split(parts.netloc, 80)
    if isinstance(split, str):
        return HeadRefused(400, split)
    host, port = split
    hosts = [value for name, value in request.headers if name == b"host"]
    named = _split(hosts[0].decode("ascii", errors="replace"), 80) if len(hosts) == 1 else None
    if named != (host, port):
        return HeadRefused(400, f"the Host header is not the URL's host ({parts.netloc})")
    path = parts.path or "/"
    if parts.query:
        path = f"{path}?{parts.query}"
    return ProxyTarget("http", host, port, path)


def answer_bytes(http: h11.Connection, status: int, text: str) -> bytes:
    """The proxy's own answer (``text`` as a plain-text body), then the connection
    closes; b"" when h11 cannot send an answer any more."""
    body = text.encode("utf-8", errors="replace")
    headers = [
        ("content-type", "text/plain; charset=utf-8"),
        ("content-length", str(len(body))),
        ("connection", "close"),
        ("proxy-agent", PROXY_AGENT),
    ]
    try:
        return b"".join(
            (
                http.send(h11.Response(status_code=status, headers=headers)) or b"",
                http.send(h11.Data(data=body)) or b"",
                http.send(h11.EndOfMessage()) or b"",
            )
        )
    except h11.LocalProtocolError:
        return b""


def established_bytes(http: h11.Connection) -> bytes:
    """``200 Connection established``: the tunnel is open (h11 switches protocol)."""
    response = h11.Response(
        status_code=200, headers=[("proxy-agent", PROXY_AGENT)], reason=b"Connection established"
    )
    return http.send(response) or b""
