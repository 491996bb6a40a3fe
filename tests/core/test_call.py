"""core/call.py: every row of the call's transition table, effect by effect.

The stateful test (tests/stateful/test_call_machine.py) checks the invariants over any
interleaving; these pin down exactly what each row does, detail strings included.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import typing
from typing import Final

import attrs
import pytest

from boxmaker.core import call_events as ev
from boxmaker.core.approvals import GrantRef, PendingEntry, due
from boxmaker.core.call import (
    APPROVAL_UNRECORDED,
    CALL_ID_USED,
    REFUSAL_UNRECORDED,
    RESULT_UNRECORDED_DETAIL,
    RUN_STOPPED_DETAIL,
    STOPPING_DETAIL,
    Call,
    IllegalEvent,
    IllegalTransition,
)
from boxmaker.core.call_phases import Phase, State, Waiting
from boxmaker.core.call_table import TRANSITIONS
from boxmaker.core.decide import Ask, Deny, Run, Verdict, evaluate
from boxmaker.core.external_tools import ExternalTool
from boxmaker.core.grant_parse import parse_grants
from boxmaker.core.grants import GrantSet
from boxmaker.core.labels import FRESH, UNKNOWN, Label, Taint
from boxmaker.core.reasons import AUDIT_UNAVAILABLE_DETAIL, Reason
from boxmaker.core.state import StateUnreadable
from boxmaker.core.vocabulary import (
    Answer,
    Approval,
    ApprovalBy,
    ApprovalOutcome,
    Decision,
    ErrorCode,
    ErrorFrame,
    Pending,
    Result,
    ResultStatus,
    RunEnd,
    ToolRequest,
)

CALL: Final = "c-0000000000000001"
SESSION: Final = "s-0000000000a1"
BOOT: Final = "b-0000000000000001"
NOW: Final = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
STATE: Final = Label(Taint.INTERNAL, True)
RAISED: Final = Label(Taint.SECRET, True)
LABEL: Final = Label(Taint.SECRET, False)
AUDIT: Final = Answer.denied(CALL, Reason.AUDIT_UNAVAILABLE, AUDIT_UNAVAILABLE_DETAIL)
STOPPING: Final = Answer.denied(CALL, Reason.BROKER_STOPPING, STOPPING_DETAIL)
CLOSE: Final = ev.Close()


def grants(mode: str | None) -> GrantSet:
    text = "" if mode is None else f'[[grant]]\nid = "g"\ntool = "read_file"\nmode = "{mode}"\n'
    parsed = parse_grants(text)
    assert isinstance(parsed, GrantSet)
    return parsed


def verdict(mode: str | None, *, usable: bool = True, state: Label = STATE) -> Verdict:
    request = ToolRequest(
        call=CALL, session=SESSION, tool="read_file", arguments={"path": "notes.txt"}
    )
    # ``if_untrusted`` defaults to ask: an untrusted session asks even on an auto grant.
    return evaluate(
        request,
        ledger_usable=usable,
        grants=grants(mode),
        state=state,
        now=NOW,
        workspace="/w",
    )


def run_verdict() -> Run:
    v = verdict("auto", state=FRESH)
    assert isinstance(v, Run)
    return v


def ask_verdict() -> Ask:
    v = verdict("ask")
    assert isinstance(v, Ask)
    return v


def entry() -> PendingEntry:
    return PendingEntry.create(
        approval="a-00000001",
        call=CALL,
        session=SESSION,
        tool="read_file",
        arguments={"path": "notes.txt"},
        grant=GrantRef(id="g", mode="ask"),
        taint=STATE.taint,
        untrusted=STATE.untrusted,
        requested_at=NOW,
        now=100.0,
        timeout=300.0,
    )


def new_call(timeout: float = 300.0) -> Call:
    return Call(CALL, SESSION, boot=BOOT, pending_timeout=timeout)


def waiting(timeout: float = 300.0) -> Call:
    call = new_call(timeout)
    ask = ask_verdict()
    assert call.handle(ev.Decided(ask)) == [ev.AppendRecord(Decision.of(ask.decision, BOOT))]
    assert call.handle(ev.Recorded()) == [ev.Enqueue(ask)]
    pending = entry()
    assert call.handle(ev.Enqueued(pending)) == [
        ev.Send(Pending.of(pending)),
        ev.AwaitOwner(pending),
    ]
    assert pending.deadline == 400.0
    assert call.phase is Phase.WAITING
    assert call.state == Waiting(pending)
    return call


def body(
    outcome: ApprovalOutcome, reason: str | None, by: ApprovalBy, state: Label
) -> ev.AppendRecord:
    return ev.AppendRecord(
        Approval(CALL, "a-00000001", outcome, reason, by, state.taint, state.untrusted)
    )


def result_body(
    ok: bool,
    reason: Reason | None,
    label: Label,
    after: Label,
    sha256: str | None,
    size: int,
    stopped: bool = False,
) -> Result:
    status = ResultStatus.OK if ok else ResultStatus.FAILED
    return Result(CALL, status, reason, label, after.taint, after.untrusted, sha256, size, stopped)


# --- before the decision --------------------------------------------------------------


def test_a_reused_call_id_is_a_bad_frame_and_nothing_is_recorded() -> None:
    call = new_call()
    bad_frame = ErrorFrame(code=ErrorCode.BAD_FRAME, detail=CALL_ID_USED)
    assert call.handle(ev.Reused()) == [ev.Send(bad_frame), CLOSE]
    assert CALL_ID_USED == "call id already used"
    assert call.phase is Phase.DONE


def test_stopping_before_the_decision_is_answered_and_not_recorded() -> None:
    call = new_call()
    assert call.handle(ev.Stopping()) == [ev.Send(STOPPING), CLOSE]
    assert STOPPING_DETAIL == "brokerd is stopping"
    assert call.decision is None


def test_an_unrecordable_decision_is_answered_and_not_recorded() -> None:
    call = new_call()
    denied = verdict("auto", usable=False)
    assert call.handle(ev.Decided(denied)) == [ev.Send(AUDIT), CLOSE]
    assert call.phase is Phase.DONE


# --- the decision's record ------------------------------------------------------------


def test_a_denial_is_recorded_then_answered_with_its_reason() -> None:
    call = new_call()
    denied = verdict(None)
    assert isinstance(denied, Deny)
    assert call.handle(ev.Decided(denied)) == [ev.AppendRecord(Decision.of(denied.decision, BOOT))]
    assert call.phase is Phase.DECISION
    detail = denied.decision.detail
    assert call.handle(ev.Recorded()) == [
        ev.Send(Answer.denied(CALL, Reason.NO_GRANT, detail)),
        CLOSE,
    ]


def test_a_denial_without_a_reason_answers_no_grant() -> None:
    assert new_call()._denied(verdict(None).decision).frame.reason is Reason.NO_GRANT
    call = new_call()
    denied = verdict("deny")
    call.handle(ev.Decided(denied))
    [send, _] = call.handle(ev.Recorded())
    assert isinstance(send, ev.Send)
    assert isinstance(send.frame, Answer)
    assert send.frame.reason is Reason.DENIED_BY_GRANT


@pytest.mark.parametrize("make", [run_verdict, ask_verdict, lambda: verdict(None)])
def test_an_unrecorded_decision_is_denied_audit_unavailable(make: object) -> None:
    call = new_call()
    call.handle(ev.Decided(make()))  # type: ignore[operator]
    assert call.handle(ev.RecordFailed()) == [ev.Send(AUDIT), CLOSE]
    assert call.phase is Phase.DONE


def test_an_ask_over_the_pending_caps_is_denied_too_many_pending() -> None:
    call = new_call()
    ask = ask_verdict()
    [record] = call.handle(ev.Decided(ask, pending_full="10 asks wait"))
    assert isinstance(record, ev.AppendRecord)
    decision = call.decision
    assert decision == ask.too_many_pending("10 asks wait").decision
    assert record.body == Decision.of(decision, BOOT)
    assert (decision.verdict, decision.reason, decision.detail, decision.grant) == (  # type: ignore[union-attr]
        "deny",
        Reason.TOO_MANY_PENDING,
        "10 asks wait",
        "g",
    )
    assert call.handle(ev.Recorded()) == [
        ev.Send(Answer.denied(CALL, Reason.TOO_MANY_PENDING, "10 asks wait")),
        CLOSE,
    ]


def test_pending_full_means_nothing_to_a_run() -> None:
    call = new_call()
    run = run_verdict()
    assert call.handle(ev.Decided(run, pending_full="full")) == [
        ev.AppendRecord(Decision.of(run.decision, BOOT))
    ]
    assert call.handle(ev.Recorded()) == [ev.LastLook()]


# --- a run ----------------------------------------------------------------------------


def ran_call(run: Run | None = None) -> Call:
    call = new_call()
    run = run or run_verdict()
    call.handle(ev.Decided(run))
    assert call.handle(ev.Recorded()) == [ev.LastLook()]
    assert call.phase is Phase.LOOK_RUN
    assert call.handle(ev.Looked(gone=False)) == [ev.RunVerdict(run, approved=False)]
    assert call.phase is Phase.RUNNING
    return call


def test_a_run_raises_the_state_records_the_result_then_answers_the_content() -> None:
    call = ran_call()
    outcome = ev.RunOutcome(True, None, None, "héllo\n", LABEL)
    assert call.handle(ev.Ran(outcome)) == [ev.RaiseState(SESSION, LABEL)]
    assert call.phase is Phase.RAISING
    output = "héllo\n".encode()
    assert call.handle(ev.StateRaised(RAISED)) == [
        ev.AppendRecord(
            result_body(True, None, LABEL, RAISED, hashlib.sha256(output).hexdigest(), len(output))
        )
    ]
    assert len(output) == 7
    assert call.phase is Phase.RESULT
    assert call.handle(ev.Recorded()) == [
        ev.Send(Answer.ok(CALL, "héllo\n", LABEL)),
        CLOSE,
    ]


@pytest.mark.parametrize(
    ("reason", "expected"),
    [(Reason.NOT_FOUND, Reason.NOT_FOUND), (None, Reason.TOOL_ERROR)],
)
def test_a_failed_run_is_recorded_and_answered_failed(
    reason: Reason | None, expected: Reason
) -> None:
    call = ran_call()
    call.handle(ev.Ran(ev.RunOutcome(False, reason, "no such file", "", LABEL)))
    [record] = call.handle(ev.StateRaised(RAISED))
    assert record == ev.AppendRecord(
        result_body(False, expected, LABEL, RAISED, hashlib.sha256(b"").hexdigest(), 0)
    )
    assert call.handle(ev.Recorded()) == [
        ev.Send(Answer.failed(CALL, expected, "no such file")),
        CLOSE,
    ]


def test_an_unrecorded_result_never_passes_its_content_on() -> None:
    call = ran_call()
    call.handle(ev.Ran(ev.RunOutcome(True, None, None, "secret", LABEL)))
    call.handle(ev.StateRaised(RAISED))
    assert call.handle(ev.RecordFailed()) == [
        ev.Send(Answer.failed(CALL, Reason.AUDIT_UNAVAILABLE, AUDIT_UNAVAILABLE_DETAIL)),
        CLOSE,
    ]


def test_a_state_that_cannot_be_raised_is_result_unrecorded_with_no_record() -> None:
    call = ran_call()
    call.handle(ev.Ran(ev.RunOutcome(True, None, None, "x", LABEL)))
    assert call.handle(ev.StateUnrecordable("disk full")) == [
        ev.Send(Answer.failed(CALL, Reason.RESULT_UNRECORDED, RESULT_UNRECORDED_DETAIL)),
        CLOSE,
    ]
    assert "docs/runbook.md" in RESULT_UNRECORDED_DETAIL


@pytest.mark.parametrize("written", [ev.Recorded(), ev.RecordFailed()])
def test_a_requester_gone_at_the_last_look_runs_nothing(written: ev.Event) -> None:
    call = new_call()
    run = run_verdict()
    call.handle(ev.Decided(run))
    call.handle(ev.Recorded())
    gone = result_body(False, Reason.REQUESTER_GONE, FRESH, run.decision.state, None, 0, False)
    assert call.handle(ev.Looked(gone=True)) == [ev.AppendRecord(gone)]
    assert call.phase is Phase.GONE
    assert call.handle(written) == [CLOSE]
    assert call.phase is Phase.DONE


@pytest.mark.parametrize("written", [ev.Recorded(), ev.RecordFailed()])
def test_a_requester_gone_while_the_tool_runs_closes_the_call_with_nothing_passed_on(
    written: ev.Event,
) -> None:
    call = new_call()
    run = run_verdict()
    call.handle(ev.Decided(run))
    call.handle(ev.Recorded())
    assert call.handle(ev.Looked(gone=False)) == [ev.RunVerdict(run, approved=False)]
    # The driver stopped the run: no output, no label, the state it was decided on.
    gone = result_body(False, Reason.REQUESTER_GONE, FRESH, run.decision.state, None, 0, True)
    assert call.handle(ev.RequesterGone()) == [ev.AppendRecord(gone)]
    assert call.phase is Phase.GONE
    assert call.handle(written) == [CLOSE]
    assert call.phase is Phase.DONE


@pytest.mark.parametrize("written", [ev.Recorded(), ev.RecordFailed()])
def test_an_approved_run_stopped_by_its_requester_leaving_tells_the_owner(
    written: ev.Event,
) -> None:
    call = waiting()
    now = ask_verdict()
    call.handle(ev.OwnerApproved(now))
    call.handle(ev.Looked(gone=False))
    assert call.handle(ev.Recorded()) == [ev.RunVerdict(now, approved=True)]
    gone = result_body(False, Reason.REQUESTER_GONE, FRESH, now.decision.state, None, 0, True)
    assert call.handle(ev.RequesterGone()) == [ev.AppendRecord(gone)]
    stopped = RunEnd(outcome="failed", reason=Reason.REQUESTER_GONE, detail=RUN_STOPPED_DETAIL)
    assert call.handle(written) == [
        ev.ReplyAdmin(ev.ApprovedReply(ApprovalOutcome.ASK, None, ran=stopped)),
        CLOSE,
    ]
    assert RUN_STOPPED_DETAIL == "its requester left while it ran: the run was stopped"


def test_only_its_end_or_its_requester_leaving_is_taken_while_a_tool_runs() -> None:
    allowed = {ev.Ran, ev.RequesterGone}
    for event in EVENTS:
        call = ran_call()
        assert call.phase is Phase.RUNNING
        if type(event) in allowed:
            call.handle(event)
            continue
        with pytest.raises(IllegalEvent) as raised:
            call.handle(event)
        assert raised.value.phase is Phase.RUNNING
        assert call.phase is Phase.RUNNING


# --- an ask and its endings -----------------------------------------------------------


def test_an_ask_is_enqueued_after_its_record_and_then_waits() -> None:
    call = waiting()
    assert call.decision == ask_verdict().decision


def test_an_ask_enqueued_while_stopping_is_withdrawn_without_a_pending_frame() -> None:
    call = new_call()
    call.handle(ev.Decided(ask_verdict()))
    call.handle(ev.Recorded())
    closed = call.handle(ev.Enqueued(entry(), closed=True))
    assert closed == [body(ApprovalOutcome.WITHDRAWN, "broker_stopping", ApprovalBy.BROKER, STATE)]
    assert call.handle(ev.Recorded()) == [ev.Send(STOPPING), CLOSE]


@pytest.mark.parametrize(("timeout", "shown"), [(300.0, "300"), (2.5, "2.5")])
def test_expiry_is_recorded_then_denied_expired(timeout: float, shown: str) -> None:
    call = waiting(timeout)
    assert call.handle(ev.Expired()) == [
        body(ApprovalOutcome.EXPIRED, "expired", ApprovalBy.EXPIRY, STATE)
    ]
    assert call.phase is Phase.ENDING
    detail = f"no approval within {shown} s"
    assert call.handle(ev.Recorded()) == [
        ev.Send(Answer.denied(CALL, Reason.EXPIRED, detail)),
        CLOSE,
    ]


def test_a_stop_while_waiting_is_withdrawn_broker_stopping() -> None:
    call = waiting()
    assert call.handle(ev.Stopping()) == [
        body(ApprovalOutcome.WITHDRAWN, "broker_stopping", ApprovalBy.BROKER, STATE)
    ]
    assert call.handle(ev.Recorded()) == [ev.Send(STOPPING), CLOSE]


@pytest.mark.parametrize("ending", [ev.Expired(), ev.Stopping()])
def test_an_unrecorded_expiry_or_stop_is_denied_audit_unavailable(ending: ev.Event) -> None:
    call = waiting()
    call.handle(ending)
    assert call.handle(ev.RecordFailed()) == [ev.Send(AUDIT), CLOSE]


@pytest.mark.parametrize("written", [ev.Recorded(), ev.RecordFailed()])
def test_a_requester_gone_while_waiting_is_withdrawn_and_not_answered(written: ev.Event) -> None:
    call = waiting()
    assert call.handle(ev.RequesterGone()) == [
        body(ApprovalOutcome.WITHDRAWN, "requester_gone", ApprovalBy.BROKER, STATE)
    ]
    assert call.handle(written) == [CLOSE]


def test_a_refusal_is_recorded_told_to_the_owner_then_answered() -> None:
    call = waiting()
    assert call.handle(ev.OwnerRefused("not now")) == [
        body(ApprovalOutcome.REFUSED, "not now", ApprovalBy.OWNER, STATE)
    ]
    assert call.handle(ev.Recorded()) == [
        ev.ReplyAdmin(ev.RefusedReply()),
        ev.Send(Answer.denied(CALL, Reason.REFUSED, "not now")),
        CLOSE,
    ]


def test_an_unrecorded_refusal_tells_the_owner_and_denies_audit_unavailable() -> None:
    call = waiting()
    call.handle(ev.OwnerRefused("not now"))
    assert call.handle(ev.RecordFailed()) == [
        ev.ReplyAdmin(ev.NotRecorded(REFUSAL_UNRECORDED)),
        ev.Send(AUDIT),
        CLOSE,
    ]


# --- approve --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("redecided", "outcome", "approved"),
    [("ask", ApprovalOutcome.ASK, True), ("auto", ApprovalOutcome.ALLOWED, False)],
)
def test_approve_looks_last_records_tells_the_owner_then_runs(
    redecided: str, outcome: ApprovalOutcome, approved: bool
) -> None:
    call = waiting()
    now = verdict(redecided, state=FRESH if redecided == "auto" else RAISED)
    assert isinstance(now, Run | Ask)
    assert call.handle(ev.OwnerApproved(now)) == [ev.LastLook()]
    assert call.phase is Phase.LOOK_APPROVAL
    state = now.decision.state
    assert call.handle(ev.Looked(gone=False)) == [body(outcome, None, ApprovalBy.OWNER, state)]
    assert call.phase is Phase.APPROVAL
    # The owner hears after the run, how it ended (not before it, with nothing to say).
    assert call.handle(ev.Recorded()) == [ev.RunVerdict(now, approved=approved)]
    assert call.phase is Phase.RUNNING


def test_approve_with_the_requester_gone_is_withdrawn_and_runs_nothing() -> None:
    call = waiting()
    now = ask_verdict()
    call.handle(ev.OwnerApproved(now))
    assert call.handle(ev.Looked(gone=True)) == [
        body(ApprovalOutcome.WITHDRAWN, "requester_gone", ApprovalBy.OWNER, STATE)
    ]
    assert call.handle(ev.Recorded()) == [
        ev.ReplyAdmin(ev.ApprovedReply(ApprovalOutcome.WITHDRAWN, Reason.REQUESTER_GONE)),
        CLOSE,
    ]


def test_approve_whose_re_decision_denies_takes_no_look_and_answers_its_reason() -> None:
    call = waiting()
    now = verdict("deny")
    assert isinstance(now, Deny)
    assert call.handle(ev.OwnerApproved(now)) == [
        body(ApprovalOutcome.DENIED, "denied_by_grant", ApprovalBy.OWNER, STATE)
    ]
    assert call.handle(ev.Recorded()) == [
        ev.ReplyAdmin(
            ev.ApprovedReply(ApprovalOutcome.DENIED, Reason.DENIED_BY_GRANT, now.decision.detail)
        ),
        ev.Send(Answer.denied(CALL, Reason.DENIED_BY_GRANT, now.decision.detail)),
        CLOSE,
    ]


def test_a_re_decision_on_no_state_records_the_unknown_state() -> None:
    call = waiting()
    unusable = verdict("ask", usable=False)
    assert call.handle(ev.OwnerApproved(unusable)) == [
        body(ApprovalOutcome.DENIED, "audit_unavailable", ApprovalBy.OWNER, UNKNOWN)
    ]
    call = waiting()
    request = ToolRequest(
        call=CALL, session=SESSION, tool="read_file", arguments={"path": "notes.txt"}
    )
    unreadable = evaluate(
        request, ledger_usable=True, grants=grants("ask"), state=StateUnreadable("x"), now=NOW
    )
    assert call.handle(ev.OwnerApproved(unreadable)) == [
        body(ApprovalOutcome.DENIED, "state_unreadable", ApprovalBy.OWNER, UNKNOWN)
    ]


@pytest.mark.parametrize("redecided", ["ask", "deny"])
def test_an_unrecorded_approval_tells_the_owner_and_denies_audit_unavailable(
    redecided: str,
) -> None:
    call = waiting()
    call.handle(ev.OwnerApproved(verdict(redecided)))
    if redecided == "ask":
        call.handle(ev.Looked(gone=False))
    assert call.handle(ev.RecordFailed()) == [
        ev.ReplyAdmin(ev.NotRecorded(APPROVAL_UNRECORDED)),
        ev.Send(AUDIT),
        CLOSE,
    ]
    assert "docs/runbook.md#audit-unavailable" in APPROVAL_UNRECORDED
    assert "docs/runbook.md#audit-unavailable" in REFUSAL_UNRECORDED


def approved_and_ran(outcome: ev.RunOutcome) -> Call:
    call = waiting()
    call.handle(ev.OwnerApproved(ask_verdict()))
    call.handle(ev.Looked(gone=False))
    call.handle(ev.Recorded())
    assert call.handle(ev.Ran(outcome)) == [ev.RaiseState(SESSION, LABEL)]
    return call


def test_an_approved_call_runs_on_as_a_run_does_and_tells_the_owner_how_it_ended() -> None:
    call = approved_and_ran(ev.RunOutcome(True, None, None, "x", LABEL))
    assert [type(effect) for effect in call.handle(ev.StateRaised(STATE))] == [ev.AppendRecord]
    ok = ev.ApprovedReply(ApprovalOutcome.ASK, None, ran=RunEnd(outcome="ok"))
    assert call.handle(ev.Recorded()) == [
        ev.ReplyAdmin(ok),
        ev.Send(Answer.ok(CALL, "x", LABEL)),
        CLOSE,
    ]


def test_an_approved_call_that_failed_tells_the_owner_its_reason() -> None:
    call = approved_and_ran(ev.RunOutcome(False, Reason.NOT_FOUND, "gone", "", LABEL))
    call.handle(ev.StateRaised(STATE))
    failed = RunEnd(outcome="failed", reason=Reason.NOT_FOUND, detail="gone")
    assert call.handle(ev.Recorded())[0] == ev.ReplyAdmin(
        ev.ApprovedReply(ApprovalOutcome.ASK, None, ran=failed)
    )
    call = approved_and_ran(ev.RunOutcome(True, None, None, "x", LABEL))
    call.handle(ev.StateRaised(STATE))
    unrecorded = RunEnd(
        outcome="failed", reason=Reason.AUDIT_UNAVAILABLE, detail=AUDIT_UNAVAILABLE_DETAIL
    )
    assert call.handle(ev.RecordFailed())[0] == ev.ReplyAdmin(
        ev.ApprovedReply(ApprovalOutcome.ASK, None, ran=unrecorded)
    )
    call = approved_and_ran(ev.RunOutcome(True, None, None, "x", LABEL))
    effects = call.handle(ev.StateUnrecordable("disk full"))
    assert effects[0] == ev.ReplyAdmin(
        ev.ApprovedReply(
            ApprovalOutcome.ASK,
            None,
            ran=RunEnd(
                outcome="failed", reason=Reason.RESULT_UNRECORDED, detail=RESULT_UNRECORDED_DETAIL
            ),
        )
    )


def test_an_auto_run_tells_no_admin() -> None:
    call = new_call()
    call.handle(ev.Decided(run_verdict()))
    call.handle(ev.Recorded())
    call.handle(ev.Looked(gone=False))
    call.handle(ev.Ran(ev.RunOutcome(True, None, None, "x", LABEL)))
    call.handle(ev.StateRaised(STATE))
    assert not any(isinstance(e, ev.ReplyAdmin) for e in call.handle(ev.Recorded()))


# --- what the table refuses, and the rules beside it -----------------------------------


EVENTS: Final[list[ev.Event]] = [
    ev.Reused(),
    ev.Stopping(),
    ev.Decided(verdict(None)),
    ev.Recorded(),
    ev.RecordFailed(),
    ev.Enqueued(entry()),
    ev.Looked(gone=False),
    ev.OwnerApproved(verdict(None)),
    ev.OwnerRefused("no"),
    ev.Expired(),
    ev.RequesterGone(),
    ev.Ran(ev.RunOutcome(True, None, None, "", LABEL)),
    ev.StateRaised(STATE),
    ev.StateUnrecordable("x"),
]


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: type(e).__name__)
def test_no_event_is_taken_once_the_call_is_done(event: ev.Event) -> None:
    call = new_call()
    call.handle(ev.Reused())
    with pytest.raises(IllegalEvent, match=f"{type(event).__name__} is not expected in phase"):
        call.handle(event)
    assert call.phase is Phase.DONE


def test_only_an_ending_or_an_approve_is_taken_while_waiting() -> None:
    allowed = {ev.Expired, ev.Stopping, ev.RequesterGone, ev.OwnerRefused, ev.OwnerApproved}
    for event in EVENTS:
        call = waiting()
        if type(event) in allowed:
            call.handle(event)
            continue
        with pytest.raises(IllegalEvent) as raised:
            call.handle(event)
        assert raised.value.phase is Phase.WAITING
        assert raised.value.event is event
        assert call.phase is Phase.WAITING


def test_due_is_at_or_after_the_deadline() -> None:
    assert not due(400.0, 399.999)
    assert due(400.0, 400.0)
    assert due(400.0, 400.5)
    assert entry().is_expired(400.0)
    assert not entry().is_expired(399.999)


# --- the table as data ------------------------------------------------------------------


def test_the_table_s_data_names_every_phase_and_each_state_one() -> None:
    assert TRANSITIONS.keys() == Call.rows.keys()
    assert {phase for phase, _ in TRANSITIONS} == set(Phase) - {Phase.DONE}
    assert set().union(*TRANSITIONS.values()) == set(Phase) - {Phase.IDLE}
    states = typing.get_args(State)
    assert sorted(state.phase.name for state in states) == sorted(phase.name for phase in Phase)


def test_a_transition_its_row_does_not_name_raises() -> None:
    assert TRANSITIONS[(Phase.IDLE, ev.Reused)] == {Phase.DONE}
    row = Call.rows[(Phase.IDLE, ev.Reused)]

    class Drifted(Call):
        rows: typing.ClassVar = {
            **Call.rows,
            (Phase.IDLE, ev.Reused): attrs.evolve(row, next=frozenset()),
        }

    call = Drifted(CALL, SESSION, boot=BOOT, pending_timeout=300.0)
    with pytest.raises(IllegalTransition) as raised:
        call.handle(ev.Reused())
    assert str(raised.value) == "Reused in phase IDLE went to DONE, which its row does not name"
    assert (raised.value.phase, raised.value.reached) == (Phase.IDLE, Phase.DONE)
    assert raised.value.event == ev.Reused()
    assert call.phase is Phase.IDLE
    assert call.handle(ev.Stopping()) == [ev.Send(STOPPING), CLOSE]


@pytest.mark.parametrize(
    ("redecided", "gone", "outcome", "reason"),
    [
        ("ask", False, ApprovalOutcome.ASK, None),
        ("ask", True, ApprovalOutcome.WITHDRAWN, "requester_gone"),
        ("deny", False, ApprovalOutcome.DENIED, "denied_by_grant"),
    ],
)
@pytest.mark.parametrize(
    ("written", "note"), [("always-1", None), (None, "checked the path"), ("always-1", "ok")]
)
def test_the_approval_record_names_the_written_grant_and_keeps_the_owners_note(
    redecided: str,
    gone: bool,
    outcome: ApprovalOutcome,
    reason: str | None,
    written: str | None,
    note: str | None,
) -> None:
    call = waiting()
    now = verdict(redecided)
    effects = call.handle(ev.OwnerApproved(now, grant_written=written, note=note))
    if not isinstance(now, Deny):
        assert effects == [ev.LastLook()]
        effects = call.handle(ev.Looked(gone=gone))
    state = now.decision.state
    [record] = effects
    assert record == ev.AppendRecord(
        Approval(
            CALL,
            "a-00000001",
            outcome,
            reason,
            ApprovalBy.OWNER,
            state.taint,
            state.untrusted,
            written,
            note=note,
        )
    )


# --- an MCP tool's definition on every record of its call ------------------------------

DEFINITION: Final = "de" * 32
MCP_LABEL: Final = Label(Taint.PUBLIC, True)


def mcp_verdict(mode: str, definition: str = DEFINITION) -> Verdict:
    tool = ExternalTool("mcp.git.git_log", "", {}, MCP_LABEL, definition)
    parsed = parse_grants(f'[[grant]]\nid = "g"\ntool = "mcp.git.*"\nmode = "{mode}"\n')
    assert isinstance(parsed, GrantSet)
    request = ToolRequest(call=CALL, session=SESSION, tool="mcp.git.git_log", arguments={})
    return evaluate(
        request,
        ledger_usable=True,
        grants=parsed,
        state=FRESH,
        now=NOW,
        external={"mcp.git.git_log": tool},
    )


def test_an_mcp_run_records_its_definition_on_the_decision_and_the_result() -> None:
    call = new_call()
    run = mcp_verdict("auto")
    assert isinstance(run, Run)
    [record] = call.handle(ev.Decided(run))
    assert isinstance(record, ev.AppendRecord)
    assert isinstance(record.body, Decision)
    assert record.body.definition == DEFINITION
    call.handle(ev.Recorded())
    call.handle(ev.Looked(gone=False))
    call.handle(ev.Ran(ev.RunOutcome(True, None, None, "log", MCP_LABEL)))
    [result] = call.handle(ev.StateRaised(MCP_LABEL))
    assert isinstance(result, ev.AppendRecord)
    assert isinstance(result.body, Result)
    assert result.body.definition == DEFINITION


@pytest.mark.parametrize("stopped", [False, True])
def test_an_mcp_run_whose_requester_left_records_its_definition(stopped: bool) -> None:
    call = new_call()
    run = mcp_verdict("auto")
    call.handle(ev.Decided(run))
    call.handle(ev.Recorded())
    if stopped:
        call.handle(ev.Looked(gone=False))
        [gone] = call.handle(ev.RequesterGone())
    else:
        [gone] = call.handle(ev.Looked(gone=True))
    assert isinstance(gone, ev.AppendRecord)
    assert isinstance(gone.body, Result)
    assert (gone.body.definition, gone.body.stopped) == (DEFINITION, stopped)


def mcp_waiting() -> Call:
    call = new_call()
    ask = mcp_verdict("ask")
    assert isinstance(ask, Ask)
    call.handle(ev.Decided(ask))
    call.handle(ev.Recorded())
    call.handle(ev.Enqueued(entry()))
    return call


@pytest.mark.parametrize("ending", [ev.Expired(), ev.RequesterGone(), ev.Stopping()])
def test_an_mcp_ask_that_ends_unanswered_records_the_definition_asked_about(
    ending: ev.Event,
) -> None:
    [record] = mcp_waiting().handle(ending)
    assert isinstance(record, ev.AppendRecord)
    assert isinstance(record.body, Approval)
    assert record.body.definition == DEFINITION


def test_an_approved_mcp_ask_records_the_re_decisions_definition() -> None:
    call = mcp_waiting()
    again = mcp_verdict("auto")
    call.handle(ev.OwnerApproved(again))
    [record] = call.handle(ev.Looked(gone=False))
    assert isinstance(record, ev.AppendRecord)
    assert isinstance(record.body, Approval)
    assert (record.body.outcome, record.body.definition) == (ApprovalOutcome.ALLOWED, DEFINITION)


def test_a_built_in_call_records_no_definition() -> None:
    call = new_call()
    [record] = call.handle(ev.Decided(run_verdict()))
    assert isinstance(record, ev.AppendRecord)
    assert isinstance(record.body, Decision)
    assert record.body.definition is None
