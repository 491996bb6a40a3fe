"""What verification asks of a ledger's files (docs/protocol.md, "Reading and verifying
segments"), beyond what it asks of their lines, which it reads chained in order
(:func:`~boxmaker.ledger.segments.ledger_lines`).

Each sealed segment must be named for the seqs its first and last lines hold, end with
a newline (a torn line is only ever the live file's last), and, as must the live file
after a seal, begin with a ``checkpoint`` record whose size is its first seq (every file
but the ledger's very first, which begins with the genesis). A segment that can be
written to is a warning, not a problem: its lines are still checked, and the signed
roots over them find any change (docs/decisions.md, "Segments: reading and verifying").

With the oldest segments archived (moved away), the lines before the first file present
are not read: the verification starts at that file's leading checkpoint exactly as the
fast start does (:func:`~boxmaker.ledger.checkpoint_resume.resume_at_checkpoint`: its
note's signature with the ledger's key, its root against the tiles' root at its size,
its open calls taken), or reports why it cannot.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import attrs

from boxmaker.ledger.checkpoint_resume import (
    Archived,
    Refusal,
    RefusalReason,
    resume_at_checkpoint,
)
from boxmaker.ledger.reader import line_at, line_before
from boxmaker.ledger.records import BadRecord, line_fields
from boxmaker.ledger.segments import LedgerFiles, ledger_lines
from boxmaker.ledger.signed_note import NoteVerifier
from boxmaker.ledger.tiles import TileStore
from boxmaker.ledger.tree import TREE_DIR
from boxmaker.ledger.verify_report import Problem, ResumePoint

__all__ = ["FileFindings", "archived_start", "file_findings"]

_WRITABLE = 0o222


@attrs.frozen
class FileFindings:
    """What the files themselves show: problems (each at the seq it concerns) and
    warnings (in words)."""

    problems: tuple[Problem, ...] = ()
    warnings: tuple[str, ...] = ()


@attrs.frozen
class _Ends:
    first: bytes | None
    last: bytes | None
    newline: bool
    mode: int


def _ends(path: Path) -> _Ends | None:
    """A file's first and last lines (without the newline; the last may be torn), and
    its mode; None when it is not there. Two reads, whatever its size."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        stat = os.fstat(fd)
        size = stat.st_size
        newline = size > 0 and os.pread(fd, 1, size - 1) == b"\n"
        # A torn last line ends at the end of the file, as if a newline followed it.
        last = line_before(fd, size if newline else size + 1) if size else None
        first = line_at(fd, 0)
        if first is None:
            first = last  # no newline at all: the one torn line, or nothing
    finally:
        os.close(fd)
    return _Ends(first, last, newline, stat.st_mode)


def _seq_kind_size(line: bytes | None) -> tuple[object, object, object]:
    """A line's seq, kind and size, as far as it says them (None for each it does not)."""
    if line is None:
        return None, None, None
    try:
        fields = line_fields(line)
    except (BadRecord, ValueError):
        return None, None, None
    return fields.get("seq"), fields.get("kind"), fields.get("size")


def _begins_with_checkpoint(name: str, first: int, line: bytes | None) -> str | None:
    seq, kind, size = _seq_kind_size(line)
    if (seq, kind, size) == (first, "checkpoint", first):
        return None
    return (
        f"{name} does not begin with the checkpoint of size {first} that closes the "
        f"file before it (its first line: seq {seq!r}, kind {kind!r})"
    )


def file_findings(files: LedgerFiles) -> FileFindings:
    """Check each file as a file (see the module docstring). Blocking; two reads a file."""
    problems: list[Problem] = []
    warnings: list[str] = []
    for segment in files.segments:
        name = f"segment {segment.path.name}"
        ends = _ends(segment.path)
        if ends is None or ends.first is None:
            problems.append(Problem(segment.first, f"{name} is empty or gone"))
            continue
        if segment.first > 0:
            found = _begins_with_checkpoint(name, segment.first, ends.first)
            if found is not None:
                problems.append(Problem(segment.first, found))
        first_seq = _seq_kind_size(ends.first)[0]
        last_seq = _seq_kind_size(ends.last)[0]
        if first_seq != segment.first or last_seq != segment.last:
            problems.append(
                Problem(
                    segment.first,
                    f"{name} is misnamed: its lines are seq {first_seq!r} to {last_seq!r}",
                )
            )
        if not ends.newline:
            problems.append(
                Problem(segment.last, f"{name} ends in a torn line (only the live file may)")
            )
        if ends.mode & _WRITABLE:
            warnings.append(f"{name} can be written to (mode {ends.mode & 0o777:o}, not 444)")
    if files.live_first > 0:
        ends = _ends(files.live)
        if ends is not None:
            found = _begins_with_checkpoint("the live file", files.live_first, ends.first)
            if found is not None:
                problems.append(Problem(files.live_first, found))
    return FileFindings(tuple(problems), tuple(warnings))


def archived_start(
    files: LedgerFiles, verifier: NoteVerifier | None
) -> tuple[ResumePoint, Iterator[bytes]] | Problem:
    """With the oldest segments archived: the resume point at the checkpoint the first
    file present begins with and the lines after it, or the problem why the lines after
    it cannot be verified without the archived ones."""
    archived = files.archived
    lines = ledger_lines(files)
    line = next(lines, b"").removesuffix(b"\n")
    if verifier is None:
        refusal: ResumePoint | Refusal = Refusal(
            RefusalReason.NO_KEY, "no ledger key to check its signature"
        )
    else:
        refusal = resume_at_checkpoint(
            line,
            archived,
            f"the start of {files.segments[0].path.name}",
            before=Archived.BEFORE,
            origin=None,
            verifier=verifier,
            tiles=lambda: TileStore(files.directory / TREE_DIR),
        )
    if isinstance(refusal, Refusal):
        return Problem(
            archived,
            f"lines 0-{archived - 1} are archived and checkpoint seq {archived} cannot "
            f"stand for them: {refusal}",
        )
    return refusal, lines
