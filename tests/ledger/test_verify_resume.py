"""Verification from a checkpoint (boxmaker.ledger.fast_start, docs/protocol.md,
"Verifying"): resumed at any checkpoint of a generated ledger (calls in every phase,
boots stopped and started, a line lost after it or not) it finds what the full
verification finds in the lines after it, and the same open calls; a position, a
chain, a note or tiles that do not hold are refused with the reason."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

import orjson
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tests.harness.ledger_gen import Generated, write_ledger

from boxmaker.ledger.checkpointer import CheckpointPosition
from boxmaker.ledger.fast_start import (
    Refusal,
    RefusalReason,
    SinceCheckpoint,
    verify_since_checkpoint,
)
from boxmaker.ledger.merkle import Frontier
from boxmaker.ledger.reader import READ_BUFFER
from boxmaker.ledger.signed_note import NoteSigner
from boxmaker.ledger.tiles import TileStore, tile_path
from boxmaker.ledger.tree import CHECKPOINT_POS_FILE, TREE_DIR
from boxmaker.ledger.verify import ResumePoint, verify_lines
from boxmaker.ledger.verify_tree import TileCheck

SIGNER = NoteSigner(
    "boxmaker.local/ledger/l-resume", Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
)
OTHER = NoteSigner(
    "boxmaker.local/ledger/l-resume", Ed25519PrivateKey.from_private_bytes(bytes(32))
)


def point_at(ledger: Generated, seq: int) -> int:
    """Make ``checkpoint.pos`` name line ``seq``; its offset."""
    data = ledger.path.read_bytes()
    offset = 0
    for _ in range(seq):
        offset = data.index(b"\n", offset) + 1
    line = data[offset : data.index(b"\n", offset)]
    position = CheckpointPosition(seq=seq, offset=offset, sha256=hashlib.sha256(line).hexdigest())
    (ledger.path.parent / TREE_DIR / CHECKPOINT_POS_FILE).write_bytes(position.to_json())
    return offset


def lose_line(path: Path, seq: int) -> None:
    lines = path.read_bytes().split(b"\n")
    del lines[seq]
    path.write_bytes(b"\n".join(lines))


def since(ledger: Generated) -> SinceCheckpoint:
    found = verify_since_checkpoint(ledger.path, SIGNER.verifier)
    assert isinstance(found, SinceCheckpoint), found
    return found


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    records=st.integers(160, 700),
    every=st.integers(20, 150),
    stop_chance=st.sampled_from([0.0, 0.02, 0.1]),
    lost=st.none() | st.integers(1, 10_000),
    pick=st.integers(0, 1_000),
)
# The lost line is the checkpoint after the one resumed from.
@example(seed=0, records=160, every=20, stop_chance=0.0, lost=19, pick=0)
def test_resumed_at_any_checkpoint_it_finds_what_the_full_verification_finds(
    seed: int,
    records: int,
    every: int,
    stop_chance: float,
    lost: int | None,
    pick: int,
) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        ledger = write_ledger(
            Path(scratch), records, SIGNER, every=every, seed=seed, stop_chance=stop_chance
        )
        assert ledger.checkpoints
        at = ledger.checkpoints[pick % len(ledger.checkpoints)]
        point_at(ledger, at)
        lost_seq = None
        if lost is not None and at + 1 < ledger.records:
            lost_seq = at + 1 + lost % (ledger.records - at - 1)
            lose_line(ledger.path, lost_seq)
        with ledger.path.open("rb", buffering=READ_BUFFER) as lines:
            full = verify_lines(lines, verifier=SIGNER.verifier)
        resumed = since(ledger)
        assert resumed.checkpoint_seq == at
        report = resumed.report
        assert report.resumed_from == at + 1
        assert list(report.problems) == [p for p in full.problems if p.seq > at]
        assert report.open_calls == full.open_calls
        assert report.head == full.head
        # A lost line may be a checkpoint itself; the lines after it are still read.
        assert report.checkpoints == len(
            [seq for seq in ledger.checkpoints if seq > at and seq != lost_seq]
        )
        counts, full_counts = report.calls, full.calls
        assert (counts.pending, counts.running, counts.unfinished) == (
            full_counts.pending,
            full_counts.running,
            full_counts.unfinished,
        )


@pytest.fixture
def ledger(tmp_path: Path) -> Generated:
    return write_ledger(tmp_path / "ledger", 900, SIGNER, every=200, seed=3)


def refusal(ledger: Generated, key: NoteSigner | None = SIGNER) -> Refusal:
    found = verify_since_checkpoint(ledger.path, None if key is None else key.verifier)
    assert isinstance(found, Refusal), found
    return found


def test_the_newest_checkpoint_is_resumed_from(ledger: Generated) -> None:
    found = since(ledger)
    assert found.checkpoint_seq == ledger.checkpoints[-1] == 800
    assert found.report.records == 900 - 801
    assert found.report.sound


def test_without_a_position_or_a_key_it_is_refused(ledger: Generated) -> None:
    assert refusal(ledger, key=None) == Refusal(
        RefusalReason.NO_KEY, "no ledger key to check the checkpoint's signature"
    )
    (ledger.path.parent / TREE_DIR / CHECKPOINT_POS_FILE).unlink()
    assert refusal(ledger) == Refusal(RefusalReason.NO_POSITION, "no checkpoint.pos yet")


def test_a_position_that_names_another_line_is_refused(ledger: Generated) -> None:
    pos = ledger.path.parent / TREE_DIR / CHECKPOINT_POS_FILE
    fields = orjson.loads(pos.read_bytes())
    line_start = ledger.path.read_bytes().rindex(b"\n", 0, fields["offset"] - 1) + 1
    pos.write_bytes(orjson.dumps(dict(fields, offset=line_start)))
    assert refusal(ledger) == Refusal(
        RefusalReason.WRONG_LINE,
        f"the line at offset {line_start} is not the one checkpoint.pos names",
    )
    pos.write_bytes(orjson.dumps(dict(fields, offset=fields["offset"] + 1)))
    assert refusal(ledger).reason is RefusalReason.WRONG_LINE
    pos.write_bytes(b"{}")
    assert refusal(ledger).reason is RefusalReason.BAD_POSITION


def test_a_position_at_a_line_that_is_not_a_checkpoint_is_refused(ledger: Generated) -> None:
    offset = point_at(ledger, 799)
    assert refusal(ledger) == Refusal(
        RefusalReason.NOT_A_CHECKPOINT, f"the line at offset {offset} is not checkpoint seq 799"
    )


def test_a_checkpoint_the_chain_does_not_match_is_refused(ledger: Generated) -> None:
    lines = ledger.path.read_bytes().split(b"\n")
    lines[799] = lines[799].replace(b'"at":"2026', b'"at":"2027')
    ledger.path.write_bytes(b"\n".join(lines))
    assert refusal(ledger) == Refusal(
        RefusalReason.CHAIN_BROKEN,
        "the line before checkpoint seq 800 is not the one its prev names",
    )


def test_a_checkpoint_signed_by_another_key_is_refused(ledger: Generated) -> None:
    found = refusal(ledger, key=OTHER)
    assert found == Refusal(
        RefusalReason.BAD_NOTE, "checkpoint seq 800: not_verified: no signature by a known key"
    )


def test_tiles_that_do_not_give_the_signed_root_are_refused(ledger: Generated) -> None:
    # Frontier.at(800) reads the root of leaves [512, 768) from tile 1/000.p/3.
    tile = ledger.path.parent / TREE_DIR / tile_path(1, 0, 3)
    data = bytearray(tile.read_bytes())
    data[64] ^= 1
    tile.write_bytes(bytes(data))
    assert refusal(ledger) == Refusal(
        RefusalReason.TILES, "the tiles do not give checkpoint seq 800's signed root"
    )


def test_tiles_shorter_than_the_checkpoint_are_refused(tmp_path: Path) -> None:
    ledger = write_ledger(tmp_path / "ledger", 900, SIGNER, every=200, seed=3)
    for level_dir in (ledger.path.parent / TREE_DIR / "tile").iterdir():
        for path in sorted(level_dir.rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
    assert refusal(ledger) == Refusal(
        RefusalReason.TILES, "the tiles hold 0 leaves, checkpoint seq 800 needs 800"
    )


def test_resumed_at_the_last_line_it_reports_the_checkpoint_as_the_head(
    ledger: Generated,
) -> None:
    # Nothing after the newest checkpoint: the report is of no lines, its head the
    # checkpoint's own line, the calls then open as the record says.
    lines = ledger.path.read_bytes().split(b"\n")
    ledger.path.write_bytes(b"\n".join(lines[:801]) + b"\n")
    with ledger.path.open("rb", buffering=READ_BUFFER) as whole:
        full = verify_lines(whole, verifier=SIGNER.verifier)
    report = since(ledger).report
    assert report.records == 0
    assert report.head == full.head == f"800:{hashlib.sha256(lines[800]).hexdigest()}"
    assert report.resumed_from == 801
    assert report.open_calls == full.open_calls
    assert (report.calls.pending, report.calls.running, report.calls.unfinished) == (
        full.calls.pending,
        full.calls.running,
        full.calls.unfinished,
    )
    assert report.sound


def test_a_resumed_verification_refuses_what_it_cannot_check(tmp_path: Path) -> None:
    resume = ResumePoint(
        next_seq=801,
        prev_hash="00" * 32,
        tree=Frontier(),
        open_calls={},
        unfinished=frozenset(),
        newest_boot=None,
        boot_stopped=False,
        origin=SIGNER.name,
    )
    for before in (0, 800):
        with pytest.raises(ValueError, match=rf"^the expected head's seq {before} is before the"):
            verify_lines([], f"{before}:" + "00" * 32, resume=resume)
    # The first resumed seq, or none expected, is not before the resumed lines.
    assert verify_lines([], "801:" + "00" * 32, resume=resume).head == "800:" + "00" * 32
    assert verify_lines([], resume=resume).resumed_from == 801
    tiles = TileCheck(TileStore(tmp_path))
    with pytest.raises(ValueError, match=r"^the tiles are checked in a full verification only$"):
        verify_lines([], resume=resume, tiles=tiles)
