"""Text from outside made safe to show: on the owner's terminal and in the daemons' logs.

The model chooses tool names, arguments and replies; the owner's files hold grant ids,
keys and notes. Shown raw, such text could clear the screen, move the cursor or set the
window title (escape sequences, C1 controls), reorder what the owner reads (bidi
overrides), hide characters (zero-width ones), or split a log line in two. Every
human-readable output of every program goes through :func:`printable`: bxctl's through
:class:`PrintableStream` on its stdout and stderr, the daemons' through
:class:`PrintableFormatter` on their log, and single-line fields through the function
itself (docs/architecture.md, "What the owner sees").

The escaped form is JSON's: ``\\u`` and four hex digits (a surrogate pair above
U+FFFF), so JSON text stays the same JSON, and the owner reads one form everywhere. A
backslash is not escaped: an escape the model types is shown as typed, which changes
nothing on the terminal; where the exact text matters (the arguments of a call) it is
shown as JSON, where a typed backslash reads ``\\\\``.
"""

from __future__ import annotations

import logging
import re
import unicodedata
from typing import Final, TextIO

UNSAFE_CATEGORIES: Final = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
"""Controls (C0, DEL, C1), format characters (bidi controls, zero-width characters,
the byte-order mark, tags), lone surrogates, and the line and paragraph separators."""

LAYOUT: Final = "\n\t"
"""Kept by ``lines=True``: the line breaks and tabs of a block the program lays out."""


_CANDIDATE: Final = re.compile(r"[^ -~]")
"""Each character but printable ASCII: only these need a look at their category."""


def _escaped(char: str) -> str:
    code = ord(char)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def printable(text: str, *, lines: bool = False) -> str:
    """``text`` with every control, format and separator character written as ``\\u``
    and four hex digits; with ``lines``, newlines and tabs are kept (for a block of
    several lines), else they are escaped too (for one line, or one field of one).

    >>> printable("ok\\x1b[2J\\u202egone\\nnext")
    'ok\\\\u001b[2J\\\\u202egone\\\\u000anext'
    >>> printable("ok\\n\\tnext\\u2028", lines=True)
    'ok\\n\\tnext\\\\u2028'
    >>> printable("\\U000e0041 tag")
    '\\\\udb40\\\\udc41 tag'
    >>> printable('C:\\\\path "quoted" …')
    'C:\\\\path "quoted" …'
    """
    if text.isprintable():  # the common case, and much faster than looking at each char
        return text
    keep = LAYOUT if lines else ""

    def shown(match: re.Match[str]) -> str:
        char = match.group()
        if char in keep or unicodedata.category(char) not in UNSAFE_CATEGORIES:
            return char
        return _escaped(char)

    return _CANDIDATE.sub(shown, text)


_NOT_PLAIN: Final = re.compile(r"[^ -\[\]-~]")
"""Each character but printable ASCII, and the backslash."""


def printable_exactly(text: str) -> str:
    """``text`` with every character but printable ASCII written as ``\\u`` and four hex
    digits, and each backslash as two: one form for each text, so two texts that differ
    never read the same (through :func:`printable` they may: it leaves a look-alike
    letter, a no-break space and an escape typed as text as they are).

    >>> printable_exactly("a\\u00a0b \\\\u00a0 \\u0430\\n")
    'a\\\\u00a0b \\\\\\\\u00a0 \\\\u0430\\\\u000a'
    """
    return _NOT_PLAIN.sub(
        lambda match: "\\\\" if match.group() == "\\" else _escaped(match.group()), text
    )


class PrintableStream:
    """A text stream that passes each write through ``printable(…, lines=True)``:
    bxctl's stdout and stderr, so that no command can forget to escape what it prints."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(printable(text, lines=True))
        return len(text)

    def writelines(self, lines: list[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self.stream.flush()

    # input() and rich look at these to decide whether they talk to a terminal.
    def fileno(self) -> int:
        return self.stream.fileno()

    def isatty(self) -> bool:
        return self.stream.isatty()

    @property
    def encoding(self) -> str:
        return self.stream.encoding

    @property
    def errors(self) -> str | None:
        return self.stream.errors

    def writable(self) -> bool:
        return True


class PrintableFormatter(logging.Formatter):
    """Each log record one line, whatever text it carries: the message is escaped whole
    (a newline in it too); a traceback keeps its lines, each escaped and indented, so
    that no line of it can pass for a record of its own."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return printable(super().formatMessage(record))

    def formatException(self, ei: logging._SysExcInfoType) -> str:
        return _indented(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return _indented(super().formatStack(stack_info))


def _indented(block: str) -> str:
    return "\n".join("  " + printable(line) for line in block.split("\n"))
