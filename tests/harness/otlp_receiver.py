"""A real OTLP/HTTP receiver for the export's tests and benchmark: a separate process
(``python -m tests.harness.otlp_receiver OUT [--port N] [--take N] [--answers A,B…]
[--ack-only] [--seqs-only] [--answer-after S]``) on 127.0.0.1
that takes ``POST /v1/logs`` and ``POST /v1/traces`` with protobuf bodies, decodes them
with the OpenTelemetry proto package (``ExportLogsServiceRequest``,
``ExportTraceServiceRequest``: the decoding is theirs, not boxmaker's), and appends
one JSON line per log record and per span to OUT. It prints ``listening PORT`` when
ready. With ``--take N`` it exits right after answering its Nth request: a receiver
that goes away mid-stream. With ``--answers``, its first requests are answered otherwise,
one answer each, and not kept: ``503:2`` (that status with ``Retry-After: 2``), ``400``
(that status), ``partial`` (taken, but a partial success rejecting one item; kept).
With ``--ack-only`` it reads each request and answers success without decoding or
keeping anything (the benchmark's exporter-alone figure). With ``--seqs-only`` it
decodes each request whole as usual and keeps only each item's ``boxmaker.seq``
(``boxmaker.seq.first`` for a span), one JSON line a request: a receiver that does the
work a collector's receiver does (decode, check, hand on), not the tests' conversion of
every attribute to JSON, which costs Python more than the export itself (the
benchmark's figure held to the target). With ``--answer-after S`` it waits S seconds
between keeping what it got and answering: a request in flight while the export stops.

:class:`Receiver` starts and stops it from a test and reads OUT back.
"""

from __future__ import annotations

import argparse
import http.server
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import orjson
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsPartialSuccess,
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from tests.harness.lines import whole_lines

ROOT = Path(__file__).resolve().parents[2]
PARTIAL_WORDS = "one item dropped by the test's receiver"
REFUSED_WORDS = "bad data, says the test's receiver"


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return None if kind is None else getattr(value, kind)


def _attributes(attributes: Any) -> dict[str, Any]:
    pairs: list[KeyValue] = list(attributes)
    return {pair.key: _value(pair.value) for pair in pairs}


def _logs(body: bytes) -> tuple[bytes, list[dict[str, Any]]]:
    request = ExportLogsServiceRequest.FromString(body)
    got = []
    for resource_logs in request.resource_logs:
        resource = _attributes(resource_logs.resource.attributes)
        for scope_logs in resource_logs.scope_logs:
            for record in scope_logs.log_records:
                got.append(
                    {
                        "signal": "log",
                        "resource": resource,
                        "scope": scope_logs.scope.name,
                        "time": record.time_unix_nano,
                        "severity": record.severity_text,
                        "body": _value(record.body),
                        "attributes": _attributes(record.attributes),
                        "trace_id": record.trace_id.hex(),
                        "span_id": record.span_id.hex(),
                    }
                )
    return ExportLogsServiceResponse().SerializeToString(), got


def _spans(body: bytes) -> tuple[bytes, list[dict[str, Any]]]:
    request = ExportTraceServiceRequest.FromString(body)
    got = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                got.append(
                    {
                        "signal": "span",
                        "resource": resource,
                        "scope": scope_spans.scope.name,
                        "name": span.name,
                        "kind": span.kind,
                        "trace_id": span.trace_id.hex(),
                        "span_id": span.span_id.hex(),
                        "parent_span_id": span.parent_span_id.hex(),
                        "start": span.start_time_unix_nano,
                        "end": span.end_time_unix_nano,
                        "status": span.status.code,
                        "status_message": span.status.message,
                        "attributes": _attributes(span.attributes),
                    }
                )
    return ExportTraceServiceResponse().SerializeToString(), got


DECODERS = {"/v1/logs": _logs, "/v1/traces": _spans}


def _seq(attributes: Any, key: str) -> int:
    pair: KeyValue
    for pair in attributes:
        if pair.key == key:
            return int(pair.value.int_value)
    raise ValueError(f"no {key}")


_SEQS: Final = {
    # path: (request type, the levels down to the items, the attribute kept, signal)
    "/v1/logs": (
        ExportLogsServiceRequest, ("resource_logs", "scope_logs", "log_records"),
        "boxmaker.seq", "log",
    ),
    "/v1/traces": (
        ExportTraceServiceRequest, ("resource_spans", "scope_spans", "spans"),
        "boxmaker.seq.first", "span",
    ),
}  # fmt: skip


def _seqs(path: str, body: bytes) -> dict[str, Any]:
    """The request decoded whole, kept as its items' seqs."""
    request_type, levels, key, signal = _SEQS[path]
    items = [request_type.FromString(body)]
    for level in levels:
        items = [inner for item in items for inner in getattr(item, level)]
    return {"signal": signal, "seqs": [_seq(item.attributes, key) for item in items]}


def _partial(path: str) -> bytes:
    if path == "/v1/logs":
        partial = ExportLogsPartialSuccess(rejected_log_records=1, error_message=PARTIAL_WORDS)
        return ExportLogsServiceResponse(partial_success=partial).SerializeToString()
    spans = ExportTracePartialSuccess(rejected_spans=1, error_message=PARTIAL_WORDS)
    return ExportTraceServiceResponse(partial_success=spans).SerializeToString()


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        decode = DECODERS.get(self.path)
        if decode is None or self.headers.get("Content-Type") != "application/x-protobuf":
            self.send_error(404 if decode is None else 415)
            return
        body = self.rfile.read(int(self.headers["Content-Length"]))
        status, headers, answer = 200, {"Content-Type": "application/x-protobuf"}, b""
        planned = self.server.answers.pop(0) if self.server.answers else None
        if planned is not None and planned != "partial":
            code, _, retry_after = planned.partition(":")
            status, answer = int(code), REFUSED_WORDS.encode()
            headers = {"Content-Type": "text/plain"}
            if retry_after:
                headers["Retry-After"] = retry_after
        elif self.server.seqs_only:
            taken = (
                ExportLogsServiceResponse if self.path == "/v1/logs" else ExportTraceServiceResponse
            )
            answer = taken().SerializeToString()
            with self.server.out.open("ab") as out:
                out.write(orjson.dumps(_seqs(self.path, body)) + b"\n")
        elif not self.server.ack_only:
            answer, got = decode(body)
            if planned == "partial":
                answer = _partial(self.path)
            with self.server.out.open("ab") as out:
                out.write(b"".join(orjson.dumps(item) + b"\n" for item in got))
        time.sleep(self.server.answer_after)  # what it got is written already
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)
        self.wfile.flush()
        self.server.answered += 1

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(http.server.HTTPServer):
    out: Path
    answered: int = 0
    answers: list[str]
    ack_only: bool = False
    seqs_only: bool = False
    answer_after: float = 0.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--take", type=int, default=None)
    parser.add_argument("--answers", default="")
    parser.add_argument("--ack-only", action="store_true")
    parser.add_argument("--seqs-only", action="store_true")
    parser.add_argument("--answer-after", type=float, default=0.0)
    args = parser.parse_args()
    server = _Server(("127.0.0.1", args.port), _Handler)
    server.out = args.out
    server.answers = [answer for answer in args.answers.split(",") if answer]
    server.ack_only = args.ack_only
    server.seqs_only = args.seqs_only
    server.answer_after = args.answer_after
    print(f"listening {server.server_address[1]}", flush=True)
    while args.take is None or server.answered < args.take:
        server.handle_request()
    server.server_close()


class Receiver:
    """The receiver process, started by :meth:`start` (on ``port``, 0 for any)."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.port = 0
        self.process: subprocess.Popen[str] | None = None
        self.processes: list[subprocess.Popen[str]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(
        self,
        *,
        take: int | None = None,
        answers: tuple[str, ...] = (),
        ack_only: bool = False,
        seqs_only: bool = False,
        answer_after: float = 0.0,
    ) -> None:
        argv = [sys.executable, "-m", "tests.harness.otlp_receiver", str(self.out)]
        argv += ["--port", str(self.port)]
        if take is not None:
            argv += ["--take", str(take)]
        if answers:
            argv += ["--answers", ",".join(answers)]
        if ack_only:
            argv.append("--ack-only")
        if seqs_only:
            argv.append("--seqs-only")
        if answer_after:
            argv += ["--answer-after", str(answer_after)]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        self.processes.append(self.process)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line.startswith("listening "), line
        self.port = int(line.split()[1])

    def stop(self) -> None:
        """Kill the receiver if it runs; close every pipe of every start."""
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait(10)
            if process.stdout is not None:
                process.stdout.close()

    def wait_gone(self, within: float = 10.0) -> int:
        """The exit status of a receiver started with ``take``, once it exited."""
        assert self.process is not None
        return self.process.wait(within)

    def received(self) -> list[dict[str, Any]]:
        """What the receiver wrote so far (whole lines: a test may look while it writes)."""
        if not self.out.exists():
            return []
        return [orjson.loads(line) for line in whole_lines(self.out)]

    def logs(self) -> list[dict[str, Any]]:
        return [item for item in self.received() if item["signal"] == "log"]

    def spans(self) -> list[dict[str, Any]]:
        return [item for item in self.received() if item["signal"] == "span"]

    def seqs(self, signal: str) -> list[int]:
        """What a ``--seqs-only`` receiver kept of ``signal`` (log, span), in order."""
        return [seq for item in self.received() if item["signal"] == signal for seq in item["seqs"]]


@contextmanager
def receiver(out: Path, *, ack_only: bool = False, seqs_only: bool = False) -> Iterator[Receiver]:
    """A receiver started on any free port, stopped at the end."""
    started = Receiver(out)
    started.start(ack_only=ack_only, seqs_only=seqs_only)
    try:
        yield started
    finally:
        started.stop()


if __name__ == "__main__":
    main()
