"""What a pending write_file would change, for the owner deciding on it (docs/protocol.md,
``approvals``' ``preview``).

brokerd reads the file as it is when the approvals list is asked for (the owner decides
on the file as it is, not as it was when the model asked), in a worker thread, reached
the way the write would reach it (:func:`boxmaker.broker.runner.look_before_write`: no
symlink followed out, no FIFO opened for reading, only a regular file with one name, at
most :data:`MAX_READ` bytes). What it cannot read safely is described ("cannot show:
…"), never followed.

What is shown is bounded: at most :data:`MAX_SHOWN_LINES` lines and
:data:`MAX_SHOWN_BYTES` bytes, each line cut at :data:`MAX_LINE`; two texts are compared
only in the part that differs, up to :data:`MAX_COMPARED_LINES` lines each (difflib is
quadratic at worst, and the model chooses one side). Binary content (a NUL, or bytes
that are not UTF-8) is described, not dumped. A file the ``[labels]`` rules make secret
is not shown either: only the new content is (the model wrote it), so a secret never
lands in a terminal's scrollback or a shared screen because the model chose to
overwrite it. The lines are the file's and
the model's text: the display escapes them (:func:`boxmaker.printable.printable`).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from boxmaker.broker.runner import look_before_write
from boxmaker.core.labels import LabelRules, Taint
from boxmaker.wire import ChangePreview

MAX_READ: Final = 1024 * 1024
"""The most bytes of the file as it is that are read (write_file's own content cap)."""
MAX_COMPARED_LINES: Final = 1000
"""The most lines compared on either side once the lines both texts share at the start
and the end are left out (about 0.15 s of difflib at its worst)."""
CONTEXT: Final = 3
MAX_SHOWN_LINES: Final = 200
MAX_SHOWN_BYTES: Final = 64 * 1024
MAX_LINE: Final = 400


def _text(data: bytes) -> str | None:
    """``data`` as text, or None when it is binary (a NUL, or not UTF-8)."""
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _bytes(size: int) -> str:
    return f"{size} byte" if size == 1 else f"{size} bytes"


def _bounded(lines: Iterable[str]) -> tuple[list[str], int]:
    """The first lines within the bounds, and how many were left out."""
    shown: list[str] = []
    used = 0
    left_out = 0
    for line in lines:
        if len(shown) >= MAX_SHOWN_LINES or used >= MAX_SHOWN_BYTES:
            left_out += 1
            continue
        cut = line if len(line) <= MAX_LINE else line[:MAX_LINE] + f"… ({len(line)} characters)"
        shown.append(cut)
        used += len(cut.encode("utf-8", errors="surrogatepass")) + 1
    return shown, left_out


def as_lines(text: str) -> list[str]:
    r"""``text``'s lines as a file has them: split at ``\n`` only (``str.splitlines``
    would also split at U+2028, form feeds and other separators the model may choose,
    making lines the file does not have), a final ``\r`` dropped.

    >>> as_lines("a\u2028b\r\nc\n")
    ['a\u2028b', 'c']
    """
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def _added(summary: str, text: str | None) -> ChangePreview:
    """``text`` shown as added lines (a new file, or one not compared)."""
    if text is None:
        return ChangePreview(summary=f"{summary}; binary content (not shown)")
    lines, left_out = _bounded("+" + line for line in as_lines(text))
    return ChangePreview(summary=summary, lines=lines, lines_left_out=left_out)


def preview_write(workspace: Path, rules: LabelRules, path: str, content: str) -> ChangePreview:
    """The preview of writing ``content`` to ``path`` (a checked workspace path).
    Blocking: run it in a worker thread."""
    new = content.encode("utf-8", errors="surrogatepass")
    new_text = None if "\0" in content else content
    target = look_before_write(workspace, path, MAX_READ)
    if target.missing_directory is not None:
        return ChangePreview(summary=f"cannot show: {target.missing_directory} does not exist")
    if target.problem is not None:
        return ChangePreview(summary=f"cannot show: {target.problem}")
    if target.data is None:
        return _added(f"creates {_bytes(len(new))}", new_text)
    old = target.data
    replaces = f"replaces {_bytes(len(old))} with {_bytes(len(new))}"
    if old == new:
        return ChangePreview(summary=f"no change: {path} already holds these {_bytes(len(new))}")
    opened = target.opened or path
    if rules.label_for_opened(path, opened, 1).taint is Taint.SECRET:
        return _added(f"{replaces}; the file is secret ([labels]), only the new content", new_text)
    old_text = _text(old)
    if old_text is None or new_text is None:
        return ChangePreview(summary=f"{replaces}; binary content (not shown)")
    diff = unified_diff(as_lines(old_text), as_lines(new_text), path)
    if diff is None:
        summary = f"{replaces}; over {MAX_COMPARED_LINES} changed lines: the new content"
        return _added(summary, new_text)
    lines, left_out = _bounded(diff)
    return ChangePreview(summary=replaces, lines=lines, lines_left_out=left_out)


_HUNK: Final = re.compile(r"@@ -(\d+)(,\d+)? \+(\d+)(,\d+)? @@")


def unified_diff(before: list[str], after: list[str], path: str) -> list[str] | None:
    """The unified diff of two texts' lines, or None when the part that differs is over
    :data:`MAX_COMPARED_LINES` lines on either side. The lines both share at the start
    and the end are left out of the comparison (an edit in a big file costs what the
    edit costs): difflib is quadratic at worst, and the model chooses one side.

    >>> unified_diff(["a", "b", "c"], ["a", "B", "c"], "f")[2:]
    ['@@ -1,3 +1,3 @@', ' a', '-b', '+B', ' c']
    """
    head = 0
    while head < min(len(before), len(after)) and before[head] == after[head]:
        head += 1
    tail = 0
    limit = min(len(before), len(after)) - head
    while tail < limit and before[-1 - tail] == after[-1 - tail]:
        tail += 1
    if max(len(before), len(after)) - head - tail > MAX_COMPARED_LINES:
        return None
    # The changed part with its context; hunk numbers moved back to the whole file's.
    start = max(0, head - CONTEXT)
    old = before[start : len(before) - max(0, tail - CONTEXT)]
    new = after[start : len(after) - max(0, tail - CONTEXT)]
    lines = list(difflib.unified_diff(old, new, f"{path} (now)", f"{path} (written)", lineterm=""))

    def moved(match: re.Match[str]) -> str:
        a, b, c, d = match.groups()
        return f"@@ -{int(a) + start}{b or ''} +{int(c) + start}{d or ''} @@"

    return [_HUNK.sub(moved, line, count=1) if line.startswith("@@") else line for line in lines]
