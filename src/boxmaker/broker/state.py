"""brokerd's shared mutable state (spec §2): one :class:`Broker` per process.

Everything here is touched only from trio tasks of the one thread, so nothing is
locked: a method that does not await runs to completion, which is what makes "take the
entry and hand its waiter a command" one atomic step (spec §6.3).

How approve/refuse reach the waiting call (spec §6.3-6.5). The table is pure
(:mod:`boxmaker.core.approvals`); next to it the broker keeps one :class:`Waiter` per
approval id. Whoever takes an entry out of the table delivers exactly one
:data:`Command` to that entry's waiter in the same step:

- the admin handler delivers :class:`ApproveCommand` / :class:`RefuseCommand` (with a
  reply channel) or :class:`ExpireCommand` (an approve/refuse at or after expires_at);
- shutdown delivers :class:`StopCommand` to every entry;
- the expiry task (:meth:`Broker.expire_due`, woken at the earliest expires_at) takes
  every entry whose deadline has come and delivers :class:`ExpireCommand`;
- the look task (:meth:`Broker.look_all`, once a second) takes the entry of every
  requester that left and delivers :class:`RequesterGone`.

The *waiting task* then does all the rest: the re-decision, the last look, the one
approval record and the run. One task thus writes every record of its call, in order,
so no record can be written twice; the admin handler only waits on the reply channel
for the outcome it answers with. (The spec lets either side do the work; this is the
side that owns the connection the last look peeks at.)
"""

from __future__ import annotations

import hashlib
import heapq
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Final, TypeAlias

import attrs
import trio

from boxmaker.broker.limits import Capacity
from boxmaker.broker.sandbox import SandboxPool
from boxmaker.convert import new_approval_id
from boxmaker.core.approvals import ApprovalsTable, PendingEntry
from boxmaker.core.grants import Grant, GrantSet, GrantsProblem, parse_grants
from boxmaker.core.labels import Label
from boxmaker.core.reasons import Reason
from boxmaker.core.state import StateUnreadable
from boxmaker.daemon import CONFIG_ANCHOR
from boxmaker.home import Config, Home, workspace_problem
from boxmaker.ledger.records import Body
from boxmaker.ledger.writer import LedgerStopped, LedgerWriter
from boxmaker.oneshot import OneShot
from boxmaker.regular_file import NotRegularFile, read_regular_file
from boxmaker.state_files import StateKey, read_state_keyed, state_key
from boxmaker.wire import ApprovedOutcome

log = logging.getLogger("boxmaker.brokerd")

REMEMBER_EXPIRED: Final = 4096
"""How many expired approval ids are kept, so a late approve hears ``expired``."""


# ---------------------------------------------------------------------------------------
# What the admin side hands a waiting call, and what it hears back


@attrs.frozen
class ApprovedReply:
    """The outcome of approve's re-decision and last look (the ``approved`` answer)."""

    outcome: ApprovedOutcome
    reason: Reason | None


@attrs.frozen
class RefusedReply:
    """The refusal was recorded."""


@attrs.frozen
class NotRecorded:
    """The approval record could not be written; the admin answers ``error internal``."""

    detail: str


AdminReply: TypeAlias = ApprovedReply | RefusedReply | NotRecorded


@attrs.frozen
class ApproveCommand:
    note: str | None
    reply: trio.MemorySendChannel[AdminReply]


@attrs.frozen
class RefuseCommand:
    reason: str
    reply: trio.MemorySendChannel[AdminReply]


@attrs.frozen
class ExpireCommand:
    """An approve or refuse arrived at or after expires_at (spec §6.5)."""


@attrs.frozen
class StopCommand:
    """brokerd is stopping (spec §2): withdrawn, reason ``broker_stopping``."""


@attrs.frozen
class RequesterGone:
    """The waiting task's own finding: loopd closed its end (spec §6.5)."""


Command: TypeAlias = ApproveCommand | RefuseCommand | ExpireCommand | StopCommand | RequesterGone


@attrs.define
class Waiter:
    """The one-shot mailbox of a pending entry (a :class:`OneShot`: thousands wait)."""

    _slot: OneShot[Command] = attrs.Factory(OneShot)

    @property
    def command(self) -> Command | None:
        return self._slot.peek()

    def deliver(self, command: Command) -> None:
        """Hand over the entry's ending. Only the taker of the entry calls this, so a
        second delivery is a bug; its reply channel is closed so no admin waits on it."""
        if not self._slot.put(command):
            _close_reply(command)
            log.error("a second ending for one pending entry was dropped: %r", command)

    async def wait(self) -> Command:
        """The command, once delivered (the entry's taker delivers in the same step).
        Cancellable: a cancelled wait leaves the waiter as it was."""
        return await self._slot.get()

    def close(self) -> None:
        """The waiting task is done: an admin still waiting on a reply hears the end."""
        command = self._slot.peek()
        if command is not None:
            _close_reply(command)


def _close_reply(command: Command) -> None:
    if isinstance(command, ApproveCommand | RefuseCommand):
        command.reply.close()


# ---------------------------------------------------------------------------------------
# grants.toml, watched (spec §4.1)

_StatKey: TypeAlias = tuple[int, ...] | None

GrantsReader: TypeAlias = Callable[[Path], bytes]
"""How grants.toml's bytes are read (a seam: tests inject a read that fails)."""


def _stat_key(path: Path) -> _StatKey:
    """What "the file changed" means (spec §4.1: mtime, size, inode; ctime too, since a
    rewrite within one mtime tick still moves it). ``None``: no such file. An ``lstat``:
    a symlink there is refused (not followed), so its own stat is the one that counts."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return (-1, exc.errno or 0)
    return (info.st_mtime_ns, info.st_size, info.st_ino, info.st_dev, info.st_ctime_ns)


@attrs.frozen
class _Loaded:
    key: _StatKey
    digest: str
    """Tells one content from another, so each broken content is logged once."""
    value: GrantSet | GrantsProblem
    cacheable: bool
    """False when the bytes could not be read: a transient error (EMFILE, EIO) must not
    stay the answer until the file's stat moves, which it never does for such an error.
    What was read (valid or not) and a missing file are kept until the stat moves."""


def _load(path: Path, read: GrantsReader) -> _Loaded:
    """Read and parse grants.toml.

    The stat comes first: if the file changes after it, the next check sees a new key
    and reads again; the other order could keep old content under a new key.
    """
    key = _stat_key(path)
    try:
        data = read(path)
    except FileNotFoundError:
        problem = GrantsProblem(str(path), None, None, "no such file (`bxctl init` creates it)")
        return _Loaded(key, "missing", problem, cacheable=True)
    except NotRegularFile as exc:
        problem = GrantsProblem(str(path), None, None, str(exc.strerror))
        return _Loaded(key, "not regular", problem, cacheable=False)
    except OSError as exc:
        problem = GrantsProblem(str(path), None, None, f"cannot read it ({exc.strerror})")
        return _Loaded(key, f"unreadable {exc.errno}", problem, cacheable=False)
    digest = hashlib.sha256(data).hexdigest()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return _Loaded(key, digest, GrantsProblem(str(path), None, None, "not UTF-8"), True)
    return _Loaded(key, digest, parse_grants(text, str(path)), cacheable=True)


class GrantsWatcher:
    """The current grant set, re-read when grants.toml's stat changes (checked before each
    decision and on every status) or on SIGHUP (spec §4.1).

    A problem is logged once per distinct file content, not on every call; once the file
    is valid again the memory is cleared, so a relapse is logged again. Once ``guard``
    has refused the home (:class:`HomeGuard`), the grants are never used again.
    """

    def __init__(
        self,
        path: Path,
        *,
        read: GrantsReader = read_regular_file,
        guard: HomeGuard | None = None,
    ) -> None:
        self.path = path
        self._read = read
        self._guard = guard
        self._key: _StatKey | str = "never read"
        self._value: GrantSet | GrantsProblem = GrantsProblem(str(path), None, None, "not read")
        self._logged: set[str] = set()
        # Two decisions may both see a changed stat; one reload is enough, and two
        # racing ones could finish out of order and keep the older content.
        self._lock = trio.Lock()

    @property
    def value(self) -> GrantSet | GrantsProblem:
        """The last grant set read, without looking at the file."""
        return self._value

    async def current(self, *, force: bool = False) -> GrantSet | GrantsProblem:
        """The grant set as the file is now; ``force`` re-reads whatever the stat says."""
        if self._guard is not None and self._guard.refusal is not None:
            return self._guard.refused_grants(self.path)
        # The stat is inline: metadata only, no data read (the re-read goes through a
        # worker thread). Unchanged, the common case, costs no thread hop and no lock.
        if not force and _stat_key(self.path) == self._key:
            return self._value
        async with self._lock:
            if not force and _stat_key(self.path) == self._key:
                return self._value
            # abandon_on_cancel: a read only, safe to leave behind, so a stuck file
            # system can never hold brokerd's stop.
            loaded = await trio.to_thread.run_sync(
                _load, self.path, self._read, abandon_on_cancel=True
            )
            value = loaded.value
            # Whenever the grants are re-read, so is the home's place (a link may have
            # moved it into the workspace since): grants the model can write are none.
            if self._guard is not None and await self._guard.look():
                value = self._guard.refused_grants(self.path)
                loaded = attrs.evolve(loaded, cacheable=False)
            self._key = loaded.key if loaded.cacheable else "not cached"
            self._note(loaded.digest, value)
            self._value = value
            return value

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

    config.toml was checked at start (:func:`boxmaker.home.workspace_problem`, on real
    paths); links can change afterwards. The sandbox and the file tools use the
    workspace's real path resolved once at start (``real_workspace``), so a workspace
    link retargeted later changes nothing for them; but the home can still be moved
    into it, or the link pointed at a directory that holds the home. :meth:`look` runs
    the same check again, on the configured workspace and on the real path in use; the
    first problem is kept for good (:attr:`refusal`), every call from then on is denied
    ``grants_invalid``, and serve stops brokerd with exit 2, as a refused start.
    """

    def __init__(self, home: Home, workspace: Path, real_workspace: Path) -> None:
        self.home = home
        self.workspace = workspace
        self.real_workspace = real_workspace
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
            problem = await trio.to_thread.run_sync(self.problem, abandon_on_cancel=True)
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
# Session states, cached (spec §4.3)


class SessionStates:
    """Each session's state as last read, validated by the file's stat key.

    brokerd is the only writer of state files, so a state read once stays true until
    brokerd raises it (and then :meth:`forget` is called) or someone else changes or
    damages the file, which moves its stat key (mtime, size, inode, device, ctime). The
    key is an inline ``lstat`` (metadata, no data read); reads of the data still go
    through a worker thread (spec §2), so a damaged file is still ``state_unreadable``.
    Only readable states are cached, and none read within a timestamp tick of its last
    change (:data:`boxmaker.state_files.RACY_NS`).
    """

    def __init__(self, sessions_dir: Path) -> None:
        self.sessions_dir = sessions_dir
        self._cache: dict[str, tuple[StateKey, Label]] = {}
        self._raising: dict[str, trio.Lock] = {}

    def raising(self, session: str) -> trio.Lock:
        """Held around one session's read-join-write (spec §4.3: a state only rises).
        Two results of one session raised at once in two threads would each join onto
        the same old state, and the second write would undo the first."""
        return self._raising.setdefault(session, trio.Lock())

    async def read(self, session: str) -> Label | StateUnreadable:
        cached = self._cache.get(session)
        if cached is not None and state_key(self.sessions_dir, session) == cached[0]:
            return cached[1]
        # abandon_on_cancel: a read only, so a stuck file system never holds the stop.
        key, value, cacheable = await trio.to_thread.run_sync(
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


def grant_named(grants: GrantSet | GrantsProblem, grant_id: str | None) -> Grant | None:
    """The grant a decision names, from the grant set it was decided on."""
    if grant_id is None or isinstance(grants, GrantsProblem):
        return None
    return next((grant for grant in grants.grants if grant.id == grant_id), None)


# ---------------------------------------------------------------------------------------
# The broker


@attrs.define(eq=False)
class Broker:
    """What every connection of one brokerd boot shares (spec §2)."""

    home: Home
    config: Config
    writer: LedgerWriter
    boot: str
    version: str
    owner_uid: int
    grants: GrantsWatcher
    guard: HomeGuard
    """Where the workspace really is, and whether it has come to reach the home."""
    started_at: float = attrs.field(factory=trio.current_time)
    table: ApprovalsTable = attrs.Factory(ApprovalsTable)
    waiters: dict[str, Waiter] = attrs.Factory(dict)
    looks: dict[str, Callable[[], bool]] = attrs.Factory(dict)
    """Per pending entry: "has its requester left?" (the one-second look, spec §6.5)."""
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
    _expired: dict[str, None] = attrs.Factory(dict)
    _deadlines: list[tuple[float, str]] = attrs.Factory(list)
    """A heap of (deadline, approval) of the pending entries; an item whose entry has
    ended stays until its deadline and is then skipped."""
    _expiry_scope: trio.CancelScope | None = None
    _stop: trio.Event = attrs.Factory(trio.Event)

    _sessions_dir: Path = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        # Home's paths are properties that join on every use: computed once per boot.
        self._sessions_dir = self.home.sessions_dir
        self.states = SessionStates(self._sessions_dir)
        self.capacity = Capacity.for_config(self.config.broker)

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
        """Begin the clean stop of spec §2 (SIGINT/SIGTERM, or a test)."""
        self._stop.set()

    async def wait_stop_requested(self) -> None:
        await self._stop.wait()

    # -- the ledger -------------------------------------------------------------------

    async def record(self, body: Body) -> bool:
        """Append one record; False when the ledger is stopped (spec §5.4) — the
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

    def new_approval_id(self) -> str:
        while True:
            approval = new_approval_id()
            if approval not in self.table and approval not in self._expired:
                return approval

    def add_pending(self, entry: PendingEntry) -> Waiter | None:
        """Put an entry in the table with its waiter; None once stopping has begun
        (the table was already emptied, so a late entry would wait for nothing)."""
        if self.stopping:
            return None
        waiter = Waiter()
        self.table.add(entry)
        self.waiters[entry.approval] = waiter
        heapq.heappush(self._deadlines, (entry.deadline, entry.approval))
        if self._expiry_scope is not None and entry.deadline < self._expiry_scope.deadline:
            self._expiry_scope.deadline = entry.deadline
        return waiter

    async def run_expiry(self) -> None:
        """The pending deadline of spec §6.5 for every entry at once (run by serve): one
        task that sleeps until the earliest expires_at (on the monotonic clock), then
        expires what is due. A thousand pending calls cost one timer, not a cancel scope
        each. Never returns."""
        while True:
            next_deadline = self._deadlines[0][0] if self._deadlines else math.inf
            with trio.CancelScope(deadline=next_deadline) as scope:
                self._expiry_scope = scope
                await trio.sleep_forever()
            self._expiry_scope = None
            self.expire_due(trio.current_time())

    def expire_due(self, now: float) -> int:
        """At ``now >= expires_at`` (the boundary is ``>=`` everywhere, spec §6.5) take
        each due entry, remember the expiry, and hand its task :class:`ExpireCommand`
        (it records approval ``expired``). An entry already taken (approve, refuse,
        requester gone, stop) has its ending already. Returns how many expired."""
        expired = 0
        while self._deadlines and self._deadlines[0][0] <= now:
            _, approval = heapq.heappop(self._deadlines)
            entry = self.table.get(approval)
            # Only an entry that is itself due (an id may have been reused since).
            if entry is None or entry.deadline > now:
                continue
            waiter = self.waiters.get(approval)
            if waiter is not None and self.table.take_own(approval) is not None:
                self.note_expired(approval)
                waiter.deliver(ExpireCommand())
                expired += 1
        return expired

    def watch(self, approval: str, gone: Callable[[], bool]) -> None:
        """Let the one-second look (:meth:`look_all`) watch this entry's requester."""
        if approval in self.waiters:
            self.looks[approval] = gone

    def look_all(self) -> int:
        """The one-second look of spec §6.5, for every pending entry at once: the entry
        of each requester that closed its end is taken, and its waiter handed
        :class:`RequesterGone` (its task records ``withdrawn``). Returns how many.

        One task does this for all entries (see serve.py), so a thousand pending calls
        cost one timer a second, not a thousand wake-ups and cancel scopes.
        """
        left = 0
        for approval, gone in list(self.looks.items()):
            if not gone():
                continue
            del self.looks[approval]
            if self.table.take_own(approval) is not None:
                waiter = self.waiters.get(approval)
                if waiter is not None:
                    waiter.deliver(RequesterGone())
                    left += 1
        return left

    def take_own(self, approval: str) -> bool:
        """The waiting task takes its own entry (expiry, requester gone)."""
        return self.table.take_own(approval) is not None

    def forget_pending(self, approval: str) -> None:
        """The waiting task is done, however it ended: its entry and waiter go, so the
        table never holds an entry whose task is gone (spec §6.5)."""
        self.table.take_own(approval)
        self.looks.pop(approval, None)
        waiter = self.waiters.pop(approval, None)
        if waiter is not None:
            waiter.close()

    def note_expired(self, approval: str) -> None:
        """Remember an expiry, so an approve racing it (both at expires_at) answers
        ``error expired`` whichever of the two took the entry first (spec §6.5)."""
        self._expired[approval] = None
        while len(self._expired) > REMEMBER_EXPIRED:
            del self._expired[next(iter(self._expired))]

    def was_expired(self, approval: str) -> bool:
        return approval in self._expired

    def withdraw_all(self) -> int:
        """Shutdown (spec §2): every pending entry ends ``withdrawn``/``broker_stopping``;
        each waiting task records it and answers its call."""
        self.stopping = True
        entries = self.table.withdraw_all()
        for entry in entries:
            waiter = self.waiters.get(entry.approval)
            if waiter is not None:
                waiter.deliver(StopCommand())
        return len(entries)
