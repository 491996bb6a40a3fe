"""core/vocabulary.py: each named constructor, field by field, against the value spelled
out (the machine's tests compare the machine with these constructors, so they are
pinned here on their own); the frames' and records' bytes are tests/test_wire.py's and
tests/ledger/'s."""

from __future__ import annotations

import datetime as dt
import hashlib
from typing import Final

import pytest

from boxmaker.core.approvals import GrantRef, PendingEntry
from boxmaker.core.decide import Ask, Ruling, evaluate
from boxmaker.core.grant_parse import parse_grants
from boxmaker.core.grants import GrantSet
from boxmaker.core.labels import FRESH, Label, Taint
from boxmaker.core.reasons import Reason
from boxmaker.core.vocabulary import (
    Answer,
    AnswerOutcome,
    Approval,
    ApprovalBy,
    ApprovalOutcome,
    Decision,
    Pending,
    Result,
    ResultStatus,
    ToolRequest,
    VerdictCode,
    to_ms,
)
from boxmaker.formats.convert import InvalidField

CALL: Final = "c-0000000000000001"
SESSION: Final = "s-0000000000a1"
REQUESTED: Final = dt.datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=dt.UTC)
STATE: Final = Label(Taint.INTERNAL, True)
LABEL: Final = Label(Taint.SECRET, False)


def ask() -> Ask:
    grants = parse_grants('[[grant]]\nid = "g"\ntool = "read_file"\nmode = "ask"\nnote = "why"\n')
    assert isinstance(grants, GrantSet)
    request = ToolRequest(
        call=CALL, session=SESSION, tool="read_file", arguments={"path": "notes.txt"}
    )
    verdict = evaluate(request, ledger_usable=True, grants=grants, state=STATE, now=REQUESTED)
    assert isinstance(verdict, Ask)
    return verdict


def entry() -> PendingEntry:
    return PendingEntry.for_ask(
        ask(), approval="a-00000001", requested_at=REQUESTED, now=100.0, timeout=300.0
    )


def test_an_ask_s_entry_is_its_call_grant_and_state() -> None:
    made = entry()
    assert made == PendingEntry(
        approval="a-00000001",
        call=CALL,
        session=SESSION,
        tool="read_file",
        arguments={"path": "notes.txt"},
        grant=GrantRef(id="g", mode="ask", note="why"),
        requested_at=REQUESTED,
        expires_at_wall=REQUESTED + dt.timedelta(seconds=300),
        deadline=400.0,
        taint=Taint.INTERNAL,
        untrusted=True,
    )
    # Shared, not copied: thousands of entries may wait.
    asked = ask()
    shared = PendingEntry.for_ask(asked, approval="a-1", requested_at=REQUESTED, now=0, timeout=1)
    assert shared.arguments is asked.decision.arguments


def test_the_pending_frame_names_the_entry_s_call_approval_grant_and_expiry() -> None:
    assert Pending.of(entry()) == Pending(
        call=CALL,
        approval="a-00000001",
        grant="g",
        expires_at=dt.datetime(2026, 1, 1, 12, 5, 0, 123000, tzinfo=dt.UTC),
    )


def test_the_answers() -> None:
    assert Answer.ok(CALL, "hi", LABEL) == Answer(
        call=CALL, outcome=AnswerOutcome.OK, content="hi", label=LABEL
    )
    assert Answer.denied(CALL, Reason.NO_GRANT, "none") == Answer(
        call=CALL, outcome=AnswerOutcome.DENIED, reason=Reason.NO_GRANT, detail="none"
    )
    assert Answer.failed(CALL, Reason.TOOL_ERROR) == Answer(
        call=CALL, outcome=AnswerOutcome.FAILED, reason=Reason.TOOL_ERROR
    )
    with pytest.raises(InvalidField, match="required"):
        Answer(call=CALL, outcome=AnswerOutcome.DENIED)
    with pytest.raises(InvalidField, match="must be absent when ok"):
        Answer(call=CALL, outcome=AnswerOutcome.OK, reason=Reason.NO_GRANT)


def test_a_decision_record_keeps_all_of_the_ruling_but_its_words() -> None:
    ruling = Ruling(
        call=CALL,
        session=SESSION,
        tool="read_file",
        arguments={"path": "notes.txt"},
        verdict=VerdictCode.DENY,
        reason=Reason.DENIED_BY_GRANT,
        detail="grant g denies it",
        grant="g",
        note="why",
        state=STATE,
    )
    record = Decision.of(ruling, "b-1")
    assert record == Decision(
        call=CALL,
        session=SESSION,
        tool="read_file",
        arguments={"path": "notes.txt"},
        verdict=VerdictCode.DENY,
        reason=Reason.DENIED_BY_GRANT,
        grant="g",
        taint=Taint.INTERNAL,
        untrusted=True,
        boot="b-1",
    )
    assert record.arguments is not ruling.arguments


def test_an_approval_record_is_its_entry_s_ending_on_a_state() -> None:
    approved = Approval.of(
        entry(), ApprovalOutcome.ASK, None, ApprovalBy.OWNER, LABEL, grant_written="g-2"
    )
    assert approved == Approval(
        call=CALL,
        approval="a-00000001",
        outcome=ApprovalOutcome.ASK,
        reason=None,
        by=ApprovalBy.OWNER,
        taint=Taint.SECRET,
        untrusted=False,
        grant_written="g-2",
    )
    expired = Approval.of(entry(), ApprovalOutcome.EXPIRED, "expired", ApprovalBy.EXPIRY, STATE)
    assert (expired.reason, expired.by, expired.taint, expired.untrusted) == (
        "expired",
        ApprovalBy.EXPIRY,
        Taint.INTERNAL,
        True,
    )
    assert expired.grant_written is None


def test_a_run_s_result_hashes_its_output_and_carries_the_state_after() -> None:
    content = "héllo\n"
    assert Result.of_run(
        CALL, ok=True, reason=None, label=LABEL, content=content, after=STATE
    ) == Result(
        call=CALL,
        status=ResultStatus.OK,
        reason=None,
        label=LABEL,
        taint_after=Taint.INTERNAL,
        untrusted_after=True,
        output_sha256=hashlib.sha256(content.encode()).hexdigest(),
        output_bytes=7,
        stopped=False,
    )
    failed = Result.of_run(
        CALL, ok=False, reason=Reason.NOT_FOUND, label=FRESH, content="", after=FRESH
    )
    assert (failed.status, failed.reason, failed.output_bytes) == (
        ResultStatus.FAILED,
        Reason.NOT_FOUND,
        0,
    )


@pytest.mark.parametrize("stopped", [False, True])
def test_a_requester_gone_result_has_no_output_and_no_label(stopped: bool) -> None:
    assert Result.requester_gone(CALL, STATE, stopped=stopped) == Result(
        call=CALL,
        status=ResultStatus.FAILED,
        reason=Reason.REQUESTER_GONE,
        label=FRESH,
        taint_after=Taint.INTERNAL,
        untrusted_after=True,
        output_sha256=None,
        output_bytes=0,
        stopped=stopped,
    )


def test_a_time_is_carried_in_utc_to_the_millisecond() -> None:
    east = dt.timezone(dt.timedelta(hours=2))
    carried = to_ms(dt.datetime(2026, 1, 1, 14, 0, 0, 999999, tzinfo=east))
    assert carried == dt.datetime(2026, 1, 1, 12, 0, 0, 999000, tzinfo=dt.UTC)
    assert carried.tzinfo is dt.UTC  # not the machine's own zone, even where that is UTC
    with pytest.raises(ValueError, match=r"^a time without a zone$"):
        to_ms(dt.datetime(2026, 1, 1))


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("call", "c-1", "call: expected c- and 16 hex digits"),
        ("call", 7, "call: expected c- and 16 hex digits"),
        ("session", "s-0000000000a1x", "session: expected s- and 12 hex digits"),
    ],
)
def test_a_request_s_ids_are_checked(field: str, value: object, expected: str) -> None:
    fields: dict[str, object] = {"call": CALL, "session": SESSION, field: value}
    with pytest.raises(InvalidField) as raised:
        ToolRequest(tool="read_file", arguments={}, **fields)  # type: ignore[arg-type]
    assert (raised.value.name, str(raised.value)) == (field, expected)


def test_a_pending_frame_s_approval_id_is_checked() -> None:
    with pytest.raises(InvalidField) as raised:
        Pending(call=CALL, approval="a-1", grant="g", expires_at=REQUESTED)
    assert (raised.value.name, str(raised.value)) == (
        "approval",
        "approval: expected a- and 8 hex digits",
    )
