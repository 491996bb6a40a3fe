"""Streaming verification: each check, each call state, and the report."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest

from boxmaker.core.labels import Label, Taint
from boxmaker.core.reasons import Reason
from boxmaker.ledger.records import (
    GENESIS_PREV,
    Approval,
    ApprovalBy,
    ApprovalOutcome,
    Body,
    Decision,
    Genesis,
    Repair,
    Result,
    ResultStatus,
    Start,
    Stop,
    VerdictCode,
    encode_line,
    line_hash,
)
from boxmaker.ledger.verify import CallCounts, Problem, Report, verify_lines
from boxmaker.ledger.verify_files import verify_file

AT = "2026-01-02T03:04:05.678Z"


def decision(call: str, verdict: str, boot: str = "b-1") -> Decision:
    return Decision(
        call=call,
        session="s-000000000001",
        tool="read_file",
        arguments={"path": "notes.txt"},
        verdict=VerdictCode(verdict),
        reason=Reason.NO_GRANT if verdict == "deny" else None,
        grant=None if verdict == "deny" else "read-notes",
        taint=Taint.PUBLIC,
        untrusted=False,
        boot=boot,
    )


def approval(call: str, outcome: str) -> Approval:
    return Approval(
        call=call,
        approval="a-00000001",
        outcome=ApprovalOutcome(outcome),
        reason=None,
        by=ApprovalBy.OWNER,
        taint=Taint.PUBLIC,
        untrusted=False,
    )


def result(
    call: str, status: str = "ok", reason: Reason | None = None, *, stopped: bool = False
) -> Result:
    return Result(
        call=call,
        status=ResultStatus(status),
        reason=reason,
        label=Label(Taint.INTERNAL, False),
        taint_after=Taint.INTERNAL,
        untrusted_after=False,
        output_sha256="00" * 32,
        output_bytes=3,
        stopped=stopped,
    )


def chain(bodies: Iterable[Body], *, genesis: bool = True) -> list[bytes]:
    """Lines (without newline) of a ledger holding these bodies after a genesis."""
    all_bodies = [Genesis(ledger="l-1"), *bodies] if genesis else list(bodies)
    lines: list[bytes] = []
    prev = GENESIS_PREV
    for seq, body in enumerate(all_bodies):
        line = encode_line(seq, AT, prev, body)
        prev = line_hash(line)
        lines.append(line)
    return lines


def check(lines: list[bytes], expect_head: str | None = None) -> Report:
    return verify_lines([line + b"\n" for line in lines], expect_head)


def relink(lines: list[bytes]) -> list[bytes]:
    """Re-chain hand-edited lines so that only the edit under test is wrong."""
    import orjson

    out: list[bytes] = []
    prev = GENESIS_PREV
    for line in lines:
        fields = orjson.loads(line)
        fields["prev"] = prev
        new = orjson.dumps(fields, option=orjson.OPT_SORT_KEYS)
        prev = line_hash(new)
        out.append(new)
    return out


def test_empty_input_is_an_empty_sound_report() -> None:
    assert verify_lines([]) == Report(problems=(), records=0, head=None, calls=CallCounts())


def test_a_sound_ledger_reports_records_head_and_states() -> None:
    lines = chain(
        [
            Start(boot="b-1", version="0.1.0"),
            decision("c-1", "run"),
            result("c-1"),
            decision("c-2", "deny"),
        ]
    )
    report = check(lines)
    assert report.problems == ()
    assert report.sound
    assert report.records == 5
    assert report.head == f"4:{line_hash(lines[4])}"
    assert report.calls == CallCounts(complete=1, denied=1)
    assert report.calls.total == 2


def test_verify_file_reads_the_file(tmp_path: Path) -> None:
    lines = chain([decision("c-1", "deny")])
    path = tmp_path / "audit.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    report = verify_file(path, expect_head=f"1:{line_hash(lines[1])}")
    assert report.sound
    assert report.records == 2


def test_verify_file_passes_io_errors_on(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        verify_file(tmp_path / "missing.jsonl")


# -- chain checks ------------------------------------------------------------------------


def test_not_json_names_its_seq_and_the_chain_goes_on() -> None:
    lines = chain([Stop(boot="b"), Stop(boot="b")])
    lines[1] = b"{not json"
    report = check(lines)
    assert report.problems == (
        Problem(1, "not valid JSON"),
        # The last line, with no head to vouch for it: either may have changed.
        Problem(
            1, "seq 1 was changed (its hash is not what seq 2 names as prev), or seq 2's prev was"
        ),
    )


def test_not_an_object() -> None:
    lines = chain([])
    lines.append(b"[1, 2]")
    assert check(lines).problems == (Problem(1, "not a JSON object"),)


def test_missing_common_fields_are_named() -> None:
    lines = chain([])
    lines.append(b'{"kind":"stop","boot":"b","prev":"x"}')
    assert check(lines).problems == (Problem(1, "missing seq, at"),)


def test_seq_gap_is_one_problem_not_a_cascade() -> None:
    lines = chain([Stop(boot="b")] * 4)
    del lines[2]
    problems = check(lines).problems
    assert problems[0] == Problem(2, "seq 3 where 2 was expected")
    assert [p.seq for p in problems] == [2, 3]  # seq, then the broken prev link, once


def test_seq_of_the_wrong_type() -> None:
    lines = relink(
        [
            *chain([]),
            b'{"seq":true,"at":"'
            + AT.encode()
            + b'","kind":"repair","prev":"","file":"f","sha256":"s"}',
        ]
    )
    assert check(lines).problems == (Problem(1, "seq True where 1 was expected"),)


def test_first_prev_must_be_zeros() -> None:
    lines = chain([], genesis=False)
    lines = [encode_line(0, AT, "1" * 64, Genesis(ledger="l"))]
    assert check(lines).problems == (
        Problem(0, f"prev does not match the hash of the line before ({'0' * 12}…)"),
    )


def test_at_must_be_a_string() -> None:
    lines = chain([])
    lines.append(
        b'{"seq":1,"at":5,"kind":"stop","boot":"b","prev":"' + line_hash(lines[0]).encode() + b'"}'
    )
    assert check(lines).problems == (Problem(1, "at 5 is not a UTC time"),)


def test_genesis_first_and_only_first() -> None:
    assert check(chain([Stop(boot="b")], genesis=False)).problems == (
        Problem(0, "the first record is 'stop', not genesis"),
    )
    assert check(chain([Genesis(ledger="l-2")])).problems == (
        Problem(1, "a genesis record after the first"),
    )


def test_first_line_not_json_also_lacks_genesis() -> None:
    assert [p.what for p in verify_lines([b"xx\n"]).problems] == [
        "the first record is None, not genesis",
        "not valid JSON",
    ]


def test_a_genesis_without_its_ledger_id_is_a_problem_not_a_crash() -> None:
    line = chain([])[0].replace(b'"ledger"', b'"ledgez"')
    assert check([line]).problems == (Problem(0, "genesis with ledger id None"),)
    line = chain([])[0].replace(b'"l-1"', b"5")
    assert check([line]).problems == (Problem(0, "genesis with ledger id 5"),)


def test_unknown_kind() -> None:
    lines = relink([*chain([]), b'{"seq":1,"at":"x","kind":"party","prev":""}'])
    assert check(lines).problems == (Problem(1, "unknown kind 'party'"),)


def test_repair_records_are_known() -> None:
    assert check(chain([Repair(file="torn-x.bin", sha256="00" * 32)])).sound


def test_torn_last_line_without_newline() -> None:
    lines = chain([Stop(boot="b")])
    report = verify_lines([lines[0] + b"\n", lines[1]])
    assert report.problems == (Problem(1, "torn last line (no newline)"),)
    assert report.head == f"1:{line_hash(lines[1])}"


def test_torn_last_line_cut_short() -> None:
    lines = chain([Stop(boot="b")])
    report = verify_lines([lines[0] + b"\n", lines[1][:10]])
    assert report.problems == (
        Problem(1, "not valid JSON"),
        Problem(1, "torn last line (no newline)"),
    )
    assert report.head == f"1:{line_hash(lines[1][:10])}"


def test_expect_head_found_and_matching() -> None:
    lines = chain([Stop(boot="b")] * 3)
    assert check(lines, expect_head=f"2:{line_hash(lines[2])}").sound


def test_expect_head_replaced() -> None:
    lines = chain([Stop(boot="b")] * 3)
    other = chain([Stop(boot="c")] * 3)
    report = check(other, expect_head=f"2:{line_hash(lines[2])}")
    assert report.problems == (
        Problem(2, f"line hash differs from the expected head 2:{line_hash(lines[2])}"),
    )


def test_expect_head_truncated() -> None:
    lines = chain([Stop(boot="b")] * 3)
    head = f"3:{line_hash(lines[3])}"
    assert check(lines[:3], expect_head=head).problems == (
        Problem(3, f"the expected head {head} is not in the ledger (truncated?)"),
    )


def test_expect_head_must_be_well_formed() -> None:
    with pytest.raises(ValueError, match="a head is"):
        check(chain([]), expect_head="1:xyz")


def test_problems_are_capped_and_counted() -> None:
    lines = [b"x\n"] * 10
    report = verify_lines(lines, max_problems=3)
    assert len(report.problems) == 3
    assert report.problems_left_out == 11 - 3  # 10 not-JSON, 1 genesis
    assert not report.sound


# -- call order --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bodies", "what"),
    [
        ([approval("c-1", "ask")], "approval for call c-1 with no open decision"),
        ([result("c-1")], "result for call c-1 with no open decision"),
        (
            [decision("c-1", "run"), approval("c-1", "ask")],
            "approval for call c-1 whose verdict was run, not ask",
        ),
        ([decision("c-1", "ask"), result("c-1")], "result for call c-1 before its approval"),
        (
            [decision("c-1", "deny"), approval("c-1", "ask")],
            "approval for call c-1 with no open decision",
        ),
        ([decision("c-1", "deny"), result("c-1")], "result for call c-1 with no open decision"),
        (
            [decision("c-1", "ask"), approval("c-1", "ask"), approval("c-1", "ask")],
            "a second approval for call c-1",
        ),
        (
            [decision("c-1", "ask"), approval("c-1", "refused"), result("c-1")],
            "result for call c-1 with no open decision",
        ),
        (
            [decision("c-1", "ask"), approval("c-1", "expired"), approval("c-1", "ask")],
            "approval for call c-1 with no open decision",
        ),
        (
            [decision("c-1", "run"), result("c-1"), result("c-1")],
            "result for call c-1 with no open decision",
        ),
        (
            [decision("c-1", "run"), decision("c-1", "run")],
            "a second decision for call c-1 while it is open",
        ),
    ],
)
def test_illegal_orders(bodies: list[Body], what: str) -> None:
    lines = chain(bodies)
    problems = check(lines).problems
    assert len(problems) == 1
    assert problems[0].seq == len(bodies)
    assert problems[0].what.startswith(what)


@pytest.mark.parametrize(
    ("edit", "what"),
    [
        (
            (b'"verdict":"run"', b'"verdict":"yes"'),
            "decision for call c-1 with unknown verdict 'yes'",
        ),
        ((b'"call":"c-1"', b'"call":7'), "decision with call id 7"),
        (
            (b'"verdict":"run"', b'"verdict":["run"]'),
            "decision for call c-1 with unknown verdict ['run']",
        ),
        ((b',"verdict":"run"', b""), "decision record without 'verdict'"),
    ],
)
def test_bad_decisions(edit: tuple[bytes, bytes], what: str) -> None:
    lines = chain([decision("c-1", "run")])
    lines[1] = lines[1].replace(*edit)
    assert check(relink(lines)).problems == (Problem(1, what),)


@pytest.mark.parametrize(
    ("edit", "what"),
    [
        (
            (b'"outcome":"ask"', b'"outcome":"maybe"'),
            "approval for call c-1 with unknown outcome 'maybe'",
        ),
        (
            (b'"outcome":"ask"', b'"outcome":["x"]'),
            "approval record with a field of the wrong type",
        ),
        ((b'"call":"c-1"', b'"call":["c-1"]'), "approval record with a field of the wrong type"),
    ],
)
def test_bad_approvals(edit: tuple[bytes, bytes], what: str) -> None:
    lines = chain([decision("c-1", "ask"), approval("c-1", "ask")])
    lines[2] = lines[2].replace(*edit)
    problems = check(relink(lines)).problems
    assert problems == (Problem(2, what),)


def test_bad_result_status() -> None:
    lines = chain([decision("c-1", "run"), result("c-1")])
    lines[2] = lines[2].replace(b'"status":"ok"', b'"status":"fine"')
    assert check(relink(lines)).problems == (
        Problem(2, "result for call c-1 with unknown status 'fine'"),
    )


def test_a_call_id_may_be_reused_once_its_call_ended() -> None:
    # The documented trade-off: finished calls are forgotten.
    lines = chain([decision("c-1", "deny"), decision("c-1", "run"), result("c-1")])
    report = check(lines)
    assert report.sound
    assert report.calls == CallCounts(complete=1, denied=1)


# -- call states -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bodies", "counts"),
    [
        ([decision("c-1", "run"), result("c-1")], CallCounts(complete=1)),
        (
            [decision("c-1", "run"), result("c-1", "failed", Reason.TOOL_ERROR)],
            CallCounts(complete=1),
        ),
        (
            [decision("c-1", "run"), result("c-1", "failed", Reason.REQUESTER_GONE)],
            CallCounts(withdrawn=1),
        ),
        (
            # It ran, and was stopped when its requester left: not "nothing ran".
            [decision("c-1", "run"), result("c-1", "failed", Reason.REQUESTER_GONE, stopped=True)],
            CallCounts(complete=1),
        ),
        ([decision("c-1", "ask"), approval("c-1", "ask"), result("c-1")], CallCounts(complete=1)),
        (
            [decision("c-1", "ask"), approval("c-1", "allowed"), result("c-1")],
            CallCounts(complete=1),
        ),
        ([decision("c-1", "deny")], CallCounts(denied=1)),
        ([decision("c-1", "ask"), approval("c-1", "denied")], CallCounts(denied=1)),
        ([decision("c-1", "ask"), approval("c-1", "refused")], CallCounts(refused=1)),
        ([decision("c-1", "ask"), approval("c-1", "expired")], CallCounts(expired=1)),
        ([decision("c-1", "ask"), approval("c-1", "withdrawn")], CallCounts(withdrawn=1)),
        ([decision("c-1", "ask")], CallCounts(pending=1)),
        ([decision("c-1", "run")], CallCounts(running=1)),
        ([decision("c-1", "ask"), approval("c-1", "ask")], CallCounts(running=1)),
        ([decision("c-1", "ask"), approval("c-1", "allowed")], CallCounts(running=1)),
    ],
)
def test_each_call_state(bodies: list[Body], counts: CallCounts) -> None:
    report = check(chain([Start(boot="b-1", version="v"), *bodies]))
    assert report.sound
    assert report.calls == counts


def test_open_calls_of_an_earlier_boot_are_unfinished() -> None:
    bodies: list[Body] = [
        Start(boot="b-1", version="v"),
        decision("c-1", "run", boot="b-1"),
        decision("c-2", "ask", boot="b-1"),
        decision("c-3", "ask", boot="b-1"),
        approval("c-3", "allowed"),
        Start(boot="b-2", version="v"),
        decision("c-4", "run", boot="b-2"),
        decision("c-5", "ask", boot="b-2"),
    ]
    report = check(chain(bodies))
    assert report.calls == CallCounts(pending=1, running=1, unfinished=3)
    # Every call without an end, whatever its boot: brokerd refuses these ids at start.
    assert report.open_calls == {"c-1", "c-2", "c-3", "c-4", "c-5"}


def test_ended_calls_are_not_open() -> None:
    bodies: list[Body] = [
        decision("c-1", "deny"),
        decision("c-2", "ask"),
        approval("c-2", "refused"),
        decision("c-3", "run"),
        result("c-3"),
        decision("c-4", "ask"),
    ]
    assert check(chain(bodies)).open_calls == {"c-4"}


def test_a_stopped_newest_boot_leaves_its_open_calls_unfinished() -> None:
    bodies: list[Body] = [
        Start(boot="b-1", version="v"),
        decision("c-1", "run"),
        decision("c-2", "ask"),
        Stop(boot="b-1"),
    ]
    assert check(chain(bodies)).calls == CallCounts(unfinished=2)


def test_a_stop_of_another_boot_does_not_end_the_newest() -> None:
    bodies: list[Body] = [
        Start(boot="b-2", version="v"),
        decision("c-1", "run", boot="b-2"),
        Stop(boot="b-1"),
    ]
    assert check(chain(bodies)).calls == CallCounts(running=1)


def test_without_start_records_the_ledger_is_one_boot() -> None:
    assert check(chain([decision("c-1", "run"), decision("c-2", "ask")])).calls == CallCounts(
        pending=1, running=1
    )


def test_problem_prints_as_one_line() -> None:
    assert str(Problem(3, "not valid JSON")) == "seq 3: not valid JSON"


def test_an_edited_line_is_named_not_the_one_after_it() -> None:
    lines = chain([Stop(boot="b")] * 3)
    lines[1] = lines[1].replace(b'"boot":"b"', b'"boot":"x"')
    assert check(lines).problems == (
        Problem(1, "seq 1 was changed (its hash is not what seq 2 names as prev)"),
    )


def test_an_edited_prev_is_named_at_its_own_line() -> None:
    lines = chain([Stop(boot="b")] * 3)
    lines[2] = lines[2].replace(line_hash(lines[1]).encode(), b"f" * 64)
    assert check(lines).problems == (
        Problem(
            2,
            "seq 2 was changed (its prev does not name seq 1, and its hash is not what seq 3"
            " names as prev)",
        ),
    )


def test_a_line_that_is_not_a_record_at_the_expected_head_is_named_there() -> None:
    lines = chain([Stop(boot="b"), Stop(boot="b")])
    head = f"2:{line_hash(lines[2])}"
    for broken in (b"not json", b'{"seq":2}'):
        report = check([*lines[:2], broken], head)
        assert Problem(2, f"line hash differs from the expected head {head}") in report.problems
        assert not any("is not in the ledger" in problem.what for problem in report.problems)
        assert report.head == f"2:{line_hash(broken)}"


def test_a_line_that_is_not_a_record_after_an_edited_one_names_both_ways() -> None:
    lines = chain([Stop(boot="b"), Stop(boot="b"), Stop(boot="b")])
    edited = relink(lines[:2])[1].replace(b'"b"', b'"c"')  # its hash changed, not its link
    for broken in (b"not json", b'{"seq":3}'):
        problems = check([lines[0], edited, lines[2], broken]).problems
        assert problems[0] == Problem(
            1, "seq 1 was changed (its hash is not what seq 2 names as prev), or seq 2's prev was"
        )


def test_a_verification_without_tiles_checked_none() -> None:
    report = check(chain([Stop(boot="b")]))
    assert (report.tiles_checked, report.tiles_sound) == (0, None)
