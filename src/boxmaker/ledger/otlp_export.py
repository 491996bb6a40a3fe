"""``bxctl audit export --otlp URL``: the ledger sent to an OpenTelemetry receiver
(docs/operations.md). Needs the optional extra ``boxmaker[otel]``: only
``bxctl audit export`` imports this module.

The ledger is read with the one reader (:mod:`boxmaker.ledger.reader`), a batch of lines
at a time from the byte offset where the last export stopped; each line's ``prev`` is
checked against the line before (a chain broken since the last export stops it). The
records become values by the pure mapping (:mod:`boxmaker.ledger.otel_mapping`), then
the SDK's log records and spans, which the SDK's OTLP/HTTP exporters send as protobuf
(``URL/v1/logs``, ``URL/v1/traces``; the exporters' calls block, so they run through
``trio.to_thread``).

The cursor (:class:`Cursor`, a JSON file written atomically) moves only after the
receiver took a batch: first the logs (``logs_through``), then the spans of the calls the
batch ended (``seq``, with the calls still open then). A stopped or crashed export, or a
receiver that was down, resumes from it: nothing is lost and nothing the receiver took is
sent again. The one exception is a crash between the receiver's answer and the cursor's
rename (docs/decisions.md, "Export to OpenTelemetry"). A receiver that does not take a
batch is tried again with backoff; the cursor stays.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Final

import attrs
import orjson
import trio
from opentelemetry._logs import LogRecord, SeverityNumber
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk._logs.export import LogRecordExportResult
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    set_span_in_context,
)

from boxmaker import __version__
from boxmaker.home.file_ops import write_atomically
from boxmaker.home.regular_file import read_regular_file
from boxmaker.ledger.otel_mapping import (
    Attributes,
    CallSpan,
    CallTracker,
    LedgerLog,
    OpenCall,
    log_of,
)
from boxmaker.ledger.reader import READ_BUFFER, LedgerReader, NotARecord
from boxmaker.ledger.records import GENESIS_PREV, BadRecord, Genesis, decode_line, line_hash

__all__ = [
    "RUNBOOK",
    "Backoff",
    "Cursor",
    "ExportProblem",
    "Sent",
    "export_ledger",
    "read_cursor",
]

RUNBOOK: Final = "docs/runbook.md#otlp-export"
BATCH_LINES: Final = 4096
"""Ledger lines a batch at most: one request a signal (about 2 MB of logs)."""
REQUEST_TIMEOUT: Final = 5.0
"""Seconds the exporter waits for the receiver's answer to one request."""
POLL: Final = 0.5
"""Seconds between looks at the ledger's end with ``--follow``."""
CURSOR_LIMIT: Final = 64 << 20
CURSOR_VERSION: Final = 1
_SAMPLED: Final = TraceFlags(TraceFlags.SAMPLED)
_EXPORTER_LOGGER: Final = "opentelemetry.exporter"


class ExportProblem(Exception):
    """The export cannot go on: the message says why and what to do."""


@attrs.frozen
class Backoff:
    """The waits between tries when the receiver does not take a batch: ``first``
    seconds, doubled each time, at most ``most``."""

    first: float = 0.5
    most: float = 30.0


@attrs.frozen
class Cursor:
    """How far the export to ``url`` got in ``ledger``: every record up to ``seq`` was
    taken (the line at byte ``offset`` with hash ``line_sha256``), with the spans of the
    calls they ended; the log records up to ``logs_through`` (>= seq) too. The calls open
    at ``seq`` travel with it."""

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
        :data:`~boxmaker.ledger.records.GENESIS_PREV`)."""
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


@attrs.frozen
class Sent:
    """What an export sent (and the receiver took)."""

    logs: int
    spans: int
    through: int
    """The last seq the receiver has, -1 for none."""


@attrs.define
class _Tail:
    """The ledger file from a byte offset: complete lines only (a line still being
    written, without its newline, waits for the next look)."""

    file: BinaryIO
    offset: int

    def read_lines(self, most: int) -> list[tuple[int, bytes]]:
        """Up to ``most`` complete lines, each with its byte offset. Blocking."""
        self.file.seek(self.offset)
        lines: list[tuple[int, bytes]] = []
        readline = self.file.readline
        offset = self.offset
        while len(lines) < most:
            line = readline()
            if not line.endswith(b"\n"):
                break
            lines.append((offset, line))
            offset += len(line)
        self.offset = offset
        return lines


def _ledger_id(file: BinaryIO, path: Path) -> str:
    """The id its genesis record (line 0) gives the ledger. Blocking."""
    file.seek(0)
    first = file.readline()
    try:
        genesis = decode_line(first.rstrip(b"\n"))
    except BadRecord as exc:
        raise ExportProblem(
            f"{path}: its first line is not a record ({exc}); see {RUNBOOK}"
        ) from None
    if not isinstance(genesis.body, Genesis) or genesis.seq != 0:
        raise ExportProblem(f"{path}: its first record is not genesis; see {RUNBOOK}")
    return genesis.body.ledger


def _resume_point(file: BinaryIO, path: Path, cursor: Cursor, url: str, ledger: str) -> None:
    """Refuse a cursor of another receiver or ledger, or of a ledger rewritten since:
    the line at its offset must still be its seq with its hash. Blocking."""
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
    if cursor.seq < 0:
        return
    file.seek(cursor.offset)
    line = file.readline()
    if not line.endswith(b"\n") or line_hash(line[:-1]) != cursor.line_sha256:
        raise ExportProblem(
            f"the ledger no longer has the line the cursor {path} ends at (seq {cursor.seq}): "
            f"it was rewritten; run `bxctl audit verify`; see {RUNBOOK}"
        )


class _ExporterWords(logging.Handler):
    """The OTLP exporters' last warning (a status code, a refused connection): said in
    bxctl's own message rather than as a traceback on stderr."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.last = ""

    def emit(self, record: logging.LogRecord) -> None:
        self.last = record.getMessage().splitlines()[0] if record.getMessage() else ""


def _sdk_log(log: LedgerLog, resource: Resource, scope: InstrumentationScope) -> ReadableLogRecord:
    context = Context()
    if log.trace_id is not None and log.span_id is not None:
        span = NonRecordingSpan(SpanContext(log.trace_id, log.span_id, False, _SAMPLED))
        context = set_span_in_context(span, context)
    record = LogRecord(
        timestamp=log.time_ns,
        observed_timestamp=log.time_ns,
        context=context,
        severity_number=SeverityNumber.INFO,
        severity_text="INFO",
        body=log.body,
        attributes=log.attributes,
    )
    return ReadableLogRecord(record, resource, scope)


def _sdk_span(span: CallSpan, resource: Resource, scope: InstrumentationScope) -> ReadableSpan:
    status = Status(StatusCode.UNSET)
    if span.error is not None:
        status = Status(StatusCode.ERROR, span.error)
    return ReadableSpan(
        name=span.name,
        context=SpanContext(span.trace_id, span.span_id, False, _SAMPLED),
        resource=resource,
        attributes=span.attributes,
        kind=SpanKind.INTERNAL,
        status=status,
        start_time=span.start_ns,
        end_time=span.end_ns,
        instrumentation_scope=scope,
    )


@attrs.define
class _Exporter:
    """The SDK's two OTLP/HTTP exporters for one receiver, and what they said last."""

    url: str
    ledger: str
    logs: OTLPLogExporter = attrs.field(init=False)
    spans: OTLPSpanExporter = attrs.field(init=False)
    resource: Resource = attrs.field(init=False)
    scope: InstrumentationScope = attrs.field(init=False)
    words: _ExporterWords = attrs.field(factory=_ExporterWords)

    def __attrs_post_init__(self) -> None:
        base = self.url.rstrip("/")
        self.logs = OTLPLogExporter(endpoint=f"{base}/v1/logs", timeout=REQUEST_TIMEOUT)
        self.spans = OTLPSpanExporter(endpoint=f"{base}/v1/traces", timeout=REQUEST_TIMEOUT)
        attributes: Attributes = {
            "service.name": "boxmaker",
            "service.version": __version__,
            "boxmaker.ledger": self.ledger,
        }
        self.resource = Resource.create(attributes)
        self.scope = InstrumentationScope("boxmaker.ledger", __version__)
        logger = logging.getLogger(_EXPORTER_LOGGER)
        logger.addHandler(self.words)
        logger.propagate = False

    def close(self) -> None:
        logger = logging.getLogger(_EXPORTER_LOGGER)
        logger.removeHandler(self.words)
        logger.propagate = True
        self.logs.shutdown()  # type: ignore[no-untyped-call]  # the SDK's, unannotated
        self.spans.shutdown()  # type: ignore[no-untyped-call]

    def send_logs(self, logs: Sequence[LedgerLog]) -> bool:
        """Whether the receiver took ``logs``. Blocking."""
        batch = [_sdk_log(log, self.resource, self.scope) for log in logs]
        return self.logs.export(batch) is LogRecordExportResult.SUCCESS

    def send_spans(self, spans: Sequence[CallSpan]) -> bool:
        """Whether the receiver took ``spans``. Blocking."""
        batch = [_sdk_span(span, self.resource, self.scope) for span in spans]
        return self.spans.export(batch) is SpanExportResult.SUCCESS


@attrs.define
class _Export:
    """One run of the export: the state between batches."""

    path: Path
    url: str
    cursor_path: Path
    say: Callable[[str], None]
    backoff: Backoff
    exporter: _Exporter
    tracker: CallTracker
    tail: _Tail
    cursor: Cursor
    sent_logs: int = 0
    sent_spans: int = 0

    async def deliver(self, what: str, send: Callable[[], bool], first: int, last: int) -> None:
        """Send until the receiver takes it; the cursor stays meanwhile."""
        delay = self.backoff.first
        failed = False
        while not await trio.to_thread.run_sync(send):
            failed = True
            words = self.exporter.words.last or "no answer"
            self.say(
                f"the receiver at {self.url} did not take the {what} of seq {first}-{last} "
                f"({words}); the cursor stays at seq {self.cursor.seq}; trying again in "
                f"{delay:g} s (see {RUNBOOK})"
            )
            await trio.sleep(delay)
            delay = min(delay * 2, self.backoff.most)
        if failed:
            self.say(f"the receiver at {self.url} took the {what} of seq {first}-{last}")

    async def move_cursor(self, cursor: Cursor) -> None:
        """Write the cursor: shielded, so a stop right after the receiver's answer
        still records what it took."""
        with trio.CancelScope(shield=True):
            data = cursor.to_json()
            await trio.to_thread.run_sync(write_atomically, self.cursor_path, data)
        self.cursor = cursor

    async def batch(self, lines: list[tuple[int, bytes]], *, capture_content: bool) -> None:
        """Send one batch of lines: their logs, then the spans of the calls they end;
        the cursor after each."""
        at = self.cursor
        expected, prev = at.seq + 1, at.line_sha256
        logs: list[LedgerLog] = []
        spans: list[CallSpan] = []
        for line, record in LedgerReader(raw for _, raw in lines).records():
            if isinstance(record, NotARecord):
                raise ExportProblem(
                    f"{self.path}: the line after seq {expected - 1} is not a record "
                    f"({record.problem}); run `bxctl audit verify`; see {RUNBOOK}"
                )
            if record.seq != expected or record.prev != prev:
                raise ExportProblem(
                    f"{self.path}: the chain breaks at seq {record.seq} (expected seq "
                    f"{expected} after the line hashed {prev[:12]}…); run `bxctl audit "
                    f"verify`; see {RUNBOOK}"
                )
            prev = line_hash(line)
            expected += 1
            if record.seq > at.logs_through:
                ledger = self.exporter.ledger
                logs.append(log_of(line, record, ledger, capture_content=capture_content))
            if (span := self.tracker.feed(record)) is not None:
                spans.append(span)
        first, last = at.seq + 1, expected - 1
        if logs:
            await self.deliver("log records", lambda: self.exporter.send_logs(logs), first, last)
            self.sent_logs += len(logs)
            if spans:
                await self.move_cursor(attrs.evolve(at, logs_through=last))
        if spans:
            await self.deliver("spans", lambda: self.exporter.send_spans(spans), first, last)
            self.sent_spans += len(spans)
        last_offset = lines[-1][0]
        done = Cursor(
            url=self.url,
            ledger=at.ledger,
            seq=last,
            offset=last_offset,
            line_sha256=prev,
            logs_through=max(last, at.logs_through),
            open_calls=tuple(self.tracker.open_calls.values()),
        )
        await self.move_cursor(done)


async def export_ledger(
    path: Path,
    url: str,
    cursor_path: Path,
    *,
    capture_content: bool,
    follow: bool,
    say: Callable[[str], None],
    backoff: Backoff = Backoff(),
    batch_lines: int | None = None,
    poll: float = POLL,
) -> Sent:
    """Export the ledger at ``path`` to the OTLP/HTTP receiver at ``url`` from the cursor
    at ``cursor_path`` on (from the start without one), until its end; with ``follow``,
    on as it grows until cancelled. ``say`` hears about a receiver that does not take a
    batch. Raises :class:`ExportProblem`."""
    try:
        file = await trio.to_thread.run_sync(lambda: path.open("rb", buffering=READ_BUFFER))
    except OSError as exc:
        raise ExportProblem(f"{path}: {exc.strerror}; see {RUNBOOK}") from None
    try:
        ledger = await trio.to_thread.run_sync(_ledger_id, file, path)
        cursor = await trio.to_thread.run_sync(read_cursor, cursor_path)
        tracker = CallTracker(ledger, capture_content=capture_content)
        if cursor is None:
            cursor = Cursor.start(url, ledger)
        await trio.to_thread.run_sync(_resume_point, file, cursor_path, cursor, url, ledger)
        tracker.open_calls = {call.call: call for call in cursor.open_calls}
        tail = _Tail(file, cursor.offset)
        if cursor.seq >= 0:
            await trio.to_thread.run_sync(tail.read_lines, 1)  # the cursor's own line
        exporter = _Exporter(url, ledger)
        most = BATCH_LINES if batch_lines is None else batch_lines
        run = _Export(path, url, cursor_path, say, backoff, exporter, tracker, tail, cursor)
        try:
            while True:
                lines = await trio.to_thread.run_sync(tail.read_lines, most)
                if lines:
                    await run.batch(lines, capture_content=capture_content)
                elif follow:
                    await trio.sleep(poll)
                else:
                    break
        finally:
            exporter.close()
        return Sent(run.sent_logs, run.sent_spans, run.cursor.seq)
    finally:
        file.close()
