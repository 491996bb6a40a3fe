"""broker/client_answers.py through the real brokerd: a raw broker.sock client sends a
``client_answer`` after its ``pending`` frame, as ``bxctl mcp serve`` does for an answer
from the MCP client's own prompt. It counts only where the asking grant's approvers name
``mcp-client``; anything else leaves the call waiting for the owner."""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Final

import orjson
import pytest
import trio
from tests.broker.test_connection import approval, ask_call, denied, notes, ok_answer
from tests.harness.broker import (
    Brokerd,
    Client,
    admin,
    body,
    call,
    records_of,
    tool_request,
)
from tests.harness.homes import grant, write_grants

from boxmaker.broker.client_answers import MAX_AFTER_REQUEST, MAX_LINES, AfterRequest
from boxmaker.home.paths import Home

pytestmark = pytest.mark.usefixtures("inline_threads")

Clock = trio.testing.MockClock
OPTS_IN: Final = ["owner", "mcp-client"]
CLIENT: Final = "Claude Code"


def answer(approval_id: str, approve: bool = True, client: str = CLIENT) -> bytes:
    frame = {"kind": "client_answer", "v": 1, "approval": approval_id, "approve": approve}
    return orjson.dumps({**frame, "client": client}) + b"\n"


async def asked(
    home: Home, brokerd: Brokerd, approvers: list[str] | None = OPTS_IN
) -> tuple[Client, dict[str, Any], dict[str, Any]]:
    extra = {} if approvers is None else {"approvers": approvers}
    write_grants(home, grant("notes", "read_file", "ask", **extra))
    notes(home)
    await brokerd.start()
    frame = tool_request("read_file", {"path": "notes.txt"})
    client, pending = await ask_call(home, frame)
    return client, frame, pending


async def still_waits(home: Home, brokerd: Brokerd, call_id: str, approval_id: str) -> None:
    """Some virtual time on, the call still waits, and only its decision is recorded."""
    await trio.sleep(1)
    assert approval_id in brokerd.broker.table
    assert len(records_of(home, call_id)) == 1


async def test_the_pending_frame_names_who_may_answer(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    client, _, pending = await asked(home, brokerd)
    assert pending["approvers"] == OPTS_IN
    await client.aclose()


async def test_the_pending_frame_of_an_owner_only_grant_is_as_before(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    client, _, pending = await asked(home, brokerd, approvers=None)
    assert "approvers" not in pending
    await client.aclose()


async def test_a_client_approve_where_the_grant_opts_in_runs_and_names_the_client(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    client, frame, pending = await asked(home, brokerd)
    c, a = frame["call"], pending["approval"]
    await client.send(answer(a))
    assert await client.final() == ok_answer(c, "hello\n")
    await client.aclose()
    await brokerd.stop()
    [_, approved, result] = [body(r) for r in records_of(home, c)]
    assert approved == approval(
        c, a, outcome="ask", by="mcp-client", approver="mcp-client:Claude Code"
    )
    assert result["status"] == "ok"


async def test_a_client_refusal_where_the_grant_opts_in_is_refused(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    client, frame, pending = await asked(home, brokerd)
    c, a = frame["call"], pending["approval"]
    await client.send(answer(a, approve=False))
    reason = "refused in the MCP client Claude Code"
    assert await client.final() == denied(c, "refused", reason)
    await client.aclose()
    await brokerd.stop()
    assert [body(r) for r in records_of(home, c)][1:] == [
        approval(
            c,
            a,
            outcome="refused",
            reason=reason,
            by="mcp-client",
            approver="mcp-client:Claude Code",
        )
    ]


@pytest.mark.parametrize("approvers", [None, ["owner"]])
async def test_a_client_answer_where_the_grant_does_not_opt_in_changes_nothing(
    home: Home,
    brokerd: Brokerd,
    autojump_clock: Clock,
    approvers: list[str] | None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    client, frame, pending = await asked(home, brokerd, approvers)
    c, a = frame["call"], pending["approval"]
    with caplog.at_level(logging.INFO, logger="boxmaker.brokerd"):
        await client.send(answer(a))
        await still_waits(home, brokerd, c, a)
    ignored = [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()]
    assert ignored == [
        f"call {c} (approval {a}): ignored a client_answer from 'Claude Code' does not count: "
        'grant notes does not let the MCP client answer (approvers = ["owner"])'
    ]
    # The owner's answer decides, and the record is the owner's.
    approved = await admin(home, {"kind": "approve", "approval": a})
    assert approved["outcome"] == "ask"
    assert await client.final() == ok_answer(c, "hello\n")
    await client.aclose()
    await brokerd.stop()
    assert [body(r) for r in records_of(home, c)][1] == approval(c, a, outcome="ask")


async def test_a_grant_that_stopped_opting_in_turns_the_answer_away(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    client, frame, pending = await asked(home, brokerd)
    c, a = frame["call"], pending["approval"]
    write_grants(home, grant("notes", "read_file", "ask"))
    await client.send(answer(a))
    await still_waits(home, brokerd, c, a)
    refused = await admin(home, {"kind": "refuse", "approval": a, "reason": "no"})
    assert refused["kind"] == "refused"
    assert await client.final() == denied(c, "refused", "no")
    await client.aclose()


async def test_an_answer_for_another_approval_is_ignored(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    client, frame, pending = await asked(home, brokerd)
    c, a = frame["call"], pending["approval"]
    other, other_pending = await ask_call(home, tool_request("read_file", {"path": "notes.txt"}))
    b = other_pending["approval"]
    # Each answers the other's approval: neither counts.
    await client.send(answer(b))
    await other.send(answer(a))
    await still_waits(home, brokerd, c, a)
    assert b in brokerd.broker.table
    await client.send(answer(a, approve=False))
    assert (await client.final())["reason"] == "refused"
    assert b in brokerd.broker.table
    await other.aclose()
    await client.aclose()


@pytest.mark.parametrize(
    "noise",
    [
        b"x" * (MAX_AFTER_REQUEST + 1) + b"\n",
        b"y" * 70000,
        b"not json\n",
        b'{"kind":"tool_request"}\n',
        b'{"kind":"catalogue","v":1}\n',
        b'{"kind":"client_answer","v":1,"approval":"a-1","approve":true,"client":"x"}\n',
        b'{"kind":"client_answer","v":1,"approval":"a-00000000","approve":true,"client":"\\u001b"}\n',
    ],
)
async def test_oversized_or_garbage_after_the_request_is_drained_and_changes_nothing(
    home: Home, brokerd: Brokerd, autojump_clock: Clock, noise: bytes
) -> None:
    client, frame, pending = await asked(home, brokerd)
    c, a = frame["call"], pending["approval"]
    await client.send(noise)
    await still_waits(home, brokerd, c, a)
    # What came before is dropped whole: a good answer after it counts.
    await client.send(b"\n" + answer(a))
    assert await client.final() == ok_answer(c, "hello\n")
    await client.aclose()


async def test_a_client_answer_as_the_first_frame_is_a_bad_frame(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    await brokerd.start()
    frames = await call(home, answer("a-00000001"))
    assert frames == [
        {
            "kind": "error",
            "code": "bad_frame",
            "detail": "client_answer is only read after a pending frame on the same connection",
        }
    ]


async def test_an_answer_after_the_owner_answered_changes_nothing(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    client, frame, pending = await asked(home, brokerd)
    c, a = frame["call"], pending["approval"]
    refused = await admin(home, {"kind": "refuse", "approval": a, "reason": "no"})
    assert refused["kind"] == "refused"
    assert await client.final() == denied(c, "refused", "no")
    with contextlib.suppress(trio.BrokenResourceError):  # brokerd may have closed already
        await client.send(answer(a))
    await client.aclose()
    await brokerd.stop()
    [_, refusal] = [body(r) for r in records_of(home, c)]
    assert (refusal["by"], refusal.get("approver")) == ("owner", None)


def test_lines_are_cut_as_they_come_and_a_long_one_is_never_held() -> None:
    after = AfterRequest()
    assert after.feed(b"a" * MAX_AFTER_REQUEST) == []
    assert after.feed(b"\n") == [b"a" * MAX_AFTER_REQUEST]
    assert after.feed(b"b" * MAX_AFTER_REQUEST + b"b") == []
    assert after._partial == b""
    assert after.feed(b"b" * 100) == []
    assert after._partial == b""
    assert after.feed(b"\nok\nrest") == [b"ok"]
    assert after.feed(b"\n") == [b"rest"]


def test_only_the_first_lines_of_a_call_are_cut_and_empty_ones_do_not_count() -> None:
    after = AfterRequest()
    assert after.feed(b"\n" * 1000) == []
    assert after.feed(b"x\n" * (MAX_LINES - 1) + b"last\nmore\n") == [b"x"] * (MAX_LINES - 1) + [
        b"last"
    ]
    assert after.feed(b"y\n") == []
    assert after._partial == b""


async def test_an_answer_after_a_flood_of_lines_is_not_read(
    home: Home, brokerd: Brokerd, autojump_clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    client, frame, pending = await asked(home, brokerd)
    c, a = frame["call"], pending["approval"]
    with caplog.at_level(logging.DEBUG, logger="boxmaker.brokerd"):
        await client.send(b"{}\n" * 10000 + answer(a))
        await still_waits(home, brokerd, c, a)
    decoded = [r for r in caplog.records if "ignored" in r.getMessage()]
    assert len(decoded) == MAX_LINES
    await client.aclose()
