"""The ``checkpoint`` record (boxmaker.ledger.records.CheckpointRecord): its line, read
back typed, and what verify asks of it on its own: its size is its seq."""

from __future__ import annotations

from boxmaker.ledger.records import (
    GENESIS_PREV,
    CallPhase,
    CheckpointRecord,
    Genesis,
    decode_line,
    encode_line,
    line_hash,
)
from boxmaker.ledger.verify import verify_lines

AT = "2026-12-02T05:00:00.000Z"
NOTE = "boxmaker.local/ledger/l-1\n1\nAAAA\n\n— boxmaker.local/ledger/l-1 AAAAAA==\n"


def record(size: int) -> CheckpointRecord:
    return CheckpointRecord(
        boot="b-1",
        size=size,
        root="ab" * 32,
        note=NOTE,
        open_calls={"c-0000000000000001": CallPhase.ASKED},
        unfinished=["c-0000000000000002"],
    )


def test_a_checkpoint_line_reads_back_as_it_was_written() -> None:
    line = encode_line(1, AT, "00" * 32, record(1))
    assert line.startswith(b'{"at":"2026-12-02T05:00:00.000Z","boot":"b-1","kind":"checkpoint",')
    assert b'"open_calls":{"c-0000000000000001":"asked"}' in line
    assert decode_line(line).body == record(1)


def ledger(size: int) -> list[bytes]:
    genesis = encode_line(0, AT, GENESIS_PREV, Genesis(ledger="l-1"))
    checkpoint = encode_line(1, AT, line_hash(genesis), record(size))
    return [genesis + b"\n", checkpoint + b"\n"]


def test_verify_takes_a_checkpoint_whose_size_is_its_seq() -> None:
    report = verify_lines(ledger(1))
    assert report.sound, report.problems


def test_verify_finds_a_checkpoint_whose_size_is_not_its_seq() -> None:
    report = verify_lines(ledger(2))
    assert [str(p) for p in report.problems] == ["seq 1: checkpoint record of size 2, not its seq"]
