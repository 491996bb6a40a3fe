"""broker.sock, one call per connection (docs/protocol.md), against the real
daemon started in process, over the real sockets. Every test checks the exact answer and
the exact records; ``running`` verifies the whole ledger after each test."""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from tests.harness.broker import (
    PENDING_TIMEOUT,
    SESSION,
    Brokerd,
    Client,
    FailingFile,
    admin,
    body,
    call,
    eventually,
    gone_result,
    records,
    records_of,
    tool_request,
)
from tests.harness.homes import grant, read_state_file, write_grants, write_state

from boxmaker.broker.connection import (
    APPROVAL_UNRECORDED,
    CALL_ID_USED,
    REFUSAL_UNRECORDED,
    RESULT_UNRECORDED_DETAIL,
)
from boxmaker.broker.state import Broker
from boxmaker.core.reasons import AUDIT_UNAVAILABLE_DETAIL
from boxmaker.core.state import StateUnreadable
from boxmaker.formats.convert import new_call_id
from boxmaker.home.paths import Home
from boxmaker.home.regular_file import read_regular_file
from boxmaker.runtime.ndjson import MAX_FRAME

pytestmark = pytest.mark.usefixtures("inline_threads")

Clock = trio.testing.MockClock


def decision(call_id: str, boot: str, **fields: Any) -> dict[str, Any]:
    """The expected decision record body; ``fields`` override the defaults."""
    expected = {
        "kind": "decision",
        "call": call_id,
        "session": SESSION,
        "tool": "read_file",
        "arguments": {"path": "notes.txt"},
        "verdict": "deny",
        "reason": None,
        "grant": None,
        "taint": "public",
        "untrusted": False,
        "boot": boot,
    }
    expected.update(fields)
    return expected


def approval(call_id: str, approval_id: str, **fields: Any) -> dict[str, Any]:
    expected = {
        "kind": "approval",
        "call": call_id,
        "approval": approval_id,
        "outcome": "ask",
        "reason": None,
        "by": "owner",
        "taint": "public",
        "untrusted": False,
    }
    expected.update(fields)
    return expected


def result_ok(call_id: str, content: str, taint: str = "internal") -> dict[str, Any]:
    data = content.encode()
    return {
        "kind": "result",
        "call": call_id,
        "status": "ok",
        "reason": None,
        "label": {"taint": taint, "untrusted": False},
        "taint_after": taint,
        "untrusted_after": False,
        "output_sha256": hashlib.sha256(data).hexdigest(),
        "output_bytes": len(data),
    }


def ok_answer(call_id: str, content: str, taint: str = "internal") -> dict[str, Any]:
    return {
        "kind": "answer",
        "final": True,
        "call": call_id,
        "outcome": "ok",
        "content": content,
        "label": {"taint": taint, "untrusted": False},
    }


def denied(call_id: str, reason: str, detail: str) -> dict[str, Any]:
    return {
        "kind": "answer",
        "final": True,
        "call": call_id,
        "outcome": "denied",
        "reason": reason,
        "detail": detail,
    }


def notes(home: Home, text: str = "hello\n") -> None:
    (home.default_workspace / "notes.txt").write_text(text, encoding="utf-8")


async def ask_call(home: Home, frame: dict[str, Any]) -> tuple[Client, dict[str, Any]]:
    """Send a tool request that asks; the client and its pending frame."""
    client = await Client.open(home.broker_sock)
    await client.send(frame)
    pending = await client.final()
    assert pending["kind"] == "pending", pending
    return client, pending


# ---------------------------------------------------------------------------------------
# Denials: each with its exact decision record and nothing else


DENIALS = [
    pytest.param("", None, "rm_rf", {"x": 1}, "unknown_tool", None, "public", False, id="unknown"),
    pytest.param(
        "", None, "read_file", {"path": "../x"}, "bad_arguments", None, "public", False, id="args"
    ),
    pytest.param(
        "[[grant]\n", None, "read_file", None, "grants_invalid", None, "public", False, id="grants"
    ),
    pytest.param(
        grant("r", "read_file", "auto"),
        b"not json",
        "read_file",
        None,
        "state_unreadable",
        None,
        "secret",
        True,
        id="state",
    ),
    pytest.param("", None, "read_file", None, "no_grant", None, "public", False, id="no-grant"),
    pytest.param(
        grant("r", "read_file", "auto") + grant("no-notes", "read_file", "deny"),
        None,
        "read_file",
        None,
        "denied_by_grant",
        "no-notes",
        "public",
        False,
        id="deny-grant",
    ),
    pytest.param(
        grant("r", "read_file", "auto", max_taint="public"),
        ("internal", False),
        "read_file",
        None,
        "taint_exceeded",
        "r",
        "internal",
        False,
        id="taint",
    ),
    pytest.param(
        grant("r", "read_file", "auto", if_untrusted="deny"),
        ("public", True),
        "read_file",
        None,
        "untrusted",
        "r",
        "public",
        True,
        id="untrusted",
    ),
]


@pytest.mark.parametrize(
    ("grants", "state", "tool", "arguments", "reason", "grant_id", "taint", "untrusted"), DENIALS
)
async def test_every_denial_is_answered_and_recorded_exactly(
    home: Home,
    brokerd: Brokerd,
    autojump_clock: Clock,
    grants: str,
    state: bytes | tuple[str, bool] | None,
    tool: str,
    arguments: dict[str, Any] | None,
    reason: str,
    grant_id: str | None,
    taint: str,
    untrusted: bool,
) -> None:
    write_grants(home, grants)
    if isinstance(state, bytes):
        home.session_state(SESSION).write_bytes(state)
    elif state is not None:
        write_state(home, SESSION, *state)
    arguments = arguments or {"path": "notes.txt"}
    notes(home)
    broker = await brokerd.start()
    frame = tool_request(tool, arguments)
    frames = await call(home, frame)
    await brokerd.stop()
    c = frame["call"]
    assert len(frames) == 1
    assert frames[0]["kind"] == "answer"
    assert frames[0]["outcome"] == "denied"
    assert frames[0]["reason"] == reason
    assert isinstance(frames[0]["detail"], str)
    assert frames[0]["detail"]
    assert "content" not in frames[0]
    assert [body(r) for r in records_of(home, c)] == [
        decision(
            c,
            broker.boot,
            tool=tool,
            arguments=arguments,
            reason=reason,
            grant=grant_id,
            taint=taint,
            untrusted=untrusted,
        )
    ]


async def test_no_grant_detail_names_the_tool_and_path(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    await brokerd.start()
    frame = tool_request("read_file", {"path": "notes.txt"})
    frames = await call(home, frame)
    await brokerd.stop()
    assert frames == [denied(frame["call"], "no_grant", "no grant allows read_file on notes.txt")]


# ---------------------------------------------------------------------------------------
# Auto runs (docs/protocol.md, the write order)


async def test_auto_read_file_runs_raises_the_state_and_records_the_result(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    write_grants(home, grant("read-all", "read_file", "auto"))
    notes(home)
    broker = await brokerd.start()
    frame = tool_request("read_file", {"path": "notes.txt"})
    frames = await call(home, frame)
    await brokerd.stop()
    c = frame["call"]
    assert frames == [ok_answer(c, "hello\n")]
    assert [body(r) for r in records_of(home, c)] == [
        decision(c, broker.boot, verdict="run", grant="read-all"),
        result_ok(c, "hello\n"),
    ]
    assert read_state_file(home, SESSION) == {"v": 1, "taint": "internal", "untrusted": False}


async def test_auto_write_file_writes(home: Home, brokerd: Brokerd, autojump_clock: Clock) -> None:
    write_grants(home, grant("write-out", "write_file", "auto", paths=["out/**"]))
    (home.default_workspace / "out").mkdir()
    await brokerd.start()
    frame = tool_request("write_file", {"path": "out/a.txt", "content": "hi"})
    frames = await call(home, frame)
    await brokerd.stop()
    assert frames[0]["outcome"] == "ok"
    assert (home.default_workspace / "out" / "a.txt").read_text() == "hi"
    kinds = [(r["kind"], r.get("status")) for r in records_of(home, frame["call"])]
    assert kinds == [("decision", None), ("result", "ok")]


async def test_a_tool_failure_is_recorded_and_answered_failed(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    write_grants(home, grant("read-all", "read_file", "auto"))
    await brokerd.start()
    frame = tool_request("read_file", {"path": "missing.txt"})
    frames = await call(home, frame)
    await brokerd.stop()
    assert frames[0]["outcome"] == "failed"
    assert frames[0]["reason"] == "not_found"
    assert "content" not in frames[0]
    result = records_of(home, frame["call"])[-1]
    assert (result["kind"], result["status"], result["reason"]) == ("result", "failed", "not_found")


async def test_auto_last_look_requester_gone_runs_nothing(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    write_grants(home, grant("write-all", "write_file", "auto"))
    broker = await brokerd.start()
    frame = tool_request("write_file", {"path": "x.txt", "content": "hi"})
    client = await Client.open(home.broker_sock)
    await client.send(frame)
    await client.aclose()
    await eventually(lambda: len(records_of(home, frame["call"])) == 2)
    await brokerd.stop()
    c = frame["call"]
    assert not (home.default_workspace / "x.txt").exists()
    assert [body(r) for r in records_of(home, c)] == [
        decision(
            c,
            broker.boot,
            tool="write_file",
            arguments={"path": "x.txt", "content": "hi"},
            verdict="run",
            grant="write-all",
        ),
        gone_result(c, stopped=False),
    ]


async def test_state_that_cannot_be_raised_answers_result_unrecorded(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    write_grants(home, grant("read-all", "read_file", "auto"))
    notes(home)
    await brokerd.start(raise_state=lambda *_: StateUnreadable("disk full"))
    frame = tool_request("read_file", {"path": "notes.txt"})
    frames = await call(home, frame)
    await brokerd.stop()
    assert frames == [
        {
            "kind": "answer",
            "final": True,
            "call": frame["call"],
            "outcome": "failed",
            "reason": "result_unrecorded",
            "detail": RESULT_UNRECORDED_DETAIL,
        }
    ]
    # Nothing more is written: the ledger shows the call unfinished.
    assert [r["kind"] for r in records_of(home, frame["call"])] == ["decision"]


# ---------------------------------------------------------------------------------------
# Ask → approve, with each outcome of the re-decision (docs/protocol.md)


async def test_ask_then_approve_runs_with_outcome_ask(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    write_grants(home, grant("ask-notes", "read_file", "ask", note="the owner's notes"))
    notes(home)
    broker = await brokerd.start()
    frame = tool_request("read_file", {"path": "notes.txt"})
    c = frame["call"]
    client, pending = await ask_call(home, frame)
    a = pending["approval"]
    assert pending == {
        "kind": "pending",
        "final": False,
        "call": c,
        "approval": a,
        "grant": "ask-notes",
        "expires_at": pending["expires_at"],
    }
    listed = await admin(home, {"kind": "approvals"})
    assert listed["kind"] == "approvals"
    [entry] = listed["entries"]
    assert entry == {
        "approval": a,
        "call": c,
        "session": SESSION,
        "tool": "read_file",
        "arguments": {"path": "notes.txt"},
        "grant": {"id": "ask-notes", "mode": "ask", "note": "the owner's notes"},
        "requested_at": entry["requested_at"],
        "expires_at": pending["expires_at"],
        "taint": "public",
        "untrusted": False,
        "preview": None,
    }
    approved = await admin(home, {"kind": "approve", "approval": a})
    # The answer comes after the run, and says how it ended.
    assert approved == {
        "kind": "approved",
        "outcome": "ask",
        "call": c,
        "reason": None,
        "detail": None,
        "tool": "read_file",
        "ran": {"outcome": "ok", "reason": None, "detail": None},
    }
    assert await client.receive() == ok_answer(c, "hello\n")
    assert await client.at_eof()
    await client.aclose()
    assert len(broker.table) == 0
    await brokerd.stop()
    assert [body(r) for r in records_of(home, c)] == [
        decision(c, broker.boot, verdict="ask", grant="ask-notes"),
        approval(c, a),
        result_ok(c, "hello\n"),
    ]


async def test_approve_after_the_grant_became_auto_is_allowed(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    write_grants(home, grant("notes", "read_file", "ask"))
    notes(home)
    await brokerd.start()
    frame = tool_request("read_file", {"path": "notes.txt"})
    client, pending = await ask_call(home, frame)
    write_grants(home, grant("notes", "read_file", "auto"))
    approved = await admin(home, {"kind": "approve", "approval": pending["approval"]})
    assert approved["outcome"] == "allowed"
    assert approved["reason"] is None
    assert await client.receive() == ok_answer(frame["call"], "hello\n")
    await client.aclose()
    await brokerd.stop()
    outcomes = [r.get("outcome") for r in records_of(home, frame["call"])]
    assert outcomes == [None, "allowed", None]


async def test_approve_after_the_grant_was_removed_is_denied(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    write_grants(home, grant("notes", "read_file", "ask"))
    await brokerd.start()
    frame = tool_request("read_file", {"path": "notes.txt"})
    c = frame["call"]
    client, pending = await ask_call(home, frame)
    write_grants(home, "")
    a = pending["approval"]
    approved = await admin(home, {"kind": "approve", "approval": a})
    assert approved == {
        "kind": "approved",
        "outcome": "denied",
        "call": c,
        "reason": "no_grant",
        "detail": "no grant allows read_file on notes.txt",
        "tool": "read_file",
        "ran": None,
    }
    assert await client.receive() == denied(c, "no_grant", "no grant allows read_file on notes.txt")
    await client.aclose()
    await brokerd.stop()
    assert [body(r) for r in records_of(home, c)][1:] == [
        approval(c, a, outcome="denied", reason="no_grant")
    ]


async def test_approve_after_the_taint_rose_past_max_taint_is_denied(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    write_grants(home, grant("notes", "read_file", "ask", max_taint="internal"))
    await brokerd.start()
    frame = tool_request("read_file", {"path": "notes.txt"})
    c = frame["call"]
    client, pending = await ask_call(home, frame)
    write_state(home, SESSION, "secret")
    a = pending["approval"]
    approved = await admin(home, {"kind": "approve", "approval": a})
    assert approved == {
        "kind": "approved",
        "outcome": "denied",
        "call": c,
        "reason": "taint_exceeded",
        "detail": approved["detail"],
        "tool": "read_file",
        "ran": None,
    }
    assert approved["detail"].startswith("the session's taint secret is above grant")
    await client.expect_denied("taint_exceeded")
    await brokerd.stop()
    assert [body(r) for r in records_of(home, c)][1:] == [
        approval(c, a, outcome="denied", reason="taint_exceeded", taint="secret")
    ]


async def test_last_look_after_approve_requester_gone_runs_nothing(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    write_grants(home, grant("w", "write_file", "ask"))
    leave: list[Callable[[], None]] = []

    def read_grants(path: Path) -> bytes:
        # The requester leaves while approve's re-decision reads the grants: after the
        # entry was taken, before the last look (a waiting call notices a close at once).
        while leave:
            leave.pop()()
        return read_regular_file(path)

    await brokerd.start(read_grants=read_grants)
    frame = tool_request("write_file", {"path": "x.txt", "content": "hi"})
    c = frame["call"]
    client, pending = await ask_call(home, frame)
    leave.append(client.stream.socket.close)
    write_grants(home, grant("w", "write_file", "ask") + "\n")  # re-read at approve
    a = pending["approval"]
    approved = await admin(home, {"kind": "approve", "approval": a})
    assert approved == {
        "kind": "approved",
        "outcome": "withdrawn",
        "call": c,
        "reason": "requester_gone",
        "detail": None,
        "tool": "write_file",
        "ran": None,
    }
    await brokerd.stop()
    assert not (home.default_workspace / "x.txt").exists()
    assert [body(r) for r in records_of(home, c)][1:] == [
        approval(c, a, outcome="withdrawn", reason="requester_gone")
    ]


async def test_approve_of_an_unknown_or_finished_approval(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    write_grants(home, grant("notes", "read_file", "ask"))
    await brokerd.start()
    client, pending = await ask_call(home, tool_request("read_file", {"path": "n.txt"}))
    a = pending["approval"]
    first = await admin(home, {"kind": "refuse", "approval": a, "reason": "no"})
    assert first["kind"] == "refused"
    again = await admin(home, {"kind": "approve", "approval": a})
    assert again == {
        "kind": "error",
        "code": "no_such_approval",
        "detail": f"no pending approval {a}",
    }
    await client.aclose()


# ---------------------------------------------------------------------------------------
# Refuse: the owner's reason goes to the model


async def test_refuse_reaches_the_answer_and_the_record(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    write_grants(home, grant("notes", "read_file", "ask"))
    reason = "not today: that file is private"
    await brokerd.start()
    frame = tool_request("read_file", {"path": "notes.txt"})
    c = frame["call"]
    client, pending = await ask_call(home, frame)
    a = pending["approval"]
    refused = await admin(home, {"kind": "refuse", "approval": a, "reason": reason})
    assert refused == {"kind": "refused", "call": c}
    assert await client.receive() == denied(c, "refused", reason)
    await client.aclose()
    await brokerd.stop()
    assert [body(r) for r in records_of(home, c)][1:] == [
        approval(c, a, outcome="refused", reason=reason)
    ]


async def test_a_refusal_that_cannot_be_recorded(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    write_grants(home, grant("notes", "read_file", "ask"))
    _, opener = FailingFile.opener(lambda data: b'"outcome":"refused"' in data)
    await brokerd.start(open_file=opener)
    frame = tool_request("read_file", {"path": "notes.txt"})
    c = frame["call"]
    client, pending = await ask_call(home, frame)
    refused = await admin(home, {"kind": "refuse", "approval": pending["approval"], "reason": "no"})
    assert refused == {"kind": "error", "code": "internal", "detail": REFUSAL_UNRECORDED}
    assert await client.receive() == denied(c, "audit_unavailable", AUDIT_UNAVAILABLE_DETAIL)
    await client.aclose()
    await brokerd.stop()
    assert [r["kind"] for r in records_of(home, c)] == ["decision"]


async def test_an_approval_that_cannot_be_recorded(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    write_grants(home, grant("w", "write_file", "ask"))
    _, opener = FailingFile.opener(lambda data: b'"kind":"approval"' in data)
    await brokerd.start(open_file=opener)
    frame = tool_request("write_file", {"path": "x.txt", "content": "hi"})
    client, pending = await ask_call(home, frame)
    approved = await admin(home, {"kind": "approve", "approval": pending["approval"]})
    assert approved == {"kind": "error", "code": "internal", "detail": APPROVAL_UNRECORDED}
    assert await client.receive() == denied(
        frame["call"], "audit_unavailable", AUDIT_UNAVAILABLE_DETAIL
    )
    await client.aclose()
    await brokerd.stop()
    assert not (home.default_workspace / "x.txt").exists()


# ---------------------------------------------------------------------------------------
# Expiry and a lost requester (docs/protocol.md)


async def test_expiry_is_exactly_at_expires_at(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    write_grants(home, grant("notes", "read_file", "ask"))
    broker = await brokerd.start()
    frame = tool_request("read_file", {"path": "notes.txt"})
    c = frame["call"]
    client, pending = await ask_call(home, frame)
    a = pending["approval"]
    entry = broker.table.get(a)
    assert entry is not None
    assert entry.deadline == trio.current_time() + PENDING_TIMEOUT
    await trio.sleep_until(entry.deadline - 0.001)
    listed = await admin(home, {"kind": "approvals"})
    assert [e["approval"] for e in listed["entries"]] == [a]
    assert (await admin(home, {"kind": "status"}))["pending"] == 1
    await trio.sleep_until(entry.deadline)
    answer = await client.receive()
    assert answer == denied(c, "expired", f"no approval within {PENDING_TIMEOUT:g} s")
    assert trio.current_time() == entry.deadline
    assert (await admin(home, {"kind": "approvals"}))["entries"] == []
    await client.aclose()
    await brokerd.stop()
    assert [body(r) for r in records_of(home, c)][1:] == [
        approval(c, a, outcome="expired", reason="expired", by="expiry")
    ]


@pytest.mark.parametrize("kind", ["approve", "refuse"])
@pytest.mark.parametrize("attempt", range(4))  # the two racing takers run in random order
async def test_approve_or_refuse_at_expires_at_is_expired_once(
    home: Home, brokerd: Brokerd, autojump_clock: Clock, kind: str, attempt: int
) -> None:
    del attempt
    write_grants(home, grant("notes", "read_file", "ask"))
    broker = await brokerd.start()
    frame = tool_request("read_file", {"path": "notes.txt"})
    c = frame["call"]
    client, pending = await ask_call(home, frame)
    a = pending["approval"]
    entry = broker.table.get(a)
    assert entry is not None
    await trio.sleep_until(entry.deadline)
    request = {"kind": kind, "approval": a}
    if kind == "refuse":
        request["reason"] = "too late"
    answer = await admin(home, request)
    assert answer == {"kind": "error", "code": "expired", "detail": f"approval {a} expired"}
    await client.expect_denied("expired")
    await brokerd.stop()
    assert [body(r) for r in records_of(home, c)][1:] == [
        approval(c, a, outcome="expired", reason="expired", by="expiry")
    ]


async def test_approve_a_step_before_expires_at_still_runs(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    write_grants(home, grant("notes", "read_file", "ask"))
    notes(home)
    broker = await brokerd.start()
    frame = tool_request("read_file", {"path": "notes.txt"})
    client, pending = await ask_call(home, frame)
    entry = broker.table.get(pending["approval"])
    assert entry is not None
    await trio.sleep_until(entry.deadline - 0.001)
    approved = await admin(home, {"kind": "approve", "approval": pending["approval"]})
    assert approved["outcome"] == "ask"
    assert await client.receive() == ok_answer(frame["call"], "hello\n")
    await client.aclose()


async def test_requester_closing_while_pending_is_withdrawn_within_a_second(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    write_grants(home, grant("notes", "read_file", "ask"))
    broker = await brokerd.start()
    frame = tool_request("read_file", {"path": "notes.txt"})
    c = frame["call"]
    client, pending = await ask_call(home, frame)
    await trio.sleep(0.25)
    closed_at = trio.current_time()
    await client.aclose()
    await eventually(lambda: len(records_of(home, c)) == 2, step=0.001)
    assert 0 < trio.current_time() - closed_at <= 1.0
    assert len(broker.table) == 0
    assert broker.waiters == {}
    await brokerd.stop()
    assert [body(r) for r in records_of(home, c)][1:] == [
        approval(c, pending["approval"], outcome="withdrawn", reason="requester_gone", by="broker")
    ]


# ---------------------------------------------------------------------------------------
# A ledger that fails (docs/runbook.md#audit-unavailable)


async def test_a_failed_decision_append_denies_and_stops_the_ledger(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    write_grants(home, grant("w", "write_file", "auto"))
    made, opener = FailingFile.opener(lambda data: b'"kind":"decision"' in data)
    broker = await brokerd.start(open_file=opener)
    first = tool_request("write_file", {"path": "a.txt", "content": "1"})
    assert await call(home, first) == [
        denied(first["call"], "audit_unavailable", AUDIT_UNAVAILABLE_DETAIL)
    ]
    second = tool_request("write_file", {"path": "b.txt", "content": "2"})
    assert await call(home, second) == [
        denied(second["call"], "audit_unavailable", AUDIT_UNAVAILABLE_DETAIL)
    ]
    assert not broker.writer.usable
    status = await admin(home, {"kind": "status"})
    assert status["ledger_usable"] is False
    await brokerd.stop()
    assert made[0].failed
    assert not (home.default_workspace / "a.txt").exists()
    assert not (home.default_workspace / "b.txt").exists()
    assert [r["kind"] for r in records(home)] == ["genesis", "start", "policy"]


async def test_a_failed_result_append_never_passes_the_content(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    write_grants(home, grant("read-all", "read_file", "auto"))
    notes(home, "the secret plan")
    _, opener = FailingFile.opener(lambda data: b'"kind":"result"' in data)
    await brokerd.start(open_file=opener)
    frame = tool_request("read_file", {"path": "notes.txt"})
    frames = await call(home, frame)
    later = tool_request("read_file", {"path": "notes.txt"})
    later_frames = await call(home, later)
    await brokerd.stop()
    assert frames == [
        {
            "kind": "answer",
            "final": True,
            "call": frame["call"],
            "outcome": "failed",
            "reason": "audit_unavailable",
            "detail": AUDIT_UNAVAILABLE_DETAIL,
        }
    ]
    assert later_frames == [denied(later["call"], "audit_unavailable", AUDIT_UNAVAILABLE_DETAIL)]
    assert [r["kind"] for r in records_of(home, frame["call"])] == ["decision"]
    assert records_of(home, later["call"]) == []


# ---------------------------------------------------------------------------------------
# grants.toml changing under a running brokerd


async def test_broken_grants_deny_log_once_and_recover_without_restart(
    home: Home, brokerd: Brokerd, autojump_clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="boxmaker.brokerd")
    write_grants(home, grant("read-all", "read_file", "auto"))
    notes(home)
    await brokerd.start()
    assert (await call(home, tool_request("read_file", {"path": "notes.txt"})))[0][
        "outcome"
    ] == "ok"
    write_grants(home, grant("read-all", "read_file", "sometimes"))
    for _ in range(3):
        frames = await call(home, tool_request("read_file", {"path": "notes.txt"}))
        assert frames[0]["reason"] == "grants_invalid"
        assert "read-all" in frames[0]["detail"]
        await trio.sleep(5)  # the watcher looks too, between calls
    status = await admin(home, {"kind": "status"})
    assert status["grants_valid"] is False
    assert "mode" in status["grants_problem"]
    write_grants(home, grant("read-all", "read_file", "auto"))
    frames = await call(home, tool_request("read_file", {"path": "notes.txt"}))
    assert frames[0]["outcome"] == "ok"
    await brokerd.stop()
    logged = [r for r in caplog.records if "grants.toml is invalid" in r.getMessage()]
    assert len(logged) == 1
    assert any("valid again" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------------------------------
# Frames that are not tool requests (docs/protocol.md)


async def test_catalogue_is_answered_and_not_recorded(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    await brokerd.start()
    frames = await call(home, {"kind": "catalogue", "v": 1})
    await brokerd.stop()
    assert len(frames) == 1
    assert frames[0]["kind"] == "catalogue"
    assert frames[0]["final"] is True
    names = [tool["function"]["name"] for tool in frames[0]["tools"]]
    assert names == ["read_file", "list_dir", "write_file", "shell", "http_get"]
    assert [r["kind"] for r in records(home)] == [
        "genesis",
        "start",
        "policy",
        "stop",
        "checkpoint",
    ]


@pytest.mark.parametrize(
    ("line", "detail"),
    [
        (b"not json\n", "not valid JSON (or not UTF-8)"),
        (b"[1, 2]\n", "not a JSON object"),
        (b'{"kind":"nope"}\n', "unknown kind 'nope'"),
        (b'{"kind":"tool_request","v":1,"call":"c-1"}\n', None),
        (b"\xff\xfe\n", "not valid JSON (or not UTF-8)"),
    ],
)
async def test_malformed_frames_are_bad_frame_and_the_broker_keeps_serving(
    home: Home, brokerd: Brokerd, autojump_clock: Clock, line: bytes, detail: str | None
) -> None:
    await brokerd.start()
    frames = await call(home, line)
    assert len(frames) == 1
    assert frames[0]["kind"] == "error"
    assert frames[0]["code"] == "bad_frame"
    if detail is not None:
        assert frames[0]["detail"] == detail
    assert (await call(home, {"kind": "catalogue", "v": 1}))[0]["kind"] == "catalogue"
    await brokerd.stop()
    assert [r["kind"] for r in records(home)] == [
        "genesis",
        "start",
        "policy",
        "stop",
        "checkpoint",
    ]


async def test_an_oversized_frame_is_bad_frame(
    home: Home, broker: Broker, autojump_clock: Clock
) -> None:
    client = await Client.open(home.broker_sock)

    async def flood() -> None:
        # The broker closes once it has seen enough.
        with contextlib.suppress(trio.BrokenResourceError):
            await client.send(b"x" * (MAX_FRAME + 10) + b"\n")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(flood)
        answer = await client.receive()
    assert answer == {
        "kind": "error",
        "code": "bad_frame",
        "detail": f"frame longer than {MAX_FRAME} bytes",
    }
    await client.aclose()
    assert (await call(home, {"kind": "catalogue", "v": 1}))[0]["kind"] == "catalogue"


async def test_a_connection_that_sends_nothing_is_closed_after_5_s(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    await brokerd.start()
    client = await Client.open(home.broker_sock)
    opened = trio.current_time()
    assert await client.at_eof()
    assert trio.current_time() - opened == pytest.approx(5.0)
    await client.aclose()
    await brokerd.stop()
    assert [r["kind"] for r in records(home)] == [
        "genesis",
        "start",
        "policy",
        "stop",
        "checkpoint",
    ]


@pytest.mark.parametrize(
    "frame",
    [
        {"kind": "approve", "approval": "a-00000000"},
        {"kind": "status"},
        {"kind": "answer", "final": True, "call": "c-0000000000000000", "outcome": "ok"},
        {"kind": "pending", "final": False},
    ],
)
async def test_forbidden_kinds_are_answered_and_not_recorded(
    home: Home, brokerd: Brokerd, autojump_clock: Clock, frame: dict[str, Any]
) -> None:
    await brokerd.start()
    frames = await call(home, frame)
    await brokerd.stop()
    assert frames == [
        {
            "kind": "error",
            "code": "forbidden_kind",
            "detail": f"kind {frame['kind']!r} is not accepted here",
        }
    ]
    assert [r["kind"] for r in records(home)] == [
        "genesis",
        "start",
        "policy",
        "stop",
        "checkpoint",
    ]


async def test_a_reused_call_id_is_refused_and_not_recorded(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    c = new_call_id()
    await brokerd.start()
    first = await call(home, tool_request("read_file", {"path": "a"}, call=c))
    assert first[0]["reason"] == "no_grant"
    again = await call(home, tool_request("read_file", {"path": "b"}, call=c))
    await brokerd.stop()
    assert again == [{"kind": "error", "code": "bad_frame", "detail": CALL_ID_USED}]
    assert [r["arguments"] for r in records_of(home, c)] == [{"path": "a"}]


async def test_a_peer_other_than_the_owner_is_refused(
    home: Home, brokerd: Brokerd, autojump_clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    # The owner (who loopd runs as) is taken to be someone else: we are then a stranger.
    await brokerd.start(owner_uid=4242)
    frames = await call(home, tool_request("read_file", {"path": "a"}))
    await brokerd.stop()
    assert len(frames) == 1
    assert frames[0]["kind"] == "error"
    assert frames[0]["code"] == "peer_refused"
    assert any("broker.sock: refused a peer" in r.getMessage() for r in caplog.records)
    assert [r["kind"] for r in records(home)] == [
        "genesis",
        "start",
        "policy",
        "stop",
        "checkpoint",
    ]
