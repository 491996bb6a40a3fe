"""The file tools: ``read_file``, ``list_dir``, ``write_file`` (docs/protocol.md;
docs/decisions.md, "The runner and the sandbox", repeats these choices).

- A path is reached as file_walk.py says: its real path checked inside the workspace,
  then walked with ``O_NOFOLLOW`` on every segment. The result's label is the join of
  the requested path's label and the real path's (a link ``notes.txt -> .env`` reads as
  secret).
- Links and a ``paths`` grant: the grant bounds the file actually opened. Once the
  file (or listed directory, or write_file's directory) is open, its real path is read
  from the descriptor (``/proc/self/fd``) and its link count from ``fstat``, and
  :func:`~boxmaker.core.grants.opened_refusal` decides on them before anything is read
  or written through it: a real path outside the grant's ``paths``, or a regular file
  with other names (hard links) without the grant's ``hard_links``, is ``path_escape``.
  The real path is also checked before opening, so a link out of the grant is refused
  the same way whether or not its target exists. A file with other names reads as the
  highest label ``[labels]`` gives (:meth:`~boxmaker.core.labels.LabelRules.label_for_opened`).
- ``read_file``: without ``max_bytes`` a file over 1 MiB is ``too_large``; with it, the
  first ``max_bytes`` bytes are read (the schema says "read at most") and a marker says
  the content was cut. Only regular files are read (a FIFO or device is ``tool_error``).
- ``list_dir``: sorted names, one per line; a directory ends in ``/``, a symlink in
  ``@`` (never followed); a listing over 1 MiB is ``too_large``.
- ``write_file``: the parent directory must exist (else ``not_found``); a symlink at the
  final name is ``path_escape`` and the rename replaces a name, never a link's target. A
  new file gets mode 0o666 less the umask; a replaced file keeps its permission bits.
- File tools run in a worker thread and are not timed: a thread cannot be stopped, and
  answering ``timeout`` for a write that then lands would be a lie.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from typing import Final

from boxmaker.broker.nowait import read_cached_beneath
from boxmaker.broker.run_spec import RunResult, RunSpec, ToolFailed
from boxmaker.broker.tools.file_walk import (
    READ_FLAGS,
    join_path,
    open_at,
    opened_relative,
    read_up_to,
    symlink_escape,
    walk_directory,
)
from boxmaker.broker.tools.host import CachedReader, Host
from boxmaker.broker.workspace_paths import DIR_FLAGS, split
from boxmaker.core.catalogue import MAX_BYTES, ListDirArgs, ReadFileArgs, WriteFileArgs
from boxmaker.core.grants import opened_refusal
from boxmaker.core.paths import ROOT
from boxmaker.core.reasons import Reason

CACHED_READ_MAX: Final = 64 * 1024
"""The largest file read_file reads on the trio thread when all of it is cached: the
copy and decode of a bigger one would hold up every other call."""
_TEMP_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _bound(spec: RunSpec, path: str, real: str, links: int = 1) -> None:
    """path_escape unless the grant covers ``real`` (and, for ``links`` > 1, allows a
    file with other names); see :func:`~boxmaker.core.grants.opened_refusal`."""
    refusal = opened_refusal(spec.bounds, path, real, links)
    if refusal is not None:
        raise ToolFailed(Reason.PATH_ESCAPE, refusal)


def _exists(dir_fd: int, name: str) -> bool:
    try:
        os.lstat(name, dir_fd=dir_fd)
    except OSError:
        return False
    return True


def read_file(spec: RunSpec, args: ReadFileArgs, host: Host) -> RunResult:
    root, real = host.real_relative(spec.workspace, args.path)
    _bound(spec, args.path, real)
    if real == ROOT:
        raise ToolFailed(Reason.TOOL_ERROR, f"{args.path}: is a directory")
    parent, name = split(real)
    dir_fd = walk_directory(root, parent, args.path)
    try:
        fd = open_at(dir_fd, name, READ_FLAGS, args.path)
    finally:
        os.close(dir_fd)
    try:
        # Decided on the open descriptor, before a byte is read through it.
        info = os.fstat(fd)
        opened = opened_relative(fd, root, real, args.path, host.opened_path)
        links = info.st_nlink if stat.S_ISREG(info.st_mode) else 1
        _bound(spec, args.path, opened, links)
        label = spec.label.join(spec.rules.label_for_opened(args.path, opened, links))
        if stat.S_ISDIR(info.st_mode):
            raise ToolFailed(Reason.TOOL_ERROR, f"{args.path}: is a directory")
        if not stat.S_ISREG(info.st_mode):
            raise ToolFailed(Reason.TOOL_ERROR, f"{args.path}: not a regular file")
        limit = args.max_bytes if args.max_bytes is not None else MAX_BYTES
        # One byte more than the limit tells a file that grew past it since fstat.
        data = read_up_to(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) <= limit:
        return RunResult.success(data.decode("utf-8", errors="replace"), label)
    if args.max_bytes is None:
        raise ToolFailed(
            Reason.TOO_LARGE,
            f"{args.path}: over {MAX_BYTES} bytes; pass max_bytes to read the start of it",
        )
    size = max(info.st_size, len(data))
    text = data[:limit].decode("utf-8", errors="replace")
    return RunResult.success(f"{text}\n[file cut at {limit} of {size} bytes]", label)


def read_file_cached(
    spec: RunSpec, args: ReadFileArgs, read_cached: CachedReader = read_cached_beneath
) -> RunResult | None:
    """read_file on the trio thread, when the kernel can serve it without blocking
    (nowait.py): a small regular file, inside the workspace, all of it cached. None
    sends the call to :func:`read_file` in a worker thread, which also gives every
    failure its reason. The same content and label as :func:`read_file` would give."""
    limit = args.max_bytes if args.max_bytes is not None else MAX_BYTES
    cached = read_cached(str(spec.workspace), args.path, min(limit, CACHED_READ_MAX))
    if cached is None:
        return None
    # Decided on the descriptor read (nowait.py): a refusal leaves the data unused.
    _bound(spec, args.path, cached.relative, cached.links)
    label = spec.label.join(spec.rules.label_for_opened(args.path, cached.relative, cached.links))
    return RunResult.success(cached.data.decode("utf-8", errors="replace"), label)


def list_dir(spec: RunSpec, args: ListDirArgs, host: Host) -> RunResult:
    root, real = host.real_relative(spec.workspace, args.path)
    _bound(spec, args.path, real)
    parent, name = split(real)
    if real == ROOT:
        fd = walk_directory(root, ROOT, args.path)
    else:
        dir_fd = walk_directory(root, parent, args.path)
        try:
            fd = open_at(dir_fd, name, DIR_FLAGS, args.path)
        except ToolFailed as failed:
            if (failed.reason is Reason.NOT_FOUND) and _exists(dir_fd, name):
                raise ToolFailed(Reason.TOOL_ERROR, f"{args.path}: not a directory") from None
            raise
        finally:
            os.close(dir_fd)
    try:
        # Decided on the open descriptor, before it is listed.
        opened = opened_relative(fd, root, real, args.path, host.opened_path)
        _bound(spec, args.path, opened)
        label = spec.label.join(spec.rules.label_for_opened(args.path, opened, 1))
        names = []
        with os.scandir(fd) as entries:
            for entry in entries:
                if entry.is_symlink():
                    names.append(entry.name + "@")
                elif entry.is_dir(follow_symlinks=False):
                    names.append(entry.name + "/")
                else:
                    names.append(entry.name)
    finally:
        os.close(fd)
    content = "\n".join(sorted(names))
    if len(content.encode("utf-8", errors="surrogateescape")) > MAX_BYTES:
        raise ToolFailed(Reason.TOO_LARGE, f"{args.path}: the listing is over {MAX_BYTES} bytes")
    return RunResult.success(content, label)


def write_file(spec: RunSpec, args: WriteFileArgs, host: Host) -> RunResult:
    parent_path, name = split(args.path)
    if args.path == ROOT:
        raise ToolFailed(Reason.TOOL_ERROR, f"{args.path}: is a directory")
    root, real_parent = host.real_relative(spec.workspace, parent_path)
    _bound(spec, args.path, join_path(real_parent, name))
    dir_fd = walk_directory(root, real_parent, args.path)
    try:
        # The target's real path is its directory's (read from the descriptor the
        # rename goes through) and its own name, which is never a symlink: one there is
        # refused below, and one raced in is replaced by the rename, not followed.
        opened_parent = opened_relative(dir_fd, root, real_parent, args.path, host.opened_path)
        _bound(spec, args.path, join_path(opened_parent, name))
        mode: int | None = None
        try:
            info = os.lstat(name, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        else:
            if stat.S_ISLNK(info.st_mode):
                raise symlink_escape(args.path)
            if stat.S_ISDIR(info.st_mode):
                raise ToolFailed(Reason.TOOL_ERROR, f"{args.path}: is a directory")
            mode = stat.S_IMODE(info.st_mode)
        data = args.content.encode("utf-8", errors="surrogatepass")
        temp = f".{name[:100]}.{secrets.token_hex(8)}.tmp"
        fd = os.open(temp, _TEMP_FLAGS, 0o666, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "wb", buffering=0) as file:
                if mode is not None:
                    os.fchmod(fd, mode)
                view = memoryview(data)
                while view:
                    view = view[file.write(view) or 0 :]
                os.fsync(fd)
            # rename replaces the name itself: a symlink raced in at the final name is
            # replaced, its target is never written.
            os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=dir_fd)
            raise
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return RunResult.success(f"wrote {len(data)} bytes to {args.path}", spec.label)
