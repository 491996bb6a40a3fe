"""The export's cursor (:mod:`boxmaker.ledger.otlp_export`; docs/operations.md, "The
cursor"): the JSON file that says how far the export to one receiver got, read and
checked, and the place in the ledger it names, found again (the file that holds its seq,
its line still there with its hash) or, without a cursor, the oldest file present."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import attrs
import orjson

from boxmaker.home.regular_file import read_regular_file
from boxmaker.ledger.checkpoint import ORIGIN_PREFIX, ledger_origin
from boxmaker.ledger.follow import LedgerTail
from boxmaker.ledger.ledger_key import read_ledger_origin
from boxmaker.ledger.otel_mapping import OpenCall
from boxmaker.ledger.records import GENESIS_PREV, BadRecord, line_fields, line_hash
from boxmaker.ledger.segments import SegmentProblem, ledger_files

__all__ = [
    "RUNBOOK",
    "Cursor",
    "ExportProblem",
    "check_cursor",
    "ledger_id",
    "read_cursor",
    "resume",
]

RUNBOOK: Final = "docs/runbook.md#otlp-export"
CURSOR_LIMIT: Final = 64 << 20
CURSOR_VERSION: Final = 1


class ExportProblem(Exception):
    """The export cannot go on: the message says why and what to do."""


@attrs.frozen
class Cursor:
    """How far the export to ``url`` got in ``ledger``: every record up to ``seq`` was
    taken (the line at byte ``offset`` of the file that holds it, with hash
    ``line_sha256``), with the spans of the calls they ended; the log records up to
    ``logs_through`` (>= seq) too. The calls open at ``seq`` travel with it."""

    url: str
    ledger: str
    seq: int
    offset: int
    line_sha256: str
    logs_through: int
    open_calls: tuple[OpenCall, ...] = ()

    def to_json(self) -> bytes:
        fields = {
            "v": CURSOR_VERSION,
            "url": self.url,
            "ledger": self.ledger,
            "seq": self.seq,
            "offset": self.offset,
            "line_sha256": self.line_sha256,
            "logs_through": self.logs_through,
            "open_calls": [attrs.asdict(call) for call in self.open_calls],
        }
        return orjson.dumps(fields, option=orjson.OPT_INDENT_2) + b"\n"

    @classmethod
    def start(cls, url: str, ledger: str) -> Cursor:
        """Nothing taken yet: the export begins at genesis (seq 0, whose ``prev`` is
        :data:`~boxmaker.ledger.records.GENESIS_PREV`), or at the oldest file present
        when the oldest segments were archived."""
        return cls(url, ledger, seq=-1, offset=0, line_sha256=GENESIS_PREV, logs_through=-1)


def _cursor_problem(path: Path, what: str) -> ExportProblem:
    return ExportProblem(f"the cursor {path} is not one this export wrote ({what}); see {RUNBOOK}")


def _open_call(path: Path, fields: Any) -> OpenCall:
    if not isinstance(fields, dict) or set(fields) != {
        "call",
        "tool",
        "start_ns",
        "attributes",
        "awaits",
    }:
        raise _cursor_problem(path, "an open call without its fields")
    attributes = fields["attributes"]
    if not isinstance(attributes, dict) or not all(
        isinstance(v, str | int | float) for v in attributes.values()
    ):
        raise _cursor_problem(path, "an open call's attributes")
    call, tool, start, awaits = (fields[k] for k in ("call", "tool", "start_ns", "awaits"))
    if not (isinstance(call, str) and isinstance(tool, str) and type(start) is int):
        raise _cursor_problem(path, "an open call's id, tool or start")
    if awaits not in ("approval", "result"):
        raise _cursor_problem(path, "an open call's end")
    return OpenCall(call, tool, start, attributes, awaits)


def read_cursor(path: Path) -> Cursor | None:
    """The cursor at ``path``; None when there is none. Raises :class:`ExportProblem`
    for one that cannot be read or is not a cursor. Blocking."""
    try:
        data = read_regular_file(path, limit=CURSOR_LIMIT)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ExportProblem(f"the cursor {path}: {exc}; see {RUNBOOK}") from None
    try:
        fields = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise _cursor_problem(path, "not JSON") from None
    expected = {"v", "url", "ledger", "seq", "offset", "line_sha256", "logs_through", "open_calls"}
    if not isinstance(fields, dict) or set(fields) != expected:
        raise _cursor_problem(path, "other fields")
    if fields["v"] != CURSOR_VERSION:
        raise _cursor_problem(path, f"version {fields['v']!r}")
    numbers = [fields[k] for k in ("seq", "offset", "logs_through")]
    texts = [fields[k] for k in ("url", "ledger", "line_sha256")]
    if not all(type(n) is int and n >= -1 for n in numbers) or not all(
        isinstance(t, str) for t in texts
    ):
        raise _cursor_problem(path, "a field of the wrong type")
    if fields["logs_through"] < fields["seq"] or not isinstance(fields["open_calls"], list):
        raise _cursor_problem(path, "logs behind the spans")
    open_calls = tuple(_open_call(path, call) for call in fields["open_calls"])
    return Cursor(
        url=fields["url"],
        ledger=fields["ledger"],
        seq=fields["seq"],
        offset=fields["offset"],
        line_sha256=fields["line_sha256"],
        logs_through=fields["logs_through"],
        open_calls=open_calls,
    )


def ledger_id(path: Path) -> str:
    """The ledger's id: its genesis's (line 0, in the oldest file), or, with the oldest
    segments archived, the one named by the origin of the checkpoint that the oldest
    file present begins with. Blocking."""
    try:
        try:
            origin = read_ledger_origin(path)
        except (BadRecord, SegmentProblem):
            # The first seal may move the oldest file between the listing and the read.
            origin = read_ledger_origin(path)
    except OSError as exc:
        raise ExportProblem(f"{exc.filename or path}: {exc.strerror}; see {RUNBOOK}") from None
    except (BadRecord, SegmentProblem) as exc:
        raise ExportProblem(
            f"{path.parent}: the ledger's id cannot be read ({exc}); run `bxctl audit verify`; "
            f"see {RUNBOOK}"
        ) from None
    ledger = origin.removeprefix(ORIGIN_PREFIX)
    try:
        ledger_origin(ledger)
    except ValueError:
        raise ExportProblem(
            f"{path.parent}: the ledger's origin {origin!r} names no ledger id; run `bxctl "
            f"audit verify`; see {RUNBOOK}"
        ) from None
    return ledger


def check_cursor(path: Path, cursor: Cursor, url: str, ledger: str) -> None:
    """Refuse a cursor of another receiver or ledger."""
    if cursor.url != url:
        raise ExportProblem(
            f"the cursor {path} is for {cursor.url}, not {url}: give each receiver its own "
            f"(--cursor FILE); see {RUNBOOK}"
        )
    if cursor.ledger != ledger:
        raise ExportProblem(
            f"the cursor {path} is of ledger {cursor.ledger}, and this ledger is {ledger}: "
            f"refused; see {RUNBOOK}"
        )


def _rewritten(path: Path, cursor: Cursor) -> ExportProblem:
    return ExportProblem(
        f"the ledger no longer has the line the cursor {path} ends at (seq {cursor.seq}): "
        f"it was rewritten; run `bxctl audit verify`; see {RUNBOOK}"
    )


def resume(directory: Path, cursor_path: Path, cursor: Cursor) -> tuple[LedgerTail, int, str]:
    """The ledger from the line after the cursor's (found by its seq: the file that holds
    it, the offset in that file), which must still be there with its hash; from the
    oldest file present without a cursor. The tail, the seq it begins at, and the hash
    that line's ``prev`` must be. Blocking; raises :class:`ExportProblem`."""
    try:
        archived = ledger_files(directory).archived
        if cursor.seq >= archived:
            tail = LedgerTail.open_at(directory, cursor.seq, cursor.offset)
            line = tail.line_at(cursor.offset)
            if line is None or line_hash(line[:-1]) != cursor.line_sha256:
                tail.close()
                raise _rewritten(cursor_path, cursor)
            tail.offset += len(line)
            return tail, cursor.seq + 1, cursor.line_sha256
        if cursor.seq >= 0 and cursor.seq != archived - 1:
            raise ExportProblem(
                f"the cursor {cursor_path} ends at seq {cursor.seq}, and lines "
                f"{cursor.seq + 1}-{archived - 1} were archived (moved away) before they were "
                f"sent; see {RUNBOOK}"
            )
        tail = LedgerTail.open_at(directory, archived, 0)
    except (OSError, SegmentProblem) as exc:
        raise ExportProblem(f"{directory}: {exc}; see {RUNBOOK}") from None
    if not archived:
        return tail, 0, GENESIS_PREV
    # The first file present begins with the checkpoint of the archived lines; its prev,
    # the hash of the last of them, is what a cursor there must have.
    first = tail.line_at(0)
    try:
        prev = line_fields(first.removesuffix(b"\n") if first else b"").get("prev")
    except BadRecord:
        prev = None
    if not isinstance(prev, str) or (cursor.seq >= 0 and prev != cursor.line_sha256):
        tail.close()
        if isinstance(prev, str):
            raise _rewritten(cursor_path, cursor)
        raise ExportProblem(
            f"{tail.path}: its first line is not a record; run `bxctl audit verify`; see {RUNBOOK}"
        )
    return tail, archived, prev
