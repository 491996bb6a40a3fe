"""An answer from the MCP client's own prompt (core/client_answer.py, core/call.py): when it
counts, and the approval record of every way it can end a call, field by field."""

from __future__ import annotations

from typing import Final

import pytest
from tests.core.test_call import BOOT, CALL, NOW, SESSION, STATE

from boxmaker.core import call_events as ev
from boxmaker.core.approvals import PendingEntry
from boxmaker.core.call import Call
from boxmaker.core.call_phases import Phase
from boxmaker.core.client_answer import client_approver, client_refusal, not_counted
from boxmaker.core.decide import Ask, Deny, Run, Verdict, evaluate
from boxmaker.core.grant_parse import parse_grants
from boxmaker.core.grants import GrantSet
from boxmaker.core.labels import FRESH, Label, Taint
from boxmaker.core.reasons import Reason
from boxmaker.core.vocabulary import (
    Answer,
    Approval,
    ApprovalBy,
    ApprovalOutcome,
    Decision,
    Pending,
    ToolRequest,
)

APPROVER: Final = "mcp-client:Claude Code"
REQUEST: Final = ToolRequest(
    call=CALL, session=SESSION, tool="read_file", arguments={"path": "notes.txt"}
)


def grant_set(mode: str, approvers: str | None) -> GrantSet:
    text = f'[[grant]]\nid = "g"\ntool = "read_file"\nmode = "{mode}"\n'
    if approvers is not None:
        text += f"approvers = {approvers}\n"
    parsed = parse_grants(text)
    assert isinstance(parsed, GrantSet), parsed
    return parsed


OPTS_IN: Final = '["owner", "mcp-client"]'


def decided(mode: str, approvers: str | None = OPTS_IN, state: Label = STATE) -> Verdict:
    return evaluate(
        REQUEST,
        ledger_usable=True,
        grants=grant_set(mode, approvers),
        state=state,
        now=NOW,
        workspace="/w",
    )


def waiting(approvers: str | None = OPTS_IN) -> tuple[Call, PendingEntry]:
    call = Call(CALL, SESSION, boot=BOOT, pending_timeout=300.0)
    ask = decided("ask", approvers)
    assert isinstance(ask, Ask)
    call.handle(ev.Decided(ask))
    call.handle(ev.Recorded())
    entry = PendingEntry.for_ask(ask, approval="a-00000001", requested_at=NOW, now=0, timeout=300)
    [send, _] = call.handle(ev.Enqueued(entry))
    assert isinstance(send, ev.Send)
    assert isinstance(send.frame, Pending)
    assert send.frame.approvers == entry.approvers == ask.grant.approvers
    return call, entry


def approval(outcome: ApprovalOutcome, reason: str | None, state: Label) -> ev.AppendRecord:
    return ev.AppendRecord(
        Approval(
            CALL,
            "a-00000001",
            outcome,
            reason,
            ApprovalBy.MCP_CLIENT,
            state.taint,
            state.untrusted,
            approver=APPROVER,
        )
    )


# --- the pending frame says who may answer ----------------------------------------------


@pytest.mark.parametrize(
    ("approvers", "shown"),
    [(None, ("owner",)), ('["owner"]', ("owner",)), (OPTS_IN, ("owner", "mcp-client"))],
)
def test_the_entry_and_its_pending_frame_carry_the_asking_grants_approvers(
    approvers: str | None, shown: tuple[str, ...]
) -> None:
    _, entry = waiting(approvers)
    assert entry.approvers == shown
    assert Pending.of(entry).approvers == shown


# --- when it counts ---------------------------------------------------------------------


def test_it_counts_for_this_call_where_both_grants_opt_in() -> None:
    _, entry = waiting()
    assert not_counted(entry, "a-00000001", None) is None
    assert not_counted(entry, "a-00000001", decided("ask")) is None


def test_an_answer_for_another_approval_never_counts() -> None:
    _, entry = waiting()
    assert not_counted(entry, "a-00000002", decided("ask")) == (
        "approval a-00000002 is not this call's (a-00000001)"
    )


@pytest.mark.parametrize("approvers", [None, '["owner"]'])
def test_a_grant_that_does_not_opt_in_turns_it_away(approvers: str | None) -> None:
    _, entry = waiting(approvers)
    assert not_counted(entry, "a-00000001", decided("ask")) == (
        'grant g does not let the MCP client answer (approvers = ["owner"])'
    )


def test_a_grant_that_no_longer_opts_in_when_it_answers_turns_it_away() -> None:
    _, entry = waiting()
    assert not_counted(entry, "a-00000001", decided("ask", None)) == (
        'grant g, which asks now, does not let the MCP client answer (approvers = ["owner"])'
    )


@pytest.mark.parametrize("mode", ["auto", "deny"])
def test_a_re_decision_that_runs_or_denies_does_not_rest_on_the_answer(mode: str) -> None:
    _, entry = waiting()
    now = decided(mode, None, state=FRESH)
    assert isinstance(now, Run | Deny)
    assert not_counted(entry, "a-00000001", now) is None


def test_the_approver_and_the_refusal_name_the_client() -> None:
    assert client_approver("Claude Code") == APPROVER
    assert client_refusal("Claude Code") == "refused in the MCP client Claude Code"


# --- every ending it can give, as recorded ----------------------------------------------


@pytest.mark.parametrize(
    ("mode", "state", "outcome", "approved"),
    [
        ("ask", Label(Taint.SECRET, True), ApprovalOutcome.ASK, True),
        ("auto", FRESH, ApprovalOutcome.ALLOWED, False),
    ],
)
def test_a_client_approve_looks_last_records_the_client_then_runs(
    mode: str, state: Label, outcome: ApprovalOutcome, approved: bool
) -> None:
    call, _ = waiting()
    now = decided(mode, OPTS_IN if mode == "ask" else None, state=state)
    assert isinstance(now, Run | Ask)
    assert call.handle(ev.OwnerApproved(now, approver=APPROVER)) == [ev.LastLook()]
    assert call.handle(ev.Looked(gone=False)) == [approval(outcome, None, state)]
    # Nobody at admin.sock to tell: the driver's reply port has no channel for it.
    assert call.handle(ev.Recorded()) == [ev.RunVerdict(now, approved=approved)]
    assert call.phase is Phase.RUNNING


def test_a_client_approve_whose_requester_left_is_withdrawn_with_the_client_named() -> None:
    call, _ = waiting()
    now = decided("ask")
    call.handle(ev.OwnerApproved(now, approver=APPROVER))
    assert call.handle(ev.Looked(gone=True)) == [
        approval(ApprovalOutcome.WITHDRAWN, "requester_gone", STATE)
    ]


def test_a_client_approve_whose_re_decision_denies_records_the_client() -> None:
    call, _ = waiting()
    now = decided("deny", None)
    assert isinstance(now, Deny)
    assert call.handle(ev.OwnerApproved(now, approver=APPROVER)) == [
        approval(ApprovalOutcome.DENIED, "denied_by_grant", STATE)
    ]
    effects = call.handle(ev.Recorded())
    assert ev.Send(Answer.denied(CALL, Reason.DENIED_BY_GRANT, now.decision.detail)) in effects


def test_a_client_refusal_is_recorded_with_the_client_and_told_to_the_model() -> None:
    call, _ = waiting()
    reason = client_refusal("Claude Code")
    assert call.handle(ev.OwnerRefused(reason, approver=APPROVER)) == [
        approval(ApprovalOutcome.REFUSED, reason, STATE)
    ]
    assert call.handle(ev.Recorded())[1:] == [
        ev.Send(Answer.denied(CALL, Reason.REFUSED, reason)),
        ev.Close(),
    ]


def test_the_owners_answers_still_record_no_approver() -> None:
    call, _ = waiting()
    [record] = call.handle(ev.OwnerRefused("no"))
    assert isinstance(record, ev.AppendRecord)
    assert isinstance(record.body, Approval)
    assert (record.body.by, record.body.approver) == (ApprovalBy.OWNER, None)
    call, _ = waiting()
    call.handle(ev.OwnerApproved(decided("ask")))
    [record] = call.handle(ev.Looked(gone=False))
    assert isinstance(record, ev.AppendRecord)
    assert isinstance(record.body, Approval)
    assert (record.body.by, record.body.approver) == (ApprovalBy.OWNER, None)


def test_the_decision_record_is_the_same_whoever_may_answer() -> None:
    ask = decided("ask")
    owner_only = decided("ask", None)
    assert Decision.of(ask.decision, BOOT) == Decision.of(owner_only.decision, BOOT)
