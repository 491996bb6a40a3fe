"""Session state files on disk (spec §4.3): read, and raise atomically.

Blocking file I/O: callers in trio run these in ``trio.to_thread.run_sync``. The format
lives in the pure :mod:`boxmaker.core.state`; this module only moves bytes.

A state is written only when a label actually raises it, so most results cost no fsync.
A write goes to a temp file in the same directory (``.<session>.json.<random>.tmp``),
is fsynced, renamed over the state file and the directory fsynced: a crash leaves the
old state or the new one, never a torn one. A leftover temp file is never read.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import Final

from boxmaker.core.labels import FRESH, Label
from boxmaker.core.state import StateUnreadable, encode_state, parse_state
from boxmaker.wire import SESSION_ID

MAX_STATE_BYTES: Final = 4096
"""A real state file is about 50 bytes; anything far bigger is not one."""


def state_path(sessions_dir: Path, session: str) -> Path:
    """``<sessions_dir>/<session>.json``; ``session`` must be a session id (spec §6.1)."""
    return sessions_dir / f"{session}.json"


def _where(sessions_dir: Path, session: str) -> str:
    return f"state file of {session} in {sessions_dir}"


def read_state(sessions_dir: Path, session: str) -> Label | StateUnreadable:
    """The session's state: FRESH when there is no file, else what the file says."""
    if not SESSION_ID.fullmatch(session):
        return StateUnreadable(f"not a session id: {session[:40]!r}")
    path = state_path(sessions_dir, session)
    try:
        # O_NOFOLLOW: a symlink planted in place of the state file is an error, not a state.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return FRESH
    except OSError as exc:
        return StateUnreadable(f"{_where(sessions_dir, session)}: {exc.strerror or exc}")
    try:
        with os.fdopen(fd, "rb") as file:
            data = file.read(MAX_STATE_BYTES + 1)
    except OSError as exc:
        return StateUnreadable(f"{_where(sessions_dir, session)}: {exc.strerror or exc}")
    if len(data) > MAX_STATE_BYTES:
        return StateUnreadable(f"{_where(sessions_dir, session)}: over {MAX_STATE_BYTES} bytes")
    parsed = parse_state(data)
    if isinstance(parsed, StateUnreadable):
        return StateUnreadable(f"{_where(sessions_dir, session)}: {parsed.detail}")
    return parsed


def _write_atomically(directory: Path, name: str, data: bytes) -> None:
    temp = directory / f".{name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        temp.replace(directory / name)
    except BaseException:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def raise_state(sessions_dir: Path, session: str, label: Label) -> Label | StateUnreadable:
    """Join ``label`` into the session's state; write only if that raises it.

    Returns the state after the join, or why it could not be read or written (the
    caller answers ``result_unrecorded``, spec §5.3 step 4).
    """
    current = read_state(sessions_dir, session)
    if isinstance(current, StateUnreadable):
        return current
    raised = current.join(label)
    if raised == current:
        return current
    try:
        _write_atomically(sessions_dir, f"{session}.json", encode_state(raised))
    except OSError as exc:
        return StateUnreadable(
            f"{_where(sessions_dir, session)}: write failed: {exc.strerror or exc}"
        )
    return raised
