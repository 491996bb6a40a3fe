r"""What a pending write_file would change, for the owner deciding on it (docs/protocol.md,
``approvals``' ``preview``).

brokerd reads the file as it is when the approvals list is asked for (the owner decides
on the file as it is, not as it was when the model asked), in a worker thread, reached
the way the write would reach it (:func:`boxmaker.broker.tools.write_target.look_before_write`: no
symlink followed out, no FIFO opened for reading, only a regular file with one name, at
most :data:`MAX_READ` bytes). What it cannot read safely is described ("cannot show:
…"), never followed.

What is shown is bounded: at most :data:`MAX_SHOWN_LINES` lines and
:data:`MAX_SHOWN_BYTES` bytes, each line cut at :data:`MAX_LINE`; two texts are compared
only in the part that differs, up to :data:`MAX_COMPARED_LINES` lines each (difflib is
quadratic at worst, and the model chooses one side). Binary content (bytes that are
not UTF-8) is described, not dumped. A file the ``[labels]`` rules make secret
is not shown either: only the new content is (the model wrote it), so a secret never
lands in a terminal's scrollback or a shared screen because the model chose to
overwrite it.

Every byte the write changes shows in the lines: they are compared with their line
endings, so a ``\r`` added before a newline, or a final newline added or taken away, is
a changed line; a line is kept as it is (``\r``, trailing spaces, NUL and every other
character in it); a last line without a newline is followed by diff's ``\ No newline
at end of file``; and a changed line longer than :data:`MAX_LINE` is shown from a little
before where it first differs from the line it replaces, not from its start. The lines
are the file's and the model's text: the owner's screens escape them
(:mod:`boxmaker.cli.change`), ``--json`` carries them as they are.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from boxmaker.broker.tools.write_target import look_before_write
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
WINDOW_BEFORE: Final = 40
"""Characters shown before the first difference of a long changed line."""
NO_NEWLINE: Final = "\\ No newline at end of file"


def _text(data: bytes) -> str | None:
    """``data`` as text, or None when it is binary (not UTF-8). A NUL is text: it is
    shown, escaped, like every other control character."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _bytes(size: int) -> str:
    return f"{size} byte" if size == 1 else f"{size} bytes"


def _cut(line: str, start: int) -> str:
    """``line`` cut to :data:`MAX_LINE` characters, shown from its content's character
    ``start`` (0: from the start of the line)."""
    if len(line) <= MAX_LINE:
        return line
    if start == 0:
        return line[:MAX_LINE] + f"… ({len(line)} characters)"
    window = line[1 + start : start + MAX_LINE]
    return f"{line[0]}…{window}… ({len(line)} characters, shown from character {start + 2})"


def _bounded(lines: list[str], starts: list[int] | None = None) -> tuple[list[str], int]:
    """The first lines within the bounds, each cut (:func:`_cut`, from ``starts``), and
    how many were left out."""
    shown: list[str] = []
    used = 0
    left_out = 0
    for index, line in enumerate(lines):
        if len(shown) >= MAX_SHOWN_LINES or used >= MAX_SHOWN_BYTES:
            left_out += 1
            continue
        cut = _cut(line, starts[index] if starts else 0)
        shown.append(cut)
        used += len(cut.encode("utf-8", errors="surrogatepass")) + 1
    return shown, left_out


def file_lines(text: str) -> list[str]:
    r"""``text``'s lines as a file has them, each with its ``\n`` (a last line without
    one when the text does not end in a newline): split at ``\n`` only
    (``str.splitlines`` would also split at ``\r``, U+2028, form feeds and other
    separators the model may choose, making lines the file does not have).

    >>> file_lines("a\u2028b\r\nc\n"), file_lines("a\n\nb"), file_lines("")
    (['a\u2028b\r\n', 'c\n'], ['a\n', '\n', 'b'], [])
    """
    lines = [line + "\n" for line in text.split("\n")]
    lines[-1] = lines[-1][:-1]
    return lines if lines[-1] else lines[:-1]


def _ended(lines: Iterable[str]) -> list[str]:
    r"""Diff lines as shown: each content line without its ``\n``, and one without a
    ``\n`` (a file's last) followed by :data:`NO_NEWLINE`. A diff's ``@@`` lines come
    without ``\n`` and are left as they are (a content line starts with `` ``, ``-`` or
    ``+``)."""
    ended: list[str] = []
    for line in lines:
        if line.endswith("\n"):
            ended.append(line[:-1])
        else:
            ended.append(line)
            if not line.startswith("@@"):
                ended.append(NO_NEWLINE)
    return ended


def _added(summary: str, text: str) -> ChangePreview:
    """``text`` shown as added lines (a new file, or one not compared)."""
    lines, left_out = _bounded(_ended("+" + line for line in file_lines(text)))
    return ChangePreview(summary=summary, lines=lines, lines_left_out=left_out)


def preview_write(workspace: Path, rules: LabelRules, path: str, content: str) -> ChangePreview:
    """The preview of writing ``content`` to ``path`` (a checked workspace path).
    Blocking: run it in a worker thread."""
    new = content.encode("utf-8", errors="surrogatepass")
    target = look_before_write(workspace, path, MAX_READ)
    if target.missing_directory is not None:
        return ChangePreview(summary=f"cannot show: {target.missing_directory} does not exist")
    if target.problem is not None:
        return ChangePreview(summary=f"cannot show: {target.problem}")
    if target.data is None:
        return _added(f"creates {_bytes(len(new))}", content)
    old = target.data
    replaces = f"replaces {_bytes(len(old))} with {_bytes(len(new))}"
    if old == new:
        return ChangePreview(summary=f"no change: {path} already holds these {_bytes(len(new))}")
    opened = target.opened or path
    if rules.label_for_opened(path, opened, 1).taint is Taint.SECRET:
        return _added(f"{replaces}; the file is secret ([labels]), only the new content", content)
    old_text = _text(old)
    if old_text is None:
        return ChangePreview(summary=f"{replaces}; binary content (not shown)")
    diff = unified_diff(file_lines(old_text), file_lines(content), path)
    if diff is None:
        summary = f"{replaces}; over {MAX_COMPARED_LINES} changed lines: the new content"
        return _added(summary, content)
    lines, left_out = _bounded(diff, _windows(diff))
    return ChangePreview(summary=replaces, lines=lines, lines_left_out=left_out)


_HUNK: Final = re.compile(r"@@ -(\d+)(,\d+)? \+(\d+)(,\d+)? @@")


def unified_diff(before: list[str], after: list[str], path: str) -> list[str] | None:
    r"""The unified diff of two texts' lines (:func:`file_lines`: with their endings),
    shown without the endings (:func:`_ended`); or None when the part that differs is
    over :data:`MAX_COMPARED_LINES` lines on either side. The lines both share at the
    start and the end are left out of the comparison (an edit in a big file costs what
    the edit costs): difflib is quadratic at worst, and the model chooses one side.

    >>> unified_diff(file_lines("a\nb\nc\n"), file_lines("a\nB\nc\n"), "f")[2:]
    ['@@ -1,3 +1,3 @@', ' a', '-b', '+B', ' c']
    >>> unified_diff(file_lines("a\n"), file_lines("a\r\n"), "f")[2:]
    ['@@ -1 +1 @@', '-a', '+a\r']
    >>> unified_diff(file_lines("a\n"), file_lines("a"), "f")[2:]
    ['@@ -1 +1 @@', '-a', '+a', '\\ No newline at end of file']
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

    # The first two lines are the headers (lineterm="": no newline of their own).
    headers, body = lines[:2], lines[2:]
    return headers + _ended(
        _HUNK.sub(moved, line, count=1) if line.startswith("@@") else line for line in body
    )


def _common_prefix(first: str, second: str) -> int:
    """How many characters two strings share at the start (comparing slices, each in C:
    a long line costs a few copies, not a Python loop per character)."""
    low, high = 0, min(len(first), len(second))
    while low < high:
        middle = (low + high + 1) // 2
        if first[:middle] == second[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def _windows(diff: list[str]) -> list[int]:
    """Where each line of ``diff`` (:func:`unified_diff`'s) is shown from when it is cut:
    a changed line over :data:`MAX_LINE` and the line it replaces (the n-th ``-`` and the
    n-th ``+`` of one change) both from :data:`WINDOW_BEFORE` characters before their
    first difference, when a cut from the start would not show it; 0 for every other
    line."""
    starts = [0] * len(diff)
    removed: list[int] = []
    added: list[int] = []
    for index in range(2, len(diff) + 1):
        kind = diff[index][:1] if index < len(diff) else " "
        if kind == "\\":  # diff's note on the line before it: still the same change
            continue
        if kind == "+":
            added.append(index)
            continue
        if kind == "-" and not added:
            removed.append(index)
            continue
        for old, new in zip(removed, added, strict=False):
            starts[old] = starts[new] = _window_start(diff[old], diff[new])
        removed, added = ([index], []) if kind == "-" else ([], [])
    return starts


def _window_start(old: str, new: str) -> int:
    if max(len(old), len(new)) <= MAX_LINE:
        return 0
    differs = _common_prefix(old[1:], new[1:])
    return 0 if differs < MAX_LINE - 1 else differs - WINDOW_BEFORE
