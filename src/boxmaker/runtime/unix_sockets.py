"""Unix sockets of the daemons (docs/protocol.md): listeners, stale socket files, the
peer check, and what counts as a peer gone. brokerd, loopd, inferproxy and the built-in
model all serve on sockets in ``run/``.

trio has no Unix-socket listener helper: the socket is made with ``trio.socket``, bound,
chmod 0600, listened on and wrapped in :class:`trio.SocketListener`. The sockets live in
``run/`` (0700, see :meth:`boxmaker.home.paths.Home.ensure_run_dir`), so the short window
between bind and chmod is not visible to other users.

A path already there is removed only if it *is* a socket and nobody answers on it: a
live socket means another daemon serves this home, and removing it would silently take
its clients away. Anything else (a file, a directory) is refused.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import socket
import stat
import struct
from pathlib import Path
from typing import Final

import attrs
import trio

from boxmaker.runtime.threads import WORKER_THREAD, ToThread
from boxmaker.wire import ErrorCode, ErrorFrame, encode_frame

log = logging.getLogger("boxmaker.sockets")

SOCKET_MODE: Final = 0o600
BACKLOG: Final = 128
_UCRED: Final = struct.Struct("3i")
"""``struct ucred``: pid, uid, gid (Linux SO_PEERCRED)."""
REFUSE_SEND_S: Final = 1.0
DISCONNECTS: Final = (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError)
"""A peer gone, or too slow to read: a normal end of a connection, not a crash."""


class ListenerError(Exception):
    """A socket path that cannot be served; brokerd refuses to start."""


@attrs.define(eq=False)
class UnixListener:
    """A bound, listening Unix socket, and what is needed to remove exactly it."""

    path: Path
    listener: trio.SocketListener
    inode: int

    def remove_path(self) -> None:
        """Remove our socket file, unless something else has taken the path since."""
        remove_socket_path(self.path, self.inode)


def remove_socket_path(path: Path, inode: int) -> None:
    """Remove the socket file ``path`` if it is still ours (``inode``)."""
    with contextlib.suppress(OSError):
        if path.lstat().st_ino == inode:
            path.unlink()


def remove_stale_socket(path: Path) -> None:
    """Make way for a new socket at ``path``: a dead socket file is removed, a live one
    or anything else refused (:class:`ListenerError`). Blocking."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise ListenerError(f"{path}: exists and is not a socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        pass  # stale: left by a brokerd that did not stop cleanly
    except OSError as exc:
        raise ListenerError(f"{path}: cannot probe the old socket ({exc.strerror})") from exc
    else:
        raise ListenerError(
            f"{path}: another process is serving on it (is this home's daemon running?)"
        )
    finally:
        probe.close()
    path.unlink(missing_ok=True)
    log.info("removed a stale socket %s", path)


def _make_private(path: Path) -> int:
    """chmod 0600 before listen(), so no connection is accepted at the umask's mode;
    returns the inode that identifies our socket file for removal."""
    path.chmod(SOCKET_MODE)
    return path.lstat().st_ino


def bind_unix_socket(path: Path) -> tuple[socket.socket, int]:
    """A listening Unix socket at ``path`` (mode 0600; a stale socket file replaced, a
    live one or anything else refused) and the inode that identifies our socket file.
    Blocking. Raises :class:`ListenerError`."""
    remove_stale_socket(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        inode = _make_private(path)
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ListenerError(f"{path}: address in use") from exc
        raise ListenerError(f"{path}: cannot listen ({exc.strerror})") from exc
    return sock, inode


async def open_unix_listener(path: Path, *, to_thread: ToThread = WORKER_THREAD) -> UnixListener:
    """Bind ``path`` (mode 0600) and listen (docs/protocol.md), the bind in ``to_thread``.
    Raises :class:`ListenerError`."""
    sock, inode = await to_thread(bind_unix_socket, path)
    return UnixListener(path, trio.SocketListener(trio.socket.from_stdlib_socket(sock)), inode)


def peer_uid(stream: trio.SocketStream) -> int | None:
    """The connecting process's uid (SO_PEERCRED), or None when it cannot be learnt."""
    try:
        raw = stream.socket.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    except OSError:
        return None
    _pid, uid, _gid = _UCRED.unpack(raw)
    return int(uid)


async def check_peer(stream: trio.SocketStream, *, allowed: int, name: str) -> bool:
    """True if the peer is ``allowed``; otherwise answer ``error peer_refused``, log a
    line, and return False (the caller closes). Who may connect: docs/protocol.md."""
    uid = peer_uid(stream)
    if uid == allowed:
        return True
    who = "an unknown uid" if uid is None else f"uid {uid}"
    log.warning("%s: refused a peer with %s (only uid %d may connect)", name, who, allowed)
    frame = ErrorFrame(code=ErrorCode.PEER_REFUSED, detail=f"{who} may not use {name}")
    # The peer may not read; the refusal must not hold the connection open.
    with trio.move_on_after(REFUSE_SEND_S), contextlib.suppress(trio.BrokenResourceError):
        await stream.send_all(encode_frame(frame))
    return False
