"""Conversation histories: ``state/conversations/<session>.jsonl`` (docs/decisions.md, "loopd").

One chat message a line, appended as a turn adds them. A history holds no authority
(the broker decides from grants and the session's state, never from it), so a line that
cannot be read is skipped with a warning rather than ending the session. The file is
opened without blocking and without following a link, and only a regular file is used
(boxmaker/home/regular_file.py): a FIFO planted there would otherwise hang the turn for good.
Blocking: call through ``trio.to_thread``.
"""

from __future__ import annotations

import logging
import os
import stat
from typing import Any

import orjson

from boxmaker.home.paths import Home
from boxmaker.home.regular_file import NotRegularFile, read_regular_file

log = logging.getLogger("boxmaker.loopd")

_APPEND_FLAGS = (
    os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
)


def load_history(home: Home, session: str) -> list[dict[str, Any]]:
    """The session's messages so far ([] for a new session). Raises OSError
    (:class:`NotRegularFile` among them) when the history cannot be read."""
    try:
        data = read_regular_file(home.conversation(session))
    except FileNotFoundError:
        return []
    messages: list[dict[str, Any]] = []
    for number, line in enumerate(data.splitlines(), start=1):
        try:
            message = orjson.loads(line)
        except orjson.JSONDecodeError:
            message = None
        if isinstance(message, dict) and isinstance(message.get("role"), str):
            messages.append(message)
        elif line.strip():
            log.warning("conversation %s: line %d is not a message; skipped", session, number)
    return messages


def append_history(home: Home, session: str, messages: list[dict[str, Any]]) -> None:
    """Add ``messages`` to the session's history (mode 0600)."""
    if not messages:
        return
    data = b"".join(orjson.dumps(message) + b"\n" for message in messages)
    fd = os.open(home.conversation(session), _APPEND_FLAGS, 0o600)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile("a FIFO" if stat.S_ISFIFO(mode) else "not a plain file")
        os.write(fd, data)
    finally:
        os.close(fd)
