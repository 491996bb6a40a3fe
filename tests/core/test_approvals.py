"""The approvals table: atomic takes, the >= boundary, request order."""

from __future__ import annotations

import datetime as dt
import math

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

from boxmaker.core.approvals import (
    ApprovalsTable,
    DuplicateApproval,
    GrantRef,
    Missing,
    Overdue,
    PendingEntry,
    Taken,
)
from boxmaker.core.labels import Taint
from boxmaker.wire import ApprovalView

REQUESTED = dt.datetime(2026, 5, 6, 7, 8, 9, 10_000, tzinfo=dt.UTC)


def make(approval: str = "a-00000001", *, now: float = 0.0, timeout: float = 300.0) -> PendingEntry:
    return PendingEntry.create(
        approval=approval,
        call="c-" + approval[2:] * 2,
        session="s-0123456789ab",
        tool="read_file",
        arguments={"path": "notes.txt"},
        grant=GrantRef(id="read-notes", mode="ask", note="why"),
        taint=Taint.INTERNAL,
        untrusted=True,
        requested_at=REQUESTED,
        now=now,
        timeout=timeout,
    )


def test_create_sets_both_clocks() -> None:
    entry = make(now=1000.0, timeout=300.0)
    assert entry.deadline == 1300.0
    assert entry.requested_at == REQUESTED
    assert entry.expires_at_wall == REQUESTED + dt.timedelta(seconds=300)


def test_the_boundary_is_at_or_after_the_deadline() -> None:
    entry = make(now=10.0, timeout=5.0)
    before = math.nextafter(15.0, 0.0)
    assert not entry.is_expired(before)
    assert entry.is_expired(15.0)
    assert entry.is_expired(15.5)

    table = ApprovalsTable()
    table.add(entry)
    assert table.live(before) == [entry]
    assert table.expired(before) == []
    assert table.live(15.0) == []
    assert table.expired(15.0) == [entry]
    assert table.take(entry.approval, now=15.0) == Overdue(entry)
    assert entry.approval not in table

    table.add(entry)
    assert table.take(entry.approval, now=before) == Taken(entry)


def test_a_take_is_atomic_and_once() -> None:
    table = ApprovalsTable()
    entry = make()
    table.add(entry)
    assert table.take(entry.approval, now=1.0) == Taken(entry)
    assert table.take(entry.approval, now=1.0) == Missing(entry.approval)
    assert table.take_own(entry.approval) is None
    assert len(table) == 0


def test_the_waiting_task_takes_its_own_entry() -> None:
    table = ApprovalsTable()
    entry = make()
    table.add(entry)
    assert table.get(entry.approval) == entry
    assert table.take_own(entry.approval) == entry
    assert table.take(entry.approval, now=0.0) == Missing(entry.approval)
    assert table.get(entry.approval) is None


def test_a_duplicate_id_is_refused() -> None:
    table = ApprovalsTable()
    table.add(make("a-0000000a"))
    with pytest.raises(DuplicateApproval, match="a-0000000a") as raised:
        table.add(make("a-0000000a", now=5.0))
    assert raised.value.approval == "a-0000000a"
    assert table.entries()[0].deadline == 300.0


def test_request_order_and_withdraw_all() -> None:
    table = ApprovalsTable()
    entries = [make(f"a-0000000{i}", now=float(10 - i)) for i in range(1, 6)]
    for entry in entries:
        table.add(entry)
    assert table.entries() == entries
    table.take_own("a-00000003")
    assert [e.approval for e in table.entries()] == [
        "a-00000001",
        "a-00000002",
        "a-00000004",
        "a-00000005",
    ]
    withdrawn = table.withdraw_all()
    assert [e.approval for e in withdrawn] == [
        "a-00000001",
        "a-00000002",
        "a-00000004",
        "a-00000005",
    ]
    assert table.entries() == []
    assert table.withdraw_all() == []


def test_view_is_what_approvals_lists() -> None:
    entry = make(timeout=60.0)
    # The entry's grant is the frame's: one GrantRef, in core/vocabulary.py.
    assert ApprovalView.of(entry) == ApprovalView(
        approval="a-00000001",
        call="c-0000000100000001",
        session="s-0123456789ab",
        tool="read_file",
        arguments={"path": "notes.txt"},
        grant=GrantRef(id="read-notes", mode="ask", note="why"),
        requested_at=REQUESTED,
        expires_at=REQUESTED + dt.timedelta(seconds=60),
        taint=Taint.INTERNAL,
        untrusted=True,
    )


class TableMachine(RuleBasedStateMachine):
    """Any interleaving of add / approve-or-refuse / own expiry / withdrawal / clock.

    Mirrors the table in ``self.model``; every entry leaves the table exactly once.
    """

    pending = Bundle("pending")

    def __init__(self) -> None:
        super().__init__()
        self.table = ApprovalsTable()
        self.now = 0.0
        self.serial = 0
        self.model: dict[str, PendingEntry] = {}
        self.ended: set[str] = set()

    def end(self, approval: str) -> None:
        assert approval not in self.ended, f"{approval} taken twice"
        self.ended.add(approval)
        del self.model[approval]

    @rule(target=pending, timeout=st.sampled_from([0.0, 0.5, 1.0, 2.0, 300.0]))
    def add(self, timeout: float) -> str:
        self.serial += 1
        approval = f"a-{self.serial:08x}"
        entry = make(approval, now=self.now, timeout=timeout)
        self.table.add(entry)
        self.model[approval] = entry
        return approval

    @rule(step=st.sampled_from([0.0, 0.25, 0.5, 1.0]))
    def advance(self, step: float) -> None:
        self.now += step

    @rule(approval=pending)
    def owner_takes(self, approval: str) -> None:
        result = self.table.take(approval, self.now)
        if approval not in self.model:
            assert result == Missing(approval)
            return
        entry = self.model[approval]
        if self.now >= entry.deadline:
            assert result == Overdue(entry)
        else:
            assert result == Taken(entry)
        self.end(approval)

    @rule(approval=pending)
    def task_takes_its_own(self, approval: str) -> None:
        entry = self.table.take_own(approval)
        if approval in self.model:
            assert entry == self.model[approval]
            self.end(approval)
        else:
            assert entry is None

    @rule(approval=consumes(pending))
    def expiry_fires(self, approval: str) -> None:
        # The waiting task's cancel scope fires at the deadline and takes the entry.
        if approval in self.model:
            self.now = max(self.now, self.model[approval].deadline)
            assert self.table.expired(self.now)
        assert self.table.take_own(approval) == self.model.get(approval)
        if approval in self.model:
            self.end(approval)

    @precondition(lambda self: len(self.model) > 0)
    @rule()
    def shutdown(self) -> None:
        withdrawn = self.table.withdraw_all()
        assert [e.approval for e in withdrawn] == list(self.model)
        for entry in withdrawn:
            self.end(entry.approval)

    @invariant()
    def table_matches_model(self) -> None:
        assert self.table.entries() == list(self.model.values())
        assert len(self.table) == len(self.model)

    @invariant()
    def nothing_past_its_deadline_is_live(self) -> None:
        live = self.table.live(self.now)
        assert all(self.now < entry.deadline for entry in live)
        expired = self.table.expired(self.now)
        assert {e.approval for e in live} | {e.approval for e in expired} == set(self.model)
        assert not {e.approval for e in live} & {e.approval for e in expired}

    @invariant()
    def ended_entries_are_gone(self) -> None:
        assert not any(approval in self.table for approval in self.ended)


TestTableMachine = TableMachine.TestCase
