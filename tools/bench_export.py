"""Time ``bxctl audit export --otlp`` to a local receiver (docs/performance.md).

Builds the same realistic ledger as tools/bench_ledger.py (default 50,000 records),
starts the tests' OTLP/HTTP receiver (tests/harness/otlp_receiver.py, another process,
which decodes every request with the OpenTelemetry proto package) and times one export
of the whole ledger from no cursor, the way the command runs it
(:func:`boxmaker.ledger.otlp_export.export_ledger`); then checks that every record
arrived once. Also timed apart, on the same ledger: the reading and mapping alone (no
SDK, no send), and the SDK's encoding of the log records alone, so the figure says
where the time goes.

Run: ``python tools/bench_export.py [RECORDS]``. The target: at least 20,000 records/s.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Final

import trio

ROOT: Final = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from bench_ledger import build  # noqa: E402
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.util.instrumentation import InstrumentationScope  # noqa: E402
from tests.harness.otlp_receiver import receiver  # noqa: E402

from boxmaker.ledger import otlp_export  # noqa: E402
from boxmaker.ledger.otel_mapping import CallTracker, log_of  # noqa: E402
from boxmaker.ledger.reader import LedgerReader, iter_lines  # noqa: E402

RECORDS: Final = 50_000
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
    """Seconds the SDK's OTLP encoder takes for the first ``count`` log records."""
    reader = LedgerReader(iter_lines(path)).records()
    _, genesis = next(reader)
    ledger = genesis.body.ledger  # type: ignore[union-attr]
    logs = [
        log_of(line, record, ledger, capture_content=False)  # type: ignore[arg-type]
        for _, (line, record) in zip(range(count), reader, strict=False)
    ]
    resource = Resource.create({"service.name": "boxmaker"})
    scope = InstrumentationScope("boxmaker.ledger")
    sdk = [otlp_export._sdk_log(log, resource, scope) for log in logs]
    started = time.perf_counter()
    encode_logs(sdk).SerializeToString()
    return time.perf_counter() - started


def main() -> int:
    records = int(sys.argv[1]) if len(sys.argv) > 1 else RECORDS
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "audit.jsonl"
        build(path, records)
        started = time.perf_counter()
        _, spans = map_only(path)
        mapped = time.perf_counter() - started
        encoded = encode_only(path, 20_000)
        with receiver(Path(tmp) / "received.jsonl") as got:
            started = time.perf_counter()
            sent = trio.run(
                lambda: otlp_export.export_ledger(
                    path,
                    got.url,
                    Path(tmp) / "cursor.json",
                    capture_content=False,
                    follow=False,
                    say=print,
                )
            )
            elapsed = time.perf_counter() - started
            arrived = got.logs()
        seqs = {log["attributes"]["boxmaker.seq"] for log in arrived}
    sound = sent.logs == records == len(arrived) == len(seqs) and sent.spans == spans
    rate = records / elapsed
    print(f"records: {records}; spans: {spans}; batches of {otlp_export.BATCH_LINES} lines")
    print(f"read + map only (no SDK, no send): {records / mapped:,.0f} records/s")
    print(f"the SDK's log encoder alone:       {20_000 / encoded:,.0f} records/s")
    print(f"export to the local receiver:      {rate:,.0f} records/s ({elapsed:.2f} s)")
    print(f"every record arrived once: {'yes' if sound else 'NO'}")
    print(f"target {TARGET:,.0f} records/s: {'ok' if rate >= TARGET else 'BELOW TARGET'}")
    return 0 if sound and rate >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
