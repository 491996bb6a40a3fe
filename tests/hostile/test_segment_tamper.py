"""A sealed segment replaced by a forgery whose chain is whole (docs/threat-model.md):
someone who can write the ledger's directory but not sign with the ledger key edits a
line in ``segments/200-399``, to make a denied call read as run, and recomputes every
``prev`` after it, in that file and in every file after it. The chain alone is sound
(checked below: the attack really ran); ``bxctl audit verify``'s reading of every file
finds it by the signed roots: the checkpoint that begins the next file no longer has the
tree's root, and the tiles do not hold the forged lines."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import orjson
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from tests.harness.ledger_gen import write_ledger

from boxmaker.ledger.records import GENESIS_PREV
from boxmaker.ledger.segments import ledger_files, ledger_lines
from boxmaker.ledger.signed_note import NoteSigner
from boxmaker.ledger.verify_files import verify_file

SIGNER = NoteSigner(
    "boxmaker.local/ledger/l-tamper", Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
)


def rechain_from(directory: Path, forged_seq: int, forge: dict[str, object]) -> None:
    """Rewrite line ``forged_seq`` with ``forge``'s fields and every ``prev`` after it,
    each file in place (its name, its mode)."""
    prev = GENESIS_PREV
    for path in ledger_files(directory).paths():
        out = []
        for line in path.read_bytes().splitlines():
            fields = orjson.loads(line)
            if fields["seq"] == forged_seq:
                fields.update(forge)
            if fields["seq"] >= forged_seq:
                fields["prev"] = prev
                line = orjson.dumps(fields, option=orjson.OPT_SORT_KEYS)
            prev = hashlib.sha256(line).hexdigest()
            out.append(line + b"\n")
        mode = path.stat().st_mode & 0o777
        os.chmod(path, 0o600)
        path.write_bytes(b"".join(out))
        os.chmod(path, mode)


def chain_breaks(directory: Path) -> list[int]:
    """The seqs whose prev or seq does not follow: the chain alone, no tree, no note."""
    breaks, prev = [], GENESIS_PREV
    for seq, raw in enumerate(ledger_lines(ledger_files(directory))):
        line = raw.removesuffix(b"\n")
        fields = orjson.loads(line)
        if fields["seq"] != seq or fields["prev"] != prev:
            breaks.append(seq)
        prev = hashlib.sha256(line).hexdigest()
    return breaks


def test_a_rechained_forgery_of_a_sealed_segment_is_found_by_the_signed_roots(
    tmp_path: Path,
) -> None:
    ledger = write_ledger(
        tmp_path / "ledger", 900, SIGNER, every=10_000, seed=9, segment_records=200
    )
    directory = ledger.path.parent
    denied = next(
        fields
        for path in ledger_files(directory).paths()[1:2]
        for line in path.read_bytes().splitlines()
        if (fields := orjson.loads(line))["kind"] == "decision" and fields["verdict"] == "deny"
    )
    assert 200 < denied["seq"] < 400
    assert verify_file(ledger.path, verifier=SIGNER.verifier).sound

    rechain_from(
        directory, denied["seq"], {"verdict": "run", "reason": None, "grant": "read-notes"}
    )

    assert chain_breaks(directory) == []  # the forgery's chain alone is sound
    report = verify_file(ledger.path, verifier=SIGNER.verifier)
    problems = [(p.seq, p.what) for p in report.problems]
    assert any(
        seq == 400
        and what.startswith("checkpoint root ")
        and "is not the tree's root at size 400" in what
        for seq, what in problems
    ), problems
    assert any(seq == 0 and what.startswith("tree tile ") for seq, what in problems), problems
