"""loopd on a real loop.sock, with the real brokerd and inferproxy in process and the
scripted llama-server behind them (spec §9, §12.2)."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
import trio
from tests.broker.broker_harness import SESSION, admin, grant, records, running, write_grants
from tests.fakes.llama_server import FakeLlama

from boxmaker.home import Home
from boxmaker.loop.model_client import ModelFailure
from boxmaker.loop.serve import Loop, serve_loop
from boxmaker.ndjson import FrameReader
from boxmaker.proxy.serve import ProxyHandle, serve_proxy
from boxmaker.wire import ErrorCode

GUARD = 30.0
READ_NOTES = {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]}


@asynccontextmanager
async def stack(home: Home, fake: FakeLlama) -> AsyncIterator[Loop]:
    """The fake model, inferproxy, brokerd and loopd, stopped in turn at the end."""
    with trio.fail_after(GUARD):
        async with trio.open_nursery() as model:
            url = await model.start(fake.serve)
            async with running(home), trio.open_nursery() as daemons:
                proxy: ProxyHandle = await daemons.start(
                    functools.partial(serve_proxy, home, upstream=url)
                )
                loop: Loop = await daemons.start(serve_loop, home)
                yield loop
                loop.request_stop()
                proxy.request_stop()
            model.cancel_scope.cancel()


async def say(home: Home, text: str, session: str | None = None) -> list[dict[str, Any]]:
    """One turn on loop.sock: every event until loopd closes."""
    stream = await trio.open_unix_socket(str(home.loop_sock))
    async with stream:
        frame: dict[str, Any] = {"kind": "say", "text": text}
        if session is not None:
            frame["session"] = session
        await stream.send_all(orjson.dumps(frame) + b"\n")
        reader = FrameReader(stream)
        events = []
        # A socket closed with our unread bytes in it resets instead of ending cleanly
        # (Linux AF_UNIX): after the frames it sent, that is the same end.
        with contextlib.suppress(trio.BrokenResourceError):
            while (line := await reader.receive_line()) is not None:
                events.append(orjson.loads(line))
        return events


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [event["kind"] for event in events]


async def test_a_granted_read_reaches_the_model_and_the_reply_the_owner(home: Home) -> None:
    write_grants(home, grant("notes", "read_file", "auto"))
    (home.default_workspace / "notes.txt").write_text("Buy milk.\n")
    fake = FakeLlama(script=[READ_NOTES, {"content": "Your notes say: buy milk."}])
    async with stack(home, fake):
        events = await say(home, "what do my notes say?")
    assert kinds(events) == ["session", "model", "tool_call", "tool_result", "model", "reply"]
    session = events[0]["session"]
    assert events[2]["tool"] == "read_file"
    assert events[2]["arguments"] == {"path": "notes.txt"}
    assert (events[3]["outcome"], events[3].get("reason")) == ("ok", None)
    assert events[-1] == {"kind": "reply", "final": True, "text": "Your notes say: buy milk."}
    # What the model was sent: pinned by the proxy, the tool's answer as a tool message.
    first, second = fake.requests
    assert first["model"] == "default"
    assert first["id_slot"] == 0
    assert second["messages"][-1]["content"] == "Buy milk.\n"
    # The ledger has the call, decided and run, in the session loopd named.
    calls = [r for r in records(home) if r.get("call") == events[2]["call"]]
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
    assert told.startswith("denied: no_grant")
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
        with trio.fail_after(GUARD):
            # The owner polls, as `bxctl approvals --watch` does: there is no event.
            while not (listed := await admin(home, {"kind": "approvals"}))["entries"]:  # noqa: ASYNC110
                await trio.sleep(0.02)
        [entry] = listed["entries"]
        assert (entry["tool"], entry["grant"]["id"]) == ("read_file", "notes")
        approved = await admin(home, {"kind": "approve", "approval": entry["approval"]})
        assert approved["outcome"] == "ask"
    assert kinds(events) == [
        "session",
        "model",
        "tool_call",
        "waiting",
        "tool_result",
        "model",
        "reply",
    ]
    waiting = events[3]
    assert (waiting["approval"], waiting["grant"]) == (entry["approval"], "notes")
    assert events[4]["outcome"] == "ok"
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
    assert kinds(events) == ["session", "model", "error"]
    assert events[-1]["code"] == "model_unreachable"


class _Unreachable:
    async def complete(self, payload: dict[str, Any]) -> Any:
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
