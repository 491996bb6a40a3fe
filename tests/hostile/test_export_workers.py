"""The worker processes of ``bxctl audit export`` (ledger/otlp_batch.py) killed from
outside while they make batches (another of the owner's processes, the OOM killer): no
batch is sent that was not made whole, the export stops with a message that says what
happened and what to do (or, where the library started the batch again in a new
worker, goes on), and the next run sends the rest: every record and every span once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio
from tests.cli.test_audit_export_workers import WITHIN, generated, in_threads, sent
from tests.harness.otlp_receiver import receiver
from tests.harness.workers import WorkerWatch

from boxmaker.home.paths import Home
from boxmaker.ledger import otlp_export


async def test_killed_worker_processes_lose_nothing_and_send_nothing_twice(
    home: Home, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = generated(home, 8_000)
    monkeypatch.setattr(otlp_export, "BATCH_LINES", 2_000)
    cursor = tmp_path / "cursor.json"
    problems: list[str] = []

    async def export() -> None:
        with trio.fail_after(WITHIN):
            await otlp_export.export_ledger(
                home.audit_log, otlp.url, cursor, capture_content=False, follow=False,
                say=print, parallel_from=1,
            )  # fmt: skip

    with receiver(tmp_path / "received.jsonl") as otlp:
        watch = WorkerWatch(os.getpid(), kills=2)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch.run)
            try:
                await export()
            except otlp_export.ExportProblem as exc:
                problems.append(str(exc))
            nursery.cancel_scope.cancel()
        assert watch.killed  # the attack ran: a worker was killed while it ran
        for problem in problems:
            assert problem.startswith("the process making seq ")
            assert (
                "ended before it was done (killed by SIGKILL); nothing of them was sent" in problem
            )
            assert problem.endswith("run the export again; see docs/runbook.md#otlp-export")
        await export()  # the rest, from the cursor
        seqs = [log["attributes"]["boxmaker.seq"] for log in otlp.logs()]
        assert seqs == list(range(len(lines)))
        spans = otlp.spans()
    with receiver(tmp_path / "threads.jsonl") as threads:
        await in_threads(home, threads.url, tmp_path / "threads-cursor.json")
        assert [sent(span) for span in spans] == [sent(span) for span in threads.spans()]
