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
- the waiting task takes its own entry at its deadline or when the requester is gone.

The *waiting task* then does all the rest: the re-decision, the last look, the one
approval record and the run. One task thus writes every record of its call, in order,
so no record can be written twice; the admin handler only waits on the reply channel
for the outcome it answers with. (The spec lets either side do the work; this is the
side that owns the connection the last look peeks at.)
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Final, TypeAlias

import attrs
import trio

from boxmaker.core.approvals import ApprovalsTable, PendingEntry
from boxmaker.core.grants import Grant, GrantSet, GrantsProblem, parse_grants
from boxmaker.core.reasons import Reason
from boxmaker.home import Config, Home
from boxmaker.ledger.records import Body
from boxmaker.ledger.writer import LedgerStopped, LedgerWriter
from boxmaker.wire import ApprovedOutcome, new_approval_id

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
    """The one-shot mailbox of a pending entry."""

    event: trio.Event = attrs.Factory(trio.Event)
    command: Command | None = None

    def deliver(self, command: Command) -> None:
        """Hand over the entry's ending. Only the taker of the entry calls this, so a
        second delivery is a bug; its reply channel is closed so no admin waits on it."""
        if self.command is not None:
            _close_reply(command)
            log.error("a second ending for one pending entry was dropped: %r", command)
            return
        self.command = command
        self.event.set()

    async def wait(self) -> Command:
        """The command, once delivered (the entry's taker delivers in the same step)."""
        await self.event.wait()
        if self.command is None:  # pragma: no cover - event and command are set together
            raise RuntimeError("a waiter woke without a command")
        return self.command

    def close(self) -> None:
        """The waiting task is done: an admin still waiting on a reply hears the end."""
        if self.command is not None:
            _close_reply(self.command)


def _close_reply(command: Command) -> None:
    if isinstance(command, ApproveCommand | RefuseCommand):
        command.reply.close()


# ---------------------------------------------------------------------------------------
# grants.toml, watched (spec §4.1)

_StatKey: TypeAlias = tuple[int, ...] | None


def _stat_key(path: Path) -> _StatKey:
    """What "the file changed" means (spec §4.1: mtime, size, inode; ctime too, since a
    rewrite within one mtime tick still moves it). ``None``: no such file."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return (-1, exc.errno or 0)
    return (info.st_mtime_ns, info.st_size, info.st_ino, info.st_dev, info.st_ctime_ns)


def _load(path: Path) -> tuple[_StatKey, str, GrantSet | GrantsProblem]:
    """Read and parse grants.toml: (stat key, content digest, grants or problem).

    The stat comes first: if the file changes after it, the next check sees a new key
    and reads again; the other order could keep old content under a new key.
    """
    key = _stat_key(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        problem = GrantsProblem(str(path), None, None, "no such file (`bxctl init` creates it)")
        return key, "missing", problem
    except OSError as exc:
        problem = GrantsProblem(str(path), None, None, f"cannot read it ({exc.strerror})")
        return key, f"unreadable {exc.errno}", problem
    digest = hashlib.sha256(data).hexdigest()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return key, digest, GrantsProblem(str(path), None, None, "not UTF-8")
    return key, digest, parse_grants(text, str(path))


class GrantsWatcher:
    """The current grant set, re-read when grants.toml's stat changes (checked before each
    decision and on every status) or on SIGHUP (spec §4.1).

    A problem is logged once per distinct file content, not on every call; once the file
    is valid again the memory is cleared, so a relapse is logged again.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
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
        async with self._lock:
            if not force:
                key = await trio.to_thread.run_sync(_stat_key, self.path)
                if key == self._key:
                    return self._value
            key, digest, value = await trio.to_thread.run_sync(_load, self.path)
            self._key = key
            self._note(digest, value)
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
    started_at: float = attrs.field(factory=trio.current_time)
    table: ApprovalsTable = attrs.Factory(ApprovalsTable)
    waiters: dict[str, Waiter] = attrs.Factory(dict)
    sessions: dict[str, int] = attrs.Factory(dict)
    """Sessions seen this boot, with their number of tool requests (``bxctl sessions``)."""
    calls: set[str] = attrs.Factory(set)
    """Call ids seen this boot; a reused one is refused (see connection.py)."""
    stopping: bool = False
    _expired: dict[str, None] = attrs.Factory(dict)
    _stop: trio.Event = attrs.Factory(trio.Event)

    @property
    def workspace(self) -> Path:
        return self.config.workspace

    @property
    def sessions_dir(self) -> Path:
        return self.home.sessions_dir

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
        return waiter

    def take_own(self, approval: str) -> bool:
        """The waiting task takes its own entry (expiry, requester gone)."""
        return self.table.take_own(approval) is not None

    def forget_pending(self, approval: str) -> None:
        """The waiting task is done, however it ended: its entry and waiter go, so the
        table never holds an entry whose task is gone (spec §6.5)."""
        self.table.take_own(approval)
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
