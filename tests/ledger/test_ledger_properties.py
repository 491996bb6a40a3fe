"""Properties: what the writer writes verifies; every tampering is caught, and the first
problem names the first bad seq."""

from __future__ import annotations

import datetime as dt

import attrs
import hypothesis.strategies as st
import trio
from hypothesis import given, settings

from boxmaker.core.labels import Label, Taint
from boxmaker.core.reasons import Reason
from boxmaker.ledger.live_file import Tail
from boxmaker.ledger.records import (
    GENESIS_PREV,
    Approval,
    ApprovalBy,
    ApprovalOutcome,
    Body,
    Decision,
    Genesis,
    Result,
    ResultStatus,
    Start,
    Stop,
    VerdictCode,
    encode_line,
    line_hash,
)
from boxmaker.ledger.verify import CallCounts, Problem, Report, verify_lines
from boxmaker.ledger.writer import LedgerWriter

NOW = dt.datetime(2026, 3, 4, 5, 6, 7, 890000, tzinfo=dt.UTC)
GENESIS_LINE = encode_line(0, "2026-03-04T05:06:07.890Z", GENESIS_PREV, Genesis(ledger="l-1"))

# How a call goes, and the state verify must count it in when it ends the ledger.
PLANS = {
    "deny": "denied",
    "run": "complete",
    "run-failed": "complete",
    "run-gone": "withdrawn",
    "run-open": "running",
    "ask-open": "pending",
    "ask-ask": "complete",
    "ask-allowed": "complete",
    "ask-ask-open": "running",
    "ask-denied": "denied",
    "ask-refused": "refused",
    "ask-expired": "expired",
    "ask-withdrawn": "withdrawn",
}


@attrs.frozen
class MemoryFile:
    """The writer's file layer, in memory: these are the bytes the writer produced."""

    data: bytearray = attrs.field(factory=bytearray)

    def write(self, data: bytes) -> None:
        self.data.extend(data)

    def fsync(self) -> None:
        pass

    def close(self) -> None:
        pass


def call_records(call: str, plan: str, boot: str) -> list[Body]:
    verdict = plan.split("-")[0]
    records: list[Body] = [
        Decision(
            call=call,
            session="s-000000000001",
            tool="read_file",
            arguments={"path": f"notes/{call}.md"},
            verdict=VerdictCode(verdict),
            reason=Reason.NO_GRANT if verdict == "deny" else None,
            grant=None if verdict == "deny" else "read-notes",
            taint=Taint.INTERNAL,
            untrusted=False,
            boot=boot,
        )
    ]
    if verdict == "ask" and plan != "ask-open":
        records.append(
            Approval(
                call=call,
                approval="a-00000001",
                outcome=ApprovalOutcome(plan.split("-")[1]),
                reason=None,
                by=ApprovalBy.OWNER,
                taint=Taint.INTERNAL,
                untrusted=False,
            )
        )
    if plan in ("run", "run-failed", "run-gone", "ask-ask", "ask-allowed"):
        failed = plan in ("run-failed", "run-gone")
        records.append(
            Result(
                call=call,
                status=ResultStatus.FAILED if failed else ResultStatus.OK,
                reason=Reason.REQUESTER_GONE
                if plan == "run-gone"
                else Reason.TOOL_ERROR
                if failed
                else None,
                label=Label(Taint.INTERNAL, False),
                taint_after=Taint.INTERNAL,
                untrusted_after=False,
                output_sha256="ab" * 32,
                output_bytes=7,
            )
        )
    return records


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[Body], CallCounts]:
    """Boots of interleaved calls, and the call states a correct verify counts."""
    bodies: list[Body] = []
    counts = dict.fromkeys(attrs.fields_dict(CallCounts), 0)
    boots = draw(st.integers(1, 3))
    n = 0
    for b in range(boots):
        boot = f"b-{b}"
        bodies.append(Start(boot=boot, version="0.1.0"))
        plans = draw(st.lists(st.sampled_from(sorted(PLANS)), min_size=1, max_size=6))
        queues = []
        for plan in plans:
            n += 1
            queues.append(call_records(f"c-{n:016x}", plan, boot))
        while queues:  # interleave the calls, each in its own order
            queue = queues[draw(st.integers(0, len(queues) - 1))]
            bodies.append(queue.pop(0))
            if not queue:
                queues.remove(queue)
        stopped = draw(st.booleans())
        if stopped:
            bodies.append(Stop(boot=boot))
        newest_and_live = b == boots - 1 and not stopped
        for plan in plans:
            state = PLANS[plan]
            if state in ("running", "pending") and not newest_and_live:
                state = "unfinished"
            counts[state] += 1
    return bodies, CallCounts(**counts)


def write(bodies: list[Body]) -> list[bytes]:
    """The lines (without newline) the writer produces for these bodies."""
    file = MemoryFile()

    async def main() -> None:
        writer = LedgerWriter(file, Tail(1, line_hash(GENESIS_LINE)), clock=lambda: NOW)
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                await nursery.start(writer.run)
                for body in bodies:
                    await writer.append(body)
                await writer.aclose()

    trio.run(main)
    return [GENESIS_LINE, *bytes(file.data).split(b"\n")[:-1]]


def verify(data: bytes, expect_head: str | None = None) -> Report:
    return verify_lines(data.splitlines(keepends=True), expect_head)


def joined(lines: list[bytes]) -> bytes:
    return b"".join(line + b"\n" for line in lines)


def head_of(lines: list[bytes]) -> str:
    return f"{len(lines) - 1}:{line_hash(lines[-1])}"


@settings(max_examples=60, deadline=None)
@given(histories())
def test_what_the_writer_writes_verifies_with_the_right_states(
    history: tuple[list[Body], CallCounts],
) -> None:
    bodies, counts = history
    lines = write(bodies)
    report = verify(joined(lines), expect_head=head_of(lines))
    assert report.problems == ()
    assert report.records == len(bodies) + 1
    assert report.head == head_of(lines)
    assert report.calls == counts


@settings(max_examples=150, deadline=None)
@given(histories(), st.data())
def test_a_flipped_byte_is_caught_at_its_own_line(
    history: tuple[list[Body], CallCounts], data: st.DataObject
) -> None:
    lines = write(history[0])
    original = joined(lines)
    pos = data.draw(st.integers(0, len(original) - 1))
    mask = data.draw(st.integers(1, 255))
    mutated = bytearray(original)
    mutated[pos] ^= mask
    k = original.count(b"\n", 0, pos)  # the line holding the byte (its newline included)
    end_of_k = original.index(b"\n", pos) + 1

    report = verify(bytes(mutated), expect_head=head_of(lines))

    assert not report.sound
    first = report.problems[0]
    # The line alone, after its sound predecessors: does it show its own fault?
    own_fault = not verify(bytes(mutated[:end_of_k])).sound
    last = k == len(lines) - 1
    assert first.seq == k
    if not own_fault and not last:  # only the next link shows it, and names this line
        assert first.what == f"seq {k} was changed (its hash is not what seq {k + 1} names as prev)"


@settings(max_examples=60, deadline=None)
@given(histories(), st.data())
def test_a_flipped_prev_digit_is_caught_at_its_own_line(
    history: tuple[list[Body], CallCounts], data: st.DataObject
) -> None:
    lines = write(history[0])
    k = data.draw(st.integers(1, len(lines) - 1))
    start = lines[k].index(b'"prev":"') + len(b'"prev":"')
    at = data.draw(st.integers(start, start + 63))
    digit = data.draw(st.sampled_from(b"0123456789abcdef").filter(lambda d: d != lines[k][at]))
    mutated = bytearray(lines[k])
    mutated[at] = digit
    report = verify(joined([*lines[:k], bytes(mutated), *lines[k + 1 :]]), head_of(lines))
    assert {problem.seq for problem in report.problems} == {k}
    assert report.problems[-1].what.startswith(f"seq {k} was changed (its prev does not name")


@settings(max_examples=60, deadline=None)
@given(histories(), st.data())
def test_a_changed_value_is_named_by_the_next_link_or_the_head(
    history: tuple[list[Body], CallCounts], data: st.DataObject
) -> None:
    lines = write(history[0])
    k = data.draw(st.integers(1, len(lines) - 1))
    at = lines[k].index(b'"at":"2026') + len(b'"at":"2026')  # a digit of the month
    mutated = lines[k][:at] + b"-11" + lines[k][at + 3 :]
    report = verify(joined([*lines[:k], mutated, *lines[k + 1 :]]), head_of(lines))
    if k == len(lines) - 1:
        assert report.problems[0].seq == k
        assert report.problems[0].what.startswith("line hash differs from the expected head")
    else:
        assert report.problems == (
            Problem(k, f"seq {k} was changed (its hash is not what seq {k + 1} names as prev)"),
        )


@settings(max_examples=60, deadline=None)
@given(histories(), st.data())
def test_a_deleted_middle_line_is_caught_at_its_seq(
    history: tuple[list[Body], CallCounts], data: st.DataObject
) -> None:
    lines = write(history[0])
    k = data.draw(st.integers(1, len(lines) - 2))
    report = verify(joined(lines[:k] + lines[k + 1 :]))
    assert report.problems[0].seq == k
    assert report.problems[0].what == f"seq {k + 1} where {k} was expected"


@settings(max_examples=60, deadline=None)
@given(histories(), st.data())
def test_two_swapped_lines_are_caught_at_the_first(
    history: tuple[list[Body], CallCounts], data: st.DataObject
) -> None:
    lines = write(history[0])
    i = data.draw(st.integers(0, len(lines) - 2))
    j = data.draw(st.integers(i + 1, len(lines) - 1))
    swapped = list(lines)
    swapped[i], swapped[j] = swapped[j], swapped[i]
    report = verify(joined(swapped))
    assert report.problems[0].seq == i
    # At seq 0 the missing genesis is named first; the seq problem is there all the same.
    assert Problem(i, f"seq {j} where {i} was expected") in report.problems[:2]


@settings(max_examples=60, deadline=None)
@given(histories(), st.data())
def test_a_torn_last_line_is_caught(
    history: tuple[list[Body], CallCounts], data: st.DataObject
) -> None:
    lines = write(history[0])
    cut = data.draw(st.integers(1, len(lines[-1])))  # keep 1..all of its bytes, no newline
    report = verify(joined(lines[:-1]) + lines[-1][:cut])
    last = len(lines) - 1
    assert report.problems[0].seq == last
    assert report.problems[-1].seq == last
    assert report.problems[-1].what == "torn last line (no newline)"
    assert all(problem.seq == last for problem in report.problems)


@settings(max_examples=60, deadline=None)
@given(histories(), st.data())
def test_truncation_is_caught_against_a_noted_head(
    history: tuple[list[Body], CallCounts], data: st.DataObject
) -> None:
    lines = write(history[0])
    keep = data.draw(st.integers(1, len(lines) - 1))
    head = head_of(lines)
    truncated = verify(joined(lines[:keep]))
    assert truncated.sound  # without the noted head, the chain alone cannot tell
    report = verify(joined(lines[:keep]), expect_head=head)
    assert [(p.seq, p.what) for p in report.problems] == [
        (len(lines) - 1, f"the expected head {head} is not in the ledger (truncated?)")
    ]
