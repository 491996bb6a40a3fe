"""Reading the daemons' logs: ``bxctl logs``, ``bxctl reload``'s answers, and ``up``'s
report of a failed start. Only a regular file is read (a link is not followed)."""

from __future__ import annotations

import os
from pathlib import Path

from boxmaker.home.regular_file import open_regular_file


def read_from(path: Path, offset: int) -> list[str]:
    """The whole lines of the log at ``path`` from byte ``offset`` on."""
    try:
        fd = open_regular_file(path)
    except OSError:
        return []
    try:
        os.lseek(fd, offset, os.SEEK_SET)
        data = b"".join(iter(lambda: os.read(fd, 65536), b""))
    finally:
        os.close(fd)
    whole = data[: data.rfind(b"\n") + 1]
    return whole.decode("utf-8", "replace").splitlines()


def read_tail(path: Path, count: int) -> list[str]:
    """The last ``count`` lines of the log at ``path`` (none when there is no regular
    file there: a link is not followed)."""
    try:
        fd = open_regular_file(path)
    except OSError:
        return []
    try:
        end = os.fstat(fd).st_size
        start, data = end, b""
        while start > 0 and data.count(b"\n") <= count:
            start = max(0, start - 65536)
            data = os.pread(fd, end - start, start)
    finally:
        os.close(fd)
    return data.decode("utf-8", "replace").splitlines()[-count:] if count else []
