"""The approvals table: pending asks, waiting for the owner (docs/protocol.md). Pure data.

No I/O, no clock, no trio: ``now`` is passed in (the broker passes
``trio.current_time()``), so the boundary rules can be tested exactly. The boundary is
``>=`` everywhere: at ``now >= entry.deadline`` an entry is expired.

Whoever takes an entry out of the table owns its ending. :meth:`ApprovalsTable.take`
(approve, refuse) and :meth:`ApprovalsTable.take_own` (the waiting task's expiry or
withdrawal) remove it in one step, so of two racing takers exactly one gets it and the
other finds it gone (``no_such_approval``). The table does not wake anybody: the broker
keeps a one-shot slot per approval id next to the table
(:class:`boxmaker.broker.pending.PendingCalls`), and whoever took an entry delivers
its ending there. Keeping that out keeps the table a
value that hypothesis and mutmut can drive.

>>> table = ApprovalsTable()
>>> entry = PendingEntry.create(
...     approval="a-00000001", call="c-0000000000000001", session="s-000000000001",
...     tool="read_file", arguments={"path": "notes.txt"},
...     grant=GrantRef(id="read-notes", mode="ask"), taint=Taint.PUBLIC, untrusted=False,
...     requested_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC), now=100.0, timeout=300.0)
>>> table.add(entry)
>>> entry.is_expired(399.999), entry.is_expired(400.0)
(False, True)
>>> type(table.take("a-00000001", now=399.9)).__name__
'Taken'
>>> table.take("a-00000001", now=399.9)
Missing(approval='a-00000001')
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import attrs

from boxmaker.core.decide import Ask
from boxmaker.core.grants import OWNER
from boxmaker.core.labels import Taint
from boxmaker.core.vocabulary import GrantRef

__all__ = [
    "ApprovalsTable",
    "DuplicateApproval",
    "GrantRef",
    "Missing",
    "Overdue",
    "PendingEntry",
    "TakeResult",
    "Taken",
    "due",
]


def due(deadline: float, now: float) -> bool:
    """The expiry boundary, the one place it is written: at ``now >= deadline`` a
    pending entry has expired (``>=`` everywhere: the table, the admin's take, the
    waiting call's own deadline). ``deadline`` and ``now`` are monotonic seconds."""
    return now >= deadline


@attrs.frozen(kw_only=True)
class PendingEntry:
    """One ask waiting for the owner. It carries both clocks (docs/decisions.md):
    ``deadline`` (monotonic, ``trio.current_time()``) decides; the wall times are for
    display and records."""

    approval: str
    call: str
    session: str
    tool: str
    arguments: dict[str, Any]
    grant: GrantRef
    requested_at: dt.datetime
    expires_at_wall: dt.datetime
    deadline: float
    taint: Taint
    untrusted: bool
    approvers: tuple[str, ...] = (OWNER,)
    """The asking grant's ``approvers``: may an answer from the MCP client count."""

    @classmethod
    def create(
        cls,
        *,
        approval: str,
        call: str,
        session: str,
        tool: str,
        arguments: dict[str, Any],
        grant: GrantRef,
        taint: Taint,
        untrusted: bool,
        requested_at: dt.datetime,
        now: float,
        timeout: float,
        approvers: tuple[str, ...] = (OWNER,),
    ) -> PendingEntry:
        """An entry that expires ``timeout`` seconds (config ``pending_timeout``) after
        ``now`` on the monotonic clock and after ``requested_at`` on the wall clock."""
        return cls(
            approval=approval,
            call=call,
            session=session,
            tool=tool,
            arguments=arguments,
            grant=grant,
            requested_at=requested_at,
            expires_at_wall=requested_at + dt.timedelta(seconds=timeout),
            deadline=now + timeout,
            taint=taint,
            untrusted=untrusted,
            approvers=approvers,
        )

    @classmethod
    def for_ask(
        cls,
        ask: Ask,
        *,
        approval: str,
        requested_at: dt.datetime,
        now: float,
        timeout: float,
    ) -> PendingEntry:
        """The entry of ``ask``: its call, tool and checked arguments, the grant it
        matched (with the grant's note) and the state it was decided on."""
        decision = ask.decision
        return cls.create(
            approval=approval,
            call=decision.call,
            session=decision.session,
            tool=decision.tool,
            # A fresh dict of the checked arguments (nobody mutates it): shared with the
            # entry instead of copied, as thousands may wait.
            arguments=decision.arguments,
            grant=GrantRef(id=ask.grant.id, mode=ask.grant.mode.value, note=decision.note),
            taint=decision.state.taint,
            untrusted=decision.state.untrusted,
            requested_at=requested_at,
            now=now,
            timeout=timeout,
            approvers=ask.grant.approvers,
        )

    def is_expired(self, now: float) -> bool:
        """At or after the deadline (:func:`due`)."""
        return due(self.deadline, now)


@attrs.frozen
class Taken:
    """The caller took the live entry and now owns its ending."""

    entry: PendingEntry


@attrs.frozen
class Missing:
    """No such entry: never added, or already taken by someone else."""

    approval: str


@attrs.frozen
class Overdue:
    """The entry was at or past its deadline; it has been removed, and the caller owns
    its expiry (record approval ``expired``, deny the call ``expired``)."""

    entry: PendingEntry


TakeResult = Taken | Missing | Overdue


class DuplicateApproval(ValueError):
    def __init__(self, approval: str) -> None:
        super().__init__(f"approval id {approval} is already pending")
        self.approval = approval


@attrs.define
class ApprovalsTable:
    """Pending entries by approval id, in request order (dicts keep insertion order).

    Touched only from trio tasks of one thread, so no lock: each method runs
    to completion without a checkpoint, which is what makes a take atomic.
    """

    _entries: dict[str, PendingEntry] = attrs.field(factory=dict)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, approval: object) -> bool:
        return approval in self._entries

    def add(self, entry: PendingEntry) -> None:
        """Raises :class:`DuplicateApproval` if the id is already pending."""
        if entry.approval in self._entries:
            raise DuplicateApproval(entry.approval)
        self._entries[entry.approval] = entry

    def get(self, approval: str) -> PendingEntry | None:
        return self._entries.get(approval)

    def entries(self) -> list[PendingEntry]:
        """Every entry still in the table, in request order, expired or not."""
        return list(self._entries.values())

    def live(self, now: float) -> list[PendingEntry]:
        """The entries before their deadline, in request order: what ``bxctl approvals``
        shows. An entry whose deadline has passed is never reported as waiting."""
        return [entry for entry in self._entries.values() if not entry.is_expired(now)]

    def expired(self, now: float) -> list[PendingEntry]:
        """The entries at or past their deadline whose owners have not yet taken them."""
        return [entry for entry in self._entries.values() if entry.is_expired(now)]

    def take(self, approval: str, now: float) -> TakeResult:
        """Take an entry for ``approve`` or ``refuse``.

        :class:`Taken` before the deadline; :class:`Overdue` at or after it (the admin
        answer is ``error expired`` and the expiry happens now); :class:`Missing` when
        it is not there. Either way the entry is gone afterwards.
        """
        entry = self._entries.pop(approval, None)
        if entry is None:
            return Missing(approval)
        if entry.is_expired(now):
            return Overdue(entry)
        return Taken(entry)

    def take_own(self, approval: str) -> PendingEntry | None:
        """The waiting task takes its own entry (expiry, requester gone, the pending
        frame could not be sent). ``None``: someone else took it first, and their
        outcome is on its way to the task."""
        return self._entries.pop(approval, None)

    def withdraw_all(self) -> list[PendingEntry]:
        """Empty the table for shutdown (every pending entry ``withdrawn``,
        reason ``broker_stopping``); returns the entries in request order."""
        taken = list(self._entries.values())
        self._entries.clear()
        return taken
