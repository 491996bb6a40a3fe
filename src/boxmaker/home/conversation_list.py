"""The conversations kept in ``state/conversations`` (loop/conversations.py writes them),
as ``bxctl sessions`` lists them: each session's last use and the first words said in it.

Each file is looked at without following a link, a regular file only, and only its head
is read (home/regular_file.py). Blocking: call through ``trio.to_thread``.
"""

from __future__ import annotations

import datetime as dt
import os
import stat
from typing import Final

import attrs
import orjson

from boxmaker.formats.convert import SESSION_ID
from boxmaker.home.paths import Home
from boxmaker.home.regular_file import read_regular_file

HEAD_BYTES: Final = 65536
"""How much of a conversation is read for its first words."""
FIRST_WORDS: Final = 60
"""The most characters of the first words kept."""
SUFFIX: Final = ".jsonl"


@attrs.frozen
class Conversation:
    session: str
    last_used: dt.datetime
    first_words: str | None
    """The start of the first thing the owner said in it (None when none was found in its
    head)."""


def _first_words(data: bytes) -> str | None:
    """
    >>> _first_words(b'{"role":"user","content":"Read notes.txt"}\\n')
    'Read notes.txt'
    >>> _first_words(b'{"role":"system","content":"x"}\\n') is None
    True
    """
    for line in data.splitlines():
        try:
            message = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str) and content.strip():
                words = " ".join(content.split())
                return words if len(words) <= FIRST_WORDS else words[: FIRST_WORDS - 1] + "…"
    return None


def _conversation(home: Home, name: str) -> Conversation | None:
    session = name.removesuffix(SUFFIX)
    if not (name.endswith(SUFFIX) and SESSION_ID.fullmatch(session)):
        return None
    path = home.conversation(session)
    try:
        found = os.lstat(path)
        if not stat.S_ISREG(found.st_mode):
            return None
        head = read_regular_file(path, limit=HEAD_BYTES)[:HEAD_BYTES]
    except OSError:
        return None
    used = dt.datetime.fromtimestamp(found.st_mtime, dt.UTC)
    return Conversation(session, used, _first_words(head))


def list_conversations(home: Home) -> list[Conversation]:
    """Every kept conversation, the last used first ([] when there are none)."""
    try:
        names = [entry.name for entry in home.conversations_dir.iterdir()]
    except FileNotFoundError:
        return []
    found = [c for name in names if (c := _conversation(home, name)) is not None]
    return sorted(found, key=lambda c: (c.last_used, c.session), reverse=True)
