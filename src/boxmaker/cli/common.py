"""What every bxctl command shares: --home and --json, exit codes, output (spec §11)."""

from __future__ import annotations

import enum
import sys
import unicodedata
from typing import Any

import attrs
import orjson
from cyclopts import Parameter

from boxmaker.home import Home, resolve_home


class Exit(enum.IntEnum):
    """bxctl's exit codes (spec §11)."""

    DONE = 0
    FAILED = 1  # the operation failed, or verify found a problem
    USAGE = 2  # also: the ledger could not be read (spec §5.6)
    UNREACHABLE = 3  # a daemon is unreachable


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
    sys.stdout.write(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() + "\n")


def fail(message: str, code: Exit = Exit.FAILED) -> Exit:
    """Say what went wrong on stderr and return the exit code for it."""
    sys.stderr.write(f"bxctl: {message}\n")
    return code


def printable(text: str) -> str:
    """``text`` safe to print on the owner's terminal: control and format characters
    (escape sequences, bidi overrides) shown as ``\\u`` and four hex digits, newlines
    and tabs kept. What the model writes is untrusted; it must not be able to move the
    cursor, clear the screen or reorder the text of an approval prompt.

    >>> printable("ok\\n\\x1b[2Jgone\\u202e")
    'ok\\n\\\\u001b[2Jgone\\\\u202e'
    """
    return "".join(
        f"\\u{ord(char):04x}"
        if char not in "\n\t" and unicodedata.category(char) in ("Cc", "Cf")
        else char
        for char in text
    )
