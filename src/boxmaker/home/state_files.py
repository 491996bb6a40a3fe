"""Session state files on disk (docs/decisions.md, "Session state"): read, and raise atomically.

Blocking file I/O: callers in trio run these in ``trio.to_thread.run_sync``. The format
lives in the pure :mod:`boxmaker.core.state`; this module only moves bytes.

A state is written only when a label actually raises it, so most results cost no fsync.
A write goes to a temp file in the same directory (``.<session>.json.<random>.tmp``),
is fsynced, renamed over the state file and the directory fsynced: a crash leaves the
old state or the new one, never a torn one. A leftover temp file is never read.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Final, TypeAlias

from boxmaker.core.labels import FRESH, Label
from boxmaker.core.state import StateUnreadable, encode_state, parse_state
from boxmaker.formats.convert import SESSION_ID
from boxmaker.home.file_ops import OS_FILES, FileOps, StatKey, stat_key, write_atomically
from boxmaker.home.regular_file import read_regular_file

MAX_STATE_BYTES: Final = 4096
"""A real state file is about 50 bytes; anything far bigger is not one."""


RACY_NS: Final = 100_000_000
"""A state file changed less than this long (0.1 s) before it was read may still change
within the same timestamp tick without its stat key moving (a coarse clock): such a read
is not cached (as git treats a "racily clean" index entry)."""

StateKey: TypeAlias = StatKey
"""What "the state file changed" means (:func:`boxmaker.home.file_ops.stat_key`)."""


def state_key(sessions_dir: Path, session: str) -> StateKey:
    """The state file's stat key: an ``lstat``, metadata only, no data read, so brokerd
    calls it inline (see :class:`boxmaker.broker.session_states.SessionStates`)."""
    return stat_key(state_path(sessions_dir, session))


def read_state_keyed(
    sessions_dir: Path, session: str
) -> tuple[StateKey, Label | StateUnreadable, bool]:
    """:func:`read_state` with the stat key taken before the read, and whether the
    pair may be cached: not when the file changed within :data:`RACY_NS` of the read,
    nor when it could not be stat'ed or read. The stat comes first: a change after it
    moves the key, so the next look reads again; the other order could keep old
    content under a new key."""
    read_at = time.time_ns()
    key = state_key(sessions_dir, session)
    value = read_state(sessions_dir, session)
    racy = key is not None and (key[0] < 0 or key[-1] >= read_at - RACY_NS)
    return key, value, not racy and isinstance(value, Label)


def state_path(sessions_dir: Path, session: str) -> Path:
    """``<sessions_dir>/<session>.json``; ``session`` must be a session id (``s-`` + 12 hex)."""
    return sessions_dir / f"{session}.json"


def _where(sessions_dir: Path, session: str) -> str:
    return f"state file of {session} in {sessions_dir}"


def read_state(sessions_dir: Path, session: str) -> Label | StateUnreadable:
    """The session's state: FRESH when there is no file, else what the file says."""
    if not SESSION_ID.fullmatch(session):
        return StateUnreadable(f"not a session id: {session[:40]!r}")
    try:
        # O_NOFOLLOW: a symlink planted in place of the state file is an error, not a
        # state; O_NONBLOCK: a FIFO there is one too, instead of a read that never ends.
        data = read_regular_file(state_path(sessions_dir, session), limit=MAX_STATE_BYTES)
    except FileNotFoundError:
        return FRESH
    except OSError as exc:
        return StateUnreadable(f"{_where(sessions_dir, session)}: {exc.strerror or exc}")
    if len(data) > MAX_STATE_BYTES:
        return StateUnreadable(f"{_where(sessions_dir, session)}: over {MAX_STATE_BYTES} bytes")
    parsed = parse_state(data)
    if isinstance(parsed, StateUnreadable):
        return StateUnreadable(f"{_where(sessions_dir, session)}: {parsed.detail}")
    return parsed


def raise_state(
    sessions_dir: Path, session: str, label: Label, *, files: FileOps = OS_FILES
) -> Label | StateUnreadable:
    """Join ``label`` into the session's state; write only if that raises it (through
    ``files``: the real calls, or a test's).

    Returns the state after the join, or why it could not be read or written (the
    caller answers ``result_unrecorded``: docs/protocol.md, the write order).
    """
    current = read_state(sessions_dir, session)
    if isinstance(current, StateUnreadable):
        return current
    raised = current.join(label)
    if raised == current:
        return current
    try:
        write_atomically(state_path(sessions_dir, session), encode_state(raised), files=files)
    except OSError as exc:
        return StateUnreadable(
            f"{_where(sessions_dir, session)}: write failed: {exc.strerror or exc}"
        )
    return raised
