"""Reading the home's own files (config.toml, grants.toml, session states) safely.

Each is opened ``O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC`` and used only when ``fstat``
says it is a regular file. A FIFO planted at one of these paths would otherwise block
the open until a writer came (a worker thread stuck for good, and with it brokerd's
clean stop); a symlink could lead out of the private home, e.g. into the workspace the
model writes (docs/runbook.md#grants). Blocking I/O: callers in trio run it in a worker
thread.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Final

READ_FLAGS: Final = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK: Final = 65536


class NotRegularFile(OSError):
    """The path names something other than a regular file; ``strerror`` says what."""

    def __init__(self, kind: str) -> None:
        super().__init__(errno.EINVAL, f"not a regular file ({kind})")


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symlink, which is not followed"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "an unknown kind of file"


def open_regular_file(path: Path | str, flags: int = READ_FLAGS, mode: int = 0o600) -> int:
    """A descriptor of the regular file at ``path``, opened with ``flags`` (which keep
    ``O_NOFOLLOW``; ``O_CREAT`` creates it with ``mode``). Never blocks on a FIFO,
    never follows a symlink at ``path`` itself.

    Raises FileNotFoundError when there is nothing there, :class:`NotRegularFile` for
    anything but a regular file, another OSError when it cannot be opened.
    """
    flags |= os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, mode)
    except FileNotFoundError:
        raise
    except OSError as exc:
        # ELOOP (a symlink under O_NOFOLLOW), ENXIO (a socket): say what is there.
        try:
            kind = os.lstat(path).st_mode
        except OSError:
            raise exc from None
        if not stat.S_ISREG(kind):
            raise NotRegularFile(_kind(kind)) from exc
        raise
    kind = os.fstat(fd).st_mode
    if not stat.S_ISREG(kind):
        os.close(fd)
        raise NotRegularFile(_kind(kind))
    return fd


def read_regular_file(path: Path | str, *, limit: int | None = None) -> bytes:
    """The bytes of the regular file at ``path`` (at most ``limit + 1`` of them, so the
    caller can tell "over the limit"). Never blocks on a FIFO, never follows a symlink
    at ``path`` itself.

    Raises FileNotFoundError when there is nothing there, :class:`NotRegularFile` for
    anything but a regular file, another OSError when it cannot be opened or read.
    """
    fd = open_regular_file(path)
    try:
        chunks = []
        left = -1 if limit is None else limit + 1
        while left != 0:
            chunk = os.read(fd, _CHUNK if left < 0 else min(left, _CHUNK))
            if not chunk:
                break
            chunks.append(chunk)
            if left > 0:
                left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
