"""The ``checkpoint`` record (boxmaker.ledger.records.CheckpointRecord): its line, read
back typed, and what verify asks of it on its own: its size is its seq (the rest it
asks, root, note and open calls: tests/ledger/test_verify_tree.py)."""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from boxmaker.ledger.checkpoint import Checkpoint, format_checkpoint
from boxmaker.ledger.merkle import leaf_hash
from boxmaker.ledger.records import (
    GENESIS_PREV,
    CallPhase,
    CheckpointRecord,
    Genesis,
    decode_line,
    encode_line,
    line_hash,
)
from boxmaker.ledger.signed_note import NoteSigner, sign_note
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


SIGNER = NoteSigner("boxmaker.local/ledger/l-1", Ed25519PrivateKey.from_private_bytes(bytes(32)))


def ledger(size: int) -> list[bytes]:
    """Genesis, then a checkpoint of the tree of the genesis line that says ``size``."""
    genesis = encode_line(0, AT, GENESIS_PREV, Genesis(ledger="l-1"))
    root = leaf_hash(genesis)
    note = sign_note(format_checkpoint(Checkpoint(SIGNER.name, size, root)), [SIGNER])
    body = CheckpointRecord(
        boot="b-1", size=size, root=root.hex(), note=note.decode(), open_calls={}, unfinished=[]
    )
    checkpoint = encode_line(1, AT, line_hash(genesis), body)
    return [genesis + b"\n", checkpoint + b"\n"]


def test_verify_takes_a_checkpoint_whose_size_is_its_seq() -> None:
    report = verify_lines(ledger(1), verifier=SIGNER.verifier)
    assert report.sound, report.problems
    assert (report.checkpoints, report.signatures_checked) == (1, True)


def test_verify_finds_a_checkpoint_whose_size_is_not_its_seq() -> None:
    report = verify_lines(ledger(2))
    assert [str(p) for p in report.problems] == ["seq 1: checkpoint record of size 2, not its seq"]
