"""The one ledger reader (docs/decisions.md, "Ledger"): a ledger's lines in, typed records
out (:class:`~boxmaker.core.vocabulary.Record`), in one streaming pass; the file is never
held whole.

:class:`LedgerReader` takes the lines as iterating a binary file yields them (each ends
with ``\\n`` but perhaps the last; :func:`iter_lines`). Every command that reads the
ledger reads it here: ``bxctl audit show`` and ``bxctl why`` (:meth:`~LedgerReader.
records`), ``bxctl grants what-if`` and ``bxctl grants list`` (:meth:`~LedgerReader.
decisions`). brokerd's start reads only the last line's seq, by the shared decoding
(:func:`~boxmaker.ledger.records.line_fields`), and ``bxctl audit verify`` keeps its own
loop over the raw bytes, which must be hashed exactly as they are
(:mod:`boxmaker.ledger.verify` says what it shares).

Two paths, one answer:

- the typed path, :meth:`~LedgerReader.records`: every line decoded whole by
  :func:`~boxmaker.ledger.records.decode_line` (the one converter, strict), or said not
  to be a record and why;
- the fast path, :meth:`~LedgerReader.decisions`: the ``decision`` records only, at
  what-if's rate (docs/performance.md). A line without the bytes ``decision`` is passed
  over unparsed (most lines are approvals and results; every decision spells its kind
  plainly, as brokerd writes it), and a decision's fields are checked by hand on
  orjson's dict, the converter's rules written out, with the enums looked up in tables.
  tests/ledger/test_ledger_reader.py checks on generated ledgers, damaged ones too, that
  it yields exactly the decisions the typed path yields.

Neither verifies the chain (``bxctl audit verify`` does). A line that is not a record is
not fatal: the typed path yields it as :class:`NotARecord`, the fast path counts a line
that mentions a decision and is not one in :attr:`LedgerReader.malformed`.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Final

import attrs
import orjson

from boxmaker.core.labels import Taint
from boxmaker.core.reasons import Reason
from boxmaker.core.vocabulary import Decision, Kind, Record, VerdictCode, record_time
from boxmaker.ledger.records import BadRecord, Body, decode_line

__all__ = [
    "DECISION_WORD",
    "POLICY_WORD",
    "READ_BUFFER",
    "LedgerReader",
    "NotARecord",
    "decision_of",
    "iter_lines",
    "line_at",
    "line_before",
]

READ_BUFFER: Final = 1 << 20
"""Bytes read from the file at a time."""

DECISION_WORD: Final = Kind.DECISION.value.encode()
"""Every decision line holds these bytes (its kind); the fast path parses no other line."""

POLICY_WORD: Final = Kind.POLICY.value.encode()
"""Every policy line holds these bytes (its kind)."""

_DECISION_FIELDS: Final = 14
"""A decision line's keys: the four common ones and the body's ten, none else (one more,
``definition``, for an ``mcp.*`` tool's)."""
_VERDICTS: Final = {code.value: code for code in VerdictCode}
_REASONS: Final[dict[str | None, Reason | None]] = {None: None} | {r.value: r for r in Reason}
_TAINTS: Final = {taint.value: taint for taint in Taint}


_PREAD_CHUNK: Final = 1 << 16
"""Bytes read at a time by :func:`line_at` and :func:`line_before`."""


def iter_lines(path: Path) -> Iterator[bytes]:
    """The file's lines, newline kept, through a large buffer (one pass, streaming)."""
    with path.open("rb", buffering=READ_BUFFER) as file:
        yield from file


def line_at(fd: int, offset: int) -> bytes | None:
    """The line starting at ``offset`` without its newline; None when there is no whole
    line there (or ``offset`` is not a line's start)."""
    if offset > 0 and os.pread(fd, 1, offset - 1) != b"\n":
        return None
    parts: list[bytes] = []
    while True:
        chunk = os.pread(fd, _PREAD_CHUNK, offset)
        if not chunk:
            return None
        cut = chunk.find(b"\n")
        if cut >= 0:
            parts.append(chunk[:cut])
            return b"".join(parts)
        parts.append(chunk)
        offset += len(chunk)


def line_before(fd: int, offset: int) -> bytes | None:
    """The line that ends just before ``offset`` (without its newline); None at 0."""
    if offset == 0:
        return None
    end = offset - 1  # its newline
    start = end
    parts: list[bytes] = []
    while start > 0:
        step = min(_PREAD_CHUNK, start)
        chunk = os.pread(fd, step, start - step)
        cut = chunk.rfind(b"\n")
        if cut >= 0:
            parts.append(chunk[cut + 1 :])
            break
        parts.append(chunk)
        start -= step
    return b"".join(reversed(parts))


@attrs.frozen
class NotARecord:
    """A line that is not a record (torn, not JSON, of an unknown kind, with wrong
    fields): the typed path's answer for it, ``problem`` in words."""

    problem: str


@attrs.define
class LedgerReader:
    """One pass over a ledger's ``lines``: :meth:`records` (every line) or
    :meth:`decisions` (the fast path), once.

    >>> from boxmaker.ledger.records import Stop, encode_line
    >>> stop = encode_line(1, "2026-01-02T03:04:05.678Z", "ab", Stop(boot="b-1"))
    >>> reader = LedgerReader([stop + b"\\n", b"not json\\n"])
    >>> [(line, read) for line, read in reader.records()]  # doctest: +ELLIPSIS
    [(b'{"at":...}', Record(seq=1, ...body=Stop(boot='b-1'))), (b'not json', NotARecord(...))]
    >>> reader.read, reader.malformed
    (2, 1)
    """

    lines: Iterable[bytes]
    read: int = 0
    """Lines read so far."""
    malformed: int = 0
    """Lines that are not records (:meth:`records`), or that mention a decision and are
    not one (:meth:`decisions`)."""

    def records(
        self, *, mentioning: tuple[bytes, ...] = ()
    ) -> Iterator[tuple[bytes, Record[Body] | NotARecord]]:
        """Each line (without its newline) with its record, or why it is not one.

        With ``mentioning``, only the lines that hold one of those byte strings are
        decoded and yielded; the others are passed over unparsed (``bxctl why`` reads one
        call's records and the policy records: :data:`POLICY_WORD`).
        """
        for raw in self.lines:
            self.read += 1
            line = raw.rstrip(b"\n")
            if mentioning and not any(mark in line for mark in mentioning):
                continue
            try:
                yield line, decode_line(line)
            except BadRecord as exc:
                self.malformed += 1
                yield line, NotARecord(str(exc))

    def decisions(
        self, *, since: dt.datetime | None = None, session: str | None = None
    ) -> Iterator[Record[Decision]]:
        """The fast path: the ``decision`` records, in ledger order, from ``since`` on
        (an aware datetime, compared with the record's time, inclusive) and of
        ``session`` only when given.

        >>> line = (b'{"arguments":{"path":"a"},"at":"2026-01-02T03:04:05.678Z","boot":"b-1",'
        ...         b'"call":"c-1","grant":"r","kind":"decision","prev":"00","reason":null,'
        ...         b'"seq":1,"session":"s-1","taint":"public","tool":"read_file",'
        ...         b'"untrusted":false,"verdict":"run"}\\n')
        >>> reader = LedgerReader([line, b'not json decision\\n', b'{"kind":"stop"}\\n'])
        >>> [(d.body.call, d.body.verdict.value) for d in reader.decisions()]
        [('c-1', 'run')]
        >>> reader.read, reader.malformed
        (3, 1)
        """
        first = self.read + 1
        read, malformed = self.read, 0
        loads, decode_error, word = orjson.loads, orjson.JSONDecodeError, DECISION_WORD
        try:
            for read, line in enumerate(self.lines, first):  # noqa: B007 - the count
                if word not in line:
                    continue
                try:
                    fields = loads(line)
                except decode_error:
                    malformed += 1
                    continue
                if type(fields) is not dict:
                    malformed += 1  # not a record at all
                    continue
                if fields.get("kind") != "decision":
                    continue  # another record, whose text mentions a decision
                record = decision_of(fields)
                if record is None:
                    malformed += 1
                    continue
                if since is not None and record_time(record.at) < since:
                    continue
                if session is not None and record.body.session != session:
                    continue
                yield record
        finally:
            self.read = read
            self.malformed += malformed


def decision_of(fields: dict[str, Any]) -> Record[Decision] | None:
    """The decision record a line's JSON object says (its ``kind`` is ``decision``),
    exactly as :func:`~boxmaker.ledger.records.decode_line` decodes it; None where that
    raises :class:`~boxmaker.ledger.records.BadRecord`. By hand, not by the converter:
    a fifth of the cost (docs/performance.md).
    """
    if len(fields) != _DECISION_FIELDS + ("definition" in fields):
        return None  # a field missing (found below), or one no decision has
    definition = fields.get("definition")
    try:
        seq, at, prev = fields["seq"], fields["at"], fields["prev"]
        call, session, tool = fields["call"], fields["session"], fields["tool"]
        arguments, grant, untrusted = fields["arguments"], fields["grant"], fields["untrusted"]
        boot = fields["boot"]
        if (
            type(seq) is not int
            or type(at) is not str
            or type(prev) is not str
            or type(call) is not str
            or type(session) is not str
            or type(tool) is not str
            or type(arguments) is not dict
            or not (grant is None or type(grant) is str)
            or type(untrusted) is not bool
            or type(boot) is not str
            or not (definition is None or type(definition) is str)
        ):
            return None
        verdict = _VERDICTS[fields["verdict"]]
        reason = _REASONS[fields["reason"]]
        taint = _TAINTS[fields["taint"]]
        record_time(at)
    except (KeyError, TypeError, ValueError):
        return None
    body = Decision(
        call, session, tool, arguments, verdict, reason, grant, taint, untrusted, boot, definition
    )
    return Record(seq, at, prev, body)
