"""``bxctl audit export --otlp`` making a long ledger's batches in worker processes
(ledger/otlp_batch.py; docs/decisions.md, "Export to OpenTelemetry"), to the real
receiver (tests/harness/otlp_receiver.py): the installed ``bxctl`` script's workers send
exactly what batches made in a thread send (every record once and in order, every span
once and in the same order, the same cursor), across seals and across the calls that
are decided in one batch and end in a later one; and an export stopped while workers
make its batches resumes from its cursor with nothing lost or sent twice."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import orjson
import pytest
import trio
from tests.harness.ledger_gen import write_ledger
from tests.harness.otlp_receiver import Receiver, receiver
from tests.harness.workers import WorkerWatch

from boxmaker.home.paths import Home
from boxmaker.ledger import otlp_export
from boxmaker.ledger.checkpoint import ledger_origin
from boxmaker.ledger.segments import ledger_files, ledger_lines
from boxmaker.ledger.signed_note import Ed25519PrivateKey, NoteSigner

LEDGER_ID: Final = "l-00000000000000cd"
WITHIN: Final = 90.0
"""Real seconds an export of a few thousand records may take at most, workers' start
included, on a loaded machine."""
BXCTL: Final = Path(sys.executable).parent / "bxctl"
"""The console script as installed: a worker process starts from it."""


@pytest.fixture
def otlp(tmp_path: Path) -> Iterator[Receiver]:
    with receiver(tmp_path / "received.jsonl") as started:
        yield started


def generated(home: Home, records: int, segment_records: int | None = None) -> list[bytes]:
    """A generated ledger with up to a dozen calls open at any line (so calls cross
    every batch's edges); its lines, every file's, in order."""
    signer = NoteSigner(ledger_origin(LEDGER_ID), Ed25519PrivateKey.generate())
    write_ledger(home.ledger_dir, records, signer, every=500, segment_records=segment_records)
    return [line.removesuffix(b"\n") for line in ledger_lines(ledger_files(home.ledger_dir))]


def sent(item: dict[str, Any]) -> dict[str, Any]:
    """What a log record or a span says, less when the receiver got it."""
    return {k: v for k, v in item.items() if k not in ("observed", "received")}


def cursor_of(path: Path) -> dict[str, Any]:
    fields: dict[str, Any] = orjson.loads(path.read_bytes())
    del fields["url"]
    return fields


async def in_threads(home: Home, url: str, cursor: Path) -> otlp_export.Sent:
    """The export with every batch made in a thread (as before worker processes)."""
    with trio.fail_after(WITHIN):
        return await otlp_export.export_ledger(
            home.audit_log, url, cursor, capture_content=False, follow=False, say=print,
            parallel_from=sys.maxsize,
        )  # fmt: skip


async def test_the_scripts_worker_processes_send_what_a_thread_sends(
    home: Home, tmp_path: Path, otlp: Receiver
) -> None:
    lines = generated(home, 9_000, segment_records=3_000)
    calls = {orjson.loads(line).get("call") for line in lines} - {None}
    command = [str(BXCTL), "audit", "export", "--otlp", otlp.url, "--home", str(home.root)]
    with trio.fail_after(WITHIN):
        async with trio.open_nursery() as nursery:
            process = await trio.lowlevel.open_process(command)
            watch = WorkerWatch(process.pid)
            nursery.start_soon(watch.run)
            assert await process.wait() == 0
            nursery.cancel_scope.cancel()
    # Three files of 3,000 lines: three batches, each long enough for a worker process.
    assert 1 <= len(watch.seen) <= otlp_export.WORKERS
    logs, spans = otlp.logs(), otlp.spans()
    assert [log["attributes"]["boxmaker.seq"] for log in logs] == list(range(len(lines)))
    assert len(spans) == len({span["attributes"]["gen_ai.tool.call.id"] for span in spans})
    assert len(spans) > len(calls) // 2  # most calls ended, each once
    with receiver(tmp_path / "threads.jsonl") as threads:
        threads_cursor = tmp_path / "threads-cursor.json"
        done = await in_threads(home, threads.url, threads_cursor)
        assert (done.logs, done.spans) == (len(lines), len(spans))
        assert [sent(log) for log in logs] == [sent(log) for log in threads.logs()]
        assert [sent(span) for span in spans] == [sent(span) for span in threads.spans()]
    assert cursor_of(home.state_dir / "otlp-cursor.json") == cursor_of(threads_cursor)
    assert cursor_of(threads_cursor)["open_calls"]  # calls were open at the end


async def test_an_export_stopped_while_workers_make_its_batches_resumes_once(
    home: Home, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = generated(home, 6_000)
    monkeypatch.setattr(otlp_export, "BATCH_LINES", 500)
    cursor = tmp_path / "cursor.json"
    gone = Receiver(tmp_path / "received.jsonl")
    # It answers four requests (two batches' logs and spans), then exits: the export
    # tries again while worker processes have made the batches after.
    await trio.to_thread.run_sync(lambda: gone.start(take=4))
    try:
        with trio.move_on_after(WITHIN) as waited:
            async with trio.open_nursery() as nursery:
                watch = WorkerWatch(os.getpid())
                nursery.start_soon(watch.run)
                nursery.start_soon(
                    lambda: otlp_export.export_ledger(
                        home.audit_log,
                        gone.url,
                        cursor,
                        capture_content=False,
                        follow=False,
                        say=print,
                        parallel_from=1,
                    )
                )
                await trio.to_thread.run_sync(gone.wait_gone, WITHIN)
                nursery.cancel_scope.cancel()
        assert not waited.cancelled_caught
        assert watch.seen
        stopped_at = orjson.loads(cursor.read_bytes())
        assert stopped_at["seq"] == 999
        await trio.to_thread.run_sync(gone.start)
        with trio.fail_after(WITHIN):
            again = await otlp_export.export_ledger(
                home.audit_log, gone.url, cursor, capture_content=False, follow=False,
                say=print, parallel_from=1,
            )  # fmt: skip
    finally:
        gone.stop()
    assert again.through == len(lines) - 1
    seqs = [log["attributes"]["boxmaker.seq"] for log in gone.logs()]
    assert seqs == list(range(len(lines)))
    with receiver(tmp_path / "threads.jsonl") as threads:
        await in_threads(home, threads.url, tmp_path / "threads-cursor.json")
        assert [sent(span) for span in gone.spans()] == [sent(span) for span in threads.spans()]
