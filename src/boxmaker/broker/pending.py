"""The calls waiting for the owner: the approvals table, and how an entry ends.

Everything here runs on the trio thread without a checkpoint, so "take the entry out of
the table and hand its waiting call the ending" is one step: of two takers racing for an
entry (approve and refuse from two owners, an approve and the call's own deadline, a
stop and a requester that left) exactly one gets it, and the others find it gone. That
step is :meth:`PendingCalls.end`, the only place an entry leaves the table while its
call waits.

Each waiting call's task waits on its own connection (broker/connection.py), under
a cancel scope whose deadline is the entry's: for the requester's socket to become
readable (its end closed, or bytes after the request), or for the scope to be cancelled
because someone else delivered the ending, or for the deadline. A waiting call thus costs
no timer and no wake-up while nothing happens; an idle pending call is an epoll
registration and a deadline in trio's heap.

The commands an owner's answer delivers carry a reply channel: the admin handler waits
on it for how the call's task recorded the answer (:class:`boxmaker.core.call_events.AdminReply`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Final, TypeAlias

import attrs
import trio

from boxmaker.core.approvals import ApprovalsTable, Missing, PendingEntry, Taken
from boxmaker.core.call_events import AdminReply, Expired, RequesterGone, Stopping
from boxmaker.core.decide import Verdict
from boxmaker.core.owner_answer import EarlierEnd
from boxmaker.formats.convert import new_approval_id

REMEMBER_ENDED: Final = 4096
"""How many expired or withdrawn approval ids are kept, so a late approve hears how the
entry ended (``expired``; withdrawn because its requester left)."""


@attrs.frozen
class ApproveCommand:
    """The owner approved; the call's task re-decides and answers on ``reply``.
    ``grant_written``: the grant an approve-always wrote (its approval record says so)."""

    note: str | None
    reply: trio.MemorySendChannel[AdminReply]
    grant_written: str | None = None


@attrs.frozen
class RefuseCommand:
    reason: str
    reply: trio.MemorySendChannel[AdminReply]


@attrs.frozen
class ClientAnswered:
    """The MCP client's own prompt answered, where the asking grant lets it count
    (:mod:`boxmaker.broker.client_answers`): ``approve`` or refuse, the client's name,
    and the re-decision made just before the entry was taken (approve uses it)."""

    approve: bool
    client: str
    verdict: Verdict


Command: TypeAlias = (
    ApproveCommand | RefuseCommand | ClientAnswered | Expired | Stopping | RequesterGone
)
"""How a pending entry ends; exactly one is delivered to each."""


class DeadlineMissed(RuntimeError):
    """A waiting call's deadline ended its wait, yet its entry has not expired."""


@attrs.frozen
class Ended:
    """What :meth:`PendingCalls.end` took and delivered."""

    entry: PendingEntry
    command: Command


@attrs.define(eq=False)
class _Slot:
    """Where a waiting call's ending lands, and the scope that wakes it."""

    command: Command | None = None
    scope: trio.CancelScope | None = None

    def close(self) -> None:
        """The call's task is done: an admin still waiting on a reply hears the end."""
        if isinstance(self.command, ApproveCommand | RefuseCommand):
            self.command.reply.close()


class PendingCalls:
    """The approvals table and the endings of its entries (one per brokerd boot)."""

    def __init__(self, new_id: Callable[[], str] = new_approval_id) -> None:
        self._new_id = new_id
        self.table = ApprovalsTable()
        self._slots: dict[str, _Slot] = {}
        self._ended: dict[str, EarlierEnd] = {}
        self.closed = False
        """Set once brokerd stops: no entry is added any more."""

    @property
    def waiters(self) -> dict[str, _Slot]:
        """The approval ids whose calls wait or are still ending (tests look)."""
        return dict(self._slots)

    def new_approval_id(self) -> str:
        while True:
            approval = self._new_id()
            if approval not in self.table and approval not in self._ended:
                return approval

    def add(self, entry: PendingEntry) -> bool:
        """Put an entry in the table; False once stopping has begun (the table was
        already emptied, so a late entry would wait for nothing)."""
        if self.closed:
            return False
        self.table.add(entry)
        self._slots[entry.approval] = _Slot()
        return True

    def end(self, approval: str, command: Command, *, now: float | None = None) -> Ended | None:
        """Take the entry out of the table and deliver its ending, in one step.

        ``now`` (an owner's answer): the entry is taken as approve/refuse take it, and at
        or after its deadline the ending is the expiry instead of ``command``. Returns
        the ending delivered, or None when the entry was not there (someone else took
        it first; their ending is on its way)."""
        if now is None:
            entry = self.table.take_own(approval)
            if entry is None:
                return None
        else:
            taken = self.table.take(approval, now=now)
            if isinstance(taken, Missing):
                return None
            entry = taken.entry
            if not isinstance(taken, Taken):
                command = Expired()
        self._deliver(approval, command)
        return Ended(entry, command)

    def _deliver(self, approval: str, command: Command) -> None:
        if isinstance(command, Expired):
            self._note_ended(approval, EarlierEnd.EXPIRED)
        elif isinstance(command, RequesterGone):
            self._note_ended(approval, EarlierEnd.WITHDRAWN)
        slot = self._slots[approval]  # an entry's slot lives as long as it does
        slot.command = command
        if slot.scope is not None:
            slot.scope.cancel()

    def ending(self, approval: str) -> Command | None:
        """The ending delivered to this entry, if any yet."""
        return self._slots[approval].command

    def deadline(self, entry: PendingEntry) -> trio.CancelScope:
        """The waiting call's cancel scope: its deadline is the entry's, and
        :meth:`end` cancels it when the ending is delivered. (A waiting call's wait is
        inline in its connection's frame, broker/connection.py: thousands wait.)"""
        scope = self._slots[entry.approval].scope = trio.CancelScope(deadline=entry.deadline)
        return scope

    def woke(self, entry: PendingEntry, now: float) -> Command | None:
        """The waiting call woke (its scope ended): its ending, or the expiry when the
        deadline has come by the table's boundary (:meth:`PendingEntry.is_expired`);
        None when neither (woken early: it waits again).

        Raises :class:`DeadlineMissed` when the scope's deadline ended the wait but the
        table's boundary says the entry has not expired: waiting again would spin at
        the deadline for ever (every wait is cancelled at once), and a spinning task
        stalls brokerd; trio's deadline and the table's must be the same ``>=``."""
        slot = self._slots[entry.approval]
        scope, slot.scope = slot.scope, None
        if slot.command is None and entry.is_expired(now):
            self.end(entry.approval, Expired())
        if slot.command is None and scope is not None and scope.cancelled_caught:
            raise DeadlineMissed(
                f"approval {entry.approval}: woken by its deadline {scope.deadline!r} "
                f"at {now!r}, but not expired"
            )
        return slot.command

    def forget(self, approval: str) -> None:
        """The call's task is done, however it ended: its entry and slot go, so the
        table never holds an entry whose task is gone."""
        self.table.take_own(approval)
        slot = self._slots.pop(approval, None)
        if slot is not None:
            slot.close()

    def was_expired(self, approval: str) -> bool:
        return self._ended.get(approval) is EarlierEnd.EXPIRED

    def earlier_end(self, approval: str) -> EarlierEnd | None:
        """How this entry ended, if it expired or was withdrawn (and is remembered)."""
        return self._ended.get(approval)

    def _note_ended(self, approval: str, how: EarlierEnd) -> None:
        """Remember an expiry, so an approve racing it (both at expires_at) answers
        ``error expired`` whichever of the two took the entry first; and a withdrawal, so
        an approve after the chat ended hears why the call is gone."""
        self._ended[approval] = how
        while len(self._ended) > REMEMBER_ENDED:
            del self._ended[next(iter(self._ended))]

    def withdraw_all(self) -> int:
        """Shutdown: every pending entry ends :class:`Stopping` (withdrawn,
        ``broker_stopping``); each call's task records it and answers."""
        self.closed = True
        entries = self.table.withdraw_all()
        for entry in entries:
            self._deliver(entry.approval, Stopping())
        return len(entries)


def report(reply: trio.MemorySendChannel[AdminReply], value: AdminReply) -> None:
    """Tell the admin handler how the approval ended. It may be gone (its client left, or
    shutdown cancelled it): the call goes on regardless, since its record is written."""
    with reply, contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        reply.send_nowait(value)
