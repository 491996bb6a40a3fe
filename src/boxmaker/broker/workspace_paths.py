"""Where a workspace path leads on disk: the file tools' resolution, and the look before
an ask (blocking; a worker thread in brokerd).

The file tools (:mod:`boxmaker.broker.tools.files`) reach a path from the workspace's real
path, the path's real path relative to it, then each segment opened without following a
link; :func:`missing_directory` reaches a write's directory the same way, to tell
whether it exists before the owner is asked (the rule is
:func:`boxmaker.core.before_asking.before_asking`). It imports nothing of the runner, so
``bxctl grants test`` takes the same look without loading brokerd's run machinery.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Final

from boxmaker.core.paths import ROOT, path_below

DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
"""A directory, opened without following a link (a link there is ELOOP or ENOTDIR)."""


@functools.lru_cache(maxsize=8)
def real_root(workspace: Path) -> str:
    """The workspace's real path, resolved once per process: it is the owner's setting,
    and no tool can move it (the sandbox mounts it; file tools work below it). Resolving
    it on every call was a third of the file tools' cost."""
    return os.path.realpath(workspace)


def real_relative(workspace: Path, path: str) -> tuple[str, str | None]:
    """(the workspace's real path, ``path``'s real path relative to it), the second None
    when the path leads outside the workspace."""
    root = real_root(workspace)
    return root, path_below(root, os.path.realpath(os.path.join(root, path)))  # noqa: PTH118


def split(relative: str) -> tuple[str, str]:
    """(a path's directory, its last name); the directory of a top-level name is ROOT."""
    parent, _, name = relative.rpartition("/")
    return parent or ROOT, name


def first_missing(root: str, relative: str) -> str | None:
    """The first directory of ``relative`` (real, under ``root``) that does not exist,
    or None. A segment that is there but not a directory, or a symlink, is left to the
    write's own walk (it fails with its own reason)."""
    fd = os.open(root, DIR_FLAGS)
    walked: list[str] = []
    try:
        for segment in [] if relative == ROOT else relative.split("/"):
            walked.append(segment)
            try:
                child = os.open(segment, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                return "/".join(walked)
            except OSError:
                return None
            os.close(fd)
            fd = child
    finally:
        os.close(fd)
    return None


def missing_directory(workspace: Path, path: str) -> str | None:
    """The first directory of the write_file path ``path`` that does not exist, reached
    as the write reaches it; None when they all exist or the path cannot be looked at
    (the workspace root, a link out of the workspace, an error): the write itself then
    fails with its own reason. Blocking."""
    if path == ROOT:
        return None
    parent, _ = split(path)
    try:
        root, real_parent = real_relative(workspace, parent)
        return None if real_parent is None else first_missing(root, real_parent)
    except OSError:
        return None
