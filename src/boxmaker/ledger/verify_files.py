"""A ledger verified from its files (docs/protocol.md, "Reading and verifying
segments"): every file chained in order through the pure loop
(:func:`~boxmaker.ledger.verify.verify_lines`), with what the files themselves show
(:mod:`boxmaker.ledger.verify_segments`), the tree's tiles beside them, the kept grants
versions its ``policy`` records name, and, with the oldest segments archived, from the
checkpoint the first file present begins with. I/O: the ledger's files are read here.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import attrs

from boxmaker.ledger.policies import RUNBOOK_KEPT, kept_problem, policies_dir
from boxmaker.ledger.records import parse_head
from boxmaker.ledger.segments import LedgerFiles, SegmentProblem, ledger_files, ledger_lines
from boxmaker.ledger.signed_note import NoteVerifier
from boxmaker.ledger.tiles import TileProblem, TileStore
from boxmaker.ledger.tree import TREE_DIR
from boxmaker.ledger.verify import MAX_PROBLEMS, verify_lines
from boxmaker.ledger.verify_report import CallCounts, Problem, Report
from boxmaker.ledger.verify_segments import archived_start, file_findings
from boxmaker.ledger.verify_tree import TileCheck

__all__ = ["check_kept", "verify_file"]


def verify_file(
    path: Path, expect_head: str | None = None, *, verifier: NoteVerifier | None = None
) -> Report:
    """Verify the ledger whose live file is ``path``: all its files, chained in order
    (:func:`~boxmaker.ledger.segments.ledger_files` in ``path``'s directory; each file
    checked as a file: :mod:`boxmaker.ledger.verify_segments`), the kept grants versions
    its ``policy`` records name (:func:`check_kept`) and the tree's tiles beside it
    (``ledger/tree/``, when there); with ``verifier`` (the ledger key's), each
    checkpoint's signature. With the oldest segments archived, from the checkpoint the
    first file present begins with. I/O errors on the ledger propagate (the CLI's
    exit 2)."""
    try:
        files = ledger_files(path.parent)
    except SegmentProblem as exc:
        return Report(problems=(Problem(0, str(exc)),), records=0, head=None, calls=CallCounts())
    found = file_findings(files)
    if files.archived:
        report = _verify_archived(files, expect_head, verifier)
    else:
        report = _verify_with_tiles(ledger_lines(files), path.parent, expect_head, verifier)
    problems = tuple(sorted((*found.problems, *report.problems), key=lambda p: p.seq))
    report = attrs.evolve(report, problems=problems, warnings=found.warnings)
    return check_kept(report, policies_dir(path))


def _verify_with_tiles(
    lines: Iterable[bytes], directory: Path, expect_head: str | None, verifier: NoteVerifier | None
) -> Report:
    """Every line from the genesis, and the tiles under ``directory`` when there."""
    tiles = None
    unreadable = None
    if (directory / TREE_DIR / "tile").is_dir():
        try:
            tiles = TileCheck(TileStore(directory / TREE_DIR))
        except (TileProblem, OSError) as exc:
            unreadable = Problem(0, f"the tree's tiles cannot be read: {exc}")
    report = verify_lines(lines, expect_head, verifier=verifier, tiles=tiles)
    if unreadable is not None:
        problems = (unreadable, *report.problems)
        report = attrs.evolve(report, problems=problems, tiles_sound=False)
    return report


def _verify_archived(
    files: LedgerFiles, expect_head: str | None, verifier: NoteVerifier | None
) -> Report:
    """The lines after the checkpoint the oldest file present begins with, resumed
    there (the tiles are compared with the lines in a verification from the genesis)."""
    archived = files.archived
    refused = Report(problems=(), records=0, head=None, calls=CallCounts(), archived=archived)
    if expect_head is not None and parse_head(expect_head)[0] <= archived:
        what = f"the expected head {expect_head} is in the archived lines (0-{archived - 1})"
        return attrs.evolve(refused, problems=(Problem(archived, what),))
    start = archived_start(files, verifier)
    if isinstance(start, Problem):
        return attrs.evolve(refused, problems=(start,))
    resume, lines = start
    report = verify_lines(lines, expect_head, verifier=verifier, resume=resume)
    return attrs.evolve(report, archived=archived)


def check_kept(report: Report, directory: Path, *, max_problems: int = MAX_PROBLEMS) -> Report:
    """Add a problem for each ``policy`` record whose kept version is missing, not a
    regular file, or holds other bytes (docs/runbook.md#policy-kept). Each version is
    read once, however many records name it; policy records are rare (one a change)."""
    found: dict[str, str | None] = {}
    problems = list(report.problems)
    left_out = report.problems_left_out
    for seq, sha in report.policies:
        if sha not in found:
            found[sha] = kept_problem(directory, sha)
        what = found[sha]
        if what is None:
            continue
        if len(problems) < max_problems:
            what = f"policy {sha[:12]}…: the kept version {what}; see {RUNBOOK_KEPT}"
            problems.append(Problem(seq, what))
        else:
            left_out += 1
    if len(problems) == len(report.problems):
        return report
    problems.sort(key=lambda problem: problem.seq)
    return attrs.evolve(report, problems=tuple(problems), problems_left_out=left_out)
