"""A ledger made into request bodies a batch at a time (ledger/otlp_batch.py: each batch
on its own, as a worker process makes it, then stitched in order) sends exactly what
one pass over it sends: the same log records and the same spans, in the same order, and
the same calls open at the end. Generated ledgers whose calls cross the batches' edges
both ways: decided in one batch and approved or ended in a later one, decided again
under the same id, approved or ended without a decision, resumed from a cursor that
carried open calls and that had the log records of some lines taken already."""

from __future__ import annotations

import hashlib
import itertools
from typing import Any, Final

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tests.harness.otlp_receiver import DECODERS

from boxmaker.core.labels import Label, Taint
from boxmaker.core.reasons import Reason
from boxmaker.core.vocabulary import (
    Approval,
    ApprovalBy,
    ApprovalOutcome,
    Decision,
    Result,
    ResultStatus,
    VerdictCode,
)
from boxmaker.ledger.otel_mapping import CallTracker, log_of
from boxmaker.ledger.otlp_batch import BadBatch, BatchJob, make_part, stitch
from boxmaker.ledger.otlp_proto import ProtoEncoder
from boxmaker.ledger.records import (
    GENESIS_PREV,
    Body,
    Genesis,
    Stop,
    decode_line,
    encode_line,
)

LEDGER: Final = "l-0123456789abcdef"
AT: Final = "2026-01-02T03:04:05.678Z"
CALLS: Final = [f"c-{n:016x}" for n in range(6)]
"""Few ids, so one is decided again while it is open."""


def decided(call: str, verdict: str) -> Decision:
    deny = verdict == "deny"
    return Decision(
        call, "s-000000000001", "read_file", {"path": "a"}, VerdictCode(verdict),
        Reason.NO_GRANT if deny else None, None if deny else "notes", Taint.PUBLIC, False,
        "b-1",
    )  # fmt: skip


def approved(call: str, outcome: str) -> Approval:
    return Approval(
        call, "a-00000001", ApprovalOutcome(outcome), None, ApprovalBy.OWNER, Taint.PUBLIC,
        False,
    )  # fmt: skip


def ended(call: str, status: str) -> Result:
    failed = status == "failed"
    return Result(
        call, ResultStatus(status), Reason.TOOL_ERROR if failed else None, Label(),
        Taint.PUBLIC, False, "ab" * 32, 7,
    )  # fmt: skip


BODIES: Final = st.one_of(
    st.builds(decided, st.sampled_from(CALLS), st.sampled_from(["run", "ask", "deny"])),
    st.builds(approved, st.sampled_from(CALLS), st.sampled_from(list(ApprovalOutcome))),
    st.builds(ended, st.sampled_from(CALLS), st.sampled_from(["ok", "failed"])),
    st.just(Stop(boot="b-1")),
)


def chained(bodies: list[Body]) -> list[bytes]:
    prev, lines = GENESIS_PREV, []
    for seq, body in enumerate([Genesis(ledger=LEDGER), *bodies]):
        lines.append(line := encode_line(seq, AT, prev, body))
        prev = hashlib.sha256(line).hexdigest()
    return lines


def decoded(where: str, bodies: list[bytes]) -> list[dict[str, Any]]:
    return [item for body in bodies for item in DECODERS[where](body)[1]]


def one_pass(
    lines: list[bytes], start: int, logs_through: int, capture: bool
) -> tuple[list[bytes], list[bytes], dict[str, Any]]:
    """What the export sent before batches were made apart: every record fed in order
    to one tracker, from the cursor (the calls open there carried in)."""
    tracker = CallTracker(LEDGER, capture_content=capture)
    encoder = ProtoEncoder(LEDGER, "0")
    logs, spans = [], []
    for seq, line in enumerate(lines):
        record = decode_line(line)
        if seq >= start and seq > logs_through:
            logs.append(log_of(line, record, LEDGER, capture_content=capture))
        span = tracker.feed(record)
        if seq >= start and span is not None:
            spans.append(span)
    logs_body = [encoder.logs(logs)] if logs else []
    return logs_body, [encoder.spans(spans)] if spans else [], tracker.open_calls


def in_batches(
    lines: list[bytes], start: int, logs_through: int, capture: bool, edges: list[int]
) -> tuple[list[bytes], list[bytes], dict[str, Any], int]:
    """The same, a batch at a time from ``start``, cut at ``edges``: each batch made on
    its own, then stitched in order. Also how many spans the parts counted."""
    carried = CallTracker(LEDGER, capture_content=capture)
    for line in lines[:start]:
        carried.feed(decode_line(line))
    tracker = CallTracker(LEDGER, capture_content=capture)
    tracker.open_calls = dict(carried.open_calls)
    encoder = ProtoEncoder(LEDGER, "0")
    cuts = sorted({start, *(e for e in edges if start < e < len(lines)), len(lines)})
    logs, spans, counted = [], [], 0
    prev = GENESIS_PREV if not start else hashlib.sha256(lines[start - 1]).hexdigest()
    for first, end in itertools.pairwise(cuts):
        job = BatchJob(LEDGER, "0", capture, first, prev, logs_through, tuple(lines[first:end]))
        part = make_part(job)
        assert len(part.spans) == len(part.crossing) + 1
        body, count = stitch(job, part, tracker, encoder)
        counted += count
        logs += [part.logs] if part.logs is not None else []
        spans += [body] if body else []
        prev = part.last_hash
        assert prev == hashlib.sha256(lines[end - 1]).hexdigest()
    return logs, spans, tracker.open_calls, counted


@settings(max_examples=300, deadline=None)
@given(
    bodies=st.lists(BODIES, max_size=60),
    edges=st.lists(st.integers(1, 60), max_size=8),
    start=st.integers(0, 61),
    logs_ahead=st.integers(-1, 5),
    capture=st.booleans(),
)
@example(  # decided, approved in the next batch, ended in the one after
    bodies=[decided(CALLS[0], "ask"), approved(CALLS[0], "allowed"), ended(CALLS[0], "ok")],
    edges=[2, 3], start=0, logs_ahead=-1, capture=False,
)  # fmt: skip
@example(  # open before the batch, decided again in it before its old self ends
    bodies=[decided(CALLS[0], "run"), ended(CALLS[1], "ok"), decided(CALLS[0], "ask"),
            approved(CALLS[0], "denied"), ended(CALLS[0], "ok")],
    edges=[2], start=0, logs_ahead=-1, capture=True,
)  # fmt: skip
def test_batches_made_apart_send_what_one_pass_sends(
    bodies: list[Body], edges: list[int], start: int, logs_ahead: int, capture: bool
) -> None:
    lines = chained(bodies)
    start = min(start, len(lines) - 1)
    logs_through = start - 1 + logs_ahead if logs_ahead >= 0 else start - 1
    logs, spans, open_calls = one_pass(lines, start, logs_through, capture)
    got_logs, got_spans, got_open, counted = in_batches(lines, start, logs_through, capture, edges)
    assert decoded("/v1/logs", got_logs) == decoded("/v1/logs", logs)
    want_spans = decoded("/v1/traces", spans)
    assert decoded("/v1/traces", got_spans) == want_spans
    assert counted == len(want_spans)
    assert got_open == open_calls


def test_a_call_that_crosses_a_batch_is_the_exporters_to_end() -> None:
    """The batch that has a call's result but not its decision leaves the result to the
    exporter, which holds the call open from the batch before."""
    lines = chained([decided(CALLS[0], "run"), decided(CALLS[1], "run"), ended(CALLS[0], "ok")])
    first = make_part(BatchJob(LEDGER, "0", False, 0, GENESIS_PREV, -1, tuple(lines[:2])))
    assert first.decided == {CALLS[0]}
    assert [c.call for c in first.open_calls] == [CALLS[0]]
    second = make_part(BatchJob(LEDGER, "0", False, 2, first.last_hash, -1, tuple(lines[2:])))
    assert second.crossing == (1,)
    assert second.span_count == 0
    assert second.decided == {CALLS[1]}
    tracker = CallTracker(LEDGER, capture_content=False)
    tracker.open_calls = {call.call: call for call in first.open_calls}
    body, count = stitch(BatchJob(LEDGER, "0", False, 2, first.last_hash, -1, tuple(lines[2:])),
                         second, tracker, ProtoEncoder(LEDGER, "0"))  # fmt: skip
    [span] = decoded("/v1/traces", [body])
    assert count == 1
    assert span["attributes"]["boxmaker.call"] == CALLS[0]
    assert list(tracker.open_calls) == [CALLS[1]]


@pytest.mark.parametrize("cut", [0, 1, 2])
def test_a_batch_whose_first_line_does_not_follow_the_last_is_refused(cut: int) -> None:
    lines = chained([decided(CALLS[0], "run"), Stop(boot="b-1")])
    job = BatchJob(LEDGER, "0", False, cut, "11" * 32, -1, tuple(lines[cut:]))
    with pytest.raises(BadBatch, match=rf"the chain breaks at seq {cut} \(expected seq {cut}"):
        make_part(job)
    wrong_seq = BatchJob(LEDGER, "0", False, cut + 1, job.prev, -1, job.lines)
    with pytest.raises(BadBatch, match=rf"at seq {cut} \(expected seq {cut + 1} after"):
        make_part(wrong_seq)
