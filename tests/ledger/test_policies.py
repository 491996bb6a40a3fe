"""The kept grants versions beside the ledger (ledger/policies.py) and their check in
verify: content-addressed, 0600, written once; anything else under a kept name is not
trusted, and verify names it at its policy record."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

from boxmaker.core.vocabulary import Record
from boxmaker.ledger.policies import (
    KeptProblem,
    grant_then,
    keep,
    kept_path,
    kept_problem,
    policies_dir,
    read_kept,
)
from boxmaker.ledger.records import GENESIS_PREV, Body, Genesis, Policy, encode_line, line_hash
from boxmaker.ledger.verify import verify_lines
from boxmaker.ledger.verify_files import verify_file

AT = "2026-01-02T03:04:05.678Z"
GRANTS = b'[[grant]]\nid = "notes"\ntool = "read_file"\nmode = "auto"\n'
SHA = hashlib.sha256(GRANTS).hexdigest()


def write_ledger(path: Path, *bodies: Body) -> None:
    lines, prev = [], GENESIS_PREV
    for seq, body in enumerate((Genesis(ledger="l-1"), *bodies)):
        line = encode_line(seq, AT, prev, body)
        lines.append(line + b"\n")
        prev = line_hash(line)
    path.write_bytes(b"".join(lines))


def policy(sha: str | None, grants: int | None = 1, problem: str | None = None) -> Policy:
    return Policy(boot="b-1", sha256=sha, grants=grants, problem=problem)


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    (tmp_path / "ledger").mkdir()
    return tmp_path / "ledger" / "audit.jsonl"


def test_keep_writes_the_bytes_once_0600_named_by_their_sha(ledger: Path) -> None:
    directory = policies_dir(ledger)
    kept = keep(directory, GRANTS)
    assert (kept.sha256, kept.written, kept.replaced) == (SHA, True, None)
    path = kept_path(directory, SHA)
    assert path == ledger.parent / "policies" / f"{SHA}.toml"
    assert path.read_bytes() == GRANTS
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    inode = path.stat().st_ino
    again = keep(directory, GRANTS)
    assert (again.written, path.stat().st_ino) == (False, inode)  # never rewritten
    assert read_kept(directory, SHA) == GRANTS
    assert [p.name for p in directory.iterdir()] == [f"{SHA}.toml"]  # no temp left


def test_untrusted_entries_are_named_and_replaced_by_the_right_bytes(ledger: Path) -> None:
    directory = policies_dir(ledger)
    directory.mkdir(mode=0o700)
    path = kept_path(directory, SHA)
    elsewhere = ledger.parent / "elsewhere.toml"
    elsewhere.write_bytes(GRANTS)
    path.symlink_to(elsewhere)
    assert kept_problem(directory, SHA) == (
        f"{SHA}.toml is not a regular file (a symlink, which is not followed), not trusted"
    )
    kept = keep(directory, GRANTS)
    assert kept.replaced is not None
    assert "symlink" in kept.replaced
    assert not path.is_symlink()
    assert path.read_bytes() == GRANTS
    assert elsewhere.read_bytes() == GRANTS  # the link's target was never written


def test_each_kind_of_bad_kept_version_is_a_problem(ledger: Path) -> None:
    directory = policies_dir(ledger)
    directory.mkdir(mode=0o700)
    path = kept_path(directory, SHA)
    assert kept_problem(directory, SHA) == f"{SHA}.toml is missing"
    path.write_bytes(GRANTS.replace(b"auto", b"ask "))
    assert kept_problem(directory, SHA) == (
        f"{SHA}.toml was changed: its bytes hash to "
        f"{hashlib.sha256(GRANTS.replace(b'auto', b'ask ')).hexdigest()[:12]}…"
    )
    path.unlink()
    os.mkfifo(path)
    assert kept_problem(directory, SHA) == f"{SHA}.toml is not a regular file (a FIFO), not trusted"
    path.unlink()
    path.mkdir()
    assert "a directory" in str(kept_problem(directory, SHA))
    with pytest.raises(ValueError, match="not a SHA-256"):
        read_kept(directory, "../grants")


def test_a_policies_directory_that_is_a_symlink_is_refused(ledger: Path) -> None:
    real = ledger.parent / "real"
    real.mkdir()
    policies_dir(ledger).symlink_to(real)
    with pytest.raises(KeptProblem, match="is a symlink, which is not followed"):
        keep(policies_dir(ledger), GRANTS)
    assert list(real.iterdir()) == []


def test_verify_checks_each_policy_records_kept_version_at_its_seq(ledger: Path) -> None:
    other = GRANTS + b"# two\n"
    other_sha = hashlib.sha256(other).hexdigest()
    keep(policies_dir(ledger), GRANTS)
    keep(policies_dir(ledger), other)
    write_ledger(ledger, policy(SHA), policy(other_sha), policy(None, None, "no such file"))
    assert verify_file(ledger).sound
    kept_path(policies_dir(ledger), other_sha).unlink()
    kept_path(policies_dir(ledger), SHA).write_bytes(GRANTS + b" ")
    report = verify_file(ledger)
    changed = hashlib.sha256(GRANTS + b" ").hexdigest()[:12]
    assert [str(problem) for problem in report.problems] == [
        f"seq 1: policy {SHA[:12]}…: the kept version {SHA}.toml was changed: "
        f"its bytes hash to {changed}…; see docs/runbook.md#policy-kept",
        f"seq 2: policy {other_sha[:12]}…: the kept version {other_sha}.toml is missing; "
        "see docs/runbook.md#policy-kept",
    ]


def test_a_policy_record_of_the_wrong_shape_is_a_problem(ledger: Path) -> None:
    write_ledger(ledger, policy("../../etc/passwd"), policy(None, None, None))
    assert [str(p) for p in verify_file(ledger).problems] == [
        "seq 1: policy record with sha256 '../../etc/passwd'",
        "seq 2: policy record with neither a sha256 nor a problem",
    ]


def test_verify_lines_lists_the_policies_and_keeps_the_per_call_checks(ledger: Path) -> None:
    write_ledger(ledger, policy(SHA), policy(None, None, "no such file"))
    report = verify_lines(ledger.read_bytes().splitlines(keepends=True))
    assert (report.sound, report.policies) == (True, ((1, SHA),))


def test_grant_then_reads_the_kept_version_or_says_why_not(ledger: Path) -> None:
    directory = policies_dir(ledger)
    keep(directory, GRANTS)
    record = Record(4, "2026-01-02T03:04:05.678Z", GENESIS_PREV, Policy("b-1", SHA, 1, None))
    then = grant_then(directory, record, "notes")
    assert (then.sha256, then.policy_seq, then.missing) == (SHA, 4, None)
    assert then.text == GRANTS.decode().rstrip("\n")
    assert grant_then(directory, record, "other").missing == (
        "the kept version has no grant other to show"
    )
    assert grant_then(directory, None, "notes").missing == (
        "no policy record of its boot before the decision"
    )
    # A name that is not a SHA-256 never becomes a path (../, a link's name).
    beside = Record(5, record.at, record.prev, Policy("b-1", "../" + SHA[3:], 1, None))
    assert grant_then(directory, beside, "notes").missing == "grants.toml could not be read: None"
    kept_path(directory, SHA).unlink()
    assert grant_then(directory, record, "notes").missing == (
        f"the kept version {SHA}.toml is missing; see docs/runbook.md#policy-kept"
    )
