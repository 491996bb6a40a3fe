"""The ledger's lines read from a position on as it grows, file after file (the export
to OpenTelemetry, ``bxctl audit export --otlp --follow``; docs/protocol.md, "Segments").

A position is a seq and the byte offset of its line in the file that holds it
(:meth:`~boxmaker.ledger.segments.LedgerFiles.file_of`): the bytes of a file do not move
when it is sealed (a rename), so a position taken in the live file stays true in its
segment. :class:`LedgerTail` reads complete lines from there; at the end of the file it
reads, it goes on to the next file only once that file is sealed, and reads it to its
end again first: the writer wrote every line of a file before its seal began
(ledger/seal.py), so after the look that finds the seal no line can come after the ones
read, and before it the file is still the live one. So a seal at any moment between two
reads skips no line and gives none twice. Everything here is blocking: the export runs
it in a worker thread.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

import attrs

from boxmaker.ledger.reader import READ_BUFFER
from boxmaker.ledger.segments import (
    LIVE_FILE,
    SegmentProblem,
    leading_seq,
    ledger_files,
)

__all__ = ["LedgerTail"]


def _open_holding(directory: Path, seq: int) -> tuple[BinaryIO, Path, int]:
    """The file that holds line ``seq`` (a segment, or the live file for any seq past
    the segments) open, its path and its first seq. Raises FileNotFoundError (the live
    file between the seal's last two steps, or no ledger),
    :class:`~boxmaker.ledger.segments.SegmentProblem`.

    The live file listed may be sealed before it is opened: then it is missing (between
    the seal's renames) or the live file opened begins at another seq; either way the
    listing is read again. A segment never moves, so a second listing after a live file
    that began elsewhere names the segment it became: more than one of each is not a
    seal but a ledger whose files do not fit."""
    missing = moved = False
    while True:
        files = ledger_files(directory)
        path, first = files.file_of(seq)
        try:
            file = path.open("rb", buffering=READ_BUFFER)
        except FileNotFoundError:
            if path != files.live or missing:
                raise
            missing = True
            continue
        if path != files.live or leading_seq(file) == first:
            return file, path, first
        file.close()
        if moved:
            raise SegmentProblem(f"{path} does not begin at seq {first}, as the segments say")
        moved = True


@attrs.define
class LedgerTail:
    """The ledger's complete lines from a position on: ``offset`` bytes into ``path``,
    whose first line is seq ``first`` (a line still being written, without its newline,
    waits for the next look)."""

    directory: Path
    file: BinaryIO
    path: Path
    first: int
    offset: int

    @classmethod
    def open_at(cls, directory: Path, seq: int, offset: int) -> LedgerTail:
        """At line ``seq``, which begins at byte ``offset`` of the file that holds it.
        Raises OSError, :class:`~boxmaker.ledger.segments.SegmentProblem` (a seq in the
        archived lines, segments that do not fit)."""
        file, path, first = _open_holding(directory, seq)
        return cls(directory, file, path, first, offset)

    def close(self) -> None:
        self.file.close()

    def line_at(self, offset: int) -> bytes | None:
        """The complete line at byte ``offset`` of the file being read (newline kept),
        None when there is none; the reading position stays."""
        self.file.seek(offset)
        line = self.file.readline()
        return line if line.endswith(b"\n") else None

    def read_here(self, most: int, most_bytes: int) -> list[tuple[int, bytes]]:
        """Up to ``most`` complete lines and about ``most_bytes`` (at least one line) of
        the file being read, each with its byte offset there."""
        self.file.seek(self.offset)
        lines: list[tuple[int, bytes]] = []
        readline = self.file.readline
        offset = start = self.offset
        while len(lines) < most and (not lines or offset - start < most_bytes):
            line = readline()
            if not line.endswith(b"\n"):
                break
            lines.append((offset, line))
            offset += len(line)
        self.offset = offset
        return lines

    def read_lines(self, most: int, most_bytes: int, next_seq: int) -> list[tuple[int, bytes]]:
        """As :meth:`read_here`; at the end of a file that was sealed, the lines of the
        next one, from its start (``next_seq``: the seq after the last line read, where
        the next file must begin). The lines of one call are all of one file (an offset
        is in :attr:`path`). Raises :class:`~boxmaker.ledger.segments.SegmentProblem`
        for files that do not follow each other, OSError."""
        while True:
            lines = self.read_here(most, most_bytes)
            if lines or not self._sealed():
                return lines
            # Sealed since the read above: what was appended before the seal is read now.
            lines = self.read_here(most, most_bytes)
            if lines or not self._go_on(next_seq):
                return lines

    def _sealed(self) -> bool:
        """This file is sealed: a segment, or the live file it was is now one."""
        live = self.directory / LIVE_FILE
        if self.path != live:
            return True
        try:
            if live.stat().st_ino == os.fstat(self.file.fileno()).st_ino:
                return False
        except FileNotFoundError:
            pass  # renamed into segments/, and the next live file not made yet
        files = ledger_files(self.directory)
        if files.live_first == self.first:
            return False
        self.path = files.file_of(self.first)[0]  # its name now, for what is said of it
        return True

    def _go_on(self, next_seq: int) -> bool:
        """Read the file after this sealed one from its start; False when it is not
        there yet (the seal's last step is still to come)."""
        if os.fstat(self.file.fileno()).st_size != self.offset:
            raise SegmentProblem(f"{self.path} ends with a line cut short (at byte {self.offset})")
        try:
            file, path, first = _open_holding(self.directory, next_seq)
        except FileNotFoundError:
            return False
        if first != next_seq:
            file.close()
            raise SegmentProblem(
                f"{self.path} ends before seq {next_seq}, and the next file, {path.name}, "
                f"begins at seq {first}"
            )
        self.file.close()
        self.file, self.path, self.first, self.offset = file, path, first, 0
        return True
