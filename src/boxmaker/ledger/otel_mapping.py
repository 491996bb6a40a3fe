"""The ledger as OpenTelemetry sees it (docs/operations.md): one log record per ledger
record, one ``execute_tool`` span per call. Pure: records in, values out; no SDK, no
I/O, no clock (``bxctl audit export`` turns these values into the SDK's and sends them:
:mod:`boxmaker.ledger.otlp_export`).

- :func:`log_of`: a ledger line and its record as a :class:`LedgerLog`. Its attributes
  are the record's fields as ``boxmaker.<field>`` (nested ones as
  ``boxmaker.<field>.<key>``), with the common ones: ``boxmaker.seq``,
  ``boxmaker.kind``, ``boxmaker.ledger`` (the ledger id) and ``boxmaker.line_sha256``
  (the SHA-256 of the line's exact bytes, which the next record's ``prev`` names). An
  approval's ``approval``, ``outcome`` and ``by`` are ``boxmaker.approval.id``,
  ``.outcome`` and ``.by``. A decision's ``arguments`` are content: sent only with
  ``capture_content``, as ``gen_ai.tool.call.arguments``.
- :class:`CallTracker`: the records of calls in, a :class:`CallSpan` out when a call
  ends: at a deny decision, at an approval that ends it without a run, or at its
  result. Its names are the GenAI semantic conventions' for a tool's execution
  (docs/decisions.md, "Export to OpenTelemetry").

Ids: a call's trace and span id are derived from the ledger id and the call id
(:func:`call_ids`), so a span sent again after a crash is the same span, and a call's
log records carry its span's ids.

>>> ids = call_ids("l-0123456789abcdef", "c-0123456789abcdef")
>>> ids == call_ids("l-0123456789abcdef", "c-0123456789abcdef"), ids[0] > 0, ids[1] > 0
(True, True, True)
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
from typing import Any, Final, TypeAlias

import attrs
import orjson

from boxmaker.core.vocabulary import (
    Approval,
    ApprovalOutcome,
    Decision,
    Record,
    Result,
    ResultStatus,
    VerdictCode,
    record_time,
)
from boxmaker.ledger.records import COMMON_FIELDS, Body, call_of, line_fields, line_hash

__all__ = [
    "DISTINCT",
    "OPERATION",
    "PREFIX",
    "Attributes",
    "CallSpan",
    "CallTracker",
    "LedgerLog",
    "OpenCall",
    "call_ids",
    "log_of",
    "time_ns",
]

PREFIX: Final = "boxmaker."
OPERATION: Final = "execute_tool"
"""``gen_ai.operation.name`` of a tool's execution."""
ARGUMENTS: Final = "gen_ai.tool.call.arguments"
"""Opt-in in the conventions (sensitive): only with ``--capture-content``."""
RUNS_AFTER: Final = frozenset({ApprovalOutcome.ASK, ApprovalOutcome.ALLOWED})
"""An approval with one of these outcomes lets the call run: its span ends at the result."""
_RENAMED: Final = {
    "approval": "approval.id",
    "outcome": "approval.outcome",
    "by": "approval.by",
}
"""An approval's fields whose plain names would say less than they mean."""
_EPOCH: Final = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)

DISTINCT: Final = frozenset(
    {
        "boxmaker.seq",
        "boxmaker.seq.first",
        "boxmaker.seq.last",
        "boxmaker.line_sha256",
        "boxmaker.call",
        "gen_ai.tool.call.id",
        "boxmaker.approval.id",
        "boxmaker.output_bytes",
        "boxmaker.output_sha256",
        "boxmaker.result.output_bytes",
        "boxmaker.result.output_sha256",
    }
)
"""Attributes whose value is new on nearly every record or call (the encoder keeps no
encoding of theirs: :mod:`boxmaker.ledger.otlp_proto`)."""

Value: TypeAlias = str | int | bool | float
_SCALARS: Final = frozenset({str, int, bool, float})
Attributes: TypeAlias = dict[str, Value]


@functools.lru_cache(maxsize=64)
def time_ns(at: str) -> int:
    """A record's ``at`` in nanoseconds since the epoch, as OTLP carries times. Kept a
    short while: a record's log and its call's span ask for the same time in turn.

    >>> time_ns("1970-01-01T00:00:01.234Z")
    1234000000
    """
    return (record_time(at) - _EPOCH) // dt.timedelta(microseconds=1) * 1000


@functools.lru_cache(maxsize=4096)
def call_ids(ledger: str, call: str) -> tuple[int, int]:
    """The trace id (128 bits) and span id (64 bits) of ``call`` in ``ledger``: the same
    at every export, never zero (an invalid id in OTLP). Kept for the calls seen last:
    each call's records and its span ask for them."""
    digest = hashlib.sha256(f"boxmaker.otel\n{ledger}\n{call}".encode()).digest()
    return int.from_bytes(digest[:16]) or 1, int.from_bytes(digest[16:24]) or 1


def _flatten(name: str, value: Any, into: Attributes) -> None:
    """``value`` as attributes named ``name``: scalars as they are, an object's keys
    below it, None left out; anything else as its JSON text."""
    if value is None:
        return
    if isinstance(value, str | int | float):  # bool is an int
        into[name] = value
    elif isinstance(value, dict):
        for key, inner in value.items():
            _flatten(f"{name}.{key}", inner, into)
    else:
        into[name] = orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def arguments_text(arguments: dict[str, Any]) -> str:
    """A decision's arguments as ``gen_ai.tool.call.arguments`` holds them: JSON text
    (the conventions allow it where an attribute cannot hold an object)."""
    return orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS).decode()


@attrs.frozen
class LedgerLog:
    """One ledger record as an OTLP log record: ``body`` is the record's kind."""

    seq: int
    time_ns: int
    body: str
    attributes: Attributes
    trace_id: int | None = None
    """The call's trace and span ids, for a record of a call; None for the others."""
    span_id: int | None = None


def log_of(
    line: bytes,
    record: Record[Body],
    ledger: str,
    *,
    capture_content: bool,
    fields: dict[str, Any] | None = None,
    line_sha256: str | None = None,
) -> LedgerLog:
    """The log record of ``record``, read from ``line`` (its exact bytes, no newline).
    A caller that parsed and hashed the line already passes its ``fields`` (the line's
    JSON object, unchanged) and ``line_sha256``: the work is not done twice.

    >>> from boxmaker.ledger.records import Stop, encode_line, decode_line
    >>> line = encode_line(3, "2026-01-02T03:04:05.678Z", "ab", Stop(boot="b-1"))
    >>> log = log_of(line, decode_line(line), "l-1", capture_content=False)
    >>> log.body, log.attributes["boxmaker.seq"], log.attributes["boxmaker.boot"]
    ('stop', 3, 'b-1')
    """
    body = record.body
    kind = body.kind.value
    attributes: Attributes = {
        "boxmaker.ledger": ledger,
        "boxmaker.seq": record.seq,
        "boxmaker.kind": kind,
        "boxmaker.line_sha256": line_hash(line) if line_sha256 is None else line_sha256,
    }
    renamed = _RENAMED if isinstance(body, Approval) else {}
    decision = isinstance(body, Decision)
    # The line's own JSON (the typed record checked it): a tenth of the converter's cost.
    for name, value in (line_fields(line) if fields is None else fields).items():
        if name in COMMON_FIELDS:
            continue
        if decision and name == "arguments":
            if capture_content:
                attributes[ARGUMENTS] = arguments_text(value)
            continue
        if type(value) in _SCALARS:  # most fields: what _flatten does, without the call
            attributes[PREFIX + renamed.get(name, name)] = value
        else:
            _flatten(PREFIX + renamed.get(name, name), value, attributes)
    call = call_of(body)
    trace_id, span_id = call_ids(ledger, call) if call is not None else (None, None)
    return LedgerLog(record.seq, time_ns(record.at), kind, attributes, trace_id, span_id)


@attrs.frozen
class CallSpan:
    """A call's ``execute_tool`` span: from its decision to its end. ``error`` is the
    ``error.type`` of a call that was denied or failed (a reason code or an approval's
    outcome), None for one that ran and succeeded."""

    call: str
    name: str
    trace_id: int
    span_id: int
    start_ns: int
    end_ns: int
    error: str | None
    attributes: Attributes


@attrs.frozen
class OpenCall:
    """A call decided and not yet ended: what its span needs so far. Kept in the export's
    cursor, so a resumed export needs no record before the cursor."""

    call: str
    tool: str
    start_ns: int
    attributes: Attributes
    awaits: str
    """What ends it: ``approval`` or ``result``."""

    def with_attributes(self, attributes: Attributes, awaits: str | None = None) -> OpenCall:
        """This call with ``attributes`` (and what ends it now). Built directly: under
        half of ``attrs.evolve``'s cost, paid once or twice a call."""
        return OpenCall(self.call, self.tool, self.start_ns, attributes, awaits or self.awaits)


def _span(open_call: OpenCall, end_ns: int, last_seq: int, error: str | None) -> CallSpan:
    attributes = dict(open_call.attributes)
    attributes["boxmaker.seq.last"] = last_seq
    if error is not None:
        attributes["error.type"] = error
    trace_id, span_id = call_ids(str(attributes["boxmaker.ledger"]), open_call.call)
    return CallSpan(
        call=open_call.call,
        name=f"{OPERATION} {open_call.tool}",
        trace_id=trace_id,
        span_id=span_id,
        start_ns=open_call.start_ns,
        end_ns=max(end_ns, open_call.start_ns),
        error=error,
        attributes=attributes,
    )


@attrs.define
class CallTracker:
    """The calls open in a ledger read in order: :meth:`feed` each record; a call's span
    comes out when the call ends. A record of a call not open here (decided before the
    ledger was read from, with no open call carried over) makes no span.

    >>> from boxmaker.ledger.records import decode_line
    >>> line = (b'{"arguments":{"path":"a"},"at":"2026-01-02T03:04:05.678Z","boot":"b-1",'
    ...         b'"call":"c-0000000000000001","grant":null,"kind":"decision","prev":"00",'
    ...         b'"reason":"no_grant","seq":1,"session":"s-000000000001","taint":"public",'
    ...         b'"tool":"read_file","untrusted":false,"verdict":"deny"}')
    >>> span = CallTracker("l-1", capture_content=False).feed(decode_line(line))
    >>> span.name, span.error, span.attributes["gen_ai.tool.call.id"]
    ('execute_tool read_file', 'no_grant', 'c-0000000000000001')
    """

    ledger: str
    capture_content: bool
    open_calls: dict[str, OpenCall] = attrs.field(factory=dict)

    def feed(self, record: Record[Body]) -> CallSpan | None:
        """The span of the call ``record`` ends, if it ends one."""
        body = record.body
        moment = time_ns(record.at)
        match body:
            case Decision():
                return self._decided(record.seq, moment, body)
            case Approval():
                return self._approved(record.seq, moment, body)
            case Result():
                return self._ended(record.seq, moment, body)
            case _:
                return None

    def _decided(self, seq: int, moment: int, decision: Decision) -> CallSpan | None:
        attributes: Attributes = {
            "gen_ai.operation.name": OPERATION,
            "gen_ai.tool.name": decision.tool,
            "gen_ai.tool.call.id": decision.call,
            "gen_ai.conversation.id": decision.session,
            "boxmaker.ledger": self.ledger,
            "boxmaker.call": decision.call,
            "boxmaker.session": decision.session,
            "boxmaker.verdict": decision.verdict.value,
            "boxmaker.taint": decision.taint.value,
            "boxmaker.untrusted": decision.untrusted,
            "boxmaker.seq.first": seq,
        }
        for name, value in (
            ("reason", decision.reason),
            ("grant", decision.grant),
            ("definition", decision.definition),
        ):
            if value is not None:
                attributes[PREFIX + name] = value
        if self.capture_content:
            attributes[ARGUMENTS] = arguments_text(decision.arguments)
        awaits = "approval" if decision.verdict is VerdictCode.ASK else "result"
        opened = OpenCall(decision.call, decision.tool, moment, attributes, awaits)
        if decision.verdict is VerdictCode.DENY:
            return _span(opened, moment, seq, decision.reason.value if decision.reason else "deny")
        self.open_calls[decision.call] = opened
        return None

    def _approved(self, seq: int, moment: int, approval: Approval) -> CallSpan | None:
        opened = self.open_calls.get(approval.call)
        if opened is None:
            return None
        attributes = dict(opened.attributes)
        attributes["boxmaker.approval.id"] = approval.approval
        attributes["boxmaker.approval.outcome"] = approval.outcome.value
        attributes["boxmaker.approval.by"] = approval.by.value
        if approval.grant_written is not None:
            attributes["boxmaker.approval.grant_written"] = approval.grant_written
        if approval.outcome in RUNS_AFTER:
            self.open_calls[approval.call] = opened.with_attributes(attributes, "result")
            return None
        del self.open_calls[approval.call]
        ended = opened.with_attributes(attributes)
        return _span(ended, moment, seq, approval.outcome.value)

    def _ended(self, seq: int, moment: int, result: Result) -> CallSpan | None:
        opened = self.open_calls.pop(result.call, None)
        if opened is None:
            return None
        attributes = dict(opened.attributes)
        attributes["boxmaker.result.status"] = result.status.value
        attributes["boxmaker.result.output_bytes"] = result.output_bytes
        if result.output_sha256 is not None:
            attributes["boxmaker.result.output_sha256"] = result.output_sha256
        if result.reason is not None:
            attributes["boxmaker.result.reason"] = result.reason.value
        failed = result.status is ResultStatus.FAILED
        error = (result.reason.value if result.reason else "failed") if failed else None
        return _span(opened.with_attributes(attributes), moment, seq, error)
