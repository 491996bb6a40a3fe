"""Following the ledger across its seals (ledger/follow.py, the export's reading;
docs/protocol.md, "Segments"): whatever moment each step of a seal comes at between
and within the reader's looks (before a read, between a read that found the end and the
look for a seal, during the opening of the next file, between the seal's renames), every
line is read once, in order; a sealed file cut short or followed by a file that does not
begin at the next seq is a problem, not a skip."""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from boxmaker.ledger import follow
from boxmaker.ledger.follow import LedgerTail
from boxmaker.ledger.seal import NEXT_FILE, seal_live
from boxmaker.ledger.segments import LIVE_FILE, SEGMENTS_DIR, SegmentProblem, segment_name

BIG = 1 << 20


def line(seq: int) -> bytes:
    """A line as the reading sees one: only its seq matters (the chain is the export's)."""
    return orjson.dumps({"seq": seq, "pad": "x" * (seq % 7)}) + b"\n"


def append(path: Path, data: bytes) -> None:
    with path.open("ab") as file:
        file.write(data)


def archive(live: Path, segment: Path) -> None:
    segment.parent.mkdir(exist_ok=True)
    live.rename(segment)


def writer_steps(directory: Path, lines: int, room: int) -> Iterator[Callable[[], None]]:
    """The writer's file steps, one at a time: each line appended to the live file; when
    it holds ``room`` lines, the next line (the checkpoint) begins the next live file by
    the seal's three steps, each its own step (ledger/seal.py)."""
    live, next_file = directory / LIVE_FILE, directory / NEXT_FILE
    first = 0
    for seq in range(lines):
        if seq - first == room:
            segment = directory / SEGMENTS_DIR / segment_name(first, seq - 1)
            yield functools.partial(next_file.write_bytes, line(seq))
            yield functools.partial(archive, live, segment)
            yield functools.partial(next_file.rename, live)
            first = seq
            continue
        yield functools.partial(append, live, line(seq))


@settings(max_examples=300, deadline=None)
@example(lines=41, room=5, seed=3372255, chance=0.2, most=5)  # seals while a file is opened
@given(
    lines=st.integers(1, 60),
    room=st.integers(2, 5),
    seed=st.integers(0, 2**32),
    chance=st.sampled_from([0.0, 0.2, 0.5, 0.8]),
    most=st.integers(1, 8),
)
def test_every_line_is_read_once_in_order_whenever_the_seals_come(
    tmp_path_factory: pytest.TempPathFactory,
    lines: int,
    room: int,
    seed: int,
    chance: float,
    most: int,
) -> None:
    directory = tmp_path_factory.mktemp("ledger")
    steps = writer_steps(directory, lines, room)
    next(steps)()  # line 0: a live file to open
    rng = random.Random(seed)
    done = False

    def advance() -> None:
        nonlocal done
        if (step := next(steps, None)) is None:
            done = True
        else:
            step()

    def maybe_step() -> None:
        """Now and then, inside the reader's own looks, the writer goes on a few steps
        (a seal is three)."""
        if rng.random() < chance:
            for _ in range(rng.randint(1, 5)):
                advance()

    real_listing, real_leading, real_read_here = (
        follow.ledger_files,
        follow.leading_seq,
        LedgerTail.read_here,
    )

    def hooked(real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            maybe_step()
            result = real(*args)
            maybe_step()
            return result

        return call

    read: list[int] = []
    with (
        mock.patch.object(follow, "ledger_files", hooked(real_listing)),
        mock.patch.object(follow, "leading_seq", hooked(real_leading)),
        mock.patch.object(LedgerTail, "read_here", hooked(real_read_here)),
    ):
        tail = LedgerTail.open_at(directory, 0, 0)
        try:
            while True:
                finished = done  # the writer's last step came before this read
                got = tail.read_lines(most, BIG, len(read))
                read += [orjson.loads(raw)["seq"] for _, raw in got]
                for offset, raw in got:
                    assert tail.line_at(offset) == raw  # the offset is in the file read
                if got:
                    continue
                if finished:
                    break
                advance()
        finally:
            tail.close()
    assert read == list(range(lines))


def sealed_with_lines(directory: Path, count: int) -> None:
    directory.mkdir(exist_ok=True)
    (directory / LIVE_FILE).write_bytes(b"".join(line(seq) for seq in range(count)))


def test_a_sealed_file_cut_short_is_a_problem(tmp_path: Path) -> None:
    sealed_with_lines(tmp_path, 3)
    tail = LedgerTail.open_at(tmp_path, 0, 0)
    assert [raw for _, raw in tail.read_lines(9, BIG, 0)] == [line(0), line(1), line(2)]
    with (tmp_path / LIVE_FILE).open("ab") as live:
        live.write(b'{"seq":3')  # torn: no newline
    seal_live(tmp_path, 0, 3, line(4).removesuffix(b"\n"))
    with pytest.raises(
        SegmentProblem,
        match=r"/segments/000000000000-000000000003\.jsonl ends with a line cut short",
    ):
        tail.read_lines(9, BIG, 3)
    tail.close()


def test_a_next_file_that_does_not_begin_at_the_next_seq_is_a_problem(tmp_path: Path) -> None:
    sealed_with_lines(tmp_path, 3)
    tail = LedgerTail.open_at(tmp_path, 0, 0)
    assert len(tail.read_lines(9, BIG, 0)) == 3
    # Sealed as if it held a line more than it does: the next file begins at seq 4.
    seal_live(tmp_path, 0, 3, line(4).removesuffix(b"\n"))
    with pytest.raises(SegmentProblem, match=r"ends before seq 3, and the next file"):
        tail.read_lines(9, BIG, 3)
    tail.close()


def test_the_live_file_between_the_seals_last_two_steps_is_waited_for(tmp_path: Path) -> None:
    sealed_with_lines(tmp_path, 2)
    tail = LedgerTail.open_at(tmp_path, 0, 0)
    assert len(tail.read_lines(9, BIG, 0)) == 2
    (tmp_path / NEXT_FILE).write_bytes(line(2))
    (tmp_path / SEGMENTS_DIR).mkdir()
    (tmp_path / LIVE_FILE).rename(tmp_path / SEGMENTS_DIR / segment_name(0, 1))
    assert tail.read_lines(9, BIG, 2) == []
    # Still the sealed one, at its end, under its new name.
    assert (tail.path, tail.offset) == (
        tmp_path / SEGMENTS_DIR / segment_name(0, 1),
        len(line(0) + line(1)),
    )
    (tmp_path / NEXT_FILE).rename(tmp_path / LIVE_FILE)
    assert tail.read_lines(9, BIG, 2) == [(0, line(2))]
    assert (tail.path, tail.first) == (tmp_path / LIVE_FILE, 2)
    tail.close()


def test_lines_appended_after_the_read_that_found_the_end_and_then_sealed_are_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sealed_with_lines(tmp_path, 2)
    tail = LedgerTail.open_at(tmp_path, 0, 0)
    assert len(tail.read_lines(9, BIG, 0)) == 2
    real_read_here = LedgerTail.read_here

    def then_sealed(self: LedgerTail, most: int, most_bytes: int) -> list[tuple[int, bytes]]:
        got = real_read_here(self, most, most_bytes)
        if not got and self.first == 0:
            # Between the read that found the end and the look for a seal: a line more,
            # then the seal.
            append(tmp_path / LIVE_FILE, line(2))
            seal_live(tmp_path, 0, 2, line(3).removesuffix(b"\n"))
        return got

    monkeypatch.setattr(LedgerTail, "read_here", then_sealed)
    assert tail.read_lines(9, BIG, 2) == [(len(line(0) + line(1)), line(2))]
    assert tail.read_lines(9, BIG, 3) == [(0, line(3))]
    assert tail.read_lines(9, BIG, 4) == []
    tail.close()
