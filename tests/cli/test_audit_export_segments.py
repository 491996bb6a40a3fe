"""``bxctl audit export --otlp`` over a segmented ledger (docs/protocol.md, "Segments";
docs/operations.md, "The cursor"), to the real receiver (tests/harness/otlp_receiver.py):
every record of every file arrives once, in order, as the same lines in one file send
them; a cursor taken in the live file resumes after the writer sealed it (its offset is
in the file that holds its seq); ``--follow`` goes on across the seals the real
LedgerWriter makes while it follows; with the oldest segments archived the export
starts at the first file present, and a cursor in the archived lines that were never
sent is refused."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import attrs
import orjson
import pytest
import trio
from tests.harness.cli import bxctl_in_process as bxctl
from tests.harness.ledger_gen import write_ledger
from tests.harness.otlp_receiver import Receiver, receiver
from tests.ledger.test_checkpointer import BOOT, ledger

from boxmaker.home.paths import Home
from boxmaker.ledger import otlp_export
from boxmaker.ledger.checkpoint import ledger_origin
from boxmaker.ledger.otlp_export import Cursor
from boxmaker.ledger.records import Start
from boxmaker.ledger.seal import Sealer
from boxmaker.ledger.segments import SEGMENTS_DIR, ledger_files, ledger_lines
from boxmaker.ledger.signed_note import Ed25519PrivateKey, NoteSigner

LEDGER_ID: Final = "l-00000000000000ab"
WITHIN: Final = 20.0
"""Real seconds a test waits on the export or the receiver at most."""
ROOM: Final = 10
"""Lines a live file holds in the writer's tests."""


@pytest.fixture
def otlp(tmp_path: Path) -> Iterator[Receiver]:
    with receiver(tmp_path / "received.jsonl") as started:
        yield started


def segmented(home: Home, records: int = 400, segment_records: int = 37) -> list[bytes]:
    """A generated ledger (calls open across the seals) sealed every ``segment_records``
    lines; its lines, every file's, in order."""
    signer = NoteSigner(ledger_origin(LEDGER_ID), Ed25519PrivateKey.generate())
    write_ledger(home.ledger_dir, records, signer, every=50, segment_records=segment_records)
    assert len(ledger_files(home.ledger_dir).segments) == records // segment_records
    return [line.removesuffix(b"\n") for line in ledger_lines(ledger_files(home.ledger_dir))]


def seqs_once_in_order(logs: list[dict[str, Any]]) -> list[int]:
    """The seqs of the log records in the order the receiver took them."""
    return [log["attributes"]["boxmaker.seq"] for log in logs]


def sent(item: dict[str, Any]) -> dict[str, Any]:
    """What a log record or a span says, less when the receiver got it."""
    return {k: v for k, v in item.items() if k not in ("observed", "received")}


async def export(home: Home, *args: str) -> int:
    with trio.fail_after(WITHIN):
        return await bxctl(home, "audit", "export", *args)


async def test_a_segmented_ledger_arrives_whole_once_in_order_as_one_file_sends_it(
    home: Home, tmp_path: Path, otlp: Receiver, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = segmented(home)
    assert await export(home, "--otlp", otlp.url) == 0
    assert seqs_once_in_order(otlp.logs()) == list(range(len(lines)))
    for log, line in zip(otlp.logs(), lines, strict=True):
        assert log["attributes"]["boxmaker.line_sha256"] == hashlib.sha256(line).hexdigest()
        assert log["attributes"]["boxmaker.ledger"] == LEDGER_ID
    cursor = orjson.loads((home.state_dir / "otlp-cursor.json").read_bytes())
    live = home.audit_log.read_bytes()
    assert (cursor["seq"], cursor["offset"]) == (len(lines) - 1, live.rindex(b"\n", 0, -1) + 1)
    # The same lines in one file, sent to another receiver: the same records and spans.
    whole = b"".join(path.read_bytes() for path in ledger_files(home.ledger_dir).paths())
    shutil.rmtree(home.ledger_dir / SEGMENTS_DIR)
    home.audit_log.write_bytes(whole)
    with receiver(tmp_path / "one-file.jsonl") as one_file:
        cursor_file = str(tmp_path / "one-file-cursor.json")
        assert await export(home, "--otlp", one_file.url, "--cursor", cursor_file) == 0
        assert [sent(log) for log in otlp.logs()] == [sent(log) for log in one_file.logs()]
        assert [sent(span) for span in otlp.spans()] == [sent(span) for span in one_file.spans()]
    assert otlp.spans()
    capsys.readouterr()


async def test_a_cursor_taken_in_the_live_file_resumes_after_the_writer_sealed_it(
    tmp_path: Path, otlp: Receiver
) -> None:
    sealer = Sealer(tmp_path / "home" / "ledger", ROOM)
    async with ledger(tmp_path, sealer=sealer) as book:
        await book.append(*(Start(boot=BOOT, version="1") for _ in range(5)))
        home = book.home
        cursor = tmp_path / "cursor.json"
        with trio.fail_after(WITHIN):
            first = await otlp_export.export_ledger(
                home.audit_log, otlp.url, cursor, capture_content=False, follow=False, say=print
            )
        taken = orjson.loads(cursor.read_bytes())
        assert (first.through, taken["seq"]) == (5, 5)
        assert not (home.ledger_dir / SEGMENTS_DIR).exists()  # taken in the live file
        # Two seals: lines 0-9 and 10-19 sealed, the live file begins at 20.
        await book.append(*(Start(boot=BOOT, version="1") for _ in range(2 * ROOM - 3)))
    files = ledger_files(home.ledger_dir)
    assert [(s.first, s.last) for s in files.segments] == [(0, 9), (10, 19)]
    assert files.file_of(taken["seq"])[0] == files.segments[0].path
    lines = list(ledger_lines(files))
    with trio.fail_after(WITHIN):
        again = await otlp_export.export_ledger(
            home.audit_log, otlp.url, cursor, capture_content=False, follow=False, say=print
        )
    assert (again.logs, again.through) == (len(lines) - 6, len(lines) - 1)
    assert seqs_once_in_order(otlp.logs()) == list(range(len(lines)))


async def test_follow_goes_on_across_the_seals_the_writer_makes_meanwhile(
    tmp_path: Path, otlp: Receiver
) -> None:
    sealer = Sealer(tmp_path / "home" / "ledger", ROOM)
    cursor = tmp_path / "cursor.json"
    async with ledger(tmp_path, sealer=sealer) as book:
        home = book.home

        async def follow() -> None:
            await otlp_export.export_ledger(
                home.audit_log,
                otlp.url,
                cursor,
                capture_content=False,
                follow=True,
                say=print,
                poll=0.01,
            )

        async def received(count: int) -> None:
            with trio.fail_after(WITHIN):
                while len(otlp.logs()) < count:  # noqa: ASYNC110 - another process's file
                    await trio.sleep(0.01)

        async def taken_through(seq: int) -> None:
            """The cursor moves once the receiver's answer is back, a moment after it
            wrote what it got: wait for that too before stopping the export."""
            with trio.fail_after(WITHIN):
                while not cursor.exists() or orjson.loads(cursor.read_bytes())["seq"] < seq:  # noqa: ASYNC110
                    await trio.sleep(0.01)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow)
            await received(1)  # genesis: following the first live file
            for count in range(2, 4 * ROOM):
                await book.append(Start(boot=BOOT, version="1"))
                if count % 3 == 0:
                    await received(len(list(ledger_lines(ledger_files(home.ledger_dir)))))
            total = len(list(ledger_lines(ledger_files(home.ledger_dir))))
            await received(total)
            await taken_through(total - 1)
            nursery.cancel_scope.cancel()
    files = ledger_files(home.ledger_dir)
    assert [(s.first, s.last) for s in files.segments] == [(0, 9), (10, 19), (20, 29), (30, 39)]
    assert seqs_once_in_order(otlp.logs()) == list(range(total))
    taken = orjson.loads(cursor.read_bytes())
    assert (taken["seq"], files.file_of(taken["seq"])[0]) == (total - 1, home.audit_log)


async def test_an_archived_prefix_exports_from_the_first_file_present(
    home: Home, tmp_path: Path, otlp: Receiver, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = segmented(home, records=200, segment_records=40)
    second = ledger_files(home.ledger_dir).segments[1]
    line_79 = second.path.read_bytes().splitlines(keepends=True)[-1]
    at_79 = Cursor(
        url=otlp.url,
        ledger=LEDGER_ID,
        seq=79,
        offset=second.path.stat().st_size - len(line_79),
        line_sha256=hashlib.sha256(line_79[:-1]).hexdigest(),
        logs_through=79,
    )
    archive = tmp_path / "archive"
    archive.mkdir()
    for segment in ledger_files(home.ledger_dir).segments[:2]:
        shutil.move(segment.path, archive / segment.path.name)
    assert ledger_files(home.ledger_dir).archived == 80
    assert await export(home, "--otlp", otlp.url) == 0
    assert seqs_once_in_order(otlp.logs()) == list(range(80, len(lines)))
    first = otlp.logs()[0]["attributes"]
    assert (first["boxmaker.kind"], first["boxmaker.ledger"]) == ("checkpoint", LEDGER_ID)
    taken = orjson.loads((home.state_dir / "otlp-cursor.json").read_bytes())
    assert (taken["ledger"], taken["seq"]) == (LEDGER_ID, len(lines) - 1)
    assert capsys.readouterr().out.startswith(f"sent {len(lines) - 80} log record(s)")

    # A cursor at the last line archived: on from the first file present (its checkpoint's
    # prev is that line's hash); one at a line archived before it was sent: refused.
    with receiver(tmp_path / "second.jsonl") as later:
        cursor = tmp_path / "cursor.json"
        cursor.write_bytes(attrs.evolve(at_79, url=later.url).to_json())
        assert await export(home, "--otlp", later.url, "--cursor", str(cursor)) == 0
        assert seqs_once_in_order(later.logs()) == list(range(80, len(lines)))
        assert orjson.loads(cursor.read_bytes())["seq"] == len(lines) - 1
        stale = attrs.evolve(at_79, url=later.url, seq=30, logs_through=30)
        cursor.write_bytes(stale.to_json())
        assert await export(home, "--otlp", later.url, "--cursor", str(cursor)) == 1
    assert capsys.readouterr().err == (
        f"bxctl: the cursor {cursor} ends at seq 30, and lines 31-79 were archived (moved "
        "away) before they were sent; see docs/runbook.md#otlp-export\n"
    )
