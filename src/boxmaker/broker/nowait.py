"""File reads that cannot block: the kernel answers from its caches or refuses.

brokerd keeps blocking file I/O off the trio thread. A small file the kernel already
holds — path, inode and data all cached — can be read without blocking at all, and a
worker thread for it costs more than the read (a thread hop and the GIL handed back and
forth for every system call; docs/performance.md). Linux says when it can serve a
request from its caches: ``openat2`` with ``RESOLVE_CACHED`` (5.12) fails with EAGAIN
when a lookup would need I/O or revalidation, and ``preadv2`` with ``RWF_NOWAIT``
(4.14) fails with EAGAIN when the data is not in the page cache. io_uring tries its
opens and reads the same way before it hands them to a worker.

These functions only ever *try*: any error, and anything but the plain case, is None,
and the caller does the work in a worker thread as before, where every error gets its
reason. So a kernel without these calls, a filesystem that does not support them, or a
cold cache changes nothing but speed.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from collections.abc import Callable
from typing import Final

import attrs

from boxmaker.core.paths import ROOT, path_below

AT_FDCWD: Final = -100
SYS_OPENAT2: Final = 437
"""The same number on every Linux architecture (added in 5.6)."""
RESOLVE_NO_MAGICLINKS: Final = 0x02
RESOLVE_BENEATH: Final = 0x08
RESOLVE_CACHED: Final = 0x20
_READ_FLAGS: Final = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class _OpenHow(ctypes.Structure):
    """``struct open_how`` (linux/openat2.h)."""

    _fields_ = (
        ("flags", ctypes.c_uint64),
        ("mode", ctypes.c_uint64),
        ("resolve", ctypes.c_uint64),
    )


def _load_syscall() -> Callable[..., int] | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        function = libc.syscall
    except (OSError, AttributeError):
        return None
    function.restype = ctypes.c_long
    return function


_syscall = _load_syscall()
_unsupported = _syscall is None or not hasattr(os, "RWF_NOWAIT")


def _openat2(
    dir_fd: int, path: str, flags: int, resolve: int, syscall: Callable[..., int] | None
) -> int | None:
    """``openat2`` through ``syscall`` (libc's), or None when it failed for any reason
    (remembered when the kernel lacks the call or the flags, so it is not tried again)."""
    global _unsupported  # one process-wide fact, learnt once
    if _unsupported or syscall is None:
        return None
    how = _OpenHow(flags, 0, resolve)
    fd = int(
        syscall(
            ctypes.c_long(SYS_OPENAT2),
            ctypes.c_int(dir_fd),
            ctypes.c_char_p(os.fsencode(path)),
            ctypes.byref(how),
            ctypes.c_size_t(ctypes.sizeof(how)),
        )
    )
    if fd >= 0:
        return fd
    if ctypes.get_errno() in (errno.ENOSYS, errno.EINVAL, errno.E2BIG, errno.EPERM):
        # No openat2 (before 5.6), no RESOLVE_CACHED (before 5.12), or a seccomp filter.
        _unsupported = True
    return None


@attrs.frozen
class CachedFile:
    """A whole small file, read from the kernel's caches."""

    data: bytes
    relative: str
    """Its real path relative to the root's real path (symlinks resolved)."""
    links: int = 1
    """Its link count (``st_nlink``): more than 1 means it has other names (hard links).
    The caller decides on ``relative`` and ``links`` before it passes ``data`` on."""


def read_cached_beneath(
    root: str,
    path: str,
    max_size: int,
    *,
    syscall: Callable[..., int] | None = _syscall,
    cached_only: bool = True,
) -> CachedFile | None:
    """The whole of the regular file ``path`` below the directory ``root``, if it is at
    most ``max_size`` bytes and the kernel can serve all of it from its caches; None
    otherwise — also for anything that would leave ``root`` (``..`` above it, an
    absolute symlink, a ``/proc`` magic link). Symlinks that stay below ``root`` are
    followed, as the file tools do. The real path and the link count come from the
    opened descriptor itself (``/proc/self/fd`` and the ``fstat`` the size check needs),
    so they are the file that was read, with no window for a link swapped in between.
    ``syscall`` is libc's ``syscall()`` (None where there is none: nothing is tried).
    ``cached_only=False`` is for tests: the same opens and read without
    ``RESOLVE_CACHED`` and ``RWF_NOWAIT``, as a kernel that holds everything in its
    caches would answer, so what is served depends on the files alone (they may block:
    never on brokerd's trio thread)."""
    if "\x00" in path or "\x00" in root:
        return None  # C would read a shorter path (checked arguments never carry one)
    cached = RESOLVE_CACHED if cached_only else 0
    root_fd = _openat2(AT_FDCWD, root, _DIR_FLAGS, cached, syscall)
    if root_fd is None:
        return None
    try:
        real_root = fd_real_path(root_fd)
        fd = _openat2(
            root_fd,
            path,
            _READ_FLAGS,
            RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS | cached,
            syscall,
        )
    finally:
        os.close(root_fd)
    if fd is None:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > max_size or real_root is None:
            return None
        data = _read_whole(fd, info.st_size, os.RWF_NOWAIT if cached_only else 0)
        real = fd_real_path(fd)
    except OSError:
        return None
    finally:
        os.close(fd)
    if data is None or real is None:
        return None
    relative = path_below(real_root, real)
    if relative is None or relative == ROOT:
        return None
    return CachedFile(data, relative, info.st_nlink)


def _read_whole(fd: int, size: int, flags: int) -> bytes | None:
    # One byte more than fstat said: getting exactly `size` back means the end of the
    # file was reached; fewer means a part was not cached (RWF_NOWAIT reads short), more
    # that the file grew since. Both are left to the worker thread.
    buffer = bytearray(size + 1)
    try:
        count = os.preadv(fd, [buffer], 0, flags)
    except OSError:
        return None
    return bytes(buffer[:count]) if count == size else None


def fd_real_path(fd: int) -> str | None:
    """What ``fd`` names now (``/proc/self/fd``); None if that cannot be told."""
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")  # noqa: PTH115  (hot path: no Path)
    except OSError:
        return None
    return None if target.endswith(" (deleted)") or not target.startswith("/") else target
