"""core/call.py: every row of the call's transition table, effect by effect.

The stateful test (tests/stateful/test_call_machine.py) checks the invariants over any
interleaving; these pin down exactly what each row does, detail strings included.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from typing import Final

import pytest

from boxmaker.core import call as m
from boxmaker.core.approvals import GrantRef, PendingEntry
from boxmaker.core.call import (
    APPROVAL_UNRECORDED,
    CALL_ID_USED,
    REFUSAL_UNRECORDED,
    RESULT_UNRECORDED_DETAIL,
    RUN_STOPPED_DETAIL,
    STOPPING_DETAIL,
    Answer,
    AnswerOutcome,
    ApprovalBody,
    ApprovalBy,
    ApprovalOutcome,
    Call,
    IllegalEvent,
    Phase,
    ResultBody,
)
from boxmaker.core.decide import Ask, Deny, Run, ToolRequest, Verdict, evaluate
from boxmaker.core.grants import GrantSet, parse_grants
from boxmaker.core.labels import FRESH, UNKNOWN, Label, Taint
from boxmaker.core.reasons import AUDIT_UNAVAILABLE_DETAIL, Reason
from boxmaker.core.state import StateUnreadable

CALL: Final = "c-0000000000000001"
SESSION: Final = "s-0000000000a1"
NOW: Final = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
STATE: Final = Label(Taint.INTERNAL, True)
RAISED: Final = Label(Taint.SECRET, True)
LABEL: Final = Label(Taint.SECRET, False)
AUDIT: Final = Answer(AnswerOutcome.DENIED, Reason.AUDIT_UNAVAILABLE, AUDIT_UNAVAILABLE_DETAIL)
STOPPING: Final = Answer(AnswerOutcome.DENIED, Reason.BROKER_STOPPING, STOPPING_DETAIL)
CLOSE: Final = m.Close()


def grants(mode: str | None) -> GrantSet:
    text = "" if mode is None else f'[[grant]]\nid = "g"\ntool = "read_file"\nmode = "{mode}"\n'
    parsed = parse_grants(text)
    assert isinstance(parsed, GrantSet)
    return parsed


def verdict(mode: str | None, *, usable: bool = True, state: Label = STATE) -> Verdict:
    request = ToolRequest(CALL, SESSION, "read_file", {"path": "notes.txt"})
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
    return Call(CALL, SESSION, pending_timeout=timeout)


def waiting(timeout: float = 300.0) -> Call:
    call = new_call(timeout)
    ask = ask_verdict()
    assert call.handle(m.Decided(ask)) == [m.Record(ask.decision)]
    assert call.handle(m.Recorded()) == [m.Enqueue(ask)]
    pending = entry()
    assert call.handle(m.Enqueued(pending)) == [
        m.Send(m.PendingNotice(pending)),
        m.AwaitOwner(400.0),
    ]
    assert call.phase is Phase.WAITING
    assert call.entry == pending
    return call


def body(outcome: ApprovalOutcome, reason: str | None, by: ApprovalBy, state: Label) -> m.Record:
    return m.Record(ApprovalBody("a-00000001", outcome, reason, by, state))


# --- before the decision --------------------------------------------------------------


def test_a_reused_call_id_is_a_bad_frame_and_nothing_is_recorded() -> None:
    call = new_call()
    assert call.handle(m.Reused()) == [m.Send(m.BadFrameError(CALL_ID_USED)), CLOSE]
    assert CALL_ID_USED == "call id already used"
    assert call.phase is Phase.DONE


def test_stopping_before_the_decision_is_answered_and_not_recorded() -> None:
    call = new_call()
    assert call.handle(m.Stopping()) == [m.Send(STOPPING), CLOSE]
    assert STOPPING_DETAIL == "brokerd is stopping"
    assert call.decision is None


def test_an_unrecordable_decision_is_answered_and_not_recorded() -> None:
    call = new_call()
    denied = verdict("auto", usable=False)
    assert call.handle(m.Decided(denied)) == [m.Send(AUDIT), CLOSE]
    assert call.phase is Phase.DONE


# --- the decision's record ------------------------------------------------------------


def test_a_denial_is_recorded_then_answered_with_its_reason() -> None:
    call = new_call()
    denied = verdict(None)
    assert isinstance(denied, Deny)
    assert call.handle(m.Decided(denied)) == [m.Record(denied.decision)]
    assert call.phase is Phase.DECISION
    detail = denied.decision.detail
    assert call.handle(m.Recorded()) == [
        m.Send(Answer(AnswerOutcome.DENIED, Reason.NO_GRANT, detail)),
        CLOSE,
    ]


def test_a_denial_without_a_reason_answers_no_grant() -> None:
    assert m._denied(verdict(None).decision).reason is Reason.NO_GRANT
    call = new_call()
    denied = verdict("deny")
    call.handle(m.Decided(denied))
    [send, _] = call.handle(m.Recorded())
    assert isinstance(send, m.Send)
    assert isinstance(send.frame, Answer)
    assert send.frame.reason is Reason.DENIED_BY_GRANT


@pytest.mark.parametrize("make", [run_verdict, ask_verdict, lambda: verdict(None)])
def test_an_unrecorded_decision_is_denied_audit_unavailable(make: object) -> None:
    call = new_call()
    call.handle(m.Decided(make()))  # type: ignore[operator]
    assert call.handle(m.RecordFailed()) == [m.Send(AUDIT), CLOSE]
    assert call.phase is Phase.DONE


def test_an_ask_over_the_pending_caps_is_denied_too_many_pending() -> None:
    call = new_call()
    ask = ask_verdict()
    [record] = call.handle(m.Decided(ask, pending_full="10 asks wait"))
    assert isinstance(record, m.Record)
    decision = record.body
    assert decision == ask.too_many_pending("10 asks wait").decision
    assert (decision.verdict, decision.reason, decision.detail, decision.grant) == (  # type: ignore[union-attr]
        "deny",
        Reason.TOO_MANY_PENDING,
        "10 asks wait",
        "g",
    )
    assert call.handle(m.Recorded()) == [
        m.Send(Answer(AnswerOutcome.DENIED, Reason.TOO_MANY_PENDING, "10 asks wait")),
        CLOSE,
    ]


def test_pending_full_means_nothing_to_a_run() -> None:
    call = new_call()
    run = run_verdict()
    assert call.handle(m.Decided(run, pending_full="full")) == [m.Record(run.decision)]
    assert call.handle(m.Recorded()) == [m.LastLook()]


# --- a run ----------------------------------------------------------------------------


def ran_call(run: Run | None = None) -> Call:
    call = new_call()
    run = run or run_verdict()
    call.handle(m.Decided(run))
    assert call.handle(m.Recorded()) == [m.LastLook()]
    assert call.phase is Phase.LOOK_RUN
    assert call.handle(m.Looked(gone=False)) == [m.RunVerdict(run, approved=False)]
    assert call.phase is Phase.RUNNING
    return call


def test_a_run_raises_the_state_records_the_result_then_answers_the_content() -> None:
    call = ran_call()
    outcome = m.RunOutcome(True, None, None, "héllo\n", LABEL)
    assert call.handle(m.Ran(outcome)) == [m.RaiseState(SESSION, LABEL)]
    assert call.phase is Phase.RAISING
    output = "héllo\n".encode()
    assert call.handle(m.StateRaised(RAISED)) == [
        m.Record(
            ResultBody(True, None, LABEL, RAISED, hashlib.sha256(output).hexdigest(), len(output))
        )
    ]
    assert len(output) == 7
    assert call.phase is Phase.RESULT
    assert call.handle(m.Recorded()) == [
        m.Send(Answer(AnswerOutcome.OK, content="héllo\n", label=LABEL)),
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
    call.handle(m.Ran(m.RunOutcome(False, reason, "no such file", "", LABEL)))
    [record] = call.handle(m.StateRaised(RAISED))
    assert record == m.Record(
        ResultBody(False, expected, LABEL, RAISED, hashlib.sha256(b"").hexdigest(), 0)
    )
    assert call.handle(m.Recorded()) == [
        m.Send(Answer(AnswerOutcome.FAILED, expected, "no such file")),
        CLOSE,
    ]


def test_an_unrecorded_result_never_passes_its_content_on() -> None:
    call = ran_call()
    call.handle(m.Ran(m.RunOutcome(True, None, None, "secret", LABEL)))
    call.handle(m.StateRaised(RAISED))
    assert call.handle(m.RecordFailed()) == [
        m.Send(Answer(AnswerOutcome.FAILED, Reason.AUDIT_UNAVAILABLE, AUDIT_UNAVAILABLE_DETAIL)),
        CLOSE,
    ]


def test_a_state_that_cannot_be_raised_is_result_unrecorded_with_no_record() -> None:
    call = ran_call()
    call.handle(m.Ran(m.RunOutcome(True, None, None, "x", LABEL)))
    assert call.handle(m.StateUnrecordable("disk full")) == [
        m.Send(Answer(AnswerOutcome.FAILED, Reason.RESULT_UNRECORDED, RESULT_UNRECORDED_DETAIL)),
        CLOSE,
    ]
    assert "docs/runbook.md" in RESULT_UNRECORDED_DETAIL


@pytest.mark.parametrize("written", [m.Recorded(), m.RecordFailed()])
def test_a_requester_gone_at_the_last_look_runs_nothing(written: m.Event) -> None:
    call = new_call()
    run = run_verdict()
    call.handle(m.Decided(run))
    call.handle(m.Recorded())
    gone = ResultBody(False, Reason.REQUESTER_GONE, FRESH, run.decision.state, None, 0, False)
    assert call.handle(m.Looked(gone=True)) == [m.Record(gone)]
    assert call.phase is Phase.GONE
    assert call.handle(written) == [CLOSE]
    assert call.phase is Phase.DONE


@pytest.mark.parametrize("written", [m.Recorded(), m.RecordFailed()])
def test_a_requester_gone_while_the_tool_runs_closes_the_call_with_nothing_passed_on(
    written: m.Event,
) -> None:
    call = new_call()
    run = run_verdict()
    call.handle(m.Decided(run))
    call.handle(m.Recorded())
    assert call.handle(m.Looked(gone=False)) == [m.RunVerdict(run, approved=False)]
    # The driver stopped the run: no output, no label, the state it was decided on.
    gone = ResultBody(False, Reason.REQUESTER_GONE, FRESH, run.decision.state, None, 0, True)
    assert call.handle(m.RequesterGone()) == [m.Record(gone)]
    assert call.phase is Phase.GONE
    assert call.handle(written) == [CLOSE]
    assert call.phase is Phase.DONE


@pytest.mark.parametrize("written", [m.Recorded(), m.RecordFailed()])
def test_an_approved_run_stopped_by_its_requester_leaving_tells_the_owner(
    written: m.Event,
) -> None:
    call = waiting()
    now = ask_verdict()
    call.handle(m.OwnerApproved(now))
    call.handle(m.Looked(gone=False))
    assert call.handle(m.Recorded()) == [m.RunVerdict(now, approved=True)]
    gone = ResultBody(False, Reason.REQUESTER_GONE, FRESH, now.decision.state, None, 0, True)
    assert call.handle(m.RequesterGone()) == [m.Record(gone)]
    stopped = m.RanReply(False, Reason.REQUESTER_GONE, RUN_STOPPED_DETAIL)
    assert call.handle(written) == [
        m.ReplyAdmin(m.ApprovedReply(ApprovalOutcome.ASK, None, ran=stopped)),
        CLOSE,
    ]
    assert RUN_STOPPED_DETAIL == "its requester left while it ran: the run was stopped"


def test_only_its_end_or_its_requester_leaving_is_taken_while_a_tool_runs() -> None:
    allowed = {m.Ran, m.RequesterGone}
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
    call.handle(m.Decided(ask_verdict()))
    call.handle(m.Recorded())
    closed = call.handle(m.Enqueued(entry(), closed=True))
    assert closed == [body(ApprovalOutcome.WITHDRAWN, "broker_stopping", ApprovalBy.BROKER, STATE)]
    assert call.handle(m.Recorded()) == [m.Send(STOPPING), CLOSE]


@pytest.mark.parametrize(("timeout", "shown"), [(300.0, "300"), (2.5, "2.5")])
def test_expiry_is_recorded_then_denied_expired(timeout: float, shown: str) -> None:
    call = waiting(timeout)
    assert call.handle(m.Expired()) == [
        body(ApprovalOutcome.EXPIRED, "expired", ApprovalBy.EXPIRY, STATE)
    ]
    assert call.phase is Phase.ENDING
    detail = f"no approval within {shown} s"
    assert call.handle(m.Recorded()) == [
        m.Send(Answer(AnswerOutcome.DENIED, Reason.EXPIRED, detail)),
        CLOSE,
    ]


def test_a_stop_while_waiting_is_withdrawn_broker_stopping() -> None:
    call = waiting()
    assert call.handle(m.Stopping()) == [
        body(ApprovalOutcome.WITHDRAWN, "broker_stopping", ApprovalBy.BROKER, STATE)
    ]
    assert call.handle(m.Recorded()) == [m.Send(STOPPING), CLOSE]


@pytest.mark.parametrize("ending", [m.Expired(), m.Stopping()])
def test_an_unrecorded_expiry_or_stop_is_denied_audit_unavailable(ending: m.Event) -> None:
    call = waiting()
    call.handle(ending)
    assert call.handle(m.RecordFailed()) == [m.Send(AUDIT), CLOSE]


@pytest.mark.parametrize("written", [m.Recorded(), m.RecordFailed()])
def test_a_requester_gone_while_waiting_is_withdrawn_and_not_answered(written: m.Event) -> None:
    call = waiting()
    assert call.handle(m.RequesterGone()) == [
        body(ApprovalOutcome.WITHDRAWN, "requester_gone", ApprovalBy.BROKER, STATE)
    ]
    assert call.handle(written) == [CLOSE]


def test_a_refusal_is_recorded_told_to_the_owner_then_answered() -> None:
    call = waiting()
    assert call.handle(m.OwnerRefused("not now")) == [
        body(ApprovalOutcome.REFUSED, "not now", ApprovalBy.OWNER, STATE)
    ]
    assert call.handle(m.Recorded()) == [
        m.ReplyAdmin(m.RefusedReply()),
        m.Send(Answer(AnswerOutcome.DENIED, Reason.REFUSED, "not now")),
        CLOSE,
    ]


def test_an_unrecorded_refusal_tells_the_owner_and_denies_audit_unavailable() -> None:
    call = waiting()
    call.handle(m.OwnerRefused("not now"))
    assert call.handle(m.RecordFailed()) == [
        m.ReplyAdmin(m.NotRecorded(REFUSAL_UNRECORDED)),
        m.Send(AUDIT),
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
    assert call.handle(m.OwnerApproved(now)) == [m.LastLook()]
    assert call.phase is Phase.LOOK_APPROVAL
    state = now.decision.state
    assert call.handle(m.Looked(gone=False)) == [body(outcome, None, ApprovalBy.OWNER, state)]
    assert call.phase is Phase.APPROVAL
    # The owner hears after the run, how it ended (not before it, with nothing to say).
    assert call.handle(m.Recorded()) == [m.RunVerdict(now, approved=approved)]
    assert call.phase is Phase.RUNNING


def test_approve_with_the_requester_gone_is_withdrawn_and_runs_nothing() -> None:
    call = waiting()
    now = ask_verdict()
    call.handle(m.OwnerApproved(now))
    assert call.handle(m.Looked(gone=True)) == [
        body(ApprovalOutcome.WITHDRAWN, "requester_gone", ApprovalBy.OWNER, STATE)
    ]
    assert call.handle(m.Recorded()) == [
        m.ReplyAdmin(m.ApprovedReply(ApprovalOutcome.WITHDRAWN, Reason.REQUESTER_GONE)),
        CLOSE,
    ]


def test_approve_whose_re_decision_denies_takes_no_look_and_answers_its_reason() -> None:
    call = waiting()
    now = verdict("deny")
    assert isinstance(now, Deny)
    assert call.handle(m.OwnerApproved(now)) == [
        body(ApprovalOutcome.DENIED, "denied_by_grant", ApprovalBy.OWNER, STATE)
    ]
    assert call.handle(m.Recorded()) == [
        m.ReplyAdmin(
            m.ApprovedReply(ApprovalOutcome.DENIED, Reason.DENIED_BY_GRANT, now.decision.detail)
        ),
        m.Send(Answer(AnswerOutcome.DENIED, Reason.DENIED_BY_GRANT, now.decision.detail)),
        CLOSE,
    ]


def test_a_re_decision_on_no_state_records_the_unknown_state() -> None:
    call = waiting()
    unusable = verdict("ask", usable=False)
    assert call.handle(m.OwnerApproved(unusable)) == [
        body(ApprovalOutcome.DENIED, "audit_unavailable", ApprovalBy.OWNER, UNKNOWN)
    ]
    call = waiting()
    request = ToolRequest(CALL, SESSION, "read_file", {"path": "notes.txt"})
    unreadable = evaluate(
        request, ledger_usable=True, grants=grants("ask"), state=StateUnreadable("x"), now=NOW
    )
    assert call.handle(m.OwnerApproved(unreadable)) == [
        body(ApprovalOutcome.DENIED, "state_unreadable", ApprovalBy.OWNER, UNKNOWN)
    ]


@pytest.mark.parametrize("redecided", ["ask", "deny"])
def test_an_unrecorded_approval_tells_the_owner_and_denies_audit_unavailable(
    redecided: str,
) -> None:
    call = waiting()
    call.handle(m.OwnerApproved(verdict(redecided)))
    if redecided == "ask":
        call.handle(m.Looked(gone=False))
    assert call.handle(m.RecordFailed()) == [
        m.ReplyAdmin(m.NotRecorded(APPROVAL_UNRECORDED)),
        m.Send(AUDIT),
        CLOSE,
    ]
    assert "docs/runbook.md#audit-unavailable" in APPROVAL_UNRECORDED
    assert "docs/runbook.md#audit-unavailable" in REFUSAL_UNRECORDED


def approved_and_ran(outcome: m.RunOutcome) -> Call:
    call = waiting()
    call.handle(m.OwnerApproved(ask_verdict()))
    call.handle(m.Looked(gone=False))
    call.handle(m.Recorded())
    assert call.handle(m.Ran(outcome)) == [m.RaiseState(SESSION, LABEL)]
    return call


def test_an_approved_call_runs_on_as_a_run_does_and_tells_the_owner_how_it_ended() -> None:
    call = approved_and_ran(m.RunOutcome(True, None, None, "x", LABEL))
    assert [type(effect) for effect in call.handle(m.StateRaised(STATE))] == [m.Record]
    ok = m.ApprovedReply(ApprovalOutcome.ASK, None, ran=m.RanReply(True))
    assert call.handle(m.Recorded()) == [
        m.ReplyAdmin(ok),
        m.Send(Answer(AnswerOutcome.OK, content="x", label=LABEL)),
        CLOSE,
    ]


def test_an_approved_call_that_failed_tells_the_owner_its_reason() -> None:
    call = approved_and_ran(m.RunOutcome(False, Reason.NOT_FOUND, "gone", "", LABEL))
    call.handle(m.StateRaised(STATE))
    failed = m.RanReply(False, Reason.NOT_FOUND, "gone")
    assert call.handle(m.Recorded())[0] == m.ReplyAdmin(
        m.ApprovedReply(ApprovalOutcome.ASK, None, ran=failed)
    )
    call = approved_and_ran(m.RunOutcome(True, None, None, "x", LABEL))
    call.handle(m.StateRaised(STATE))
    unrecorded = m.RanReply(False, Reason.AUDIT_UNAVAILABLE, AUDIT_UNAVAILABLE_DETAIL)
    assert call.handle(m.RecordFailed())[0] == m.ReplyAdmin(
        m.ApprovedReply(ApprovalOutcome.ASK, None, ran=unrecorded)
    )
    call = approved_and_ran(m.RunOutcome(True, None, None, "x", LABEL))
    effects = call.handle(m.StateUnrecordable("disk full"))
    assert effects[0] == m.ReplyAdmin(
        m.ApprovedReply(
            ApprovalOutcome.ASK,
            None,
            ran=m.RanReply(False, Reason.RESULT_UNRECORDED, m.RESULT_UNRECORDED_DETAIL),
        )
    )


def test_an_auto_run_tells_no_admin() -> None:
    call = new_call()
    call.handle(m.Decided(run_verdict()))
    call.handle(m.Recorded())
    call.handle(m.Looked(gone=False))
    call.handle(m.Ran(m.RunOutcome(True, None, None, "x", LABEL)))
    call.handle(m.StateRaised(STATE))
    assert not any(isinstance(e, m.ReplyAdmin) for e in call.handle(m.Recorded()))


# --- what the table refuses, and the rules beside it -----------------------------------


EVENTS: Final[list[m.Event]] = [
    m.Reused(),
    m.Stopping(),
    m.Decided(verdict(None)),
    m.Recorded(),
    m.RecordFailed(),
    m.Enqueued(entry()),
    m.Looked(gone=False),
    m.OwnerApproved(verdict(None)),
    m.OwnerRefused("no"),
    m.Expired(),
    m.RequesterGone(),
    m.Ran(m.RunOutcome(True, None, None, "", LABEL)),
    m.StateRaised(STATE),
    m.StateUnrecordable("x"),
]


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: type(e).__name__)
def test_no_event_is_taken_once_the_call_is_done(event: m.Event) -> None:
    call = new_call()
    call.handle(m.Reused())
    with pytest.raises(IllegalEvent, match=f"{type(event).__name__} is not expected in phase"):
        call.handle(event)
    assert call.phase is Phase.DONE


def test_only_an_ending_or_an_approve_is_taken_while_waiting() -> None:
    allowed = {m.Expired, m.Stopping, m.RequesterGone, m.OwnerRefused, m.OwnerApproved}
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


def test_a_late_owner_answer_hears_expired_only_after_an_expiry() -> None:
    assert m.late_owner_answer("a-00000001", m.EarlierEnd.EXPIRED) == (
        "expired",
        "approval a-00000001 expired",
    )
    assert m.late_owner_answer("a-00000001", None) == (
        "no_such_approval",
        "no pending approval a-00000001",
    )


def test_due_is_at_or_after_the_deadline() -> None:
    assert not m.due(400.0, 399.999)
    assert m.due(400.0, 400.0)
    assert m.due(400.0, 400.5)
    assert entry().is_expired(400.0)
    assert not entry().is_expired(399.999)
