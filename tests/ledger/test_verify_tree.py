"""The full verification computes the tree (boxmaker.ledger.verify, docs/protocol.md,
"Verifying"): on a generated ledger with checkpoints and tiles it is sound, and a line
changed (the chain made good again, as someone without the key would), a tile, a
checkpoint's root, its note's signature or its open calls is each found, at the record
or the tile it concerns."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from tests.harness.ledger_gen import Generated, write_ledger

from boxmaker.ledger.checkpoint import Checkpoint, format_checkpoint
from boxmaker.ledger.signed_note import NoteSigner, sign_note
from boxmaker.ledger.tiles import tile_path
from boxmaker.ledger.tree import TREE_DIR
from boxmaker.ledger.verify_files import verify_file

ORIGIN = "boxmaker.local/ledger/l-tree"
SIGNER = NoteSigner(ORIGIN, Ed25519PrivateKey.from_private_bytes(bytes(range(32))))
OTHER = NoteSigner(ORIGIN, Ed25519PrivateKey.from_private_bytes(bytes(32)))


@pytest.fixture
def ledger(tmp_path: Path) -> Generated:
    return write_ledger(tmp_path / "ledger", 1500, SIGNER, every=400, seed=7)


def rewrite(path: Path, seq: int, edit: Callable[[dict[str, Any]], None]) -> None:
    """Edit record ``seq`` and make the chain after it good again (every ``prev``
    recomputed): what someone who can write the file but has no key can do."""
    lines = path.read_bytes().split(b"\n")[:-1]
    prev = None
    for at, line in enumerate(lines):
        if at >= seq:
            fields = orjson.loads(line)
            if at == seq:
                edit(fields)
            if prev is not None:
                fields["prev"] = prev
            lines[at] = orjson.dumps(fields, option=orjson.OPT_SORT_KEYS)
        prev = hashlib.sha256(lines[at]).hexdigest()
    path.write_bytes(b"".join(line + b"\n" for line in lines))


def problems(ledger: Generated, *, signed: bool = True) -> list[str]:
    report = verify_file(ledger.path, verifier=SIGNER.verifier if signed else None)
    return [str(problem) for problem in report.problems]


def test_a_generated_ledger_with_checkpoints_and_tiles_is_sound(ledger: Generated) -> None:
    report = verify_file(ledger.path, verifier=SIGNER.verifier)
    assert report.sound, report.problems
    assert report.checkpoints == len(ledger.checkpoints) == 3
    assert report.signatures_checked
    # 1500 leaves: tiles 0/000..0/004 full, 0/005.p/220 and 1/000.p/5.
    assert (report.tiles_checked, report.tiles_sound) == (7, True)
    assert report.open_calls == frozenset(ledger.open_calls)


def test_without_the_key_the_signatures_are_not_checked(ledger: Generated) -> None:
    report = verify_file(ledger.path)
    assert report.sound
    assert report.checkpoints == 3
    assert not report.signatures_checked


def test_a_line_changed_and_the_chain_made_good_breaks_the_next_checkpoints_root(
    ledger: Generated,
) -> None:
    def edit(fields: dict[str, Any]) -> None:
        fields["at"] = "2026-03-01T00:00:01.000Z"

    rewrite(ledger.path, 500, edit)
    found = problems(ledger)
    checked = [p for p in found if not p.startswith("seq 0: tree tile ")]
    first, second = ledger.checkpoints[1:]
    assert [p.split(" checkpoint root ")[0] for p in checked] == [f"seq {first}:", f"seq {second}:"]
    assert checked[0].endswith(f"… is not the tree's root at size {first} ({checked[0][-14:]}")
    # Leaf 500 is hash 244 of tile 0/001: the tiles hold what the lines held when written
    # (and every later leaf changed with its prev).
    assert found[0] == (
        "seq 0: tree tile tile/0/001 holds another hash at position 244 than the ledger's "
        "lines give"
    )


def test_a_tile_changed_is_found_at_its_position(ledger: Generated) -> None:
    tile = ledger.path.parent / TREE_DIR / tile_path(0, 2, 256)
    data = bytearray(tile.read_bytes())
    data[32 * 17] ^= 1
    tile.write_bytes(bytes(data))
    assert problems(ledger) == [
        "seq 0: tree tile tile/0/002 holds another hash at position 17 than the ledger's lines give"
    ]


def test_a_missing_partial_tile_is_found(ledger: Generated) -> None:
    (ledger.path.parent / TREE_DIR / tile_path(1, 0, 5)).unlink()
    assert problems(ledger) == [
        "seq 0: the tree's tiles cannot be read: tree tile tile/1/000.p missing: "
        "no partial tile of 5 hashes or more"
    ]


def test_a_checkpoint_root_changed_is_found(ledger: Generated) -> None:
    seq = ledger.checkpoints[0]

    def edit(fields: dict[str, Any]) -> None:
        fields["root"] = "ab" * 32

    rewrite(ledger.path, seq, edit)
    found = [p for p in problems(ledger) if p.startswith(f"seq {seq}:")]
    assert len(found) == 2
    assert found[0].startswith(f"seq {seq}: checkpoint root abababababab… is not the tree's root")
    assert found[1].startswith(f"seq {seq}: checkpoint note's root ")
    assert found[1].endswith(" is not the record's")


def test_a_note_signed_by_another_key_is_refused(ledger: Generated) -> None:
    seq = ledger.checkpoints[1]

    def edit(fields: dict[str, Any]) -> None:
        checkpoint = Checkpoint(ORIGIN, seq, bytes.fromhex(fields["root"]))
        fields["note"] = sign_note(format_checkpoint(checkpoint), [OTHER]).decode()

    rewrite(ledger.path, seq, edit)
    found = [p for p in problems(ledger) if p.startswith(f"seq {seq}:")]
    assert found == [
        f"seq {seq}: checkpoint note refused: not_verified: no signature by a known key"
    ]
    assert not [p for p in problems(ledger, signed=False) if p.startswith(f"seq {seq}:")]


def test_a_note_for_another_size_is_found(ledger: Generated) -> None:
    seq = ledger.checkpoints[1]

    def edit(fields: dict[str, Any]) -> None:
        checkpoint = Checkpoint(ORIGIN, seq - 1, bytes.fromhex(fields["root"]))
        fields["note"] = sign_note(format_checkpoint(checkpoint), [SIGNER]).decode()

    rewrite(ledger.path, seq, edit)
    found = [p for p in problems(ledger) if p.startswith(f"seq {seq}:")]
    assert found == [f"seq {seq}: checkpoint note's size {seq - 1} is not the record's"]


def test_open_calls_that_are_not_the_open_calls_are_found(ledger: Generated) -> None:
    seq = ledger.checkpoints[2]
    dropped: list[str] = []

    def edit(fields: dict[str, Any]) -> None:
        call = sorted(fields["open_calls"])[0]
        dropped.append(f"{call} {fields['open_calls'].pop(call)}")
        fields["unfinished"].append("c-00000000000000ff")

    rewrite(ledger.path, seq, edit)
    found = [p for p in problems(ledger) if p.startswith(f"seq {seq}:")]
    assert found == [
        f"seq {seq}: checkpoint open_calls differ from the calls open then: "
        f"{dropped[0]}, not recorded",
        f"seq {seq}: checkpoint unfinished differ from the calls open then: "
        "c-00000000000000ff recorded unfinished, not open",
    ]
