"""Verification from the newest checkpoint (docs/protocol.md, "Verifying"): what lets
brokerd start in well under a second at any size of ledger.

``ledger/tree/checkpoint.pos`` names the newest ``checkpoint`` record: its seq, the
byte offset of its line in the file that holds that seq (the live file, or a sealed
segment: docs/protocol.md, "Segments") and the line's hash.
:func:`verify_since_checkpoint` reads that line (and the one before it: the previous
file's last when it begins its file) at that offset, checks both against the position and the
chain, checks the record's signed note with the ledger's key and its root against the
root the tiles give at its size (:meth:`~boxmaker.ledger.merkle.Frontier.at`: log2
reads), then verifies only the lines after it, through every later file, resumed
(:class:`~boxmaker.ledger.verify.ResumePoint`): the calls then open come from the
record, not from reading everything before it. Anything that does not hold is a
:class:`Refusal` with its reason; the caller then verifies in full (and rebuilds the
tree's tiles: docs/runbook.md#ledger-fast-start).

What it trusts, and the full verification checks: that the lines before the checkpoint
are the ones its root was signed over (a line changed there, its tiles left alone, is
found by ``bxctl audit verify``), and the record's own ``open_calls`` (signed only by
the next checkpoint's root).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Final

import attrs

from boxmaker.ledger.checkpoint_resume import (
    Archived,
    Refusal,
    RefusalReason,
    resume_at_checkpoint,
)
from boxmaker.ledger.checkpointer import read_position
from boxmaker.ledger.ledger_key import read_ledger_origin
from boxmaker.ledger.reader import line_at, line_before
from boxmaker.ledger.segments import (
    LedgerFiles,
    SegmentProblem,
    ledger_files,
    ledger_lines_from,
)
from boxmaker.ledger.signed_note import NoteVerifier
from boxmaker.ledger.tiles import TileStore
from boxmaker.ledger.tree import CHECKPOINT_POS_FILE, TREE_DIR
from boxmaker.ledger.verify import Report, ResumePoint, verify_lines

__all__ = [
    "RUNBOOK_FAST_START",
    "Refusal",
    "RefusalReason",
    "SinceCheckpoint",
    "verify_since_checkpoint",
]

RUNBOOK_FAST_START: Final = "docs/runbook.md#ledger-fast-start"


class _Refused(Exception):
    def __init__(self, reason: RefusalReason, detail: str) -> None:
        super().__init__(detail)
        self.refusal = Refusal(reason, detail)


@attrs.frozen
class SinceCheckpoint:
    """A verification resumed at a checkpoint: its report (of the lines after it), the
    checkpoint's seq, and the byte offset where its line starts in the file that holds
    it (the tree is resumed from the tiles at that seq, and the lines from there
    added: :func:`~boxmaker.ledger.segments.ledger_lines_from`), and the files."""

    report: Report
    checkpoint_seq: int
    offset: int
    files: LedgerFiles


def verify_since_checkpoint(
    path: Path, verifier: NoteVerifier | None, store: TileStore | None = None
) -> SinceCheckpoint | Refusal:
    """Verify the ledger whose live file is ``path`` (its sealed segments beside it)
    from its newest checkpoint (see the module docstring); ``store`` is the tree's
    tiles (opened under ``ledger/tree/`` when not given). Blocking; I/O errors on the
    ledger propagate, and :class:`~boxmaker.ledger.segments.SegmentProblem` for files
    that do not fit together."""
    files = ledger_files(path.parent)
    try:
        resume, offset = _resume_point(files, verifier, store)
    except _Refused as refused:
        return refused.refusal
    seq = resume.next_seq - 1
    lines = ledger_lines_from(files, seq, offset)
    next(lines, None)  # the checkpoint's own line, checked already
    report = verify_lines(lines, verifier=verifier, resume=resume)
    return SinceCheckpoint(report, seq, offset, files)


def _resume_point(
    files: LedgerFiles, verifier: NoteVerifier | None, store: TileStore | None
) -> tuple[ResumePoint, int]:
    if verifier is None:
        raise _Refused(RefusalReason.NO_KEY, "no ledger key to check the checkpoint's signature")
    tree_dir = files.directory / TREE_DIR
    try:
        position = read_position(tree_dir / CHECKPOINT_POS_FILE)
    except FileNotFoundError:
        raise _Refused(RefusalReason.NO_POSITION, f"no {CHECKPOINT_POS_FILE} yet") from None
    except (OSError, ValueError) as exc:
        raise _Refused(RefusalReason.BAD_POSITION, f"{CHECKPOINT_POS_FILE}: {exc}") from None
    try:
        path, first = files.file_of(position.seq)
    except SegmentProblem as exc:
        raise _Refused(RefusalReason.BAD_POSITION, f"{CHECKPOINT_POS_FILE}: {exc}") from None
    line, before = _lines_at(files, path, first, position.offset)
    digest = "" if line is None else hashlib.sha256(line).hexdigest()
    if line is None or digest != position.sha256:
        raise _Refused(
            RefusalReason.WRONG_LINE,
            f"the line at offset {position.offset} is not the one {CHECKPOINT_POS_FILE} names",
        )
    # The line before the first file present is archived away: the signed root (checked
    # against the tiles) vouches for every line before, that one's hash included.
    archived_before = position.seq == files.archived > 0 and position.offset == 0
    found = resume_at_checkpoint(
        line,
        position.seq,
        f"offset {position.offset}",
        before=Archived.BEFORE if archived_before else before,
        origin=lambda: read_ledger_origin(files.live),
        verifier=verifier,
        tiles=lambda: TileStore(tree_dir) if store is None else store,
    )
    if isinstance(found, Refusal):
        raise _Refused(found.reason, found.detail)
    return found, position.offset


def _lines_at(
    files: LedgerFiles, path: Path, first: int, offset: int
) -> tuple[bytes | None, bytes | None]:
    """The line at ``offset`` of ``path`` (whose first line is seq ``first``) and the
    line before it: the previous file's last when ``offset`` is 0 (None when there is
    none, or it is archived away)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        line = line_at(fd, offset)
        before = line_before(fd, offset)
    finally:
        os.close(fd)
    if offset == 0 and first > files.archived:
        previous, _ = files.file_of(first - 1)
        fd = os.open(previous, os.O_RDONLY | os.O_CLOEXEC)
        try:
            before = line_before(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
    return line, before
