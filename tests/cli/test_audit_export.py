"""``bxctl audit export --otlp``: a ledger written by the real brokerd, sent to a real
OTLP/HTTP receiver in another process (tests/harness/otlp_receiver.py), which decodes
what arrives with the OpenTelemetry proto package. Every record arrives once, with its
attributes; one span per call; a receiver that goes away mid-stream, or an export that
is stopped, loses nothing and repeats nothing; a cursor of another ledger is refused;
--follow sends what is appended later; a receiver's throttling (503 with Retry-After) is
waited out, its refusal (400) stops the export with the cursor where it was, its partial
success is said."""

from __future__ import annotations

import collections
import errno
import hashlib
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import orjson
import pytest
import trio
import trio.testing
from tests.harness.broker import admin, call, inline, running, tool_request, waiting_approvals
from tests.harness.cli import bxctl_in_process as bxctl
from tests.harness.homes import grant, short_home, write_config, write_grants
from tests.harness.otlp_receiver import PARTIAL_WORDS, REFUSED_WORDS, Receiver, receiver

from boxmaker.cli.app import app
from boxmaker.home.paths import Home
from boxmaker.ledger import otlp_export
from boxmaker.ledger.otel_mapping import call_ids

GRANTS: Final = (
    grant("notes", "read_file", "auto", paths=["notes/**"])
    + "\n"
    + grant("writes", "write_file", "ask")
)
WITHIN: Final = 20.0
"""Real seconds a test waits on the export or the receiver at most."""
STATUS_UNSET, STATUS_ERROR = 0, 2
SPAN_KIND_INTERNAL = 1


async def make_calls(home: Home) -> dict[str, str]:
    """Four calls through the real brokerd: one run, one denied (no grant), one asked
    and approved (it runs), one asked and refused. Their call ids by what happened."""
    (home.default_workspace / "notes").mkdir(exist_ok=True)
    (home.default_workspace / "notes" / "a.txt").write_text("alpha\n")
    calls = {}
    async with running(home, to_thread=inline):
        ran = tool_request("read_file", {"path": "notes/a.txt"})
        assert (await call(home, ran))[-1]["outcome"] == "ok"
        denied = tool_request("read_file", {"path": "secret.txt"})
        assert (await call(home, denied))[-1]["reason"] == "no_grant"
        calls |= {"ran": ran["call"], "denied": denied["call"]}
        for name, answer in (("approved", "approve"), ("refused", "refuse")):
            frame = tool_request("write_file", {"path": f"{name}.txt", "content": name})
            async with trio.open_nursery() as nursery:
                nursery.start_soon(call, home, frame)
                [entry] = await waiting_approvals(home, within=WITHIN)
                order = {"kind": answer, "approval": entry["approval"]}
                await admin(home, order | ({"reason": "not now"} if answer == "refuse" else {}))
            calls[name] = frame["call"]
    return calls


@pytest.fixture(scope="module")
def made() -> Iterator[tuple[bytes, dict[str, str]]]:
    """A ledger the real brokerd wrote (in virtual time), and its calls."""
    with short_home() as home:
        write_config(home, "[broker]\npending_timeout = 30\n")
        write_grants(home, GRANTS)
        clock = trio.testing.MockClock(autojump_threshold=0)
        calls = trio.run(make_calls, home, clock=clock)
        yield home.audit_log.read_bytes(), calls


@pytest.fixture
def ledger(home: Home, made: tuple[bytes, dict[str, str]]) -> list[dict[str, Any]]:
    """``home`` with the made ledger; its records."""
    home.audit_log.write_bytes(made[0])
    return [orjson.loads(line) for line in made[0].splitlines()]


@pytest.fixture
def calls(made: tuple[bytes, dict[str, str]]) -> dict[str, str]:
    return made[1]


@pytest.fixture
def otlp(tmp_path: Path) -> Iterator[Receiver]:
    with receiver(tmp_path / "received.jsonl") as started:
        yield started


def by_seq(logs: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The log records by ``boxmaker.seq``; each seq must have arrived once."""
    counts = collections.Counter(log["attributes"]["boxmaker.seq"] for log in logs)
    assert [seq for seq, n in counts.items() if n > 1] == []
    return {log["attributes"]["boxmaker.seq"]: log for log in logs}


def every_record_and_call_once(got: Receiver, ledger: list[dict[str, Any]]) -> None:
    """The receiver has every record of the ledger once, and one span for each of the
    four calls."""
    assert sorted(by_seq(got.logs())) == list(range(len(ledger)))
    spans = collections.Counter(span["attributes"]["gen_ai.tool.call.id"] for span in got.spans())
    assert sorted(spans.values()) == [1, 1, 1, 1]


async def export(home: Home, *args: str) -> int:
    with trio.fail_after(WITHIN):
        return await bxctl(home, "audit", "export", *args)


async def test_every_record_arrives_once_with_its_attributes(
    home: Home,
    ledger: list[dict[str, Any]],
    otlp: Receiver,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert await export(home, "--otlp", otlp.url) == 0
    out = capsys.readouterr().out
    assert out == (
        f"sent {len(ledger)} log record(s) and 4 span(s) to {otlp.url}; the receiver has "
        f"the ledger through seq {len(ledger) - 1}\n"
    )
    logs = by_seq(otlp.logs())
    assert sorted(logs) == list(range(len(ledger)))
    lines = home.audit_log.read_bytes().splitlines()
    ledger_id = ledger[0]["ledger"]
    for record, line in zip(ledger, lines, strict=True):
        log = logs[record["seq"]]
        attributes = log["attributes"]
        assert log["body"] == record["kind"]
        assert log["scope"] == "boxmaker.ledger"
        assert log["resource"]["service.name"] == "boxmaker"
        assert attributes["boxmaker.ledger"] == ledger_id
        assert attributes["boxmaker.kind"] == record["kind"]
        assert attributes["boxmaker.line_sha256"] == hashlib.sha256(line).hexdigest()
        assert "gen_ai.tool.call.arguments" not in attributes
        if record["kind"] == "decision":
            fields = ("call", "session", "tool", "verdict", "grant", "reason", "taint")
            for name in fields:
                assert attributes.get(f"boxmaker.{name}") == record[name], name
            assert attributes["boxmaker.untrusted"] is record["untrusted"]
            assert not any("arguments" in name for name in attributes)
        if record["kind"] == "approval":
            assert attributes["boxmaker.approval.id"] == record["approval"]
            assert attributes["boxmaker.approval.outcome"] == record["outcome"]
            assert attributes["boxmaker.approval.by"] == "owner"
        if "call" in record:
            trace_id, span_id = call_ids(ledger_id, record["call"])
            assert (log["trace_id"], log["span_id"]) == (f"{trace_id:032x}", f"{span_id:016x}")
        else:
            assert (log["trace_id"], log["span_id"]) == ("", "")
    cursor = orjson.loads((home.state_dir / "otlp-cursor.json").read_bytes())
    assert (cursor["ledger"], cursor["seq"], cursor["logs_through"]) == (
        ledger_id,
        len(ledger) - 1,
        len(ledger) - 1,
    )
    assert cursor["line_sha256"] == hashlib.sha256(lines[-1]).hexdigest()
    assert cursor["open_calls"] == []

    # Again: nothing new, nothing sent.
    assert await export(home, "--otlp", otlp.url) == 0
    assert capsys.readouterr().out.startswith("sent 0 log record(s) and 0 span(s)")
    assert len(otlp.logs()) == len(ledger)


async def test_the_benchmarks_receiver_keeps_each_items_seq(
    home: Home, ledger: list[dict[str, Any]], tmp_path: Path
) -> None:
    """tools/bench_export.py's figure is taken against the receiver's ``--seqs-only``:
    what it keeps is every record's seq and each call's first."""
    with receiver(tmp_path / "seqs.jsonl", seqs_only=True) as light:
        assert await export(home, "--otlp", light.url) == 0
        logs, spans = light.seqs("log"), light.seqs("span")
    assert logs == list(range(len(ledger)))
    decisions = [record["seq"] for record in ledger if record["kind"] == "decision"]
    assert sorted(spans) == decisions
    assert len(spans) == 4


async def test_one_span_per_call_named_and_ended_as_the_call_was(
    home: Home, ledger: list[dict[str, Any]], calls: dict[str, str], otlp: Receiver
) -> None:
    assert await export(home, "--otlp", otlp.url) == 0
    spans = {span["attributes"]["gen_ai.tool.call.id"]: span for span in otlp.spans()}
    assert len(otlp.spans()) == len(spans) == 4
    ledger_id = ledger[0]["ledger"]
    records_of = collections.defaultdict(list)
    for record in ledger:
        if "call" in record:
            records_of[record["call"]].append(record)
    for what, call_id in calls.items():
        span = spans[call_id]
        records = records_of[call_id]
        decision, end = records[0], records[-1]
        attributes = span["attributes"]
        trace_id, span_id = call_ids(ledger_id, call_id)
        assert (span["trace_id"], span["span_id"], span["parent_span_id"]) == (
            f"{trace_id:032x}",
            f"{span_id:016x}",
            "",
        )
        assert span["name"] == f"execute_tool {decision['tool']}"
        assert span["kind"] == SPAN_KIND_INTERNAL
        assert attributes["gen_ai.operation.name"] == "execute_tool"
        assert attributes["gen_ai.tool.name"] == decision["tool"]
        assert attributes["gen_ai.conversation.id"] == decision["session"]
        assert attributes["boxmaker.verdict"] == decision["verdict"]
        assert (attributes["boxmaker.seq.first"], attributes["boxmaker.seq.last"]) == (
            decision["seq"],
            end["seq"],
        )
        assert span["start"] < span["end"] or what == "denied"
        assert "gen_ai.tool.call.arguments" not in attributes
        match what:
            case "ran":
                assert (span["status"], attributes["boxmaker.grant"]) == (STATUS_UNSET, "notes")
                assert attributes["boxmaker.result.status"] == "ok"
                assert attributes["boxmaker.result.output_bytes"] == len("alpha\n")
                assert "error.type" not in attributes
            case "denied":
                assert (span["status"], span["status_message"]) == (STATUS_ERROR, "no_grant")
                assert attributes["error.type"] == "no_grant"
                assert span["start"] == span["end"]
            case "approved":
                assert span["status"] == STATUS_UNSET
                assert attributes["boxmaker.approval.outcome"] == "ask"
                assert attributes["boxmaker.approval.by"] == "owner"
                assert attributes["boxmaker.result.status"] == "ok"
            case "refused":
                assert (span["status"], attributes["error.type"]) == (STATUS_ERROR, "refused")
                assert attributes["boxmaker.approval.outcome"] == "refused"
                assert "boxmaker.result.status" not in attributes
                assert end["kind"] == "approval"


async def test_capture_content_sends_the_arguments(
    home: Home, ledger: list[dict[str, Any]], calls: dict[str, str], otlp: Receiver
) -> None:
    assert await export(home, "--otlp", otlp.url, "--capture-content") == 0
    decisions = {r["call"]: r for r in ledger if r["kind"] == "decision"}
    logs = by_seq(otlp.logs())
    for decision in decisions.values():
        sent = orjson.loads(logs[decision["seq"]]["attributes"]["gen_ai.tool.call.arguments"])
        assert sent == decision["arguments"]
    for span in otlp.spans():
        call_id = span["attributes"]["gen_ai.tool.call.id"]
        sent = orjson.loads(span["attributes"]["gen_ai.tool.call.arguments"])
        assert sent == decisions[call_id]["arguments"]
    assert orjson.loads(
        logs[decisions[calls["approved"]]["seq"]]["attributes"]["gen_ai.tool.call.arguments"]
    ) == {"path": "approved.txt", "content": "approved"}


async def test_a_receiver_gone_mid_stream_loses_nothing_and_repeats_nothing(
    home: Home,
    ledger: list[dict[str, Any]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(otlp_export, "BATCH_LINES", 3)
    gone = Receiver(tmp_path / "received.jsonl")
    # It answers three requests (logs, spans, logs...), then exits: mid-stream.
    await trio.to_thread.run_sync(lambda: gone.start(take=3))
    codes: list[int] = []
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_into, codes, home, gone.url)
            assert await trio.to_thread.run_sync(gone.wait_gone) == 0
            taken = len(gone.received())
            # The export tries again; the cursor stays where the receiver's answers left it.
            err = ""
            with trio.fail_after(WITHIN):
                while "trying again" not in err:
                    await trio.sleep(0.05)
                    err += capsys.readouterr().err
            cursor = orjson.loads((home.state_dir / "otlp-cursor.json").read_bytes())
            sent_seqs = {log["attributes"]["boxmaker.seq"] for log in gone.logs()}
            assert cursor["logs_through"] == max(sent_seqs)
            assert f"the cursor stays at seq {cursor['seq']}; trying again in 0.5 s" in err
            assert f"did not take the log records of seq {cursor['logs_through'] + 1}-" in err
            assert len(gone.received()) == taken
            await trio.to_thread.run_sync(gone.start)  # the same port again
    finally:
        gone.stop()
    assert codes == [0]
    assert "took the log records" in capsys.readouterr().err
    every_record_and_call_once(gone, ledger)


async def run_into(codes: list[int], home: Home, url: str) -> None:
    codes.append(await export(home, "--otlp", url))


async def test_a_stopped_export_resumes_from_its_cursor(
    home: Home,
    ledger: list[dict[str, Any]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(otlp_export, "BATCH_LINES", 2)
    first = Receiver(tmp_path / "received.jsonl")
    await trio.to_thread.run_sync(lambda: first.start(take=4))
    try:
        with trio.move_on_after(WITHIN) as waited:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(bxctl, home, "audit", "export", "--otlp", first.url)
                await trio.to_thread.run_sync(first.wait_gone)
                nursery.cancel_scope.cancel()  # the export stopped while it retries
        assert not waited.cancelled_caught
        stopped_at = orjson.loads((home.state_dir / "otlp-cursor.json").read_bytes())
        assert 0 < stopped_at["seq"] < len(ledger) - 1
        await trio.to_thread.run_sync(first.start)
        assert await export(home, "--otlp", first.url) == 0
    finally:
        first.stop()
    every_record_and_call_once(first, ledger)
    capsys.readouterr()


async def test_a_cursor_of_another_ledger_or_a_rewritten_one_is_refused(
    home: Home,
    ledger: list[dict[str, Any]],
    otlp: Receiver,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert await export(home, "--otlp", otlp.url) == 0
    cursor = home.state_dir / "otlp-cursor.json"
    kept = cursor.read_bytes()
    with short_home() as other:
        # Another ledger: its own genesis, its own id.
        genesis = home.audit_log.read_bytes().splitlines(keepends=True)[0]
        other_id = genesis.replace(ledger[0]["ledger"].encode(), b"l-00000000000000ff")
        other.audit_log.write_bytes(other_id)
        capsys.readouterr()
        code = await export(other, "--otlp", otlp.url, "--cursor", str(cursor))
    assert code == 1
    assert capsys.readouterr().err == (
        f"bxctl: the cursor {cursor} is of ledger {ledger[0]['ledger']}, and this ledger is "
        f"l-00000000000000ff: refused; see docs/runbook.md#otlp-export\n"
    )
    # The same ledger, its last line rewritten.
    data = home.audit_log.read_bytes()
    home.audit_log.write_bytes(data[:-2] + b" \n")
    assert await export(home, "--otlp", otlp.url) == 1
    assert capsys.readouterr().err == (
        f"bxctl: the ledger no longer has the line the cursor {cursor} ends at (seq "
        f"{len(ledger) - 1}): it was rewritten; run `bxctl audit verify`; see "
        "docs/runbook.md#otlp-export\n"
    )
    assert cursor.read_bytes() == kept
    # Another receiver with this cursor.
    assert await export(home, "--otlp", "http://127.0.0.1:9") == 1
    assert capsys.readouterr().err == (
        f"bxctl: the cursor {cursor} is for {otlp.url}, not http://127.0.0.1:9: give each "
        "receiver its own (--cursor FILE); see docs/runbook.md#otlp-export\n"
    )
    assert len(otlp.logs()) == len(ledger)


async def test_follow_sends_what_is_appended_later(
    home: Home, otlp: Receiver, capsys: pytest.CaptureFixture[str]
) -> None:
    write_grants(home, GRANTS)
    (home.default_workspace / "notes").mkdir()
    (home.default_workspace / "notes" / "a.txt").write_text("alpha\n")
    async with running(home):
        pass  # a ledger: genesis, start, policy, stop
    before = len(home.audit_log.read_bytes().splitlines())
    with trio.fail_after(WITHIN):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(bxctl, home, "audit", "export", "--otlp", otlp.url, "--follow")
            while len(otlp.logs()) < before:  # noqa: ASYNC110 - another process's file
                await trio.sleep(0.05)
            async with running(home):
                later = tool_request("read_file", {"path": "notes/a.txt"})
                assert (await call(home, later))[-1]["outcome"] == "ok"
            after = len(home.audit_log.read_bytes().splitlines())
            assert after > before + 2
            # The batch's logs, then the spans of the calls it ended.
            while len(otlp.logs()) < after or not otlp.spans():  # noqa: ASYNC110
                await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
    assert sorted(by_seq(otlp.logs())) == list(range(after))
    [span] = otlp.spans()
    assert span["attributes"]["gen_ai.tool.call.id"] == later["call"]
    capsys.readouterr()


async def test_a_bad_url_is_a_usage_error(home: Home, capsys: pytest.CaptureFixture[str]) -> None:
    assert await bxctl(home, "audit", "export", "--otlp", "collector:4318") == 2
    assert capsys.readouterr().err == (
        "bxctl: --otlp takes the receiver's http:// or https:// base URL, not 'collector:4318'\n"
    )


def test_without_the_sdk_the_export_says_how_to_install_it(
    home: Home, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # As if the extra were not installed, whatever this process imported before.
    gone = ("opentelemetry.", "boxmaker.ledger.otlp_export")
    for name in [m for m in sys.modules if m.startswith(gone)]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    argv = ["audit", "export", "--otlp", "http://127.0.0.1:4318", "--home", str(home.root)]
    assert app(argv, result_action="return_value") == 1
    assert capsys.readouterr().err == (
        "bxctl: `bxctl audit export` needs the OpenTelemetry SDK, which is not installed: "
        "pip install 'boxmaker[otel]' (see docs/runbook.md#otlp-export)\n"
    )


async def test_a_503_with_retry_after_is_sent_again_after_the_wait_it_asked_for(
    home: Home,
    ledger: list[dict[str, Any]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    busy = Receiver(tmp_path / "received.jsonl")
    # Its first answer: 503 with Retry-After: 1 (the OTLP specification's throttling).
    await trio.to_thread.run_sync(lambda: busy.start(answers=("503:1",)))
    try:
        started = trio.current_time()
        assert await export(home, "--otlp", busy.url) == 0
        waited = trio.current_time() - started
    finally:
        busy.stop()
    err = capsys.readouterr().err
    last = len(ledger) - 1
    assert err == (
        f"bxctl: the receiver at {busy.url} did not take the log records of seq 0-{last} "
        f"(HTTP 503 Service Unavailable: {REFUSED_WORDS}); the cursor stays at seq -1; "
        f"trying again in 1 s (see docs/runbook.md#otlp-export)\n"
        f"bxctl: the receiver at {busy.url} took the log records of seq 0-{last}\n"
    )
    assert waited >= 1.0
    assert sorted(by_seq(busy.logs())) == list(range(len(ledger)))
    assert len(busy.spans()) == 4


async def test_a_400_is_not_sent_again_and_the_cursor_stays(
    home: Home,
    ledger: list[dict[str, Any]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    lines = home.audit_log.read_bytes().splitlines(keepends=True)
    home.audit_log.write_bytes(b"".join(lines[:5]))
    target = Receiver(tmp_path / "received.jsonl")
    await trio.to_thread.run_sync(target.start)
    try:
        assert await export(home, "--otlp", target.url) == 0
        cursor = home.state_dir / "otlp-cursor.json"
        kept = cursor.read_bytes()
        assert orjson.loads(kept)["seq"] == 4
        home.audit_log.write_bytes(b"".join(lines))
        target.stop()
        capsys.readouterr()
        # The same port: a receiver that answers its one request with 400, then exits.
        await trio.to_thread.run_sync(lambda: target.start(answers=("400",), take=1))
        assert await export(home, "--otlp", target.url) == 1
        assert await trio.to_thread.run_sync(target.wait_gone) == 0
    finally:
        target.stop()
    assert capsys.readouterr().err == (
        f"bxctl: the receiver at {target.url} refused the log records of seq 5-"
        f"{len(ledger) - 1} (HTTP 400 Bad Request: {REFUSED_WORDS}): sending them again "
        f"would not help; the cursor stays at seq 4; see docs/runbook.md#otlp-export\n"
    )
    assert cursor.read_bytes() == kept
    assert sorted(by_seq(target.logs())) == [0, 1, 2, 3, 4]


async def test_a_partial_success_is_said_and_not_sent_again(
    home: Home,
    ledger: list[dict[str, Any]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    partly = Receiver(tmp_path / "received.jsonl")
    await trio.to_thread.run_sync(lambda: partly.start(answers=("partial",)))
    try:
        assert await export(home, "--otlp", partly.url) == 0
    finally:
        partly.stop()
    last = len(ledger) - 1
    assert capsys.readouterr().err == (
        f"bxctl: the receiver at {partly.url} took the log records of seq 0-{last} but "
        f"rejected 1 of them ({PARTIAL_WORDS}); they are not sent again (see "
        "docs/runbook.md#otlp-export)\n"
    )
    assert sorted(by_seq(partly.logs())) == list(range(len(ledger)))
    cursor = orjson.loads((home.state_dir / "otlp-cursor.json").read_bytes())
    assert (cursor["seq"], cursor["logs_through"]) == (last, last)


async def test_a_cursor_with_no_directory_is_refused_before_anything_is_sent(
    home: Home,
    ledger: list[dict[str, Any]],
    otlp: Receiver,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    missing = tmp_path / "missing" / "cursor.json"
    assert await export(home, "--otlp", otlp.url, "--cursor", str(missing)) == 1
    assert capsys.readouterr().err == (
        f"bxctl: {missing.parent}, where the cursor cursor.json is kept, is not a directory: "
        f"make it, or keep the cursor elsewhere (--cursor FILE); see {otlp_export.RUNBOOK}\n"
    )
    assert otlp.received() == []
    assert not missing.parent.exists()


async def test_a_cursor_that_cannot_be_written_stops_the_export_and_says_what_is_sent_again(
    home: Home,
    ledger: list[dict[str, Any]],
    otlp: Receiver,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(otlp_export, "BATCH_LINES", 3)
    written = 0
    write = otlp_export.write_atomically

    def disk_full_after_two(path: Path, data: bytes) -> None:
        nonlocal written
        if written >= 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        write(path, data)
        written += 1

    monkeypatch.setattr(otlp_export, "write_atomically", disk_full_after_two)
    assert await export(home, "--otlp", otlp.url) == 1
    on_disk = orjson.loads((home.state_dir / "otlp-cursor.json").read_bytes())
    assert capsys.readouterr().err.endswith(
        f"cannot be written (No space left on device); the export stopped, and the next run "
        f"sends again what the receiver took after seq {on_disk['seq']}; see "
        f"{otlp_export.RUNBOOK}\n"
    )
    first = [log["attributes"]["boxmaker.seq"] for log in otlp.logs()]
    assert first[-1] > on_disk["seq"]  # the receiver took more than the cursor says
    monkeypatch.setattr(otlp_export, "write_atomically", write)
    assert await export(home, "--otlp", otlp.url) == 0
    again = [log["attributes"]["boxmaker.seq"] for log in otlp.logs()][len(first) :]
    # What the message said: everything after the cursor on disk, nothing before it.
    assert again == list(range(on_disk["logs_through"] + 1, len(ledger)))
    capsys.readouterr()


async def test_an_export_stopped_while_a_request_is_in_flight_records_what_was_taken(
    home: Home,
    ledger: list[dict[str, Any]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(otlp_export, "BATCH_LINES", 3)
    slow = Receiver(tmp_path / "received.jsonl")
    # It keeps each request before it answers, a second later: stopped in between, the
    # export awaits the answer and moves the cursor, so nothing is sent twice.
    await trio.to_thread.run_sync(lambda: slow.start(answer_after=1.0))
    try:
        with trio.fail_after(WITHIN):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(bxctl, home, "audit", "export", "--otlp", slow.url)
                while not slow.logs():  # noqa: ASYNC110 - another process's file
                    await trio.sleep(0.01)
                nursery.cancel_scope.cancel()
        cursor = orjson.loads((home.state_dir / "otlp-cursor.json").read_bytes())
        assert cursor["logs_through"] == max(
            log["attributes"]["boxmaker.seq"] for log in slow.logs()
        )
        slow.stop()
        await trio.to_thread.run_sync(slow.start)  # the same port, answering at once
        assert await export(home, "--otlp", slow.url) == 0
    finally:
        slow.stop()
    every_record_and_call_once(slow, ledger)
    capsys.readouterr()


@pytest.mark.parametrize(
    ("stop", "follow", "code"),
    [(signal.SIGINT, False, 130), (signal.SIGTERM, True, 0), (signal.SIGINT, True, 0)],
)
async def test_ctrl_c_or_a_service_managers_stop_ends_the_export_with_the_cursor_said(
    home: Home,
    ledger: list[dict[str, Any]],
    tmp_path: Path,
    stop: signal.Signals,
    follow: bool,
    code: int,
) -> None:
    """The real command, stopped as a terminal's Ctrl-C (its whole process group) or a
    service manager stops it, while a request is in flight: no traceback, the answer
    awaited, the cursor on disk and said."""
    slow = Receiver(tmp_path / "received.jsonl")
    await trio.to_thread.run_sync(lambda: slow.start(answer_after=1.0))
    argv = [sys.executable, "-m", "boxmaker.cli.app", "audit", "export", "--otlp", slow.url]
    argv += ["--home", str(home.root), *(["--follow"] if follow else [])]
    out, err = tmp_path / "out", tmp_path / "err"
    try:
        with out.open("w") as stdout, err.open("w") as stderr, trio.fail_after(WITHIN):
            process = await trio.lowlevel.open_process(
                argv, stdout=stdout, stderr=stderr, start_new_session=True
            )
            while not slow.logs():  # noqa: ASYNC110 - another process's file
                await trio.sleep(0.01)
            os.killpg(process.pid, stop)
            await process.wait()
    finally:
        slow.stop()
    cursor = orjson.loads((home.state_dir / "otlp-cursor.json").read_bytes())
    assert cursor["logs_through"] == max(log["attributes"]["boxmaker.seq"] for log in slow.logs())
    assert (process.returncode, err.read_text()) == (code, "")
    assert out.read_text() == (
        f"stopped; the receiver has the ledger through seq {cursor['seq']} (the cursor "
        f"{home.state_dir / 'otlp-cursor.json'}); the next run goes on from there\n"
    )
