"""The ledger's files: sealed segments and the live file (docs/protocol.md, "Segments").

With ``[ledger] segment_records`` set, brokerd rolls the ledger into files of that many
lines. The live file, ``ledger/audit.jsonl``, is the one appended to; at the checkpoint
that falls due when it is full, the writer seals it as
``ledger/segments/<first>-<last>.jsonl`` (read-only; ``first`` and ``last`` are the seqs
of its first and last lines, twelve digits each) and the checkpoint that closes it (its
``size`` is ``last + 1``) is the first line of the new live file. So every file but the
very first begins with a signed checkpoint of everything before it: a file can be
verified, and the files after it, with the files before it archived or moved away (the
tiles under ``ledger/tree/`` give the tree at that size).

This module names the files and finds them; it reads no record (but the live file's
first seq, when every segment was moved away). :func:`ledger_files`
lists a ledger's files in seq order and says what does not fit (a name out of pattern,
overlapping or missing ranges); :func:`ledger_lines` yields every line of every file in
order, as :func:`~boxmaker.ledger.reader.iter_lines` yields one file's; and
:meth:`LedgerFiles.file_of` says which file holds a seq, so a position (a seq and a byte
offset in the file that holds it: ``checkpoint.pos``, the export's cursor) stays true
when the live file it was taken in is sealed.

>>> segment_name(0, 999)
'000000000000-000000000999.jsonl'
>>> parse_segment_name('000000001000-000000001999.jsonl')
(1000, 1999)
>>> parse_segment_name('1000-1999.jsonl') is None
True
"""

from __future__ import annotations

import contextlib
import itertools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Final

import attrs

from boxmaker.ledger.reader import READ_BUFFER
from boxmaker.ledger.records import BadRecord, line_fields

__all__ = [
    "LIVE_FILE",
    "SEGMENTS_DIR",
    "LedgerFiles",
    "Segment",
    "SegmentProblem",
    "leading_seq",
    "ledger_files",
    "ledger_lines",
    "ledger_lines_from",
    "parse_segment_name",
    "segment_name",
]

LIVE_FILE: Final = "audit.jsonl"
"""The file appended to, in the ledger's directory."""
SEGMENTS_DIR: Final = "segments"
"""Sealed segments, in the ledger's directory."""
SEQ_DIGITS: Final = 12
MAX_LEADING_LINE: Final = 64 << 20
"""A live file's first line is a genesis or a checkpoint (with the calls then open)."""
_SEGMENT_NAME: Final = re.compile(rf"(\d{{{SEQ_DIGITS}}})-(\d{{{SEQ_DIGITS}}})\.jsonl")


def segment_name(first: int, last: int) -> str:
    """The file name of the sealed segment of lines ``first`` to ``last``."""
    if not 0 <= first <= last:
        raise ValueError(f"a segment of lines {first} to {last}")
    return f"{first:0{SEQ_DIGITS}d}-{last:0{SEQ_DIGITS}d}.jsonl"


def parse_segment_name(name: str) -> tuple[int, int] | None:
    """``(first, last)`` of a sealed segment's file name; None for any other name."""
    match = _SEGMENT_NAME.fullmatch(name)
    if match is None:
        return None
    first, last = int(match[1]), int(match[2])
    return (first, last) if first <= last else None


class SegmentProblem(Exception):
    """The ledger's files do not fit together (the message says how); nothing is read."""


@attrs.frozen
class Segment:
    """A sealed segment: lines ``first`` to ``last`` in ``path``."""

    first: int
    last: int
    path: Path


@attrs.frozen
class LedgerFiles:
    """A ledger's files in seq order: its sealed ``segments``, then the ``live`` file,
    whose first line is ``live_first`` (the last segment's ``last + 1``, or 0).

    ``archived`` is the number of lines before the first file present: 0 unless the
    oldest segments were moved away. With every segment moved away, only the live
    file's first line says where it starts: ``live_start``, its seq (read by
    :func:`ledger_files` only then).
    """

    directory: Path
    segments: tuple[Segment, ...]
    live_start: int = 0

    @property
    def live(self) -> Path:
        return self.directory / LIVE_FILE

    @property
    def live_first(self) -> int:
        return self.segments[-1].last + 1 if self.segments else self.live_start

    @property
    def archived(self) -> int:
        return self.segments[0].first if self.segments else self.live_start

    def describe(self) -> str:
        """What the ledger is read from, in the owner's words: the live file alone, or
        the ledger's directory with its sealed segments and the lines archived away.

        >>> LedgerFiles(Path("/h/ledger"), ()).describe()
        '/h/ledger/audit.jsonl'
        >>> one = Segment(10, 19, Path("/h/ledger/segments/x.jsonl"))
        >>> LedgerFiles(Path("/h/ledger"), (one,)).describe()
        '/h/ledger (1 sealed segment and audit.jsonl; lines 0-9 archived away)'
        """
        held: list[str] = []
        if self.segments:
            count = len(self.segments)
            held.append(f"{count} sealed segment{'s' if count != 1 else ''} and {LIVE_FILE}")
        if self.archived:
            held.append(f"lines 0-{self.archived - 1} archived away")
        return f"{self.directory} ({'; '.join(held)})" if held else str(self.live)

    def paths(self) -> list[Path]:
        """Every file, oldest first; the live file last (it may not exist yet)."""
        return [segment.path for segment in self.segments] + [self.live]

    def file_of(self, seq: int) -> tuple[Path, int]:
        """The file that holds line ``seq`` (the live file for any seq from
        :attr:`live_first` on) and the seq of its first line. Raises
        :class:`SegmentProblem` for a seq in the archived lines."""
        if seq < self.archived:
            raise SegmentProblem(
                f"line {seq} is in a segment archived away (before {self.archived})"
            )
        for segment in self.segments:
            if seq <= segment.last:
                return segment.path, segment.first
        return self.live, self.live_first


def ledger_files(directory: Path) -> LedgerFiles:
    """The files of the ledger in ``directory`` (the one that holds ``audit.jsonl``).

    Raises :class:`SegmentProblem` for a file in ``segments/`` whose name is not a
    segment's, or segments that overlap or leave a gap between them (a gap before the
    first is the archived lines). Blocking (one directory listing)."""
    found: list[Segment] = []
    with contextlib.suppress(FileNotFoundError):
        for entry in (directory / SEGMENTS_DIR).iterdir():
            span = parse_segment_name(entry.name)
            if span is None:
                raise SegmentProblem(f"{entry}: not a segment's name (<first>-<last>.jsonl)")
            found.append(Segment(span[0], span[1], entry))
    found.sort(key=lambda segment: segment.first)
    for before, after in itertools.pairwise(found):
        if after.first != before.last + 1:
            what = "overlaps" if after.first <= before.last else "does not follow"
            raise SegmentProblem(f"{after.path.name} {what} {before.path.name}")
    return LedgerFiles(directory, tuple(found), 0 if found else _first_seq(directory / LIVE_FILE))


def _first_seq(live: Path) -> int:
    """The seq of the live file's first line: not 0 once every segment before it was
    moved away (it then begins with a checkpoint). 0 when it cannot be read: the
    verification reports what is wrong with that line."""
    try:
        with live.open("rb") as file:
            seq = leading_seq(file)
    except OSError:
        return 0
    return seq if seq is not None and seq > 0 else 0


def leading_seq(file: BinaryIO) -> int | None:
    """The seq of the first line of the open ``file`` (read from its start); None when
    that line is not a record's. Blocking; raises OSError."""
    file.seek(0)
    first = file.readline(MAX_LEADING_LINE)
    try:
        seq = line_fields(first.removesuffix(b"\n")).get("seq")
    except BadRecord:
        return None
    return seq if type(seq) is int else None


def ledger_lines(files: LedgerFiles) -> Iterator[bytes]:
    """Every line of every file, oldest first, newline kept (one streaming pass). The
    live file may be missing after a segment (a seal cut short before it was made
    again): no lines from it; with no segments either there is no ledger, and reading
    raises FileNotFoundError as reading the one file did.
    Each file's own line iterator, chained: no generator is resumed per line (as
    verification reads one file)."""
    return itertools.chain.from_iterable(_opened(files, files.paths()))


def ledger_lines_from(files: LedgerFiles, seq: int, offset: int) -> Iterator[bytes]:
    """The lines from line ``seq`` on, which starts at byte ``offset`` of the file that
    holds it (:meth:`LedgerFiles.file_of`: a position as ``checkpoint.pos`` names one),
    through every later file, newline kept. Raises :class:`SegmentProblem` for a seq in
    the archived lines."""
    path, _ = files.file_of(seq)
    paths = files.paths()
    return itertools.chain.from_iterable(
        _opened(files, paths[paths.index(path) :], first_offset=offset)
    )


def _opened(files: LedgerFiles, paths: list[Path], first_offset: int = 0) -> Iterator[BinaryIO]:
    """Each file, open (the first from ``first_offset``), in turn; closed when the next
    is asked for."""
    for index, path in enumerate(paths):
        try:
            file = path.open("rb", buffering=READ_BUFFER)
        except FileNotFoundError:
            if path == files.live and files.segments:
                return
            raise
        with file:
            if index == 0 and first_offset:
                file.seek(first_offset)
            yield file
