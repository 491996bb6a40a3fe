"""One batch of the export's ledger lines made into OTLP request bodies
(:mod:`boxmaker.ledger.otlp_export`): each line checked against the chain, decoded,
mapped (:mod:`boxmaker.ledger.otel_mapping`) and encoded
(:mod:`boxmaker.ledger.otlp_proto`). No I/O; what goes in and comes out pickles, so a
batch can be made in another process: ``bxctl audit export`` makes a long ledger's
batches in worker processes, two at a time, while it sends the ones before
(docs/decisions.md, "Export to OpenTelemetry").

Every record's log record is the batch's own. A call's span needs the call's records in
order, and a call may be decided in one batch and end in a later one: a batch follows
the calls decided within it, and leaves the records of any other call (an approval or
a result of a call decided before the batch) to the exporter, which holds the calls
open at the batch's start (:attr:`BatchPart.crossing`; :func:`stitch`).

>>> from boxmaker.ledger.records import GENESIS_PREV, Genesis, encode_line
>>> line = encode_line(0, "2026-01-02T03:04:05.678Z", GENESIS_PREV, Genesis(ledger="l-1"))
>>> part = make_part(BatchJob("l-1", "0.1.0", False, 0, GENESIS_PREV, -1, (line,)))
>>> part.log_count, part.span_count, part.last_hash == line_hash(line)
(1, 0, True)
"""

from __future__ import annotations

import functools
from typing import Final

import attrs

from boxmaker.ledger.otel_mapping import CallSpan, CallTracker, LedgerLog, OpenCall, log_of
from boxmaker.ledger.otlp_proto import ProtoEncoder
from boxmaker.ledger.reader import decision_of
from boxmaker.ledger.records import (
    Approval,
    BadRecord,
    Decision,
    Result,
    VerdictCode,
    decode_fields,
    decode_line,
    line_fields,
    line_hash,
)

__all__ = ["BadBatch", "BatchJob", "BatchPart", "make_part", "stitch"]

_OPENS: Final = frozenset({VerdictCode.RUN, VerdictCode.ASK})
"""A decision with one of these verdicts opens its call (a denial ends it at once)."""


class BadBatch(Exception):
    """A line of the batch is not a record, or breaks the chain: the message says which."""


@attrs.frozen
class BatchJob:
    """Lines of ``ledger`` to make into request bodies."""

    ledger: str
    version: str
    """boxmaker's version, for the requests' resource and scope."""
    capture_content: bool
    first: int
    """The seq the first line must have."""
    prev: str
    """The hash the first line's ``prev`` must be: the line before it."""
    logs_through: int
    """Log records up to this seq were taken already: none is made for them."""
    lines: tuple[bytes, ...]
    """The lines, each without its newline."""


@attrs.frozen
class BatchPart:
    """A batch made: its log records and the spans of the calls it both decided and
    ended, as request bodies; what the exporter needs for the rest."""

    logs: bytes | None
    """None for none."""
    log_count: int
    spans: tuple[bytes, ...]
    """The spans between one crossing record and the next, in the order their calls
    ended, one request body each (empty for none): one more than :attr:`crossing`."""
    span_count: int
    decided: frozenset[str]
    """The calls a decision in the batch opened (``run`` or ``ask``)."""
    open_calls: tuple[OpenCall, ...]
    """Those of them still open at the batch's end, in the order they were decided."""
    crossing: tuple[int, ...]
    """The lines (their indexes in the job) with the approval or result of a call the
    batch had not decided before them, in order: the exporter's to follow."""
    last_hash: str
    """The hash of the batch's last line, which the next line's ``prev`` must be."""


@functools.lru_cache(maxsize=4)
def _encoder(ledger: str, version: str) -> ProtoEncoder:
    """The encoder of a worker process, kept across the batches it makes (its kept
    encodings are the point). Not for two threads at once: the exporter encodes with
    its own."""
    return ProtoEncoder(ledger, version)


def make_part(job: BatchJob) -> BatchPart:
    """Check, decode, map and encode ``job``'s lines. Raises :class:`BadBatch` for a
    line that is not a record, or whose seq or ``prev`` breaks the chain."""
    ledger, capture = job.ledger, job.capture_content
    tracker = CallTracker(ledger, capture_content=capture)
    feed = tracker.feed
    logs: list[LedgerLog] = []
    spans: list[CallSpan] = []
    between: list[list[CallSpan]] = [spans]
    decided: set[str] = set()
    crossing: list[int] = []
    expected, prev = job.first, job.prev
    unreadable = None
    for index, line in enumerate(job.lines):
        try:
            fields = line_fields(line)
            # Half the lines are decisions: the reader's fast path decodes them to the
            # same records at a fifth of the converter's cost; a decision it refuses goes
            # to the converter, which says why.
            decision = decision_of(fields) if fields.get("kind") == "decision" else None
            record = decode_fields(dict(fields)) if decision is None else decision
        except BadRecord as exc:
            # Raised past the loop, not here: the converter's error would travel with it
            # as its context, and not every one of them can be sent back from a process.
            unreadable = f"the line after seq {expected - 1} is not a record ({exc})"
            break
        if record.seq != expected or record.prev != prev:
            raise BadBatch(
                f"the chain breaks at seq {record.seq} (expected seq {expected} after the "
                f"line hashed {prev[:12]}…)"
            )
        prev = line_hash(line)
        expected += 1
        if record.seq > job.logs_through:
            log = log_of(
                line, record, ledger, capture_content=capture, fields=fields, line_sha256=prev
            )
            logs.append(log)
        body = record.body
        if isinstance(body, Approval | Result) and body.call not in decided:
            crossing.append(index)
            spans = []
            between.append(spans)
            continue
        if isinstance(body, Decision) and body.verdict in _OPENS:
            decided.add(body.call)
        if (span := feed(record)) is not None:
            spans.append(span)
    if unreadable is not None:
        raise BadBatch(unreadable)
    encoder = _encoder(ledger, job.version)
    return BatchPart(
        logs=encoder.logs(logs) if logs else None,
        log_count=len(logs),
        spans=tuple(encoder.spans(ended) if ended else b"" for ended in between),
        span_count=sum(map(len, between)),
        decided=frozenset(decided),
        open_calls=tuple(tracker.open_calls.values()),
        crossing=tuple(crossing),
        last_hash=prev,
    )


def stitch(
    job: BatchJob, part: BatchPart, tracker: CallTracker, encoder: ProtoEncoder
) -> tuple[bytes, int]:
    """Carry ``tracker`` (the calls open before ``job``) over ``part``: the crossing
    records fed to it in order, then the calls the batch decided taken as the batch left
    them (a call decided again replaces the one open before, as in one pass). The
    request body of all the batch's spans in the order their calls ended, as one pass
    makes them (the spans of the calls the crossing records end encoded by ``encoder``
    between the batch's own), and how many there are. Two encoded requests one after
    the other are one request holding both."""
    body, count = [part.spans[0]], part.span_count
    for index, after in zip(part.crossing, part.spans[1:], strict=True):
        # Checked by make_part already: decoding it again cannot fail.
        if (span := tracker.feed(decode_line(job.lines[index]))) is not None:
            body.append(encoder.spans([span]))
            count += 1
        body.append(after)
    open_calls = tracker.open_calls
    for call in part.decided:
        open_calls.pop(call, None)
    open_calls.update((call.call, call) for call in part.open_calls)
    return b"".join(body), count
