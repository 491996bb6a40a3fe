"""Reaching a workspace path by descriptor, for the file tools (docs/decisions.md,
"The runner and the sandbox").

Symlinks: the file tools follow a symlink only while it stays inside the workspace. The
path is resolved (``realpath``), checked to be inside the workspace's real path (else
``path_escape``), and then walked segment by segment from a descriptor of the workspace
root with ``O_NOFOLLOW`` on every segment, so a link swapped in after the check (the
sandboxed shell shares the workspace) fails instead of being followed. Failures are
:class:`~boxmaker.broker.run_spec.ToolFailed` with their reason.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Final

from boxmaker.broker.run_spec import ToolFailed
from boxmaker.broker.workspace_paths import DIR_FLAGS, real_relative
from boxmaker.core.paths import ROOT, path_below
from boxmaker.core.reasons import Reason

# O_NONBLOCK: opening a FIFO planted in the workspace must not hang the worker thread.
READ_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CHUNK: Final = 65536


def symlink_escape(path: str) -> ToolFailed:
    return ToolFailed(Reason.PATH_ESCAPE, f"{path}: a symlink leads outside the workspace")


def real_relative_inside(workspace: Path, path: str) -> tuple[str, str]:
    """(the workspace's real path, ``path``'s real path relative to it), or path_escape."""
    root, relative = real_relative(workspace, path)
    if relative is None:
        raise symlink_escape(path)
    return root, relative


def walk_directory(root: str, relative: str, path: str) -> int:
    """A descriptor of the directory ``relative`` (real, symlink-free) under ``root``.

    Every segment is opened with O_NOFOLLOW: a symlink swapped in after the realpath
    check (ELOOP) is an escape attempt, not something to follow.
    """
    fd = os.open(root, DIR_FLAGS)
    try:
        for segment in [] if relative == ROOT else relative.split("/"):
            child = open_at(fd, segment, DIR_FLAGS, path)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_at(dir_fd: int, name: str, flags: int, path: str) -> int:
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        # O_NOFOLLOW meets a symlink as ELOOP, or as ENOTDIR with O_DIRECTORY.
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            with contextlib.suppress(OSError):
                if stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode):
                    raise symlink_escape(path) from None
        raise os_failure(exc, path) from None


def opened_relative(
    fd: int, root: str, walked: str, path: str, opened_path: Callable[[int], str | None]
) -> str:
    """The workspace path of what ``fd`` names now (``/proc/self/fd``): the file that
    was opened, whatever happened to the names since the walk. path_escape when it is
    outside the workspace; ``walked`` (the O_NOFOLLOW walk's own path) when the kernel
    cannot tell (a file unlinked since it was opened has no path). ``opened_path`` is
    :func:`~boxmaker.broker.nowait.fd_real_path` (a test's stands for a name moved)."""
    real = opened_path(fd)
    if real is None:
        return walked
    relative = path_below(root, real)
    if relative is None:
        raise symlink_escape(path)
    return relative


def join_path(parent: str, name: str) -> str:
    return name if parent == ROOT else f"{parent}/{name}"


def os_failure(exc: OSError, path: str) -> ToolFailed:
    if exc.errno == errno.ELOOP:
        return symlink_escape(path)
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return ToolFailed(Reason.NOT_FOUND, f"{path}: no such file or directory")
    return ToolFailed(Reason.TOOL_ERROR, f"{path}: {exc.strerror or exc}")


def read_up_to(fd: int, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = os.read(fd, min(_CHUNK, size - len(data)))
        if not chunk:
            break
        data += chunk
    return bytes(data)
