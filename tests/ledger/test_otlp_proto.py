"""The export's request bodies (ledger/otlp_proto.py), decoded with the OpenTelemetry
proto package: every attribute arrives once with its value in the ``AnyValue`` field of
its type, whether it was set field by field (a distinct one: a seq, a line's hash) or
merged in from a kept encoding (one that repeats), on the first record and on every
later one, and after the kept encodings were let go."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from boxmaker.ledger import otlp_proto
from boxmaker.ledger.otel_mapping import DISTINCT, Attributes, CallSpan, LedgerLog
from boxmaker.ledger.otlp_proto import ProtoEncoder

KEYS = [*sorted(DISTINCT)[:3], "boxmaker.tool", "boxmaker.verdict", "boxmaker.untrusted", "x"]
# Values that compare equal across types (True == 1 == 1.0) must still arrive as their type.
VALUES = st.one_of(
    st.sampled_from([True, False, 1, 0, 1.0, 0.0, "1", "", "read_file"]),
    st.text(max_size=8),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
)
ATTRIBUTES = st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=len(KEYS))
KIND = {str: "string_value", bool: "bool_value", int: "int_value", float: "double_value"}


def typed(attributes: Attributes) -> dict[str, tuple[str, Any]]:
    return {key: (KIND[type(value)], value) for key, value in attributes.items()}


def arrived(pairs: Any) -> dict[str, tuple[str, Any]]:
    got: dict[str, tuple[str, Any]] = {}
    for pair in pairs:
        assert pair.key not in got, f"{pair.key} twice"
        kind = pair.value.WhichOneof("value")
        got[pair.key] = (kind, getattr(pair.value, kind))
    return got


def logs_of(body: bytes) -> list[Any]:
    [resource_logs] = ExportLogsServiceRequest.FromString(body).resource_logs
    [scope_logs] = resource_logs.scope_logs
    return list(scope_logs.log_records)


@given(st.lists(ATTRIBUTES, min_size=1, max_size=6), st.integers(min_value=1, max_value=4))
def test_each_log_records_attributes_arrive_once_as_their_type(
    many: list[Attributes], kept: int
) -> None:
    encoder = ProtoEncoder("l-0123456789abcdef", "0")
    encoder._log_attributes.KEPT = kept  # type: ignore[misc]  # let go of them often
    logs = [LedgerLog(seq, seq * 10, "stop", attributes) for seq, attributes in enumerate(many)]
    for body in (encoder.logs(logs), encoder.logs(logs)):  # the second from kept encodings
        records = logs_of(body)
        assert [arrived(record.attributes) for record in records] == [typed(a) for a in many]
        assert [record.body.string_value for record in records] == ["stop"] * len(many)
        assert [record.time_unix_nano for record in records] == [log.time_ns for log in logs]


@given(st.lists(ATTRIBUTES, min_size=1, max_size=4))
def test_each_spans_attributes_arrive_once_as_their_type(many: list[Attributes]) -> None:
    encoder = ProtoEncoder("l-0123456789abcdef", "0")
    spans = [
        CallSpan(f"c-{n}", "execute_tool x", n + 1, n + 1, 5, 6, None, attributes)
        for n, attributes in enumerate(many)
    ]
    for body in (encoder.spans(spans), encoder.spans(spans)):
        [resource_spans] = ExportTraceServiceRequest.FromString(body).resource_spans
        got = [arrived(span.attributes) for span in resource_spans.scope_spans[0].spans]
        assert got == [typed(a) for a in many]


def test_the_distinct_attributes_are_set_first_and_the_others_kept_for_next_time() -> None:
    encoder = ProtoEncoder("l-0123456789abcdef", "0")
    attributes: Attributes = {"boxmaker.tool": "read_file", "boxmaker.seq": 7}
    [record] = logs_of(encoder.logs([LedgerLog(7, 1, "decision", attributes)]))
    assert [pair.key for pair in record.attributes] == ["boxmaker.seq", "boxmaker.tool"]
    assert list(encoder._log_attributes._kept) == [("boxmaker.tool", str, "read_file")]


def test_the_kept_encodings_are_let_go_when_full(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(otlp_proto._EncodedAttributes, "KEPT", 2)
    encoder = ProtoEncoder("l-0123456789abcdef", "0")
    for value in ("a", "b", "c"):
        encoder.logs([LedgerLog(1, 1, "stop", {"boxmaker.tool": value})])
    assert list(encoder._log_attributes._kept) == [("boxmaker.tool", str, "c")]
