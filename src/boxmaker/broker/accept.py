"""broker.sock's accept loop (docs/protocol.md): :func:`serve_capped` rather than
``trio.serve_listeners``, so that a connection beyond brokerd's caps (limits.py) is
answered ``error busy`` and closed the moment it is accepted."""

from __future__ import annotations

import contextlib
import errno
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final

import trio

from boxmaker.wire import ErrorCode, ErrorFrame, encode_frame

if TYPE_CHECKING:
    from boxmaker.broker.limits import Capacity

log = logging.getLogger("boxmaker.brokerd")

ACCEPT_CAPACITY_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
ACCEPT_RETRY_S: Final = 0.1


async def serve_capped(
    listener: trio.SocketListener,
    handler: Callable[[trio.SocketStream], Awaitable[None]],
    handler_nursery: trio.Nursery,
    capacity: Capacity,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """``trio.serve_listeners`` for one listener, within ``capacity``'s caps: each
    connection runs ``handler`` in ``handler_nursery`` and is counted until it ends; one
    beyond the caps is answered ``error busy`` and closed at once, unread. Closes the
    listener when cancelled."""
    async with listener:
        task_status.started()
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno not in ACCEPT_CAPACITY_ERRNOS:
                    raise
                # Out of descriptors despite the reserve (sandboxes, threads): wait for
                # some to be closed, as trio.serve_listeners does.
                log.error(  # noqa: TRY400 - an expected state, not a crash
                    "broker.sock: accept failed (%s); retrying", os_error_name(exc)
                )
                await trio.sleep(ACCEPT_RETRY_S)
                continue
            refusal = capacity.refusal(stream.socket.fileno())
            if refusal is not None:
                refuse_at_once(stream, ErrorFrame(code=ErrorCode.BUSY, detail=refusal))
                continue
            capacity.opened()
            handler_nursery.start_soon(_run_counted, handler, stream, capacity)


async def _run_counted(
    handler: Callable[[trio.SocketStream], Awaitable[None]],
    stream: trio.SocketStream,
    capacity: Capacity,
) -> None:
    try:
        await handler(stream)
    finally:
        try:
            await trio.aclose_forcefully(stream)
        finally:
            capacity.closed()


def refuse_at_once(stream: trio.SocketStream, frame: ErrorFrame) -> None:
    """Send ``frame`` without waiting (a fresh connection's buffer holds one small frame;
    if it does not, the peer just sees the close) and close the connection. Nothing is
    read and no task is started, so a flood of refused connections costs nothing held."""
    sock = stream.socket
    with contextlib.suppress(OSError):
        raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, fileno=sock.fileno())
        try:
            raw.send(encode_frame(frame), socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
        finally:
            raw.detach()
    sock.close()


def os_error_name(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, str(exc.errno))
