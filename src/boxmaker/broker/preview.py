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
only up to :data:`MAX_COMPARED_LINES` lines each (difflib is quadratic at worst, and the
model chooses one side). Binary content (a NUL, or bytes that are not UTF-8) is described,
not dumped. A file the ``[labels]`` rules make secret is not shown either: only the new
content is (the model wrote it), so a secret never lands in a terminal's scrollback or
a shared screen because the model chose to overwrite it. The lines are the file's and
the model's text: the display escapes them (:func:`boxmaker.printable.printable`).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from boxmaker.broker.runner import look_before_write
from boxmaker.core.labels import LabelRules, Taint
from boxmaker.wire import ChangePreview

MAX_READ: Final = 1024 * 1024
"""The most bytes of the file as it is that are read (write_file's own content cap)."""
MAX_COMPARED_LINES: Final = 5000
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


def _as_lines(text: str) -> list[str]:
    return [line.rstrip("\r\n") for line in text.splitlines(keepends=True)]


def _added(summary: str, text: str | None) -> ChangePreview:
    """``text`` shown as added lines (a new file, or one not compared)."""
    if text is None:
        return ChangePreview(summary=f"{summary}; binary content (not shown)")
    lines, left_out = _bounded("+" + line for line in _as_lines(text))
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
    before, after = _as_lines(old_text), _as_lines(new_text)
    if len(before) > MAX_COMPARED_LINES or len(after) > MAX_COMPARED_LINES:
        return _added(f"{replaces}; over {MAX_COMPARED_LINES} lines: the new content", new_text)
    diff = difflib.unified_diff(before, after, f"{path} (now)", f"{path} (written)", lineterm="")
    lines, left_out = _bounded(diff)
    return ChangePreview(summary=replaces, lines=lines, lines_left_out=left_out)
