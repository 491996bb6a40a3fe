"""The ledger's live file before the writer takes it (docs/decisions.md, "Ledger"):
opened (created with its genesis record) or its tail read, and a torn tail repaired.

:func:`open_ledger` and :func:`repair` are synchronous and run before brokerd serves:
create the ledger with its genesis record, or read only the tail (seeking from the
end) to learn the next ``seq`` and ``prev``. A torn tail (no newline, or a last line
that is not a JSON object with an integer ``seq``) raises :class:`LedgerTorn`;
``brokerd serve --repair`` moves it aside (:func:`repair`). The writer that appends from
there is :class:`boxmaker.ledger.writer.LedgerWriter`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import os
from pathlib import Path

import attrs

from boxmaker.formats.clock import format_utc, utc_now
from boxmaker.home.file_ops import OS_FILES, FileOps, fsync_dir, write_atomically
from boxmaker.ledger.records import (
    GENESIS_PREV,
    BadRecord,
    Genesis,
    NotJson,
    Repair,
    encode_line,
    format_head,
    line_fields,
    line_hash,
    new_ledger_id,
)
from boxmaker.ledger.segments import LIVE_FILE, SEGMENTS_DIR, ledger_files

log = logging.getLogger("boxmaker.ledger")

FILE_MODE = 0o600
DIR_MODE = 0o700
TAIL_CHUNK = 1 << 16
TORN_ANCHOR = "docs/runbook.md#ledger-torn"


class LedgerTorn(Exception):
    """The ledger's last line is torn; brokerd refuses to start (docs/runbook.md#ledger-torn)."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"{path}: the ledger's last line is torn ({why}); see {TORN_ANCHOR}")
        self.path = path
        self.why = why


@attrs.frozen
class Tail:
    """Where the next record goes: its seq and the hash of the last line."""

    next_seq: int
    prev: str

    @property
    def head(self) -> str:
        return format_head(self.next_seq - 1, self.prev)


@attrs.frozen
class _Torn:
    offset: int
    data: bytes
    why: str


def _inspect_tail(fd: int) -> Tail | _Torn:
    """Read backwards from the end to the last line; never the whole file."""
    size = os.fstat(fd).st_size
    if size == 0:
        return _Torn(0, b"", "an empty file")
    buf = b""
    pos = size
    while True:
        step = min(TAIL_CHUNK, pos)
        pos -= step
        buf = os.pread(fd, step, pos) + buf
        # The file's final byte is excluded: it ends the last line, or is torn data.
        cut = buf.rfind(b"\n", 0, len(buf) - 1)
        if cut >= 0:
            start = pos + cut + 1
            last = buf[cut + 1 :]
            break
        if pos == 0:
            start, last = 0, buf
            break
    if not last.endswith(b"\n"):
        return _Torn(start, last, "no newline")
    line = last[:-1]
    # The shared decoding (the one reader's: boxmaker.ledger.reader), not the whole
    # record: only the seq and the line's hash are needed to go on from here.
    try:
        seq = line_fields(line).get("seq")
    except NotJson:
        return _Torn(start, last, "not valid JSON")
    except BadRecord:
        seq = None
    if type(seq) is not int or seq < 0:
        return _Torn(start, last, "not a record with a seq")
    return Tail(next_seq=seq + 1, prev=line_hash(line))


def file_tail(path: Path) -> Tail | None:
    """Where the ledger would go on after the file at ``path`` (the seq after its last
    line, that line's hash); None when its last line is torn or it is empty. Blocking;
    OSError propagates."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        found = _inspect_tail(fd)
    finally:
        os.close(fd)
    return found if isinstance(found, Tail) else None


def _create(path: Path, now: dt.datetime, files: FileOps) -> Tail:
    """Write genesis to a temp file and rename it, so no empty ledger is ever seen."""
    line = encode_line(0, format_utc(now), GENESIS_PREV, Genesis(ledger=new_ledger_id()))
    write_atomically(path, line + b"\n", mode=FILE_MODE, files=files)
    return Tail(next_seq=1, prev=line_hash(line))


def open_ledger(path: Path, *, now: dt.datetime | None = None, files: FileOps = OS_FILES) -> Tail:
    """Create the ledger with its genesis record (through ``files``: the real calls, or
    a test's), or read where the existing one ends.

    Raises :class:`LedgerTorn` for a torn tail, and for a live file missing after
    sealed segments (a new genesis there would start another ledger; a seal cut short
    is completed before this: :func:`boxmaker.ledger.seal.finish_seal`). Blocking:
    call it before serving, or through ``trio.to_thread.run_sync``.
    """
    path.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        if path.name == LIVE_FILE and ledger_files(path.parent).segments:
            raise LedgerTorn(
                path, f"it is missing, and {SEGMENTS_DIR}/ holds sealed segments"
            ) from None
        return _create(path, now or utc_now(), files)
    try:
        if os.fstat(fd).st_mode & 0o077:
            os.fchmod(fd, FILE_MODE)  # 0600, whatever left it looser
        found = _inspect_tail(fd)
    finally:
        os.close(fd)
    if isinstance(found, _Torn):
        raise LedgerTorn(path, found.why)
    return found


def torn_name(now: dt.datetime) -> str:
    """The file a torn tail is moved to: ``torn-<UTC, compact>.bin``.

    >>> torn_name(dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC))
    'torn-20260102T030405678Z.bin'
    """
    moment = now.astimezone(dt.UTC)
    return f"torn-{moment:%Y%m%dT%H%M%S}{moment.microsecond // 1000:03d}Z.bin"


def write_new(path: Path, data: bytes) -> Path:
    """Create a file that did not exist (a suffix avoids clobbering an earlier repair)."""
    candidate = path
    for n in range(1, 1000):
        try:
            fd = os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
        except FileExistsError:
            candidate = path.with_name(f"{path.stem}-{n}{path.suffix}")
            continue
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        return candidate
    raise FileExistsError(f"no free name for {path}")


def repair(path: Path, *, now: dt.datetime | None = None) -> Repair | None:
    """Move a torn tail aside (``brokerd serve --repair``); None when the tail is sound.

    The torn bytes go to ``torn-<UTC>.bin`` beside the ledger (fsynced, with the
    directory) before the ledger is truncated, so no byte is lost if this is cut short.
    When nothing sound is left, a new genesis record is written so that the chain can
    go on. The caller appends the returned :class:`Repair` body through the writer.
    """
    moment = now or utc_now()
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        found = _inspect_tail(fd)
        if isinstance(found, Tail):
            return None
        saved = write_new(path.with_name(torn_name(moment)), found.data)
        fsync_dir(path.parent)
        os.ftruncate(fd, found.offset)
        if found.offset == 0:
            genesis = Genesis(ledger=new_ledger_id())
            os.pwrite(fd, encode_line(0, format_utc(moment), GENESIS_PREV, genesis) + b"\n", 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    log.warning("moved a torn ledger tail (%d bytes) to %s", len(found.data), saved)
    return Repair(file=saved.name, sha256=hashlib.sha256(found.data).hexdigest())
