"""The export's values as OTLP/HTTP request bodies (docs/operations.md): the pure
mapping's :class:`~boxmaker.ledger.otel_mapping.LedgerLog` and
:class:`~boxmaker.ledger.otel_mapping.CallSpan` put into ``opentelemetry-proto``'s
generated messages (``ExportLogsServiceRequest``, ``ExportTraceServiceRequest``) and
encoded by protobuf. No I/O. Built here rather than through the SDK's record and span
objects and its encoders: the same messages at a fraction of the cost
(docs/decisions.md, "Export to OpenTelemetry").

>>> from boxmaker.ledger.otel_mapping import LedgerLog
>>> encoder = ProtoEncoder("l-1", "0.1.0")
>>> body = encoder.logs([LedgerLog(3, 7, "stop", {"boxmaker.seq": 3, "boxmaker.ok": True})])
>>> request = ExportLogsServiceRequest.FromString(body)
>>> [record] = request.resource_logs[0].scope_logs[0].log_records
>>> record.body.string_value, [(a.key, a.value.WhichOneof("value")) for a in record.attributes]
('stop', [('boxmaker.seq', 'int_value'), ('boxmaker.ok', 'bool_value')])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.logs.v1.logs_pb2 import SEVERITY_NUMBER_INFO, LogRecord
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import (
    SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK,
    Span,
    Status,
)

from boxmaker.ledger.otel_mapping import DISTINCT, Attributes, CallSpan, LedgerLog, Value

__all__ = ["SCOPE", "ProtoEncoder"]

SCOPE: Final = "boxmaker.ledger"
"""The instrumentation scope of everything exported."""
_SAMPLED: Final = 1
"""W3C trace flags: sampled (a call's log records carry its span's context)."""
_INFO: Final = "INFO"


def _put(into: Any, attributes: Attributes) -> None:
    """``attributes`` appended to a message's repeated ``attributes``, each value in the
    ``AnyValue`` field of its type (a str enum as a string; a bool is not an int). Set
    field by field: about a microsecond an attribute, the cheapest way protobuf's
    Python API offers to build one (a ``KeyValue`` built whole and appended, or one kept
    and copied, measured slower)."""
    add = into.add
    for key, value in attributes.items():
        pair = add(key=key)
        kind = type(value)
        if kind is str or (kind is not bool and kind is not int and isinstance(value, str)):
            pair.value.string_value = value
        elif kind is bool:
            pair.value.bool_value = value
        elif kind is int:
            pair.value.int_value = value
        else:
            pair.value.double_value = value


class _EncodedAttributes:
    """A message type's attributes put into a message of it: the ones whose values are
    new on nearly every record (:data:`~boxmaker.ledger.otel_mapping.DISTINCT`: a seq, a
    line's hash, a call's id) set field by field (:func:`_put`); the others (a tool, a
    verdict, a session, a grant) merged in at once from their encodings, each made by
    protobuf once (the bytes of a message holding that attribute alone) and kept while
    few. Protobuf defines a concatenation of encoded messages as their merge, which
    appends repeated fields in order; the distinct attributes come first. A record's
    encoding costs about a fifth less than setting them all one by one
    (docs/decisions.md, "Export to OpenTelemetry")."""

    KEPT: Final = 1 << 14
    """Encodings kept at most; all are let go when full."""

    def __init__(self, message_type: Any) -> None:
        self._alone = message_type()
        self._kept: dict[tuple[str, type, Value], bytes] = {}

    def _one(self, key: str, value: Value) -> bytes:
        alone = self._alone
        alone.Clear()
        _put(alone.attributes, {key: value})
        encoded: bytes = alone.SerializeToString()
        return encoded

    def put(self, message: Any, attributes: Attributes) -> None:
        """``attributes`` into ``message``: the distinct ones first, then the rest."""
        kept, one = self._kept, self._one
        distinct: Attributes = {}
        parts = []
        for key, value in attributes.items():
            if key in DISTINCT:
                distinct[key] = value
                continue
            # The type is in the key: True == 1 == 1.0, and each encodes otherwise.
            name = (key, type(value), value)
            encoded = kept.get(name)
            if encoded is None:
                encoded = one(key, value)
                if len(kept) >= self.KEPT:
                    kept.clear()
                kept[name] = encoded
            parts.append(encoded)
        _put(message.attributes, distinct)
        message.MergeFromString(b"".join(parts))


class ProtoEncoder:
    """The request bodies of one ledger's export: its resource (``service.name``
    boxmaker, ``service.version``, ``boxmaker.ledger``) and scope on every request."""

    def __init__(self, ledger: str, version: str) -> None:
        self._resource = Resource()
        resource: Attributes = {
            "service.name": "boxmaker",
            "service.version": version,
            "boxmaker.ledger": ledger,
        }
        _put(self._resource.attributes, resource)
        self._scope = InstrumentationScope(name=SCOPE, version=version)
        self._log_attributes = _EncodedAttributes(LogRecord)
        self._span_attributes = _EncodedAttributes(Span)

    def logs(self, logs: Sequence[LedgerLog]) -> bytes:
        """An ``ExportLogsServiceRequest`` with ``logs``, encoded."""
        request = ExportLogsServiceRequest()
        resource_logs = request.resource_logs.add()
        resource_logs.resource.CopyFrom(self._resource)
        scope_logs = resource_logs.scope_logs.add()
        scope_logs.scope.CopyFrom(self._scope)
        add = scope_logs.log_records.add
        for log in logs:
            record = add(
                time_unix_nano=log.time_ns,
                observed_time_unix_nano=log.time_ns,
                severity_number=SEVERITY_NUMBER_INFO,
                severity_text=_INFO,
            )
            record.body.string_value = log.body
            self._log_attributes.put(record, log.attributes)
            if log.trace_id is not None and log.span_id is not None:
                record.trace_id = log.trace_id.to_bytes(16)
                record.span_id = log.span_id.to_bytes(8)
                record.flags = _SAMPLED
        encoded: bytes = request.SerializeToString()
        return encoded

    def spans(self, spans: Sequence[CallSpan]) -> bytes:
        """An ``ExportTraceServiceRequest`` with ``spans`` (kind internal, no parent;
        status error with the call's ``error.type`` as its message, else unset),
        encoded."""
        request = ExportTraceServiceRequest()
        resource_spans = request.resource_spans.add()
        resource_spans.resource.CopyFrom(self._resource)
        scope_spans = resource_spans.scope_spans.add()
        scope_spans.scope.CopyFrom(self._scope)
        add = scope_spans.spans.add
        for span in spans:
            message = add(
                trace_id=span.trace_id.to_bytes(16),
                span_id=span.span_id.to_bytes(8),
                name=span.name,
                kind=Span.SPAN_KIND_INTERNAL,
                start_time_unix_nano=span.start_ns,
                end_time_unix_nano=span.end_ns,
                flags=SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK | _SAMPLED,
            )
            self._span_attributes.put(message, span.attributes)
            if span.error is not None:
                message.status.code = Status.STATUS_CODE_ERROR
                message.status.message = span.error
        encoded: bytes = request.SerializeToString()
        return encoded
