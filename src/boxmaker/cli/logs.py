"""``bxctl logs``: the daemons' logs, ``logs/<daemon>.log`` (README.md).

Each log is read only as a regular file in the home's ``logs/`` (a link there is not
followed), and every line is shown through ``printable``: the built-in model's server
writes what it likes into its log. ``-f`` follows the logs as ``tail -f`` does, each
line after its daemon's name; Ctrl-C ends it quietly.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Annotated, Final

import orjson
from cyclopts import Parameter

from boxmaker.cli.common import DEFAULT, Common, Exit, fail, print_json
from boxmaker.cli.daemon_processes import BY_NAME, DAEMONS, DaemonName
from boxmaker.cli.log_tail import read_tail
from boxmaker.formats.printable import printable
from boxmaker.home.regular_file import open_regular_file

FOLLOW_POLL_S: Final = 0.2


def logs(
    daemon: DaemonName | None = None,
    /,
    *,
    follow: Annotated[bool, Parameter(name=["--follow", "-f"], negative="")] = False,
    lines: Annotated[int, Parameter(name=["--lines", "-n"])] = 20,
    common: Common = DEFAULT,
) -> Exit:
    """Show the daemons' logs (or one daemon's): the last lines of each.

    Parameters
    ----------
    daemon
        Only this daemon's log.
    follow
        Keep printing new lines as they come, each after its daemon's name (Ctrl-C ends).
    lines
        How many of the last lines to show of each log.
    """
    if lines < 0:
        return fail("--lines: expected 0 or more", Exit.USAGE)
    home = common.resolve()
    chosen = DAEMONS if daemon is None else (BY_NAME[daemon],)
    paths = {each.name: home.log_file(each.name) for each in chosen}
    named = daemon is None
    tails = {name: read_tail(path, lines) for name, path in paths.items()}
    if common.json and not follow:
        print_json(tails)
        return Exit.DONE
    for name, shown in tails.items():
        for line in shown:
            _print(name, line, named=named, as_json=common.json)
    if not follow:
        if not any(os.path.lexists(path) for path in paths.values()):
            return fail(f"no logs in {home.logs_dir} yet (`bxctl up` writes them)")
        return Exit.DONE
    with contextlib.suppress(KeyboardInterrupt):
        _follow(paths, named=named, as_json=common.json)
    return Exit.DONE


def _print(name: str, line: str, *, named: bool, as_json: bool) -> None:
    if as_json:
        print(printable(orjson.dumps({"daemon": name, "line": line}).decode()), flush=True)
    elif named:
        print(f"{name:10} | {printable(line)}", flush=True)
    else:
        print(printable(line), flush=True)


class _Followed:
    """One log being followed: where it was read to, and which file that was."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.identity: tuple[int, int] | None = None
        self.offset = 0
        self.partial = b""
        self._look(at_end=True)

    def _look(self, *, at_end: bool) -> int | None:
        try:
            fd = open_regular_file(self.path)
        except OSError:
            return None
        info = os.fstat(fd)
        identity = (info.st_dev, info.st_ino)
        if identity != self.identity or info.st_size < self.offset:
            # A new file, or the same one cut short: read it from its start.
            self.identity, self.partial = identity, b""
            self.offset = info.st_size if at_end else 0
        return fd

    def new_lines(self) -> list[str]:
        fd = self._look(at_end=False)
        if fd is None:
            return []
        try:
            data = os.pread(fd, 1 << 20, self.offset)
        finally:
            os.close(fd)
        self.offset += len(data)
        *whole, self.partial = (self.partial + data).split(b"\n")
        return [line.decode("utf-8", "replace") for line in whole]


def _follow(paths: dict[str, Path], *, named: bool, as_json: bool) -> None:
    followed = {name: _Followed(path) for name, path in paths.items()}
    while True:
        for name, log in followed.items():
            for line in log.new_lines():
                _print(name, line, named=named, as_json=as_json)
        time.sleep(FOLLOW_POLL_S)
