"""Verification over a ledger's files (boxmaker.ledger.verify_segments, docs/protocol.md,
"Reading and verifying segments"): a segmented ledger verifies as the same lines in one
file do; an edited sealed line, a missing middle segment, a sealed file that does not
begin with its checkpoint, a misnamed or torn one are each found; with the oldest
segments archived the rest is verified from the first file's checkpoint, and refused
with a wrong key, no key or no tiles."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import orjson
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from tests.harness.ledger_gen import Generated, write_ledger

from boxmaker.ledger.segments import SEGMENTS_DIR, ledger_files, segment_name
from boxmaker.ledger.signed_note import NoteSigner
from boxmaker.ledger.tree import TREE_DIR
from boxmaker.ledger.verify import Problem, Report
from boxmaker.ledger.verify_files import verify_file

SIGNER = NoteSigner(
    "boxmaker.local/ledger/l-segments", Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
)
OTHER = NoteSigner(
    "boxmaker.local/ledger/l-segments", Ed25519PrivateKey.from_private_bytes(bytes(32))
)
SEGMENT = 200


@pytest.fixture
def ledger(tmp_path: Path) -> Generated:
    return write_ledger(
        tmp_path / "ledger",
        1100,
        SIGNER,
        every=300,
        seed=5,
        stop_chance=0.02,
        segment_records=SEGMENT,
    )


def segment(ledger: Generated, first: int) -> Path:
    return ledger.path.parent / SEGMENTS_DIR / segment_name(first, first + SEGMENT - 1)


def unsegmented(ledger: Generated, to: Path) -> Path:
    """The same lines in one file, with the same tiles."""
    to.mkdir()
    shutil.copytree(ledger.path.parent / TREE_DIR, to / TREE_DIR)
    with (to / "audit.jsonl").open("wb") as out:
        for path in ledger_files(ledger.path.parent).paths():
            out.write(path.read_bytes())
    return to / "audit.jsonl"


def verify(ledger: Generated, signer: NoteSigner | None = SIGNER) -> Report:
    return verify_file(ledger.path, verifier=None if signer is None else signer.verifier)


def rewrite(path: Path, data: bytes) -> None:
    os.chmod(path, 0o644)
    path.write_bytes(data)
    os.chmod(path, 0o444)


def test_the_files_verify_as_the_same_lines_in_one_file(ledger: Generated, tmp_path: Path) -> None:
    files = ledger_files(ledger.path.parent)
    assert [(s.first, s.last) for s in files.segments] == [
        (first, first + SEGMENT - 1) for first in range(0, 1000, SEGMENT)
    ]
    report = verify(ledger)
    whole = verify_file(unsegmented(ledger, tmp_path / "whole"), verifier=SIGNER.verifier)
    assert report.sound, report.problems
    assert (report.records, report.head, report.calls, report.checkpoints) == (
        whole.records,
        whole.head,
        whole.calls,
        whole.checkpoints,
    )
    assert report.tiles_checked == whole.tiles_checked > 0
    assert report.tiles_sound
    assert report.warnings == ()
    assert report.archived == 0


def test_an_edited_sealed_line_is_found(ledger: Generated) -> None:
    path = segment(ledger, 400)
    data = path.read_bytes()
    rewrite(path, data.replace(b'"output_bytes":', b'"output_bytes":1', 1))
    report = verify(ledger)
    assert not report.sound
    edited = 400 + data[: data.index(b'"output_bytes":')].count(b"\n")
    assert any(p.seq == edited and "was changed" in p.what for p in report.problems)


def test_a_missing_middle_segment_is_a_problem_and_nothing_is_read(ledger: Generated) -> None:
    segment(ledger, 400).unlink()
    report = verify(ledger)
    assert report.problems == (
        Problem(0, f"{segment_name(600, 799)} does not follow {segment_name(200, 399)}"),
    )
    assert report.records == 0


def test_a_sealed_file_not_begun_with_its_checkpoint_is_found(ledger: Generated) -> None:
    """The line that begins 400-599 (its checkpoint) moved to the end of 200-399 and the
    files named for what they hold: the chain is whole, the files are not."""
    before, after = segment(ledger, 200), segment(ledger, 400)
    head, _, rest = after.read_bytes().partition(b"\n")
    rewrite(before, before.read_bytes() + head + b"\n")
    rewrite(after, rest)
    before.rename(before.with_name(segment_name(200, 400)))
    after.rename(after.with_name(segment_name(401, 599)))
    report = verify(ledger)
    assert [(p.seq, p.what) for p in report.problems] == [
        (
            401,
            f"segment {segment_name(401, 599)} does not begin with the checkpoint of size "
            "401 that closes the file before it (its first line: seq 401, kind "
            f"{report_kind(ledger, 401)!r})",
        )
    ]


def report_kind(ledger: Generated, seq: int) -> str:
    for path in ledger_files(ledger.path.parent).paths():
        for line in path.read_bytes().splitlines():
            fields = orjson.loads(line)
            if fields["seq"] == seq:
                return str(fields["kind"])
    raise AssertionError(seq)


def test_a_misnamed_segment_is_found(ledger: Generated) -> None:
    """Two files swapped names' numbers by one line: each holds what the other says."""
    before, after = segment(ledger, 200), segment(ledger, 400)
    lines = after.read_bytes().splitlines(keepends=True)
    rewrite(before, before.read_bytes() + b"".join(lines[:1]))
    rewrite(after, b"".join(lines[1:]))
    report = verify(ledger)
    assert (
        Problem(200, f"segment {segment_name(200, 399)} is misnamed: its lines are seq 200 to 400")
        in report.problems
    )
    assert (
        Problem(400, f"segment {segment_name(400, 599)} is misnamed: its lines are seq 401 to 599")
        in report.problems
    )


def test_a_torn_sealed_file_is_found(ledger: Generated) -> None:
    path = segment(ledger, 600)
    rewrite(path, path.read_bytes()[:-1])
    report = verify(ledger)
    assert (
        Problem(
            799, f"segment {segment_name(600, 799)} ends in a torn line (only the live file may)"
        )
        in report.problems
    )


def test_a_writable_segment_is_a_warning_not_a_problem(ledger: Generated) -> None:
    os.chmod(segment(ledger, 200), 0o644)
    report = verify(ledger)
    assert report.sound
    assert report.warnings == (
        f"segment {segment_name(200, 399)} can be written to (mode 644, not 444)",
    )


def test_the_live_file_must_begin_with_its_checkpoint(ledger: Generated) -> None:
    data = ledger.path.read_bytes()
    ledger.path.write_bytes(data[data.index(b"\n") + 1 :])
    found = [p.what for p in verify(ledger).problems if p.seq == 1000]
    assert (
        "the live file does not begin with the checkpoint of size 1000 that closes the file "
        "before it (its first line: seq 1001, kind 'decision')"
    ) in found


def archive(ledger: Generated, count: int) -> Path:
    away = ledger.path.parent.parent / "archive"
    away.mkdir()
    for path in sorted((ledger.path.parent / SEGMENTS_DIR).iterdir())[:count]:
        path.rename(away / path.name)
    return away


def test_archived_segments_are_not_read_the_rest_is_verified_from_the_checkpoint(
    ledger: Generated, tmp_path: Path
) -> None:
    whole = verify_file(unsegmented(ledger, tmp_path / "whole"), verifier=SIGNER.verifier)
    archive(ledger, 2)
    report = verify(ledger)
    assert report.sound, report.problems
    assert report.archived == 400
    assert report.resumed_from == 401
    assert report.records == whole.records - 401
    assert (report.head, report.calls.pending, report.calls.running) == (
        whole.head,
        whole.calls.pending,
        whole.calls.running,
    )
    assert report.open_calls == whole.open_calls


def test_archived_and_a_line_edited_after_the_checkpoint_is_found(ledger: Generated) -> None:
    archive(ledger, 2)
    path = segment(ledger, 600)
    data = path.read_bytes()
    rewrite(path, data.replace(b'"output_bytes":', b'"output_bytes":1', 1))
    edited = 600 + data[: data.index(b'"output_bytes":')].count(b"\n")
    assert any(p.seq == edited and "was changed" in p.what for p in verify(ledger).problems)


@pytest.mark.parametrize(
    ("signer", "reason"),
    [(OTHER, "bad_note: checkpoint seq 400: "), (None, "no_key: no ledger key")],
)
def test_archived_without_the_right_key_is_a_problem(
    ledger: Generated, signer: NoteSigner | None, reason: str
) -> None:
    archive(ledger, 2)
    report = verify(ledger, signer)
    assert len(report.problems) == 1
    problem = report.problems[0]
    assert problem.seq == 400
    assert problem.what.startswith(
        f"lines 0-399 are archived and checkpoint seq 400 cannot stand for them: {reason}"
    )
    assert report.records == 0


def test_archived_without_the_tiles_is_a_problem(ledger: Generated) -> None:
    archive(ledger, 2)
    shutil.rmtree(ledger.path.parent / TREE_DIR)
    (problem,) = verify(ledger).problems
    assert problem.what.startswith(
        "lines 0-399 are archived and checkpoint seq 400 cannot stand for them: tiles: "
    )


def test_archived_with_a_forged_first_checkpoint_is_refused(ledger: Generated) -> None:
    """The checkpoint that begins the oldest file present names another root: its note
    no longer says it, whatever the lines after it say."""
    archive(ledger, 2)
    path = segment(ledger, 400)
    data = path.read_bytes()
    at = data.index(b'"root":"') + len(b'"root":"')
    flipped = b"0" if data[at : at + 1] != b"0" else b"1"
    rewrite(path, data[:at] + flipped + data[at + 1 :])
    (problem,) = verify(ledger).problems
    assert "cannot stand for them: bad_note: checkpoint seq 400: its note does not say" in (
        problem.what
    )


def test_an_expected_head_in_the_archived_lines_is_a_problem(ledger: Generated) -> None:
    archive(ledger, 2)
    report = verify_file(ledger.path, "10:" + "0" * 64, verifier=SIGNER.verifier)
    assert report.problems == (
        Problem(400, f"the expected head 10:{'0' * 64} is in the archived lines (0-399)"),
    )
