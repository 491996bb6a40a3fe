"""Each session's state as brokerd last read it, cached by the state file's stat key."""

from __future__ import annotations

from pathlib import Path

import trio

from boxmaker.core.labels import Label
from boxmaker.core.state import StateUnreadable
from boxmaker.home.state_files import StateKey, read_state_keyed, state_key
from boxmaker.runtime.threads import WORKER_THREAD, ToThread


class SessionStates:
    """Each session's state as last read, validated by the file's stat key.

    brokerd is the only writer of state files, so a state read once stays true until
    brokerd raises it (and then :meth:`forget` is called) or someone else changes or
    damages the file, which moves its stat key (mtime, size, inode, device, ctime). The
    key is an inline ``lstat`` (metadata, no data read); reads of the data still go
    through a worker thread, so a damaged file is still ``state_unreadable``.
    Only readable states are cached, and none read within a timestamp tick of its last
    change (:data:`boxmaker.home.state_files.RACY_NS`).
    """

    def __init__(self, sessions_dir: Path, *, to_thread: ToThread = WORKER_THREAD) -> None:
        self.sessions_dir = sessions_dir
        self._to_thread = to_thread
        self._cache: dict[str, tuple[StateKey, Label]] = {}
        self._raising: dict[str, trio.Lock] = {}

    def raising(self, session: str) -> trio.Lock:
        """Held around one session's read-join-write (a state only rises).
        Two results of one session raised at once in two threads would each join onto
        the same old state, and the second write would undo the first."""
        return self._raising.setdefault(session, trio.Lock())

    async def read(self, session: str) -> Label | StateUnreadable:
        cached = self._cache.get(session)
        if cached is not None and state_key(self.sessions_dir, session) == cached[0]:
            return cached[1]
        # abandon_on_cancel: a read only, so a stuck file system never holds the stop.
        key, value, cacheable = await self._to_thread(
            read_state_keyed, self.sessions_dir, session, abandon_on_cancel=True
        )
        if cacheable and isinstance(value, Label):
            self._cache[session] = (key, value)
        else:
            self._cache.pop(session, None)
        return value

    def forget(self, session: str) -> None:
        """The file was written (or a write was tried): read it again next time."""
        self._cache.pop(session, None)
