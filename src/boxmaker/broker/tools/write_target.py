"""Looking before a write: what a ``write_file``'s path leads to now, reached as the
write would reach it, for the owner's preview of its change (broker/preview.py)."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import attrs

from boxmaker.broker.run_spec import ToolFailed
from boxmaker.broker.tools.file_walk import (
    READ_FLAGS,
    join_path,
    opened_relative,
    os_failure,
    read_up_to,
    walk_directory,
)
from boxmaker.broker.tools.host import REAL_HOST, Host
from boxmaker.broker.workspace_paths import first_missing, split
from boxmaker.core.paths import ROOT
from boxmaker.core.reasons import Reason


@attrs.frozen
class WriteTarget:
    """What a write_file's path leads to now, reached as
    :func:`~boxmaker.broker.tools.files.write_file` would reach it.
    ``missing_directory``: the first directory of the path that does not exist (the
    write would fail ``not_found``); ``problem``: why the file cannot be looked at (an
    escape, not a regular file, other names, too large); else ``data``, the file's
    bytes (None: no file there yet), ``opened`` its real workspace path."""

    missing_directory: str | None = None
    problem: str | None = None
    data: bytes | None = None
    opened: str | None = None


def look_before_write(
    workspace: Path, path: str, limit: int, host: Host | None = None
) -> WriteTarget:
    """Blocking (a worker thread). ``limit``: the most bytes to read of an existing file.
    Never follows a symlink out, never opens a FIFO for reading without O_NONBLOCK, reads
    only a regular file with one name. (Before an ask, only whether the directory exists
    matters: :func:`boxmaker.broker.workspace_paths.missing_directory`.)"""
    try:
        return _look(workspace, path, limit, host or REAL_HOST)
    except ToolFailed as failed:
        return WriteTarget(problem=failed.detail)
    except OSError as exc:
        return WriteTarget(problem=f"{path}: {exc.strerror or exc}")


def _look(workspace: Path, path: str, limit: int, host: Host) -> WriteTarget:
    if path == ROOT:
        raise ToolFailed(Reason.TOOL_ERROR, f"{path}: is a directory")
    parent_path, name = split(path)
    root, real_parent = host.real_relative(workspace, parent_path)
    missing = first_missing(root, real_parent)
    if missing is not None:
        return WriteTarget(missing_directory=missing)
    dir_fd = walk_directory(root, real_parent, path)
    try:
        fd = os.open(name, READ_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return WriteTarget()
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ToolFailed(
                Reason.PATH_ESCAPE, f"{path}: a symlink (the write replaces the link itself)"
            ) from None
        raise os_failure(exc, path) from None
    finally:
        os.close(dir_fd)
    try:
        info = os.fstat(fd)
        opened = opened_relative(fd, root, join_path(real_parent, name), path, host.opened_path)
        if stat.S_ISDIR(info.st_mode):
            raise ToolFailed(Reason.TOOL_ERROR, f"{path}: is a directory")
        if not stat.S_ISREG(info.st_mode):
            raise ToolFailed(Reason.TOOL_ERROR, f"{path}: not a regular file")
        if info.st_nlink > 1:
            raise ToolFailed(Reason.TOOL_ERROR, f"{path}: the file has other names (hard links)")
        # One byte more than the limit tells a file that grew past it since fstat.
        data = b"" if info.st_size > limit else read_up_to(fd, limit + 1)
    finally:
        os.close(fd)
    if info.st_size > limit or len(data) > limit:
        raise ToolFailed(Reason.TOO_LARGE, f"{path}: over {limit} bytes")
    return WriteTarget(data=data, opened=opened)
