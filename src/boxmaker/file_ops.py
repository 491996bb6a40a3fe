"""The file system calls that make a write durable, as one injectable layer.

A durable replace is: write a temp file, fsync it, rename it over the name, fsync the
directory (without the last step a crash may lose the rename). The modules that do it
(state_files, the ledger's genesis) take a :class:`FileOps` with the real one as the
default, so a test can fail a call or record the order of the calls instead of patching
``os`` under them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final, Protocol


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
