"""Time ``bxctl audit export --otlp`` to a local receiver (docs/performance.md).

Builds the same realistic ledger as tools/bench_ledger.py (default 200,000 records: a
backlog, the export's case for a rate), starts the tests' OTLP/HTTP receiver
(tests/harness/otlp_receiver.py, another process) and times whole exports of the ledger
from no cursor, the way the command runs them
(:func:`boxmaker.ledger.otlp_export.export_ledger`: a long ledger's batches made in
worker processes), checking each time that every record arrived once. The figure held
to the target: the receiver decodes every request whole with the OpenTelemetry proto
package and keeps each record's seq (``--seqs-only``), the work a collector's receiver
does. Beside it: the same export to the receiver as the tests run it (it also turns
every attribute of every record into JSON and writes it, in Python: on 2 cores its own
work alone is near the target); to a receiver that only acknowledges (``--ack-only``);
a whole export of a 50,000-record ledger, where the worker processes' start (timed
apart: once an export) weighs; and, timed apart, the reading and mapping alone, the
encoding of the log records alone and the tests' receiver's own work alone (without
HTTP), so the figure says where time goes.

Run: ``python tools/bench_export.py [RECORDS]``. The target: at least 20,000 records/s.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Final

import trio
import trio_parallel

ROOT: Final = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from bench_ledger import build  # noqa: E402
from tests.harness import otlp_receiver  # noqa: E402
from tests.harness.otlp_receiver import receiver  # noqa: E402

from boxmaker.ledger import otlp_export  # noqa: E402
from boxmaker.ledger.otel_mapping import CallTracker, log_of  # noqa: E402
from boxmaker.ledger.otlp_batch import BatchJob, make_part, stitch  # noqa: E402
from boxmaker.ledger.otlp_cursor import ledger_id  # noqa: E402
from boxmaker.ledger.otlp_proto import ProtoEncoder  # noqa: E402
from boxmaker.ledger.reader import LedgerReader, iter_lines  # noqa: E402
from boxmaker.ledger.records import GENESIS_PREV, Genesis, encode_line  # noqa: E402

RECORDS: Final = 200_000
SHORT: Final = 50_000
"""Records of the ledger whose whole export is given beside, the workers' start in it."""
TARGET: Final = 20_000.0


def map_only(path: Path) -> tuple[int, int]:
    """Read and map the whole ledger, sending nothing: (logs, spans)."""
    reader = LedgerReader(iter_lines(path))
    records = reader.records()
    _, genesis = next(records)
    ledger = genesis.body.ledger  # type: ignore[union-attr]
    tracker = CallTracker(ledger, capture_content=False)
    logs, spans = 1, 0
    for line, record in records:
        log_of(line, record, ledger, capture_content=False)  # type: ignore[arg-type]
        logs += 1
        spans += tracker.feed(record) is not None  # type: ignore[arg-type]
    return logs, spans


def encode_only(path: Path, count: int) -> float:
    """Seconds the encoding of the first ``count`` log records into one request takes."""
    reader = LedgerReader(iter_lines(path)).records()
    _, genesis = next(reader)
    ledger = genesis.body.ledger  # type: ignore[union-attr]
    logs = [
        log_of(line, record, ledger, capture_content=False)  # type: ignore[arg-type]
        for _, (line, record) in zip(range(count), reader, strict=False)
    ]
    started = time.perf_counter()
    ProtoEncoder(ledger, "0").logs(logs)
    return time.perf_counter() - started


def receiver_alone(path: Path, out: Path) -> float:
    """Seconds the receiver's own work takes for every request the export sends: each
    body made as the export makes it, then decoded and written as the receiver does."""
    ledger = ledger_id(path)
    lines = tuple(path.read_bytes().splitlines())
    bodies: list[tuple[str, bytes]] = []
    tracker = CallTracker(ledger, capture_content=False)
    encoder = ProtoEncoder(ledger, "0")
    prev, size = GENESIS_PREV, otlp_export.BATCH_LINES
    for first in range(0, len(lines), size):
        job = BatchJob(ledger, "0", False, first, prev, -1, lines[first : first + size])
        part = make_part(job)
        spans, _ = stitch(job, part, tracker, encoder)
        bodies += [("/v1/logs", part.logs)] if part.logs else []
        bodies += [("/v1/traces", spans)] if spans else []
        prev = part.last_hash
    started = time.perf_counter()
    for where, body in bodies:
        _, got = otlp_receiver.DECODERS[where](body)
        with out.open("ab") as written:
            written.write(b"".join(otlp_receiver.orjson.dumps(item) + b"\n" for item in got))
    return time.perf_counter() - started


def workers_start() -> float:
    """Seconds :data:`~boxmaker.ledger.otlp_export.WORKERS` worker processes take to
    start and make a batch of one line, as an export's first long batches start them."""
    ledger = "l-0123456789abcdef"
    line = encode_line(0, "2026-01-02T03:04:05.678Z", GENESIS_PREV, Genesis(ledger=ledger))
    job = BatchJob(ledger, "0", False, 0, GENESIS_PREV, -1, (line,))

    async def start() -> float:
        async with trio_parallel.open_worker_context() as context:
            started = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for _ in range(otlp_export.WORKERS):
                    nursery.start_soon(context.run_sync, make_part, job)
            return time.perf_counter() - started

    return trio.run(start)


def timed_export(path: Path, url: str, cursor: Path) -> tuple[otlp_export.Sent, float]:
    started = time.perf_counter()
    sent = trio.run(
        lambda: otlp_export.export_ledger(
            path, url, cursor, capture_content=False, follow=False, say=print
        )
    )
    return sent, time.perf_counter() - started


def main() -> int:
    records = int(sys.argv[1]) if len(sys.argv) > 1 else RECORDS
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "audit.jsonl"
        build(path, records)
        started = time.perf_counter()
        _, spans = map_only(path)
        mapped = time.perf_counter() - started
        encoded = encode_only(path, 20_000)
        decoding = receiver_alone(path, Path(tmp) / "decoded.jsonl")
        with receiver(Path(tmp) / "seqs.jsonl", seqs_only=True) as got:
            sent, elapsed = timed_export(path, got.url, Path(tmp) / "cursor.json")
            log_seqs, span_seqs = got.seqs("log"), got.seqs("span")
        with receiver(Path(tmp) / "received.jsonl") as full:
            whole, whole_elapsed = timed_export(path, full.url, Path(tmp) / "cursor-full.json")
            arrived = {log["attributes"]["boxmaker.seq"] for log in full.logs()}
        with receiver(Path(tmp) / "acked.jsonl", ack_only=True) as acks:
            acked, ack_elapsed = timed_export(path, acks.url, Path(tmp) / "cursor-ack.json")
        short_path = Path(tmp) / "short" / "audit.jsonl"
        short_path.parent.mkdir()
        build(short_path, SHORT)
        with receiver(Path(tmp) / "short.jsonl", seqs_only=True) as short_receiver:
            cursor = Path(tmp) / "cursor-short.json"
            short, short_elapsed = timed_export(short_path, short_receiver.url, cursor)
            sound_short = sorted(short_receiver.seqs("log")) == list(range(SHORT))
        start = workers_start()
    every = list(range(records))
    sound = sent.logs == records and sorted(log_seqs) == every and len(span_seqs) == spans
    sound = sound and sent.spans == spans == whole.spans == acked.spans
    sound = sound and whole.logs == acked.logs == records == len(arrived)
    sound = sound and short.logs == SHORT and sound_short
    rate = records / elapsed
    print(f"records: {records}; spans: {spans}; batches of {otlp_export.BATCH_LINES} lines")
    print(f"read + map only (no encoding):          {records / mapped:,.0f} records/s")
    print(f"the log encoder alone:                  {20_000 / encoded:,.0f} records/s")
    print(f"the tests' receiver's own work alone:   {records / decoding:,.0f} records/s")
    print(f"export to a receiver that only acks:    {records / ack_elapsed:,.0f} records/s")
    print(f"export to the tests' receiver:          {records / whole_elapsed:,.0f} records/s")
    print(f"worker processes' start, once:          {start:.2f} s")
    print(f"whole export of {SHORT:,} records:         {SHORT / short_elapsed:,.0f} records/s "
          f"({short_elapsed:.2f} s, the start included)")  # fmt: skip
    print(f"export to a receiver that decodes it:   {rate:,.0f} records/s ({elapsed:.2f} s)")
    print(f"every record arrived once, each time: {'yes' if sound else 'NO'}")
    print(f"target {TARGET:,.0f} records/s: {'ok' if rate >= TARGET else 'BELOW TARGET'}")
    return 0 if sound and rate >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
