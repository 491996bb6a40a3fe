"""grants.toml, watched: the grant set brokerd decides with, re-read when the file
changes (docs/runbook.md)."""

from __future__ import annotations

import logging
from pathlib import Path

import attrs
import trio

from boxmaker.broker.home_guard import HomeGuard
from boxmaker.broker.policy_recorder import PolicyRecorder
from boxmaker.core.grant_parse import GrantsProblem
from boxmaker.core.grants import GrantSet
from boxmaker.home.file_ops import StatKey, stat_key
from boxmaker.home.grants_file import GrantsRead, GrantsReader, read_grants, read_grants_bytes
from boxmaker.runtime.threads import WORKER_THREAD, ToThread

log = logging.getLogger("boxmaker.brokerd")


def _load(path: Path, read: GrantsReader) -> tuple[StatKey, GrantsRead]:
    """Read and parse grants.toml (the same reading as ``bxctl grants check``), with the
    stat key it was read under.

    The stat comes first: if the file changes after it, the next check sees a new key
    and reads again; the other order could keep old content under a new key.
    """
    key = stat_key(path)
    return key, read_grants(path, read)


class GrantsWatcher:
    """The current grant set, re-read when grants.toml's stat changes (checked before each
    decision and on every status) or on SIGHUP (docs/runbook.md).

    A problem is logged once per distinct file content, not on every call; once the file
    is valid again the memory is cleared, so a relapse is logged again. Once ``guard``
    has refused the home (:class:`HomeGuard`), the grants are never used again.

    With a ``policy`` recorder, each change of content is recorded before anything is
    decided with it, and (the other half of the order) after every decision made with
    the old grants was recorded: a decision takes its grants with :meth:`take` and
    gives them back with :meth:`give_back` once its record is written, and a change
    waits for those in flight (at most :data:`SWITCH_WAIT_S`) while new takers wait for
    the change. So the policy in force at a decision is the last ``policy`` record
    before it in the ledger.
    """

    SWITCH_WAIT_S: float = 10.0
    """How long a change waits for the decisions in flight; past it (a ledger so slow
    that they are stuck anyway) the change goes on and says so in the log."""

    def __init__(
        self,
        path: Path,
        *,
        read: GrantsReader = read_grants_bytes,
        guard: HomeGuard | None = None,
        policy: PolicyRecorder | None = None,
        to_thread: ToThread = WORKER_THREAD,
    ) -> None:
        self.path = path
        self._read = read
        self._guard = guard
        self._policy = policy
        self._to_thread = to_thread
        self._key: StatKey | str = "never read"
        self._value: GrantSet | GrantsProblem = GrantsProblem(str(path), None, None, "not read")
        self._logged: set[str] = set()
        # Two decisions may both see a changed stat; one reload is enough, and two
        # racing ones could finish out of order and keep the older content.
        self._lock = trio.Lock()
        self._holders = 0
        self._drained = trio.Event()
        self._switched: trio.Event | None = None
        """Set while a change is being recorded: :meth:`take` waits for it."""

    @property
    def value(self) -> GrantSet | GrantsProblem:
        """The last grant set read, without looking at the file."""
        return self._value

    async def take(self) -> GrantSet | GrantsProblem:
        """:meth:`current`, for a decision that will be recorded: call
        :meth:`give_back` once its record is written (or will never be)."""
        while True:
            value = await self.current()
            if self._switched is None:
                self._holders += 1
                return value
            await self._switched.wait()

    def give_back(self) -> None:
        self._holders -= 1
        if self._holders == 0:
            self._drained.set()

    async def current(self, *, force: bool = False) -> GrantSet | GrantsProblem:
        """The grant set as the file is now; ``force`` re-reads whatever the stat says."""
        if self._guard is not None and self._guard.refusal is not None:
            return self._guard.refused_grants(self.path)
        # The stat is inline: metadata only, no data read (the re-read goes through a
        # worker thread). Unchanged, the common case, costs no thread hop and no lock.
        if not force and stat_key(self.path) == self._key:
            return self._value
        async with self._lock:
            if not force and stat_key(self.path) == self._key:
                return self._value
            # abandon_on_cancel: a read only, safe to leave behind, so a stuck file
            # system can never hold brokerd's stop.
            key, loaded = await self._to_thread(
                _load, self.path, self._read, abandon_on_cancel=True
            )
            value = loaded.value
            # Whenever the grants are re-read, so is the home's place (a link may have
            # moved it into the workspace since): grants the model can write are none.
            if self._guard is not None and await self._guard.look():
                value = self._guard.refused_grants(self.path)
                loaded = attrs.evolve(loaded, cacheable=False)
            if self._policy is not None and self._policy.needed(loaded, value):
                await self._switch(loaded, value)
            self._key = key if loaded.cacheable else "not cached"
            self._note(loaded.digest, value)
            self._value = value
            return value

    async def _switch(self, loaded: GrantsRead, value: GrantSet | GrantsProblem) -> None:
        """Record a change once the decisions in flight with the old grants are."""
        assert self._policy is not None
        switched = self._switched = trio.Event()
        try:
            if self._holders:
                self._drained = trio.Event()
                with trio.move_on_after(self.SWITCH_WAIT_S) as waited:
                    await self._drained.wait()
                if waited.cancelled_caught:
                    log.warning(
                        "%d decision(s) still unrecorded after %g s; the policy record "
                        "may come before them",
                        self._holders,
                        self.SWITCH_WAIT_S,
                    )
            await self._policy.record(loaded, value)
        finally:
            # The waiters run only after current() took the new value (no checkpoint
            # between here and its return).
            self._switched = None
            switched.set()

    def _note(self, digest: str, value: GrantSet | GrantsProblem) -> None:
        if isinstance(value, GrantsProblem):
            if digest not in self._logged:
                self._logged.add(digest)
                log.warning(
                    "grants.toml is invalid, every call is denied grants_invalid: %s",
                    value.detail(),
                )
            return
        if isinstance(self._value, GrantsProblem) and self._logged:
            log.info("grants.toml is valid again (%d grants)", len(value.grants))
        self._logged.clear()
