"""brokerd's shared mutable state: one :class:`Broker` per process.

Everything here is touched only from trio tasks of the one thread, so nothing is
locked: a method that does not await runs to completion. The calls waiting for the
owner, and how each of their entries ends, are :class:`~boxmaker.broker.pending.PendingCalls`
(the broker's ``pending``); each call's own task writes every record of its call, in
the order :mod:`boxmaker.core.call` gives, so no record can be written twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeAlias

import attrs
import trio

from boxmaker import state_files
from boxmaker.broker import runner
from boxmaker.broker.limits import Capacity
from boxmaker.broker.notify import Notifier
from boxmaker.broker.pending import PendingCalls
from boxmaker.broker.sandbox import SandboxPool
from boxmaker.core.approvals import ApprovalsTable
from boxmaker.core.grant_parse import GrantsProblem
from boxmaker.core.grants import GrantSet
from boxmaker.core.labels import Label
from boxmaker.core.state import StateUnreadable
from boxmaker.daemon import CONFIG_ANCHOR
from boxmaker.file_ops import StatKey, stat_key
from boxmaker.grants_file import GrantsRead, GrantsReader, read_grants, read_grants_bytes
from boxmaker.home.config import Config, workspace_problem
from boxmaker.home.paths import Home
from boxmaker.ledger.policies import RUNBOOK_KEPT, KeptProblem, keep
from boxmaker.ledger.records import Body, Policy
from boxmaker.ledger.writer import LedgerStopped, LedgerWriter
from boxmaker.state_files import StateKey, read_state_keyed, state_key
from boxmaker.threads import WORKER_THREAD, ToThread

log = logging.getLogger("boxmaker.brokerd")


class Executor(Protocol):
    """:func:`boxmaker.broker.runner.execute`'s shape, as brokerd calls it."""

    async def __call__(
        self,
        spec: runner.RunSpec,
        sandboxes: SandboxPool | None = ...,
        *,
        to_thread: ToThread = ...,
    ) -> runner.RunResult: ...


StateRaiser: TypeAlias = Callable[[Path, str, Label], Label | StateUnreadable]
""":func:`boxmaker.state_files.raise_state`'s shape."""


# ---------------------------------------------------------------------------------------
# grants.toml, watched


def _load(path: Path, read: GrantsReader) -> tuple[StatKey, GrantsRead]:
    """Read and parse grants.toml (the same reading as ``bxctl grants check``), with the
    stat key it was read under.

    The stat comes first: if the file changes after it, the next check sees a new key
    and reads again; the other order could keep old content under a new key.
    """
    key = stat_key(path)
    return key, read_grants(path, read)


class PolicyRecorder:
    """Records each change of the grants brokerd decides with (docs/protocol.md, "Policy
    records"): keeps the new bytes beside the ledger (:func:`boxmaker.ledger.policies.
    keep`), then appends a ``policy`` record naming them, or the problem. The same
    content as this boot's last policy record is not recorded again.
    """

    def __init__(
        self,
        writer: LedgerWriter,
        boot: str,
        directory: Path,
        *,
        to_thread: ToThread = WORKER_THREAD,
    ) -> None:
        self.writer = writer
        self.boot = boot
        self.directory = directory
        self._to_thread = to_thread
        self._last: tuple[str | None, str | None] | None = None

    @staticmethod
    def _key(loaded: GrantsRead, value: GrantSet | GrantsProblem) -> tuple[str | None, str | None]:
        sha = loaded.digest if loaded.data is not None else None
        return sha, value.describe() if isinstance(value, GrantsProblem) else None

    def needed(self, loaded: GrantsRead, value: GrantSet | GrantsProblem) -> bool:
        """Would these grants be a change from the last ones recorded this boot?"""
        return self._key(loaded, value) != self._last

    async def record(self, loaded: GrantsRead, value: GrantSet | GrantsProblem) -> None:
        """Keep, then record. A version that could not be kept is still recorded (the
        record says what decided; ``bxctl audit verify`` then names the missing copy);
        a record that could not be written leaves every call denied
        ``audit_unavailable``, as the stopped ledger does anyway."""
        sha, problem = key = self._key(loaded, value)
        if loaded.data is not None:
            await self._keep(loaded.data)
        grants = len(value.grants) if isinstance(value, GrantSet) else None
        body = Policy(boot=self.boot, sha256=sha, grants=grants, problem=problem)
        try:
            await self.writer.append(body)
        except LedgerStopped:
            log.warning("the policy record could not be written; every call is denied")
            return
        self._last = key
        log.info("policy: grants.toml %s, %s", sha, problem or f"{grants} grants")

    async def _keep(self, data: bytes) -> None:
        try:
            kept = await self._to_thread(keep, self.directory, data)
        except (KeptProblem, OSError) as exc:
            # Expected states, not crashes: the words say it, no traceback.
            log.error(  # noqa: TRY400
                "this grants.toml could not be kept: %s; see %s", exc, RUNBOOK_KEPT
            )
            return
        if kept.replaced is not None:
            log.warning(
                "replaced an untrusted kept version: %s; see %s", kept.replaced, RUNBOOK_KEPT
            )


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


# ---------------------------------------------------------------------------------------
# The workspace must never reach the home (docs/runbook.md#config)


class HomeGuard:
    """brokerd's check, while it runs, that the workspace does not reach the home.

    config.toml was checked at start (:func:`boxmaker.home.config.workspace_problem`, on real
    paths); links can change afterwards. The sandbox and the file tools use the
    workspace's real path resolved once at start (``real_workspace``), so a workspace
    link retargeted later changes nothing for them; but the home can still be moved
    into it, or the link pointed at a directory that holds the home. :meth:`look` runs
    the same check again, on the configured workspace and on the real path in use; the
    first problem is kept for good (:attr:`refusal`), every call from then on is denied
    ``grants_invalid``, and serve stops brokerd with exit 2, as a refused start.
    """

    def __init__(
        self,
        home: Home,
        workspace: Path,
        real_workspace: Path,
        *,
        to_thread: ToThread = WORKER_THREAD,
    ) -> None:
        self.home = home
        self.workspace = workspace
        self.real_workspace = real_workspace
        self._to_thread = to_thread
        self.refusal: str | None = None
        self.refused = trio.Event()

    def problem(self) -> str | None:
        """Blocking (realpath): in a worker thread, or before trio serves anything."""
        return workspace_problem(self.home, self.workspace) or workspace_problem(
            self.home, self.real_workspace
        )

    async def look(self) -> bool:
        """Check again (at each grants re-read, each watcher tick, SIGHUP); True when
        the home is refused, now or before."""
        if self.refusal is None:
            problem = await self._to_thread(self.problem, abandon_on_cancel=True)
            if problem is not None and self.refusal is None:
                self.refusal = problem
                log.error(
                    "config.toml: workspace: %s; every call is denied and brokerd stops; see %s",
                    problem,
                    CONFIG_ANCHOR,
                )
                self.refused.set()
        return self.refusal is not None

    def refused_grants(self, path: Path) -> GrantsProblem:
        return GrantsProblem(
            str(path),
            None,
            None,
            f"not used while the workspace reaches the home: {self.refusal}",
        )


# ---------------------------------------------------------------------------------------
# Session states, cached


class SessionStates:
    """Each session's state as last read, validated by the file's stat key.

    brokerd is the only writer of state files, so a state read once stays true until
    brokerd raises it (and then :meth:`forget` is called) or someone else changes or
    damages the file, which moves its stat key (mtime, size, inode, device, ctime). The
    key is an inline ``lstat`` (metadata, no data read); reads of the data still go
    through a worker thread, so a damaged file is still ``state_unreadable``.
    Only readable states are cached, and none read within a timestamp tick of its last
    change (:data:`boxmaker.state_files.RACY_NS`).
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


# ---------------------------------------------------------------------------------------
# The broker


@attrs.define(eq=False)
class Broker:
    """What every connection of one brokerd boot shares.

    ``execute``, ``raise_state`` and ``to_thread`` are the real runner, state writer and
    worker thread; a test passes its own to :func:`~boxmaker.broker.serve.serve_broker`
    (a slow run, a state that cannot be raised, work run inline)."""

    home: Home
    config: Config
    writer: LedgerWriter
    boot: str
    version: str
    owner_uid: int
    grants: GrantsWatcher
    guard: HomeGuard
    """Where the workspace really is, and whether it has come to reach the home."""
    execute: Executor = runner.execute
    """Runs a call's RunSpec (runner.py)."""
    raise_state: StateRaiser = state_files.raise_state
    """Raises a session's state file (blocking: through ``to_thread``)."""
    to_thread: ToThread = WORKER_THREAD
    """Where every blocking step of a call runs (:mod:`boxmaker.threads`)."""
    started_at: float = attrs.field(factory=trio.current_time)
    pending: PendingCalls = attrs.Factory(PendingCalls)
    """The calls waiting for the owner, and how each ends (pending.py)."""
    sessions: dict[str, int] = attrs.Factory(dict)
    """Sessions seen this boot, with their number of tool requests (``bxctl sessions``)."""
    calls: set[str] = attrs.Factory(set)
    """Call ids seen this boot; a reused one is refused (see connection.py)."""
    stopping: bool = False
    sandboxes: SandboxPool = attrs.Factory(SandboxPool)
    """The shell sandbox kept set up ahead of the next call (sandbox.py)."""
    states: SessionStates = attrs.field(init=False)
    """The session states read this boot (:class:`SessionStates`)."""
    capacity: Capacity = attrs.field(init=False)
    """broker.sock's caps and what is used of them (limits.py)."""
    notifier: Notifier = attrs.field(init=False)
    """Runs ``[notify] command`` when a call starts waiting (notify.py)."""
    _stop: trio.Event = attrs.Factory(trio.Event)

    _sessions_dir: Path = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        # Home's paths are properties that join on every use: computed once per boot.
        self._sessions_dir = self.home.sessions_dir
        self.states = SessionStates(self._sessions_dir, to_thread=self.to_thread)
        self.capacity = Capacity.for_config(self.config.broker)
        self.notifier = Notifier(self.config.notify, self.home.root, self.config.workspace)

    @property
    def workspace(self) -> Path:
        """The workspace's real path, resolved and checked once at start: the sandbox
        binds it and the file tools work below it, so a workspace link retargeted later
        can never put the home in reach (:class:`HomeGuard`)."""
        return self.guard.real_workspace

    @property
    def sessions_dir(self) -> Path:
        return self._sessions_dir

    # -- lifecycle --------------------------------------------------------------------

    def request_stop(self) -> None:
        """Begin the clean stop (SIGINT/SIGTERM, or a test; docs/runbook.md)."""
        self._stop.set()

    async def wait_stop_requested(self) -> None:
        await self._stop.wait()

    # -- the ledger -------------------------------------------------------------------

    async def record(self, body: Body) -> bool:
        """Append one record; False when the ledger is stopped — the
        caller then answers ``audit_unavailable``. The writer logs the failure."""
        try:
            await self.writer.append(body)
        except LedgerStopped:
            return False
        return True

    # -- calls and sessions -----------------------------------------------------------

    def claim_call(self, call: str, session: str) -> bool:
        """Note a tool request; False if its call id was already used in this boot."""
        if call in self.calls:
            return False
        self.calls.add(call)
        self.sessions[session] = self.sessions.get(session, 0) + 1
        return True

    # -- pending entries --------------------------------------------------------------

    @property
    def table(self) -> ApprovalsTable:
        """The pending entries (:class:`PendingCalls` owns them)."""
        return self.pending.table

    @property
    def waiters(self) -> dict[str, object]:
        """The approval ids whose calls still wait or are ending."""
        return dict(self.pending.waiters)

    def withdraw_all(self) -> int:
        """Shutdown: every pending entry ends withdrawn (``broker_stopping``); each
        waiting call records it and answers."""
        self.stopping = True
        return self.pending.withdraw_all()
