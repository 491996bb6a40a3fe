"""What every bxctl command shares: --home and --json, exit codes, output (README.md)."""

from __future__ import annotations

import enum
import sys
from typing import Any

import attrs
import orjson
from cyclopts import Parameter

from boxmaker.formats.printable import printable
from boxmaker.home.paths import Home, resolve_home


class Exit(enum.IntEnum):
    """bxctl's exit codes (README.md, "bxctl")."""

    DONE = 0
    FAILED = 1  # the operation failed, or verify found a problem
    USAGE = 2  # also: the ledger could not be read (an I/O error)
    UNREACHABLE = 3  # a daemon is unreachable
    INTERRUPTED = 130  # Ctrl-C (128 + SIGINT), as a shell reports it


@Parameter(name="*")
@attrs.frozen
class Common:
    """Options every command takes."""

    home: str | None = None
    "The boxmaker home. Default: $BOXMAKER_HOME, else ~/.local/state/boxmaker."

    json: bool = False
    "Print machine-readable JSON instead of text."

    def resolve(self) -> Home:
        return resolve_home(self.home)


DEFAULT = Common()


def print_json(data: Any) -> None:
    """``data`` as JSON; the escaping of ``printable`` is JSON's, so the JSON is exact."""
    text = orjson.dumps(data, option=orjson.OPT_INDENT_2).decode()
    sys.stdout.write(printable(text, lines=True) + "\n")


def fail(message: str, code: Exit = Exit.FAILED) -> Exit:
    """Say what went wrong on stderr and return the exit code for it."""
    sys.stderr.write(f"bxctl: {printable(message, lines=True)}\n")
    return code
