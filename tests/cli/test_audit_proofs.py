"""``bxctl audit prove``, ``check-proof`` and ``consistency`` as the owner and an
outsider run them: real bxctl processes on a home whose ledger has checkpoint records
and tiles (docs/protocol.md, "Proofs")."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest
from tests.harness.cli import bxctl
from tests.harness.proof_ledgers import (
    BuiltLedger,
    approved_call,
    denied_call,
    home_signer,
    load_home,
    save_home,
    start,
)

from boxmaker.home.paths import Home
from boxmaker.ledger.ledger_key import read_ledger_origin

DENIED = "c-" + "d" * 16
APPROVED = "c-" + "a" * 16
LATER = "c-" + "e" * 16


@pytest.fixture
def home(tmp_path: Path) -> Home:
    home = Home(tmp_path / "home")
    bxctl(home, "init")
    return home


def checkpointed(home: Home, *calls: tuple[str, str]) -> tuple[BuiltLedger, str]:
    """Append the calls ((call, "denied"|"approved")) and a checkpoint; its note."""
    built = load_home(home)
    start(built)
    for call, how in calls:
        (denied_call if how == "denied" else approved_call)(built, call)
    note, _ = built.checkpoint(home_signer(home))
    save_home(home, built)
    return built, note


def test_prove_a_denied_and_an_approved_call_and_check_them(home: Home, tmp_path: Path) -> None:
    built, _ = checkpointed(home, (DENIED, "denied"), (APPROVED, "approved"))
    origin = read_ledger_origin(home.audit_log)
    size = len(built.lines) - 1  # the checkpoint record is the last line; its seq = size
    denied_file = tmp_path / "denied.json"
    done = bxctl(home, "audit", "prove", DENIED, "--out", str(denied_file))
    assert done.stdout == (
        f"proof of call {DENIED} (1 records) by checkpoint {size} of {origin} "
        f"written to {denied_file}\n"
    )
    assert denied_file.stat().st_mode & 0o777 == 0o600
    checked = bxctl(home, "audit", "check-proof", str(denied_file), "--vkey", str(home.ledger_vkey))
    lines = checked.stdout.splitlines()
    assert len(lines) == 2
    assert lines[0].split() == [
        "2",
        "2026-12-01T10:00:00.000Z",
        "decision",
        DENIED,
        "tool=read_file",
        "verdict=deny",
        "reason=no_grant",
    ]
    assert lines[1] == f"proved by checkpoint {size} of {origin}, signed by {origin} (pinned)"

    # Printed rather than written: the document itself; checked with no key pinned.
    approved = bxctl(home, "audit", "prove", APPROVED)
    document = orjson.loads(approved.stdout)
    assert document["format"] == "boxmaker-proof/1"
    assert document["vkey"] == home.ledger_vkey.read_text().strip()
    assert [record["seq"] for record in document["records"]] == [3, 4, 5]
    assert [record["line"].encode() for record in document["records"]] == built.lines[3:6]
    approved_file = tmp_path / "approved.json"
    approved_file.write_text(approved.stdout)
    checked = bxctl(home, "audit", "check-proof", str(approved_file))
    lines = checked.stdout.splitlines()
    assert "outcome=allowed" in lines[1]
    assert "status=ok" in lines[2]
    assert "grant=read-notes" in lines[0]
    assert "verdict=ask" in lines[0]
    assert lines[3] == (
        f"proved by checkpoint {size} of {origin}, signed by {origin} "
        f"(not pinned: compare the key with the owner's: {document['vkey']})"
    )
    as_json: dict[str, Any] = orjson.loads(
        bxctl(home, "audit", "check-proof", str(approved_file), "--json").stdout
    )
    assert (as_json["ok"], as_json["pinned"], as_json["checkpoint"]) == (True, False, size)
    assert [record["kind"] for record in as_json["records"]] == ["decision", "approval", "result"]


def test_check_proof_of_an_edited_file_fails_naming_the_problem(home: Home, tmp_path: Path) -> None:
    checkpointed(home, (DENIED, "denied"))
    proof = tmp_path / "proof.json"
    bxctl(home, "audit", "prove", DENIED, "--out", str(proof))
    proof.write_text(proof.read_text().replace("notes.txt", "other.txt"))
    done = bxctl(home, "audit", "check-proof", str(proof), check=False)
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.startswith("bxctl: proof refused: bad_proof: seq 2: the line is not the one")
    as_json = orjson.loads(
        bxctl(home, "audit", "check-proof", str(proof), "--json", check=False).stdout
    )
    assert (as_json["ok"], as_json["reason"], as_json["seq"]) == (False, "bad_proof", 2)


def test_prove_before_a_checkpoint_covers_the_call_says_so(home: Home) -> None:
    built, _ = checkpointed(home, (DENIED, "denied"))
    denied_call(built, LATER)
    save_home(home, built)
    done = bxctl(home, "audit", "prove", LATER, check=False)
    assert done.returncode == 1
    assert done.stderr.startswith(
        f"bxctl: call {LATER} is not yet in a checkpoint: its last record is seq 4, "
        "the newest covers 3; brokerd writes the next within [ledger] checkpoint_every"
    )
    unknown = bxctl(home, "audit", "prove", "c-" + "0" * 16, check=False)
    assert unknown.returncode == 1
    assert "no records of call c-0000000000000000" in unknown.stderr


def test_consistency_holds_after_more_records(home: Home, tmp_path: Path) -> None:
    _, old_note = checkpointed(home, (DENIED, "denied"))
    kept = tmp_path / "kept-checkpoint"
    kept.write_text(old_note)
    built, _ = checkpointed(home, (APPROVED, "approved"))
    new_size = len(built.lines) - 1
    done = bxctl(home, "audit", "consistency", str(kept))
    origin = read_ledger_origin(home.audit_log)
    assert done.stdout == (
        f"ok: the ledger of {new_size} records (newest checkpoint) extends the checkpoint "
        f"of 3 records, both of {origin}, signed by {origin}\n"
    )
    as_json = orjson.loads(bxctl(home, "audit", "consistency", str(kept), "--json").stdout)
    assert (as_json["ok"], as_json["old_size"], as_json["new_size"]) == (True, 3, new_size)
    assert as_json["document"]["format"] == "boxmaker-consistency/1"
    assert as_json["document"]["proof"]


def test_consistency_with_a_forked_or_foreign_checkpoint_fails(home: Home, tmp_path: Path) -> None:
    checkpointed(home, (DENIED, "denied"))
    # The fork: the same key and origin, other records after the shared prefix.
    fork = Home(tmp_path / "fork")
    shutil.copytree(home.root, fork.root)
    fork_built, fork_note = checkpointed(fork, (LATER, "denied"))
    built, _ = checkpointed(home, (APPROVED, "approved"))
    assert len(built.lines) > len(fork_built.lines)
    kept = tmp_path / "fork-checkpoint"
    kept.write_text(fork_note)
    done = bxctl(home, "audit", "consistency", str(kept), check=False)
    assert done.returncode == 1
    assert done.stderr.startswith(
        f"bxctl: not consistent (old size {len(fork_built.lines) - 1}, "
        f"new size {len(built.lines) - 1}): not_a_prefix: the ledger of size"
    )
    # Another home's checkpoint: another key.
    other = Home(tmp_path / "other")
    bxctl(other, "init")
    _, other_note = checkpointed(other, (DENIED, "denied"))
    kept.write_text(other_note)
    done = bxctl(home, "audit", "consistency", str(kept), "--json", check=False)
    assert done.returncode == 1
    assert orjson.loads(done.stdout)["reason"] == "not_signed"
    assert "the old checkpoint is not signed by" in done.stderr
