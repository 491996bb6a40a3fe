"""The requester's end of one broker.sock call: its stream, and the looks at it (has it
closed its end? what did it send after its request?). broker/connection.py drives the
call; this is its socket."""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

import trio

from boxmaker.core.vocabulary import Answer, ErrorFrame
from boxmaker.wire import CatalogueAnswer, Frame, encode_frame

SEND_S: Final = 10.0
"""A requester that does not read its answer must not hold the call's task for ever."""
DRAIN: Final = 65536
"""Bytes a waiting or running call reads per wake-up when its requester sends more after
its request: left unread they would keep the socket readable. A waiting call looks in
them for the MCP client's answer (:mod:`boxmaker.broker.client_answers`); a running one
drops them."""


T = TypeVar("T")


class Requester:
    """The loopd end of one call: its stream, and the looks.

    The last look needs a non-blocking ``recv(MSG_PEEK | MSG_DONTWAIT)``, which trio's
    sockets only offer as an awaitable that blocks; so each look wraps the connection's
    descriptor in a plain socket object for that one peek and detaches it again (no
    second descriptor is kept: a pending call holds one fd). A peek sees exactly what
    the stream would read.
    """

    __slots__ = ("request_bytes", "stream")

    HEARS_CLIENT_ANSWERS: bool = True
    """Whether bytes sent while the call waits are read as the MCP client's answer
    (:mod:`boxmaker.broker.client_answers`); a requester that cannot send one (a tunnel)
    has left when it sends anything before its answer."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.request_bytes = 0
        """The request frame's size: what its arguments cost while the call waits."""

    @property
    def socket(self) -> trio.socket.SocketType:
        return self.stream.socket

    def gone(self) -> bool:
        """The last look: has the requester closed its end? Bytes it sent after its
        request do not mean gone."""
        return self._read(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) is None

    def left(self) -> bool:
        """A running call's look, once its socket became readable: has the requester
        closed its end? Bytes sent after the request are read and dropped
        (:data:`DRAIN`), so they neither mean gone nor keep the socket readable."""
        return self.sent() is None

    def sent(self) -> bytes | None:
        """A waiting call's look, once its socket became readable: what the requester
        sent after its request (up to :data:`DRAIN` bytes, read so they no longer keep
        the socket readable; empty when nothing), or None once it closed its end."""
        return self._read(DRAIN, socket.MSG_DONTWAIT)

    def _read(self, size: int, flags: int) -> bytes | None:
        fd = self.stream.socket.fileno()
        if fd < 0:
            return None
        try:
            peek = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, fileno=fd)
        except OSError:
            return None
        try:
            data = peek.recv(size, flags)
        except (BlockingIOError, InterruptedError):
            return b""
        except OSError:
            return None
        finally:
            peek.detach()
        return data or None

    async def hang_up(self) -> None:
        """Return once the requester has closed its end: its socket becomes readable,
        and the look finds the end (bytes it sent meanwhile are dropped). No timer."""
        while True:
            await trio.lowlevel.wait_readable(self.stream.socket)
            if self.left():
                return

    async def while_here(self, work: Callable[[], Awaitable[T]]) -> T | None:
        """``work()``'s result, or None when the requester left first: ``work`` is then
        cancelled (so whatever it started is stopped on its way out)."""
        result: T | None = None
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                await self.hang_up()
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch)
            result = await work()
            nursery.cancel_scope.cancel()
        return result

    async def send(self, frame: Frame) -> None:
        # A bare CancelScope rather than trio.fail_after: cheaper, once a call.
        with trio.CancelScope(deadline=trio.current_time() + SEND_S):
            await self.stream.send_all(encode_frame(frame))
            return
        raise trio.TooSlowError

    async def final(self, answer: Answer | ErrorFrame | CatalogueAnswer) -> None:
        """The one final frame of the connection."""
        await self.send(answer)
