"""Durable writes and change detection of the home's files, in one place.

A durable replace (:func:`write_atomically`) is: write a temp file beside the target,
fsync it, rename it over the name, fsync the directory (without the last step a crash
may lose the rename). Its users (session states, the ledger's genesis, the model's URL
file) take a :class:`FileOps` with the real calls as the default, so a test can fail a
call or record the order of the calls instead of patching ``os`` under them.
:func:`stat_key` is what "this file changed" means for a file brokerd caches.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import Final, Protocol, TypeAlias


class FileOps(Protocol):
    """The calls, with the meaning of their ``os`` namesakes (``replace`` is
    ``os.replace``)."""

    def open(self, path: Path, flags: int, mode: int = 0o777) -> int: ...

    def write(self, fd: int, data: bytes | memoryview) -> int: ...

    def fsync(self, fd: int) -> None: ...

    def close(self, fd: int) -> None: ...

    def replace(self, source: Path, target: Path) -> None: ...

    def unlink(self, path: Path) -> None: ...


class OsFileOps:
    """The real calls."""

    def open(self, path: Path, flags: int, mode: int = 0o777) -> int:
        return os.open(path, flags, mode)

    def write(self, fd: int, data: bytes | memoryview) -> int:
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def close(self, fd: int) -> None:
        os.close(fd)

    def replace(self, source: Path, target: Path) -> None:
        source.replace(target)

    def unlink(self, path: Path) -> None:
        path.unlink()


OS_FILES: Final[FileOps] = OsFileOps()


def fsync_dir(directory: Path, files: FileOps = OS_FILES) -> None:
    """Make the names in ``directory`` durable (after a rename or a create)."""
    fd = files.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        files.fsync(fd)
    finally:
        files.close(fd)


def write_atomically(
    path: Path, data: bytes, *, mode: int = 0o600, files: FileOps = OS_FILES
) -> None:
    """Replace ``path`` with ``data`` durably: a reader sees the old bytes or the new,
    never a part. The temp file (``.<name>.<random>.tmp``) is created anew, never
    through a link, and removed again when anything fails."""
    temp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = files.open(temp, flags, mode)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[files.write(fd, view) :]
            files.fsync(fd)
        finally:
            files.close(fd)
        files.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            files.unlink(temp)
        raise
    fsync_dir(path.parent, files)


StatKey: TypeAlias = tuple[int, ...] | None
"""(mtime_ns, size, inode, device, ctime_ns) of the file itself, None when there is
none, (-1, errno) when it cannot be stat'ed."""


def stat_key(path: Path | str) -> StatKey:
    """The file's change key, from an ``lstat`` (metadata only, so cheap enough to take
    inline before each use; a symlink is not followed, so its own stat counts). ctime
    is in it because a rewrite within one mtime tick still moves it."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return (-1, exc.errno or 0)
    return (info.st_mtime_ns, info.st_size, info.st_ino, info.st_dev, info.st_ctime_ns)
