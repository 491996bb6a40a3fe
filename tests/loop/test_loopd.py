"""loopd on a real loop.sock, with the real brokerd and inferproxy in process and the
scripted llama-server behind them (loop.sock: docs/protocol.md)."""

from __future__ import annotations

import os
from typing import Any, Final

import orjson
import trio
from tests.fakes.llama_server import FakeLlama
from tests.harness.broker import SESSION, admin, records, waiting_approvals
from tests.harness.homes import grant, write_grants
from tests.harness.stack import GUARD, READ_NOTES, say, stack

from boxmaker.home.paths import Home
from boxmaker.loop.model_client import ModelFailure
from boxmaker.runtime.ndjson import FrameReader
from boxmaker.wire import ErrorCode

STREAMED: Final = {"reply_delta", "progress"}
"""Events whose number depends on timing (the model streams; loopd coalesces)."""


def kinds(events: list[dict[str, Any]]) -> list[str]:
    """The events' kinds, but those whose number depends on timing."""
    return [event["kind"] for event in events if event["kind"] not in STREAMED]


def streamed_reply(events: list[dict[str, Any]]) -> str:
    return "".join(event["text"] for event in events if event["kind"] == "reply_delta")


async def test_a_granted_read_reaches_the_model_and_the_reply_the_owner(home: Home) -> None:
    write_grants(home, grant("notes", "read_file", "auto"))
    (home.default_workspace / "notes.txt").write_text("Buy milk.\n")
    fake = FakeLlama(script=[READ_NOTES, {"content": "Your notes say: buy milk."}])
    async with stack(home, fake):
        events = await say(home, "what do my notes say?")
    assert kinds(events) == [
        "session",
        "model",
        "model_done",
        "tool_call",
        "tool_result",
        "model",
        "model_done",
        "reply",
    ]
    # The reply came as it was generated, then whole.
    assert streamed_reply(events) == "Your notes say: buy milk."
    events = [event for event in events if event["kind"] not in STREAMED]
    session = events[0]["session"]
    assert events[3]["tool"] == "read_file"
    assert events[3]["arguments"] == {"path": "notes.txt"}
    assert (events[4]["outcome"], events[4].get("reason")) == ("ok", None)
    assert events[4]["output"] == {"lines": ["Buy milk."], "total_lines": 1}
    assert events[-1] == {"kind": "reply", "final": True, "text": "Your notes say: buy milk."}
    # What the model was sent: pinned by the proxy, the tool's answer as a tool message.
    first, second = fake.requests
    assert first["model"] == "default"
    assert first["id_slot"] == 0
    assert second["messages"][-1]["content"] == "Buy milk.\n"
    # The ledger has the call, decided and run, in the session loopd named.
    calls = [r for r in records(home) if r.get("call") == events[3]["call"]]
    assert [(r["kind"], r.get("session")) for r in calls] == [
        ("decision", session),
        ("result", None),
    ]


async def test_without_a_grant_the_model_is_told_it_was_denied(home: Home) -> None:
    fake = FakeLlama(script=[READ_NOTES, {"content": "I am not allowed to."}])
    async with stack(home, fake):
        events = await say(home, "read my notes")
    result = next(e for e in events if e["kind"] == "tool_result")
    assert (result["outcome"], result["reason"]) == ("denied", "no_grant")
    told = fake.requests[1]["messages"][-1]["content"]
    assert told.startswith("I could not do that: the call was denied (no_grant: ")
    assert events[-1]["text"] == "I am not allowed to."


async def test_an_ask_waits_for_the_owner_and_runs_once_approved(home: Home) -> None:
    write_grants(home, grant("notes", "read_file", "ask", note="the owner's notes"))
    (home.default_workspace / "notes.txt").write_text("Buy milk.\n")
    fake = FakeLlama(script=[READ_NOTES, {"content": "Milk."}])
    async with stack(home, fake), trio.open_nursery() as nursery:
        events: list[dict[str, Any]] = []

        async def turn() -> None:
            events.extend(await say(home, "read my notes"))

        nursery.start_soon(turn)
        [entry] = await waiting_approvals(home, within=GUARD)
        assert (entry["tool"], entry["grant"]["id"]) == ("read_file", "notes")
        approved = await admin(home, {"kind": "approve", "approval": entry["approval"]})
        assert approved["outcome"] == "ask"
    assert kinds(events) == [
        "session",
        "model",
        "model_done",
        "tool_call",
        "waiting",
        "tool_result",
        "model",
        "model_done",
        "reply",
    ]
    events = [event for event in events if event["kind"] not in STREAMED]
    waiting = events[4]
    assert (waiting["approval"], waiting["grant"]) == (entry["approval"], "notes")
    assert events[5]["outcome"] == "ok"
    assert fake.requests[1]["messages"][-1]["content"] == "Buy milk.\n"


async def test_a_session_keeps_its_history_across_turns(home: Home) -> None:
    fake = FakeLlama(script=[{"content": "Hello."}, {"content": "You said hi."}])
    async with stack(home, fake):
        first = await say(home, "hi", session=SESSION)
        second = await say(home, "what did I say?", session=SESSION)
    assert first[0] == {"kind": "session", "session": SESSION}
    assert second[-1]["text"] == "You said hi."
    sent = [m for m in fake.requests[1]["messages"] if m["role"] != "system"]
    assert sent == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "what did I say?"},
    ]
    lines = home.conversation(SESSION).read_bytes().splitlines()
    assert [orjson.loads(line)["role"] for line in lines] == [
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    assert os.stat(home.conversation(SESSION)).st_mode & 0o777 == 0o600


async def test_a_model_that_cannot_be_reached_ends_the_turn_with_an_error(home: Home) -> None:
    async with stack(home, FakeLlama()) as loop:
        loop.model = _Unreachable()  # type: ignore[assignment]
        events = await say(home, "hi")
    assert kinds(events) == ["session", "model", "model_done", "error"]
    assert events[-1]["code"] == "model_unreachable"


class _Unreachable:
    async def complete(self, payload: dict[str, Any], **_: Any) -> Any:
        return ModelFailure(ErrorCode.MODEL_UNREACHABLE, "see docs/runbook.md#model-unreachable")


async def test_a_bad_frame_is_answered_and_loopd_keeps_serving(home: Home) -> None:
    fake = FakeLlama(script=[{"content": "still here"}])
    async with stack(home, fake):
        stream = await trio.open_unix_socket(str(home.loop_sock))
        async with stream:
            await stream.send_all(b'{"kind": "tool_request"}\n')
            answer = orjson.loads(await FrameReader(stream).receive_line() or b"null")
        assert (answer["kind"], answer["code"]) == ("error", "bad_frame")
        events = await say(home, "hello")
    assert events[-1]["text"] == "still here"


async def test_only_the_homes_owner_may_use_loop_sock(home: Home) -> None:
    async with stack(home, FakeLlama()) as loop:
        assert loop.owner_uid == os.getuid() == home.root.stat().st_uid
        loop.owner_uid = 4242
        events = await say(home, "hello")
    assert [(e["kind"], e["code"]) for e in events] == [("error", "peer_refused")]
    assert events[0]["detail"] == f"uid {os.getuid()} may not use loop.sock"
