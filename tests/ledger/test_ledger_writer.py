"""The single writer: open, torn tails, repair, group commit, stop."""

from __future__ import annotations

import datetime as dt
import hashlib
import stat
from pathlib import Path

import attrs
import orjson
import pytest
import trio

from boxmaker.core.labels import Taint
from boxmaker.core.reasons import AUDIT_UNAVAILABLE_DETAIL
from boxmaker.formats.clock import format_utc
from boxmaker.ledger.live_file import TAIL_CHUNK, LedgerTorn, Tail, open_ledger, repair, torn_name
from boxmaker.ledger.records import (
    Body,
    Decision,
    Genesis,
    Repair,
    Start,
    Stop,
    VerdictCode,
    decode_line,
    line_hash,
)
from boxmaker.ledger.verify_files import verify_file
from boxmaker.ledger.writer import Appended, LedgerStopped, LedgerWriter, OsLedgerFile

NOW = dt.datetime(2026, 3, 4, 5, 6, 7, 890000, tzinfo=dt.UTC)
GUARD = 10  # seconds: a hung writer fails the test instead of stalling the suite


def clock() -> dt.datetime:
    return NOW


def big_decision(size: int) -> Decision:
    return Decision(
        call="c-0000000000000001",
        session="s-000000000001",
        tool="write_file",
        arguments={"path": "big.txt", "content": "x" * size},
        verdict=VerdictCode.RUN,
        reason=None,
        grant="g",
        taint=Taint.PUBLIC,
        untrusted=False,
        boot="b-1",
    )


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    return tmp_path / "ledger" / "audit.jsonl"


def lines_of(path: Path) -> list[bytes]:
    data = path.read_bytes()
    assert data.endswith(b"\n")
    return data[:-1].split(b"\n")


@attrs.define
class FakeFile:
    """A file layer that keeps bytes in memory and can fail on write or on fsync."""

    fail_on: str | None = None
    written: bytearray = attrs.field(factory=bytearray)
    synced: bytes = b""
    writes: int = 0
    fsyncs: int = 0
    closed: bool = False

    def write(self, data: bytes) -> None:
        self.writes += 1
        if self.fail_on == "write":
            raise OSError(28, "No space left on device")
        self.written += data

    def fsync(self) -> None:
        self.fsyncs += 1
        if self.fail_on == "fsync":
            raise OSError(5, "Input/output error")
        self.synced = bytes(self.written)

    def close(self) -> None:
        self.closed = True


@attrs.define
class CountingFile:
    """The real file, counting the fsyncs that reach it."""

    inner: OsLedgerFile
    fsyncs: int = 0

    def write(self, data: bytes) -> None:
        self.inner.write(data)

    def fsync(self) -> None:
        self.fsyncs += 1
        self.inner.fsync()

    def close(self) -> None:
        self.inner.close()


# -- open_ledger -------------------------------------------------------------------------


def test_open_creates_the_ledger_with_genesis(ledger: Path) -> None:
    tail = open_ledger(ledger, now=NOW)
    (line,) = lines_of(ledger)
    record = decode_line(line)
    assert record.seq == 0
    assert record.at == format_utc(NOW)
    assert record.prev == "0" * 64
    assert isinstance(record.body, Genesis)
    assert record.body.ledger.startswith("l-")
    assert tail == Tail(next_seq=1, prev=line_hash(line))
    assert tail.head == f"0:{line_hash(line)}"
    assert stat.S_IMODE(ledger.stat().st_mode) == 0o600
    assert [p.name for p in ledger.parent.iterdir()] == [ledger.name]  # no temp file left


def test_reopen_finds_the_same_tail(ledger: Path) -> None:
    assert open_ledger(ledger, now=NOW) == open_ledger(ledger, now=NOW)


def test_open_tightens_a_loose_mode(ledger: Path) -> None:
    open_ledger(ledger, now=NOW)
    ledger.chmod(0o644)
    open_ledger(ledger, now=NOW)
    assert stat.S_IMODE(ledger.stat().st_mode) == 0o600


@pytest.mark.parametrize("size", [10, TAIL_CHUNK - 200, TAIL_CHUNK, 3 * TAIL_CHUNK + 17])
async def test_tail_is_found_whatever_the_last_line_length(ledger: Path, size: int) -> None:
    writer = LedgerWriter.open(ledger, clock=clock)
    with trio.fail_after(GUARD):
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            await writer.append(Stop(boot="b-0"))
            appended = await writer.append(big_decision(size))
            await writer.aclose()
    assert open_ledger(ledger) == Tail(next_seq=3, prev=line_hash(appended.line))


@pytest.mark.parametrize(
    ("tail", "why"),
    [
        (b'{"seq":1', "no newline"),
        (b"{}}\n", "not valid JSON"),
        (b"\n", "not valid JSON"),
        (b"[1]\n", "not a record with a seq"),
        (b'{"seq":"1"}\n', "not a record with a seq"),
    ],
)
def test_torn_tails_refuse_to_open(ledger: Path, tail: bytes, why: str) -> None:
    open_ledger(ledger, now=NOW)
    with ledger.open("ab") as file:
        file.write(tail)
    with pytest.raises(LedgerTorn, match=r"docs/runbook\.md#ledger-torn") as caught:
        open_ledger(ledger)
    assert caught.value.why == why
    assert str(caught.value) == (
        f"{ledger}: the ledger's last line is torn ({why}); see docs/runbook.md#ledger-torn"
    )
    assert caught.value.path == ledger


def test_an_empty_ledger_is_torn(ledger: Path) -> None:
    ledger.parent.mkdir()
    ledger.touch(mode=0o600)
    with pytest.raises(LedgerTorn, match=r"torn \(an empty file\)"):
        open_ledger(ledger)


# -- repair ------------------------------------------------------------------------------


def test_torn_name_is_compact_utc() -> None:
    assert torn_name(NOW) == "torn-20260304T050607890Z.bin"


def test_repair_of_a_sound_ledger_does_nothing(ledger: Path) -> None:
    open_ledger(ledger, now=NOW)
    before = ledger.read_bytes()
    assert repair(ledger, now=NOW) is None
    assert ledger.read_bytes() == before
    assert not list(ledger.parent.glob("torn-*"))


def append_all(path: Path, bodies: list[Body]) -> list[Appended]:
    """Open the ledger at ``path``, append ``bodies`` one by one, close (a fresh trio.run)."""
    appended: list[Appended] = []

    async def main() -> None:
        writer = LedgerWriter.open(path, clock=clock)
        with trio.fail_after(GUARD):
            async with trio.open_nursery() as nursery:
                await nursery.start(writer.run)
                for body in bodies:
                    appended.append(await writer.append(body))
                await writer.aclose()

    trio.run(main)
    return appended


@pytest.mark.parametrize("torn", [b'{"seq":1,"at":"2026', b'{"garbage\n', b"{}\n"])
def test_repair_moves_the_torn_bytes_and_the_ledger_verifies(ledger: Path, torn: bytes) -> None:
    open_ledger(ledger, now=NOW)
    sound = ledger.read_bytes()
    with ledger.open("ab") as file:
        file.write(torn)

    body = repair(ledger, now=NOW)

    digest = hashlib.sha256(torn).hexdigest()
    assert body == Repair(file="torn-20260304T050607890Z.bin", sha256=digest)
    saved = ledger.parent / body.file
    assert saved.read_bytes() == torn
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    assert ledger.read_bytes() == sound
    (appended,) = append_all(ledger, [body])
    assert appended.seq == 1
    assert orjson.loads(appended.line)["file"] == body.file
    report = verify_file(ledger)
    assert report.problems == ()
    assert report.records == 2


def test_a_second_repair_in_the_same_millisecond_keeps_both(ledger: Path) -> None:
    open_ledger(ledger, now=NOW)
    for torn in (b"first", b"second"):
        with ledger.open("ab") as file:
            file.write(torn)
        repair(ledger, now=NOW)
    assert (ledger.parent / "torn-20260304T050607890Z.bin").read_bytes() == b"first"
    assert (ledger.parent / "torn-20260304T050607890Z-1.bin").read_bytes() == b"second"


def test_repair_when_nothing_sound_is_left_starts_a_new_chain(ledger: Path) -> None:
    ledger.parent.mkdir()
    ledger.write_bytes(b"\x00\x01garbage")
    body = repair(ledger, now=NOW)
    assert body is not None
    assert (ledger.parent / body.file).read_bytes() == b"\x00\x01garbage"
    (line,) = lines_of(ledger)
    assert isinstance(decode_line(line).body, Genesis)
    assert open_ledger(ledger) == Tail(next_seq=1, prev=line_hash(line))


# -- the writer on a real file ------------------------------------------------------------


async def test_appends_are_durable_and_chained(ledger: Path) -> None:
    writer = LedgerWriter.open(ledger, clock=clock)
    with trio.fail_after(GUARD):
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            first = await writer.append(Start(boot="b-1", version="0.1.0"))
            # Written and fsynced before append returned: it is on disk now.
            assert lines_of(ledger)[-1] == first.line
            second = await writer.append(Stop(boot="b-1"))
            assert writer.head == second.head
            await writer.aclose()
    genesis, one, two = lines_of(ledger)
    assert (first.seq, second.seq) == (1, 2)
    assert first.head == f"1:{line_hash(one)}"
    assert second.head == f"2:{line_hash(two)}"
    assert orjson.loads(one)["prev"] == line_hash(genesis)
    assert orjson.loads(two) == {
        "seq": 2,
        "at": format_utc(NOW),
        "kind": "stop",
        "prev": line_hash(one),
        "boot": "b-1",
    }
    assert verify_file(ledger).sound


async def test_a_reopened_ledger_continues_the_chain(ledger: Path) -> None:
    for _ in range(2):
        writer = LedgerWriter.open(ledger, clock=clock)
        with trio.fail_after(GUARD):
            async with trio.open_nursery() as nursery:
                await nursery.start(writer.run)
                await writer.append(Stop(boot="b"))
                await writer.aclose()
    report = verify_file(ledger)
    assert report.sound
    assert report.records == 3


async def test_group_commit_fsyncs_fewer_times_than_records(ledger: Path) -> None:
    open_ledger(ledger, now=NOW)
    file = CountingFile(OsLedgerFile.open(ledger))
    writer = LedgerWriter(file, open_ledger(ledger), clock=clock)
    seqs: list[int] = []

    async def one(n: int) -> None:
        seqs.append((await writer.append(Stop(boot=f"b-{n}"))).seq)

    with trio.fail_after(GUARD):
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            async with trio.open_nursery() as callers:
                for n in range(50):
                    callers.start_soon(one, n)
            await writer.aclose()
    assert sorted(seqs) == list(range(1, 51))
    assert 1 <= file.fsyncs < 50
    report = verify_file(ledger)
    assert report.sound
    assert report.records == 51


async def test_every_caller_is_answered_only_after_its_fsync() -> None:
    file = FakeFile()
    writer = LedgerWriter(file, Tail(next_seq=1, prev="0" * 64), clock=clock)
    checked: list[int] = []

    async def one(n: int) -> None:
        appended = await writer.append(Stop(boot=f"b-{n}"))
        assert appended.line + b"\n" in file.synced
        checked.append(appended.seq)

    with trio.fail_after(GUARD):
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            async with trio.open_nursery() as callers:
                for n in range(20):
                    callers.start_soon(one, n)
            await writer.aclose()
    assert sorted(checked) == list(range(1, 21))
    assert file.fsyncs == file.writes
    assert file.closed


@pytest.mark.parametrize("fail_on", ["write", "fsync"])
async def test_a_failed_write_or_fsync_stops_the_ledger_for_good(fail_on: str) -> None:
    file = FakeFile(fail_on=fail_on)
    writer = LedgerWriter(file, Tail(next_seq=1, prev="0" * 64), clock=clock)
    assert writer.usable
    with trio.fail_after(GUARD):
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            with pytest.raises(LedgerStopped, match=r"docs/runbook\.md#audit-unavailable") as first:
                await writer.append(Stop(boot="b"))
            assert isinstance(first.value.__cause__, OSError)
            assert not writer.usable
            assert isinstance(writer.failure, OSError)
            calls = (file.writes, file.fsyncs)
            for _ in range(3):
                with pytest.raises(LedgerStopped) as later:
                    await writer.append(Stop(boot="b"))
                assert str(later.value) == AUDIT_UNAVAILABLE_DETAIL
            assert (file.writes, file.fsyncs) == calls  # fast: no I/O after the stop
            assert writer.head == "0:" + "0" * 64  # nothing counts as written
            await writer.aclose()
    assert file.synced == b""


@pytest.mark.parametrize("fail_on", ["write", "fsync"])
async def test_every_caller_of_a_failed_batch_is_told(fail_on: str) -> None:
    file = FakeFile(fail_on=fail_on)
    writer = LedgerWriter(file, Tail(next_seq=1, prev="0" * 64), clock=clock)
    outcomes: list[str] = []

    async def one(n: int) -> None:
        try:
            await writer.append(Stop(boot=f"b-{n}"))
        except LedgerStopped:
            outcomes.append("stopped")
        else:
            outcomes.append("written")

    with trio.fail_after(GUARD):
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            async with trio.open_nursery() as callers:
                for n in range(10):
                    callers.start_soon(one, n)
            await writer.aclose()
    assert outcomes == ["stopped"] * 10
    assert not writer.usable


async def test_a_body_that_cannot_be_encoded_fails_alone() -> None:
    file = FakeFile()
    writer = LedgerWriter(file, Tail(next_seq=1, prev="0" * 64), clock=clock)
    bad = attrs.evolve(big_decision(1), arguments={"x": object()})
    with trio.fail_after(GUARD):
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            with pytest.raises(TypeError):
                await writer.append(bad)
            assert writer.usable
            appended = await writer.append(Stop(boot="b"))
            await writer.aclose()
    assert appended.seq == 1
    assert file.synced == appended.line + b"\n"


async def test_aclose_writes_what_was_sent_then_refuses() -> None:
    file = FakeFile()
    writer = LedgerWriter(file, Tail(next_seq=1, prev="0" * 64), clock=clock)
    seqs: list[int] = []

    async def one() -> None:
        seqs.append((await writer.append(Stop(boot="b"))).seq)

    with trio.fail_after(GUARD):
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            for _ in range(5):
                nursery.start_soon(one)
            await trio.testing.wait_all_tasks_blocked()
            await writer.aclose()
    assert sorted(seqs) == [1, 2, 3, 4, 5]
    assert file.synced.count(b"\n") == 5
    assert file.closed
    assert writer.usable  # closing is not a failure
    with pytest.raises(LedgerStopped, match="closed"):
        await writer.append(Stop(boot="b"))


async def test_aclose_without_run_closes_the_file() -> None:
    file = FakeFile()
    writer = LedgerWriter(file, Tail(next_seq=1, prev="0" * 64))
    await writer.aclose()
    assert file.closed


async def test_a_writer_runs_once() -> None:
    writer = LedgerWriter(FakeFile(), Tail(next_seq=1, prev="0" * 64))
    with trio.fail_after(GUARD):
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            with pytest.raises(RuntimeError, match="runs once"):
                await writer.run()
            await writer.aclose()


async def test_a_cancelled_writer_closes_and_refuses_more() -> None:
    file = FakeFile()
    writer = LedgerWriter(file, Tail(next_seq=1, prev="0" * 64))
    with trio.fail_after(GUARD):
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            nursery.cancel_scope.cancel()
    assert file.closed
    with pytest.raises(LedgerStopped):
        await writer.append(Stop(boot="b"))


def test_os_ledger_file_appends_and_closes_once(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"a\n")
    file = OsLedgerFile.open(path)
    file.write(b"b\n")
    file.fsync()
    file.close()
    file.close()
    assert path.read_bytes() == b"a\nb\n"
    assert file.fd == -1
