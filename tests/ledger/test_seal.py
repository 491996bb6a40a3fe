"""Sealing the live file (ledger/seal.py; docs/protocol.md, "Segments"): the three steps
leave a read-only segment named for its lines and a live file that begins with the
checkpoint of everything before it; a start completes a seal cut short after each step
(and a chmod left undone), moves aside a ``.next`` that does not continue the chain, and
a failure at step 2 leaves the ledger as it was while one at step 3 stops the writer
until the next start completes the seal. The writer's side: a segment holds exactly
``segment_records`` lines under bursts bigger than the room left, and the start (the
fast one, from a checkpoint in a sealed segment or the live file) reads across files."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import orjson
import pytest
import trio
import trio.testing
from tests.ledger.test_checkpointer import BOOT, NOW, ledger

from boxmaker.core.reasons import AUDIT_UNAVAILABLE_DETAIL
from boxmaker.home.file_ops import OsFileOps
from boxmaker.home.paths import Home
from boxmaker.ledger.checkpointer import read_position
from boxmaker.ledger.fast_start import SinceCheckpoint, verify_since_checkpoint
from boxmaker.ledger.ledger_key import read_ledger_origin
from boxmaker.ledger.live_file import LedgerTorn, open_ledger
from boxmaker.ledger.records import Start, line_hash
from boxmaker.ledger.seal import (
    NEXT_FILE,
    SEGMENT_MODE,
    Sealer,
    finish_seal,
    seal_live,
)
from boxmaker.ledger.segments import ledger_files, ledger_lines, segment_name
from boxmaker.ledger.signed_note import NoteVerifier
from boxmaker.ledger.start import start_ledger
from boxmaker.ledger.tree import CHECKPOINT_POS_FILE, tree_dir
from boxmaker.ledger.verify import Report, verify_lines
from boxmaker.ledger.writer import LedgerFile, LedgerStopped, SealSkipped

RECORDS = 10
"""Lines a live file holds in these tests: genesis and 9 records fill the first."""


def chain(home: Home, verifier: NoteVerifier | None = None) -> Report:
    """Every file's lines verified as one chain (what `bxctl audit verify` reads)."""
    return verify_lines(ledger_lines(ledger_files(home.ledger_dir)), verifier=verifier)


def fields(line: bytes) -> dict[str, Any]:
    parsed: dict[str, Any] = orjson.loads(line)
    return parsed


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def segment(home: Home, first: int, last: int) -> Path:
    return home.ledger_dir / "segments" / segment_name(first, last)


async def sealed_once(tmp_path: Path) -> tuple[Home, NoteVerifier]:
    """A ledger sealed once by the writer: lines 0-9 in a segment, the live file only
    the checkpoint of them (seq 10)."""
    async with ledger(tmp_path, sealer=Sealer(tmp_path / "home" / "ledger", RECORDS)) as book:
        await book.append(*(Start(boot=BOOT, version="1") for _ in range(RECORDS - 1)))
    return book.home, book.signer.verifier


async def test_a_full_live_file_is_sealed_at_a_checkpoint_that_begins_the_next(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    home, verifier = await sealed_once(tmp_path)
    sealed = segment(home, 0, RECORDS - 1)
    assert sorted(p.name for p in (home.ledger_dir / "segments").iterdir()) == [sealed.name]
    assert mode(sealed) == SEGMENT_MODE
    assert mode(home.ledger_dir / "segments") == 0o700
    assert not (home.ledger_dir / NEXT_FILE).exists()
    old = sealed.read_bytes().splitlines()
    assert len(old) == RECORDS
    assert fields(old[0])["kind"] == "genesis"
    [first] = home.audit_log.read_bytes().splitlines()
    record = fields(first)
    assert (record["kind"], record["seq"], record["size"]) == ("checkpoint", 10, 10)
    assert record["prev"] == line_hash(old[-1])
    position = read_position(tree_dir(home) / CHECKPOINT_POS_FILE)
    assert (position.seq, position.offset, position.sha256) == (10, 0, line_hash(first))
    report = chain(home, verifier)
    assert report.sound, report.problems
    assert report.records == RECORDS + 1
    assert ledger_files(home.ledger_dir).live_first == RECORDS


def crash_after_step_1(home: Home) -> None:
    """The state a crash after step 1 leaves: the live file where it was, and .next."""
    sealed = segment(home, 0, RECORDS - 1)
    home.audit_log.replace(home.ledger_dir / NEXT_FILE)
    sealed.chmod(0o600)
    sealed.replace(home.audit_log)


def crash_after_step_2(home: Home) -> None:
    home.audit_log.replace(home.ledger_dir / NEXT_FILE)


@pytest.mark.parametrize("crash", [crash_after_step_1, crash_after_step_2])
async def test_a_start_completes_a_seal_cut_short(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, crash: Any
) -> None:
    home, verifier = await sealed_once(tmp_path)
    want = {p.name: p.read_bytes() for p in [home.audit_log, segment(home, 0, RECORDS - 1)]}
    crash(home)
    finished = finish_seal(home.ledger_dir)
    assert finished.completed
    assert finished.moved_aside is None
    assert (finished.segment is None) is (crash is crash_after_step_2)
    assert {p.name: p.read_bytes() for p in [home.audit_log, segment(home, 0, 9)]} == want
    assert mode(segment(home, 0, RECORDS - 1)) == SEGMENT_MODE
    assert not (home.ledger_dir / NEXT_FILE).exists()
    assert open_ledger(home.audit_log).next_seq == RECORDS + 1
    assert chain(home, verifier).sound
    assert finish_seal(home.ledger_dir) == type(finished)()  # nothing left to do


async def test_a_start_makes_a_writable_segment_read_only_again(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    home, _ = await sealed_once(tmp_path)
    sealed = segment(home, 0, RECORDS - 1)
    sealed.chmod(0o644)  # a crash between the rename and the chmod
    assert finish_seal(home.ledger_dir).made_read_only == (sealed,)
    assert mode(sealed) == SEGMENT_MODE


def wrong_prev(line: bytes) -> bytes:
    return line.replace(fields(line)["prev"].encode(), b"0" * 64)


def wrong_seq(line: bytes) -> bytes:
    return line.replace(b'"seq":10', b'"seq":11')


@pytest.mark.parametrize(
    "forge",
    [wrong_prev, wrong_seq, lambda line: line[:-20], lambda line: line + b"\n" + line],
    ids=["wrong-prev", "wrong-seq", "cut-short", "two-lines"],
)
async def test_a_next_file_that_does_not_continue_the_chain_is_moved_aside(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, forge: Any
) -> None:
    home, verifier = await sealed_once(tmp_path)
    crash_after_step_1(home)
    next_file = home.ledger_dir / NEXT_FILE
    data = forge(next_file.read_bytes().removesuffix(b"\n")) + b"\n"
    next_file.write_bytes(data)
    live = home.audit_log.read_bytes()
    finished = finish_seal(home.ledger_dir, now=NOW)
    assert not finished.completed
    assert finished.moved_aside == home.ledger_dir / "torn-20260304T050607890Z.bin"
    assert finished.moved_aside.read_bytes() == data
    assert not next_file.exists()
    assert home.audit_log.read_bytes() == live  # the ledger as it was
    assert not any((home.ledger_dir / "segments").iterdir())
    assert chain(home, verifier).sound


async def test_a_missing_live_file_after_segments_refuses_to_start(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    home, _ = await sealed_once(tmp_path)
    home.audit_log.unlink()
    assert not finish_seal(home.ledger_dir).completed
    with pytest.raises(LedgerTorn, match="it is missing, and segments/ holds sealed segments"):
        open_ledger(home.audit_log)
    assert not home.audit_log.exists()  # no new genesis: that would start another ledger


@attrs.define
class FailingOps(OsFileOps):
    """Fails the ``replace`` into ``fail_into``'s name, or once the fsync after
    ``fsyncs`` more."""

    fail_into: str = ""
    fsyncs: int = -1

    def replace(self, source: Path, target: Path) -> None:
        if target.name == self.fail_into:
            raise OSError(28, "No space left on device")
        super().replace(source, target)

    def fsync(self, fd: int) -> None:
        self.fsyncs -= 1
        if self.fsyncs == -1:
            raise OSError(5, "Input/output error")
        super().fsync(fd)


# Each run makes its own: a counter kept between runs in one process (mutmut runs the
# tests more than once in one) would fail another fsync the second time.
@pytest.mark.parametrize(
    "make_ops",
    [
        lambda: FailingOps(fail_into=NEXT_FILE),  # step 1
        lambda: FailingOps(fail_into=segment_name(0, RECORDS - 1)),  # step 2's rename
        lambda: FailingOps(fsyncs=3),  # step 2's fsync after the rename (step 1 takes two)
    ],
    ids=["step-1", "step-2-rename", "step-2-fsync"],
)
async def test_a_failure_before_step_3_leaves_the_ledger_as_it_was(
    autojump_clock: trio.testing.MockClock,
    tmp_path: Path,
    make_ops: Callable[[], FailingOps],
) -> None:
    ops = make_ops()
    home, _ = await sealed_once(tmp_path)
    crash_after_step_1(home)
    line = (home.ledger_dir / NEXT_FILE).read_bytes().removesuffix(b"\n")
    (home.ledger_dir / NEXT_FILE).unlink()
    live = home.audit_log.read_bytes()
    with pytest.raises(SealSkipped):
        seal_live(home.ledger_dir, 0, RECORDS - 1, line, files=ops)
    assert home.audit_log.read_bytes() == live
    assert mode(home.audit_log) == 0o600
    assert sorted(p.name for p in home.ledger_dir.iterdir() if p.is_file()) == ["audit.jsonl"]
    assert not any((home.ledger_dir / "segments").iterdir())


async def test_a_failure_at_step_3_is_completed_at_the_next_start(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    home, verifier = await sealed_once(tmp_path)
    crash_after_step_1(home)
    line = (home.ledger_dir / NEXT_FILE).read_bytes().removesuffix(b"\n")
    (home.ledger_dir / NEXT_FILE).unlink()
    with pytest.raises(OSError, match="No space left"):
        seal_live(home.ledger_dir, 0, RECORDS - 1, line, files=FailingOps(fail_into="audit.jsonl"))
    assert not home.audit_log.exists()
    assert mode(segment(home, 0, RECORDS - 1)) == SEGMENT_MODE
    assert finish_seal(home.ledger_dir).completed
    assert home.audit_log.read_bytes() == line + b"\n"
    assert chain(home, verifier).sound


@attrs.define
class CountingSealer:
    """The real sealer, its files' writes counted (lines per write), its failures set."""

    sealer: Sealer
    writes: list[int] = attrs.field(factory=list)
    fail: type[Exception] | None = None

    @property
    def records(self) -> int:
        return self.sealer.records

    def seal(self, first: int, last: int, line: bytes) -> LedgerFile:
        if self.fail is not None:
            raise self.fail("the disk said no")
        return CountingFile(self.sealer.seal(first, last, line), self.writes)


@attrs.define
class CountingFile:
    file: LedgerFile
    writes: list[int]

    def write(self, data: bytes) -> None:
        self.writes.append(data.count(b"\n"))
        self.file.write(data)

    def fsync(self) -> None:
        self.file.fsync()

    def close(self) -> None:
        self.file.close()


def files_of(home: Home) -> Iterator[tuple[Path, list[bytes]]]:
    for path in ledger_files(home.ledger_dir).paths():
        yield path, path.read_bytes().splitlines()


async def test_a_segment_holds_exactly_n_lines_under_bursts_bigger_than_the_room(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    sealer = CountingSealer(Sealer(tmp_path / "home" / "ledger", RECORDS))
    async with ledger(tmp_path, every=4, sealer=sealer) as book:
        async with trio.open_nursery() as burst:
            for _ in range(45):
                burst.start_soon(book.writer.append, Start(boot=BOOT, version="1"))
        await trio.testing.wait_all_tasks_blocked()
    # After each seal (the writes counted are those to the new live files), dozens of
    # records were waiting: each batch took exactly the room left, 9 beside the checkpoint.
    assert sealer.writes == [RECORDS - 1] * 4
    found = list(files_of(book.home))
    *sealed, (live, tail) = found
    assert len(sealed) >= 4
    first = 0
    for path, lines in sealed:
        assert len(lines) == RECORDS
        assert path.name == segment_name(first, first + RECORDS - 1)
        assert mode(path) == SEGMENT_MODE
        if first:
            leading = fields(lines[0])
            assert (leading["kind"], leading["size"], leading["seq"]) == (
                "checkpoint",
                first,
                first,
            )
        first += RECORDS
    assert live == book.home.audit_log
    assert fields(tail[0])["kind"] == "checkpoint"
    assert fields(tail[0])["size"] == first
    report = chain(book.home, book.signer.verifier)
    assert report.sound, report.problems
    starts = sum(1 for _, lines in found for line in lines if b'"kind":"start"' in line)
    assert starts == 45


async def test_a_skipped_seal_goes_on_in_the_live_file_and_seals_at_the_next_checkpoint(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    sealer = CountingSealer(Sealer(tmp_path / "home" / "ledger", RECORDS), fail=SealSkipped)
    async with ledger(tmp_path, every=15, sealer=sealer) as book:
        await book.append(*(Start(boot=BOOT, version="1") for _ in range(RECORDS + 2)))
        assert book.writer.usable
        assert len(book.lines()) == RECORDS + 3  # past the size: no seal yet
        assert not (book.home.ledger_dir / "segments").exists()
        sealer.fail = None
        await book.append(*(Start(boot=BOOT, version="1") for _ in range(3)))  # 15 records
    [(sealed, _), (_, live)] = list(files_of(book.home))
    assert sealed.name == segment_name(0, 15)  # the next checkpoint sealed it, bigger
    assert fields(live[0])["size"] == 16
    assert chain(book.home, book.signer.verifier).sound


async def test_a_seal_that_cannot_be_completed_stops_the_writer(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    sealer = CountingSealer(Sealer(tmp_path / "home" / "ledger", RECORDS), fail=OSError)
    async with ledger(tmp_path, sealer=sealer) as book:
        await book.append(*(Start(boot=BOOT, version="1") for _ in range(RECORDS - 1)))
        assert not book.writer.usable
        assert book.writer.broken.is_set()
        with pytest.raises(LedgerStopped, match=re.escape(AUDIT_UNAVAILABLE_DETAIL)):
            await book.writer.append(Start(boot=BOOT, version="1"))


async def test_the_fast_start_resumes_from_a_checkpoint_in_a_sealed_segment(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with ledger(
        tmp_path, every=4, sealer=Sealer(tmp_path / "home" / "ledger", RECORDS)
    ) as book:
        await book.append(*(Start(boot=BOOT, version="1") for _ in range(7)))
        in_segment = (tree_dir(book.home) / CHECKPOINT_POS_FILE).read_bytes()
        await book.append(*(Start(boot=BOOT, version="1") for _ in range(8)))
    home, verifier = book.home, book.signer.verifier
    assert read_position(tree_dir(home) / CHECKPOINT_POS_FILE).seq > RECORDS
    (tree_dir(home) / CHECKPOINT_POS_FILE).write_bytes(in_segment)  # a crash before it moved
    position = read_position(tree_dir(home) / CHECKPOINT_POS_FILE)
    assert position.seq < RECORDS
    next_seq = open_ledger(home.audit_log).next_seq
    found = verify_since_checkpoint(home.audit_log, verifier)
    assert isinstance(found, SinceCheckpoint), found
    assert (found.checkpoint_seq, found.offset) == (position.seq, position.offset)
    assert found.report.sound, found.report.problems
    assert found.report.head == chain(home).head
    started = start_ledger(home, verifier, next_seq)
    assert started.fallback is None
    assert started.tree.size == next_seq


async def test_with_the_oldest_segment_archived_the_start_resumes_from_the_live_file(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    home, verifier = await sealed_once(tmp_path)
    origin = read_ledger_origin(home.audit_log)
    full = chain(home, verifier)
    archive = tmp_path / "archive"
    archive.mkdir()
    shutil.move(segment(home, 0, RECORDS - 1), archive)
    assert ledger_files(home.ledger_dir).archived == RECORDS
    assert read_ledger_origin(home.audit_log) == origin  # from the checkpoint's note
    next_seq = open_ledger(home.audit_log).next_seq
    started = start_ledger(home, verifier, next_seq)
    assert started.fallback is None
    assert started.checkpoint_seq == RECORDS
    assert started.report.head == full.head
    assert started.tree.size == next_seq
