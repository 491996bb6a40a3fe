"""``state/chat_history``: the lines the owner typed at ``bxctl chat``'s prompt, kept so
the next chat recalls them (Up), newest last, at most :data:`MAX_ENTRIES`.

One JSON string a line. The file is the owner's and holds what they typed, so it is
written as the home's other files are (home/file_ops.py): a temp file made anew (0600,
never through a link) renamed over the old one, so a symlink planted at the path is
replaced, never written through. It is read without blocking and without following a
link, a regular file only (home/regular_file.py); what cannot be read is no history
(docs/threat-model.md, the owner's chat history). Blocking: call through
``trio.to_thread``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import orjson

from boxmaker.home.file_ops import write_atomically
from boxmaker.home.regular_file import NotRegularFile, read_regular_file

MAX_ENTRIES: Final = 500
"""Lines kept: the oldest go first."""
MAX_BYTES: Final = 4 * 1024 * 1024
"""The most of the file read: a bigger one was not written by bxctl, and only its head
is used."""


def _entry(line: bytes) -> str | None:
    """A kept line's text, or None when it is not one bxctl writes: JSON text, printable
    (no control character reaches the prompt's line editor from the file)."""
    try:
        text = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if isinstance(text, str) and text and text.isprintable():
        return text
    return None


def read_chat_history(path: Path) -> list[str]:
    """The kept lines, oldest first ([] when there are none). Raises OSError
    (:class:`~boxmaker.home.regular_file.NotRegularFile` among them) when the file
    cannot be read."""
    try:
        data = read_regular_file(path, limit=MAX_BYTES)
    except FileNotFoundError:
        return []
    entries = [entry for line in data.splitlines() if (entry := _entry(line)) is not None]
    return entries[-MAX_ENTRIES:]


def add_chat_line(path: Path, line: str) -> list[str]:
    """Keep ``line`` (after what another chat kept meanwhile; a repeat of the newest line
    is not kept twice): the kept lines after it. Whatever is at ``path`` that is not a
    regular file (a link, a FIFO) is replaced, not used. Raises OSError when the file
    cannot be read or replaced."""
    try:
        entries = read_chat_history(path)
    except NotRegularFile:
        entries = []
    if line and line.isprintable() and (not entries or entries[-1] != line):
        entries = [*entries, line][-MAX_ENTRIES:]
        write_atomically(path, b"".join(orjson.dumps(entry) + b"\n" for entry in entries))
    return entries
