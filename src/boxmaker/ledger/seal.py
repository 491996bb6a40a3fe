"""Sealing the ledger's live file (docs/protocol.md, "Segments"): the file steps, and
their completion at a start after a crash (docs/runbook.md#ledger-segments).

When the live file ``ledger/audit.jsonl`` is full, the writer signs a checkpoint of
every line so far and :meth:`Sealer.seal` makes it the first line of the next live
file, in three steps, each durable before the next:

1. ``ledger/audit.jsonl.next`` is written holding only the checkpoint's line (a
   durable replace: it is whole or absent);
2. ``audit.jsonl`` is renamed ``segments/<first>-<last>.jsonl`` and made read-only
   (0444), ``segments/`` and ``ledger/`` fsynced;
3. ``audit.jsonl.next`` is renamed ``audit.jsonl``, ``ledger/`` fsynced; the writer
   opens it and appends after the checkpoint.

A failure in step 1 or 2 puts the live file back where it was: the writer goes on
appending to it (:class:`~boxmaker.ledger.writer.SealSkipped`) and tries again at its
next checkpoint. A failure after that (the live file cannot be made again) is an
OSError: the writer stops, and :func:`finish_seal` completes the seal at the next
start.

:func:`finish_seal` runs before the ledger is opened: a ``.next`` whose line continues
the ledger (its seq the next one, its ``prev`` the hash of the last line of the live
file, or of the newest segment when the live file is gone) is completed (steps 2 and 3,
or 3); any other ``.next`` is moved aside as ``torn-<UTC>.bin``, and the ledger is as
it was. A segment left writable (a crash between its rename and its chmod) is made
read-only again. Everything here is blocking file I/O: the writer runs it in a worker
thread.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import stat
from pathlib import Path
from typing import Final

import attrs

from boxmaker.formats.clock import utc_now
from boxmaker.home.file_ops import OS_FILES, FileOps, fsync_dir, write_atomically
from boxmaker.home.regular_file import read_regular_file
from boxmaker.ledger.live_file import DIR_MODE, FILE_MODE, Tail, file_tail, torn_name, write_new
from boxmaker.ledger.records import BadRecord, CheckpointRecord, decode_line
from boxmaker.ledger.segments import (
    LIVE_FILE,
    SEGMENTS_DIR,
    LedgerFiles,
    Segment,
    ledger_files,
    segment_name,
)
from boxmaker.ledger.writer import LedgerFile, OsLedgerFile, SealSkipped

__all__ = [
    "NEXT_FILE",
    "RUNBOOK_SEGMENTS",
    "SEGMENT_MODE",
    "SealFinish",
    "Sealer",
    "finish_seal",
    "seal_live",
]

log = logging.getLogger("boxmaker.ledger")

NEXT_FILE: Final = f"{LIVE_FILE}.next"
"""The next live file while a seal is under way: only its leading checkpoint."""
SEGMENT_MODE: Final = 0o444
RUNBOOK_SEGMENTS: Final = "docs/runbook.md#ledger-segments"
MAX_NEXT_FILE: Final = 64 << 20
"""A checkpoint line is small (its open calls are bounded by brokerd's); a ``.next``
larger than this is not one, and is moved aside unread."""


@attrs.frozen
class Sealer:
    """Seals the live file in ``directory`` (``ledger/``) once it holds ``records``
    lines: the writer's :class:`~boxmaker.ledger.writer.LiveSealer`."""

    directory: Path
    records: int
    files: FileOps = OS_FILES

    def seal(self, first: int, last: int, line: bytes) -> LedgerFile:
        """The three steps (see the module docstring), then the new live file opened
        ``O_APPEND``."""
        seal_live(self.directory, first, last, line, files=self.files)
        return OsLedgerFile.open(self.directory / LIVE_FILE)


def seal_live(
    directory: Path, first: int, last: int, line: bytes, *, files: FileOps = OS_FILES
) -> None:
    """Seal ``directory``'s live file, whose lines are ``first`` to ``last``, with the
    checkpoint ``line`` (no newline) beginning the next. Raises
    :class:`~boxmaker.ledger.writer.SealSkipped` when the live file is where it was,
    OSError when it is not."""
    next_path = directory / NEXT_FILE
    try:
        write_atomically(next_path, line + b"\n", mode=FILE_MODE, files=files)
    except OSError as exc:
        raise SealSkipped(f"{next_path} could not be written: {exc}") from exc
    segment = directory / SEGMENTS_DIR / segment_name(first, last)
    try:
        _archive_live(directory, segment, files)
    except OSError as exc:
        _put_back(directory, segment, files)  # raises when it cannot: the seal goes on at start
        raise SealSkipped(f"the live file could not be sealed as {segment}: {exc}") from exc
    _make_live(directory, files)


def _archive_live(directory: Path, segment: Path, files: FileOps) -> None:
    """Step 2: the live file becomes the read-only segment, its name durable."""
    segments = segment.parent
    segments.mkdir(mode=DIR_MODE, exist_ok=True)
    if stat.S_IMODE(segments.stat().st_mode) != DIR_MODE:
        segments.chmod(DIR_MODE)
    files.replace(directory / LIVE_FILE, segment)
    _read_only(segment)
    fsync_dir(segments, files)
    fsync_dir(directory, files)


def _put_back(directory: Path, segment: Path, files: FileOps) -> None:
    """Undo a step 2 that failed part-way: the segment's file back as the live file,
    the ``.next`` removed (both durable). OSError when the live file cannot be put
    back."""
    live = directory / LIVE_FILE
    if not live.exists():
        files.replace(segment, live)
        live.chmod(FILE_MODE)
    with contextlib.suppress(OSError):
        files.unlink(directory / NEXT_FILE)
    fsync_dir(directory, files)


def _make_live(directory: Path, files: FileOps) -> None:
    """Step 3: ``.next`` becomes the live file, its name durable."""
    files.replace(directory / NEXT_FILE, directory / LIVE_FILE)
    fsync_dir(directory, files)


def _read_only(path: Path) -> None:
    """``path`` made 0444, durably (its inode's mode fsynced)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        os.fchmod(fd, SEGMENT_MODE)
        os.fsync(fd)
    finally:
        os.close(fd)


@attrs.frozen
class SealFinish:
    """What :func:`finish_seal` did: the seal it completed (the segment made, or None
    when only step 3 was left; ``completed`` says whether one was), the ``.next`` it
    moved aside (where to), and the segments it made read-only again."""

    completed: bool = False
    segment: Path | None = None
    moved_aside: Path | None = None
    made_read_only: tuple[Path, ...] = ()


def finish_seal(
    directory: Path, *, now: dt.datetime | None = None, files: FileOps = OS_FILES
) -> SealFinish:
    """Complete or undo a seal cut short in ``directory`` (``ledger/``), before the
    ledger is opened: see the module docstring. Raises
    :class:`~boxmaker.ledger.segments.SegmentProblem` for segments that do not fit,
    OSError."""
    listing = ledger_files(directory)
    made_read_only = tuple(segment.path for segment in listing.segments if _make_read_only(segment))
    next_path = directory / NEXT_FILE
    try:
        data = read_regular_file(next_path, limit=MAX_NEXT_FILE)
    except FileNotFoundError:
        return SealFinish(made_read_only=made_read_only)
    except OSError as exc:
        log.warning("%s cannot be read (%s); it is moved aside", next_path, exc)
        data = None
    live = directory / LIVE_FILE
    tail = _ledger_tail(listing)
    if data is None or tail is None or not _continues(data, tail):
        aside = _move_aside(next_path, data, now or utc_now(), files)
        log.warning(
            "%s does not continue the ledger: moved aside to %s, the ledger as it was; see %s",
            next_path,
            aside,
            RUNBOOK_SEGMENTS,
        )
        return SealFinish(moved_aside=aside, made_read_only=made_read_only)
    segment = None
    if live.exists():
        segment = directory / SEGMENTS_DIR / segment_name(listing.live_first, tail.next_seq - 1)
        _archive_live(directory, segment, files)
    _make_live(directory, files)
    log.warning(
        "completed a seal cut short: %s now begins with checkpoint %d; see %s",
        live,
        tail.next_seq,
        RUNBOOK_SEGMENTS,
    )
    return SealFinish(completed=True, segment=segment, made_read_only=made_read_only)


def _make_read_only(segment: Segment) -> bool:
    """True when ``segment`` was writable (and is no longer)."""
    if stat.S_IMODE(segment.path.lstat().st_mode) == SEGMENT_MODE:
        return False
    _read_only(segment.path)
    log.warning("%s was not read-only: made 0444 again", segment.path)
    return True


def _ledger_tail(listing: LedgerFiles) -> Tail | None:
    """Where the ledger goes on: after the live file, or after the newest segment
    when the live file is gone; None when that file's last line is torn."""
    for path in reversed(listing.paths()):
        try:
            return file_tail(path)
        except FileNotFoundError:
            continue
    return None


def _continues(data: bytes, tail: Tail) -> bool:
    """``data`` is one checkpoint line that continues the ledger at ``tail``."""
    if not data.endswith(b"\n") or data.count(b"\n") != 1:
        return False
    try:
        record = decode_line(data[:-1])
    except BadRecord:
        return False
    body = record.body
    return (
        isinstance(body, CheckpointRecord)
        and record.seq == tail.next_seq == body.size
        and record.prev == tail.prev
    )


def _move_aside(next_path: Path, data: bytes | None, now: dt.datetime, files: FileOps) -> Path:
    """The ``.next``'s bytes saved as ``torn-<UTC>.bin`` beside it, then it removed."""
    aside = next_path.with_name(torn_name(now))
    if data is None:
        files.replace(next_path, aside)
    else:
        aside = write_new(aside, data)
        files.unlink(next_path)
    fsync_dir(next_path.parent, files)
    return aside
