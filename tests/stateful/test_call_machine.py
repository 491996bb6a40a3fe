"""The call's life as a state machine, without I/O: fast enough for thousands of examples.

A hypothesis ``RuleBasedStateMachine`` drives the pure :class:`boxmaker.core.call.Call`
of many calls at once, with the real approvals table and endings
(:class:`boxmaker.broker.pending.PendingCalls`, used without a trio loop: nothing waits
on a scope here) and an in-memory ledger, through requests, approvals, refusals, expiry
(a number for a clock), requesters that leave, a ledger that stops and comes back, grant
changes and a stop. A small synchronous driver carries out the effects as brokerd's
does. After every step the invariants of the daemon-level machine
(test_broker_machine.py) hold: one decision per call, nothing ran without a run verdict
or an approval with outcome ``ask``/``allowed``, no entry outlives its deadline, every
entry in the table is an asked call with no approval record yet, every call either waits
or has ended, and every answer matches the records.
"""

from __future__ import annotations

import datetime as dt
import itertools
import os
from collections.abc import Coroutine
from typing import Any, Final, TypeVar

import attrs
import pytest
import trio
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from boxmaker.broker.pending import (
    ApproveCommand,
    ClientAnswered,
    Command,
    PendingCalls,
    RefuseCommand,
)
from boxmaker.core import call as machine
from boxmaker.core import call_events as ev
from boxmaker.core.approvals import PendingEntry, due
from boxmaker.core.call import Call, IllegalEvent
from boxmaker.core.call_phases import Phase
from boxmaker.core.client_answer import client_approver, client_refusal, not_counted
from boxmaker.core.decide import Ask, Run, Verdict, evaluate
from boxmaker.core.drive import drive, resume
from boxmaker.core.grant_parse import parse_grants
from boxmaker.core.grants import MCP_CLIENT, GrantSet
from boxmaker.core.labels import FRESH, Label, Taint
from boxmaker.core.owner_answer import EarlierEnd, late_owner_answer
from boxmaker.core.reasons import Reason
from boxmaker.core.vocabulary import (
    Answer,
    AnswerOutcome,
    Approval,
    Decision,
    ErrorCode,
    ErrorFrame,
    Pending,
    Result,
    ResultStatus,
    ToolRequest,
)

TIMEOUT: Final = 300.0
NOW: Final = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
SESSION: Final = "s-0000000000a1"
BOOT: Final = "b-0000000000000001"
PATHS: Final = ("notes.txt", ".env", "../outside")
T = TypeVar("T")


def _grants(mode: str | None) -> GrantSet:
    text = "" if mode is None else f'[[grant]]\nid = "g"\ntool = "read_file"\nmode = "{mode}"\n'
    grants = parse_grants(text)
    assert isinstance(grants, GrantSet)
    return grants


def _client_too() -> GrantSet:
    """An ask grant that lets the MCP client's own prompt answer too."""
    text = '[[grant]]\nid = "g"\ntool = "read_file"\nmode = "ask"\n'
    grants = parse_grants(text + 'approvers = ["owner", "mcp-client"]\n')
    assert isinstance(grants, GrantSet)
    return grants


GRANTS: Final = {
    **{mode: _grants(mode) for mode in ("auto", "ask", "deny", None)},
    "ask-client": _client_too(),
}
_IDS = itertools.count()


def step(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run the driver's loop to its return: with ports that never suspend, one send
    does it (no trio here)."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    coroutine.close()
    raise AssertionError("a port suspended")


@attrs.define(eq=False)
class Model:
    """One call as the test sees it: the machine, the frames it sent, what the test set."""

    call: Call
    path: str
    gone: bool = False
    frames: list[ev.CallFrame] = attrs.Factory(list)
    replies: list[ev.AdminReply] = attrs.Factory(list)
    ran: int = 0
    closed: bool = False
    stopped_before: bool = False
    run_stopped: bool = False
    """Its requester left while its tool ran."""
    entry: PendingEntry | None = None
    """Its pending entry, once the enqueue port made one."""
    wait: ev.AwaitOwner | None = None
    """What it waits for, while it waits."""

    @property
    def finals(self) -> list[Answer | ErrorFrame]:
        return [f for f in self.frames if not isinstance(f, Pending)]

    @property
    def waiting(self) -> bool:
        return self.call.phase is Phase.WAITING


@attrs.define(eq=False)
class MemoryPorts:
    """The driver's ports (boxmaker.core.drive.Ports) in memory: the test's ledger,
    clock, approvals table and requester. None of them suspends."""

    test: CallMachine
    model: Model

    def _open(self) -> None:
        assert not self.model.closed, "a port used after the close"

    async def record(self, body: ev.CallRecord) -> bool:
        self._open()
        assert body.call == self.model.call.call, body
        if not self.test.ledger_up:
            return False
        self.test.ledger.append(self.test.record_of(body))
        return True

    async def send(self, frame: ev.CallFrame) -> bool:
        self._open()
        if self.model.gone:
            return False
        self.model.frames.append(frame)
        return True

    def look(self) -> bool:
        self._open()
        return self.model.gone

    async def run(self, verdict: Run | Ask, *, approved: bool) -> ev.Ran | ev.RequesterGone:
        self._open()
        model = self.model
        assert not model.gone, "ran for a requester that left"
        model.ran += 1
        if self.test.leaves_while_running:
            # The requester leaves while the tool runs: the driver stops the run.
            model.gone = model.run_stopped = True
            return ev.RequesterGone()
        label = Label(Taint.INTERNAL, False)
        if self.test.run_ok:
            return ev.Ran(ev.RunOutcome(True, None, None, "hello\n", label))
        return ev.Ran(ev.RunOutcome(False, Reason.NOT_FOUND, "no", "", label))

    async def raise_state(
        self, session: str, label: Label
    ) -> ev.StateRaised | ev.StateUnrecordable:
        self._open()
        if not self.test.raise_ok:
            return ev.StateUnrecordable("disk full")
        self.test.state = self.test.state.join(label)
        return ev.StateRaised(self.test.state)

    def enqueue(self, ask: Ask) -> ev.Enqueued:
        self._open()
        pending = self.test.pending
        entry = self.model.entry = PendingEntry.for_ask(
            ask,
            approval=pending.new_approval_id(),
            requested_at=NOW,
            now=self.test.now,
            timeout=TIMEOUT,
        )
        return ev.Enqueued(entry, closed=not pending.add(entry))

    async def ending(self, entry: PendingEntry) -> ev.Event | None:
        self._open()
        assert entry == self.model.entry
        if self.model.wait is None:  # the wait begins: its deadline is the entry's
            assert entry.deadline == self.test.now + TIMEOUT
        command = self.test.pending.waiters[entry.approval].command
        if isinstance(command, ApproveCommand):
            return ev.OwnerApproved(self.test.verdict(self.model))
        if isinstance(command, RefuseCommand):
            return ev.OwnerRefused(command.reason)
        if isinstance(command, ClientAnswered):
            approver = client_approver(command.client)
            if command.approve:
                return ev.OwnerApproved(command.verdict, approver=approver)
            return ev.OwnerRefused(client_refusal(command.client), approver=approver)
        return command

    def withdraw(self, approval: str) -> None:
        self._open()
        self.test.pending.end(approval, ev.RequesterGone())

    def reply(self, reply: ev.AdminReply) -> None:
        self._open()
        self.model.replies.append(reply)

    def close(self) -> None:
        self._open()
        self.model.closed = True
        if self.model.entry is not None:
            self.test.pending.forget(self.model.entry.approval)


class CallMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 1000.0
        self.pending = PendingCalls()
        self.ledger: list[dict[str, Any]] = []
        self.ledger_up = True
        self.grants = "ask"
        self.state = FRESH
        self.raise_ok = True
        self.run_ok = True
        self.leaves_while_running = False
        self.stopping = False
        self.calls: dict[str, Model] = {}

    # -- the driver: core/drive.py's loop, with the ports above -------------------------

    def verdict(self, model: Model) -> Verdict:
        request = ToolRequest(
            call=model.call.call,
            session=SESSION,
            tool="read_file",
            arguments={"path": model.path},
        )
        return evaluate(
            request,
            ledger_usable=self.ledger_up,
            grants=GRANTS[None if self.grants == "none" else self.grants],
            state=self.state,
            now=NOW,
            workspace="/w",
        )

    def _feed(self, model: Model, event: ev.Event) -> None:
        """Feed the event and carry out every effect, until the call waits or is over."""
        self._waits(model, step(drive(model.call, event, MemoryPorts(self, model))))

    def _waits(self, model: Model, wait: ev.AwaitOwner | None) -> None:
        model.wait = wait
        if wait is not None:
            assert wait.deadline == self.now + TIMEOUT
            assert wait.entry == model.entry

    def record_of(self, body: ev.CallRecord) -> dict[str, Any]:
        if isinstance(body, Approval):
            return {
                "kind": "approval",
                "call": body.call,
                "outcome": body.outcome.value,
                "by": body.by.value,
                "approver": body.approver,
            }
        if isinstance(body, Result):
            ok = body.status is ResultStatus.OK
            return {"kind": "result", "call": body.call, "ok": ok, "reason": body.reason}
        assert isinstance(body, Decision)
        return {"kind": "decision", "call": body.call, "verdict": body.verdict}

    def _deliver(self, model: Model, command: Command) -> None:
        """The waiting call's task, woken with its ending (delivered: the port reads it)."""
        assert self.pending.waiters[model.entry.approval].command == command  # type: ignore[union-attr]
        wait = model.wait
        assert wait is not None
        self._waits(model, step(resume(model.call, wait.entry, MemoryPorts(self, model))))

    def _end(self, model: Model, command: Command, *, now: float | None = None) -> bool:
        entry = model.entry
        assert entry is not None
        ended = self.pending.end(entry.approval, command, now=now)
        if ended is None:
            return False
        self._deliver(model, ended.command)
        return True

    def _expire_due(self) -> None:
        """Each waiting call's own deadline (pending.wait: its scope's deadline, then the
        table's boundary)."""
        for model in list(self.calls.values()):
            entry = model.entry
            if model.waiting and entry is not None and entry.is_expired(self.now):
                self._end(model, ev.Expired())

    # -- rules -----------------------------------------------------------------------

    @rule(
        path=st.sampled_from(PATHS),
        full=st.none() | st.just("10 asks already wait"),
        gone_at_once=st.booleans(),
    )
    def request(self, path: str, full: str | None, gone_at_once: bool) -> None:
        call_id = f"c-{next(_IDS):016x}"
        model = self.calls[call_id] = Model(
            Call(call_id, SESSION, boot=BOOT, pending_timeout=TIMEOUT), path
        )
        model.gone = gone_at_once
        if self.stopping:
            model.stopped_before = True
            self._feed(model, ev.Stopping())
            return
        verdict = self.verdict(model)
        self._feed(model, ev.Decided(verdict, full if isinstance(verdict, Ask) else None))

    @precondition(lambda self: bool(self.calls))
    @rule(data=st.data())
    def reuse_a_call_id(self, data: st.DataObject) -> None:
        call_id = data.draw(st.sampled_from(sorted(self.calls)))
        twin = Model(Call(call_id, SESSION, boot=BOOT, pending_timeout=TIMEOUT), "notes.txt")
        self._feed(twin, ev.Reused())
        assert twin.frames == [ErrorFrame(code=ErrorCode.BAD_FRAME, detail=machine.CALL_ID_USED)]
        assert twin.closed

    def _waiting(self) -> list[Model]:
        return [model for model in self.calls.values() if model.waiting]

    @precondition(lambda self: bool(self._waiting()))
    @rule(data=st.data(), approve=st.booleans(), reason=st.text(max_size=5))
    def answer(self, data: st.DataObject, approve: bool, reason: str) -> None:
        model = data.draw(st.sampled_from(self._waiting()))
        entry = model.entry
        assert entry is not None
        send, receive = trio.open_memory_channel[ev.AdminReply](1)
        command: Command = (
            ApproveCommand(None, send) if approve else RefuseCommand(f"no: {reason}", send)
        )
        records_before = len(self.ledger)
        assert self._end(model, command, now=self.now)
        assert len(self.ledger) >= records_before
        assert len(model.replies) == 1, model.replies
        reply = model.replies[0]
        if approve:
            assert isinstance(reply, ev.ApprovedReply | ev.NotRecorded)
        else:
            assert isinstance(reply, ev.RefusedReply | ev.NotRecorded)
        assert isinstance(reply, ev.NotRecorded) != self.ledger_up
        receive.close()

    @precondition(lambda self: bool(self._waiting()))
    @rule(data=st.data(), approve=st.booleans(), own=st.booleans())
    def client_answers(self, data: st.DataObject, approve: bool, own: bool) -> None:
        """An answer from the MCP client's own prompt: it ends the call only where
        core/client_answer.py says it counts (broker/client_answers.py's order: the
        re-decision, then the take); else the call still waits."""
        model = data.draw(st.sampled_from(self._waiting()))
        entry = model.entry
        assert entry is not None
        approval = entry.approval if own else "a-ffffffff"
        verdict = self.verdict(model)
        why = not_counted(entry, approval, verdict)
        if why is not None:
            assert model.waiting
            return
        assert own
        assert MCP_CLIENT in entry.approvers
        records_before = len(self.ledger)
        ended = self.pending.end(
            entry.approval, ClientAnswered(approve, "c", verdict), now=self.now
        )
        if ended is None:
            return
        # The machine tells "the admin" as for any answer; brokerd's reply port has no
        # channel for it here (nobody at admin.sock asked) and drops it.
        self._deliver(model, ended.command)
        assert len(self.ledger) >= records_before

    @precondition(lambda self: bool(self._waiting()))
    @rule(data=st.data())
    def answer_at_the_deadline(self, data: st.DataObject) -> None:
        """An owner's answer at expires_at is the expiry (the boundary is ``>=``)."""
        model = data.draw(st.sampled_from(self._waiting()))
        entry = model.entry
        assert entry is not None
        send, receive = trio.open_memory_channel[ev.AdminReply](1)
        ended = self.pending.end(entry.approval, ApproveCommand(None, send), now=entry.deadline)
        assert ended is not None
        assert isinstance(ended.command, ev.Expired)
        assert self.pending.was_expired(entry.approval)
        self._deliver(model, ended.command)
        assert model.replies == []
        # A late approve hears ``expired``; one that never was hears ``no_such_approval``.
        assert self.pending.end(entry.approval, ApproveCommand(None, send), now=0.0) is None
        assert late_owner_answer(entry.approval, EarlierEnd.EXPIRED)[0] == "expired"
        send.close()
        receive.close()

    @precondition(lambda self: bool(self._waiting()))
    @rule(data=st.data())
    def requester_leaves(self, data: st.DataObject) -> None:
        model = data.draw(st.sampled_from(self._waiting()))
        model.gone = True
        assert self._end(model, ev.RequesterGone())

    @rule(
        seconds=st.sampled_from([1.0, TIMEOUT - 0.001, TIMEOUT, TIMEOUT + 0.001])
        | st.floats(0, 400)
    )
    def advance(self, seconds: float) -> None:
        self.now += seconds
        self._expire_due()

    @rule(mode=st.sampled_from(["auto", "ask", "ask-client", "deny", "none"]))
    def change_grants(self, mode: str) -> None:
        self.grants = mode

    @rule(up=st.booleans())
    def ledger(self, up: bool) -> None:
        self.ledger_up = up

    @rule(raise_ok=st.booleans(), run_ok=st.booleans(), leaves=st.booleans())
    def runs(self, raise_ok: bool, run_ok: bool, leaves: bool) -> None:
        self.raise_ok = raise_ok
        self.run_ok = run_ok
        self.leaves_while_running = leaves

    @rule(taint=st.sampled_from(list(Taint)), untrusted=st.booleans())
    def state_rises(self, taint: Taint, untrusted: bool) -> None:
        self.state = self.state.join(Label(taint, untrusted))

    @precondition(lambda self: not self.stopping)
    @rule()
    def stop(self) -> None:
        self.stopping = True
        waiting = self._waiting()
        assert self.pending.withdraw_all() == len(waiting)
        for model in waiting:
            entry = model.entry
            assert entry is not None
            command = self.pending.waiters[entry.approval].command
            assert isinstance(command, ev.Stopping)
            self._deliver(model, command)

    # -- invariants ------------------------------------------------------------------

    def _of(self, call: str, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.ledger if r["kind"] == kind and r["call"] == call]

    @invariant()
    def every_call_has_at_most_one_decision(self) -> None:
        for call, model in self.calls.items():
            decisions = self._of(call, "decision")
            assert len(decisions) <= 1
            if decisions == [] and not model.stopped_before:
                # Unrecorded: the ledger was down, and the call was denied so.
                final = model.finals
                assert model.gone or [f.reason for f in final] == [  # type: ignore[union-attr]
                    Reason.AUDIT_UNAVAILABLE
                ], final

    @invariant()
    def nothing_ran_without_a_run_verdict_or_an_approval(self) -> None:
        for call, model in self.calls.items():
            results = self._of(call, "result")
            ran_results = [r for r in results if r["reason"] != Reason.REQUESTER_GONE]
            assert len(results) <= 1
            if model.ran == 0:
                assert ran_results == []
                continue
            assert model.ran == 1
            [decision] = self._of(call, "decision")
            outcomes = [r["outcome"] for r in self._of(call, "approval")]
            assert decision["verdict"] == "run" or (
                decision["verdict"] == "ask" and outcomes in (["ask"], ["allowed"])
            ), (decision, outcomes)

    @invariant()
    def a_run_stopped_by_its_requester_is_closed_as_requester_gone(self) -> None:
        for call, model in self.calls.items():
            if not model.run_stopped:
                continue
            assert model.call.phase is Phase.DONE
            assert model.finals == []
            results = [(r["ok"], r["reason"]) for r in self._of(call, "result")]
            assert results in ([], [(False, Reason.REQUESTER_GONE)]), results
            if model.replies:  # an approve let it run: the owner hears it was stopped
                [reply] = model.replies
                assert isinstance(reply, ev.ApprovedReply)
                assert reply.ran is not None
                assert (reply.ran.outcome, reply.ran.reason) == ("failed", Reason.REQUESTER_GONE)

    @invariant()
    def only_a_grant_that_opts_in_lets_the_client_answer(self) -> None:
        for call, model in self.calls.items():
            for record in self._of(call, "approval"):
                if record["by"] != "mcp-client":
                    assert record["approver"] is None
                    continue
                assert record["approver"] == "mcp-client:c"
                assert model.entry is not None
                assert MCP_CLIENT in model.entry.approvers

    @invariant()
    def no_entry_outlives_its_deadline(self) -> None:
        for entry in self.pending.table.entries():
            assert not due(entry.deadline, self.now)
            assert entry.deadline <= self.now + TIMEOUT

    @invariant()
    def every_entry_is_an_asked_call_with_no_approval_yet(self) -> None:
        entries = self.pending.table.entries()
        assert set(self.pending.waiters) == {entry.approval for entry in entries}
        for entry in entries:
            model = self.calls[entry.call]
            assert model.waiting
            assert [r["verdict"] for r in self._of(entry.call, "decision")] == ["ask"]
            assert self._of(entry.call, "approval") == []

    @invariant()
    def every_call_waits_or_has_ended(self) -> None:
        for call, model in self.calls.items():
            assert model.call.phase in (Phase.WAITING, Phase.DONE), (call, model.call.phase)
            assert model.closed == (model.call.phase is Phase.DONE)
            finals = model.finals
            assert len(finals) <= 1, finals
            if model.waiting:
                assert finals == []
                assert [type(f) for f in model.frames] == [Pending]
            elif not model.gone:
                assert len(finals) == 1, (call, model.frames)
            asked = [r for r in self._of(call, "decision") if r["verdict"] == "ask"]
            if asked and not model.waiting:
                assert len(self._of(call, "approval")) <= 1
                if self.ledger_up and model.entry is not None:
                    pass

    @invariant()
    def answers_match_the_records(self) -> None:
        for call, model in self.calls.items():
            for final in model.finals:
                if not isinstance(final, Answer):
                    continue
                approvals = [r["outcome"] for r in self._of(call, "approval")]
                results = self._of(call, "result")
                if final.outcome is AnswerOutcome.OK:
                    assert [r["ok"] for r in results] == [True]
                    assert final.content == "hello\n"
                elif final.outcome is AnswerOutcome.DENIED:
                    assert results == []
                    if final.reason in (Reason.REFUSED, Reason.EXPIRED):
                        assert approvals == [final.reason.value], (final, approvals)
                elif final.reason in (Reason.RESULT_UNRECORDED, Reason.AUDIT_UNAVAILABLE):
                    assert results == [], (final, results)
                else:
                    assert [r["ok"] for r in results] == [False], (final, results)

    def teardown(self) -> None:
        """A stop ends every waiting call ``withdrawn``/``broker_stopping``."""
        if not self.stopping:
            self.stop()
        assert len(self.pending.table) == 0
        assert self.pending.waiters == {}
        for call, model in self.calls.items():
            assert model.call.phase is Phase.DONE, call
            asked = [r for r in self._of(call, "decision") if r["verdict"] == "ask"]
            if asked and self.ledger_up:
                assert len(self._of(call, "approval")) <= 1


CallMachine.TestCase.settings = settings(
    # Under mutmut each mutant runs it again: fewer examples there (the table's rows are
    # pinned one by one in tests/core/test_call.py).
    max_examples=100 if os.environ.get("MUTANT_UNDER_TEST") else 1000,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestCallMachine = CallMachine.TestCase


def test_an_event_out_of_order_raises() -> None:
    call = Call("c-0000000000000001", SESSION, boot=BOOT, pending_timeout=TIMEOUT)
    with pytest.raises(IllegalEvent, match="Recorded is not expected in phase IDLE"):
        call.handle(ev.Recorded())
    call.handle(ev.Stopping())
    assert call.phase is Phase.DONE
    for event in (ev.Stopping(), ev.Expired(), ev.RecordFailed()):
        with pytest.raises(IllegalEvent):
            call.handle(event)


def test_the_boundary_is_at_or_after_the_deadline() -> None:
    assert not due(400.0, 399.999)
    assert due(400.0, 400.0)
    assert due(400.0, 400.001)
