"""loopd's model client against the real inferproxy in front of the scripted
llama-server: the streamed answer put together as the whole message it was before, the
progress of each token, failures in words, and a cancel that frees the model's slot at
once. And the stop at the end of a tool call, through the whole stack: the scripted
model, like the built-in one, otherwise writes its call again and again until
``max_tokens``."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import orjson
import pytest
import trio
from tests.fakes.llama_server import CALL_CLOSE, CALL_OPEN, TOKEN_CHARS, FakeLlama
from tests.harness.homes import grant, write_config, write_grants
from tests.harness.stack import cancel_once_generating, proxied_client, say, served, stack

from boxmaker.home.paths import Home
from boxmaker.loop.model_client import ModelClient, ModelFailure, ModelProgress
from boxmaker.loop.turn import STOP, model_tools, request_payload
from boxmaker.wire import ErrorCode

GUARD = 20.0
ASK = request_payload([{"role": "user", "content": "read notes.txt"}], [], force_tool=False)
READ_NOTES = {"name": "read_file", "arguments": {"path": "notes.txt"}}


@asynccontextmanager
async def client_on(home: Home, fake: FakeLlama) -> AsyncIterator[ModelClient]:
    """The scripted model, inferproxy in front of it, loopd's client on infer.sock."""
    with trio.fail_after(GUARD):
        async with served(fake) as url, proxied_client(home, url) as client:
            yield client


async def test_a_streamed_reply_is_the_whole_message_and_each_token_is_reported(
    home: Home,
) -> None:
    fake = FakeLlama(script=[{"content": "Your notes say: buy milk."}])
    seen: list[ModelProgress] = []

    async def progress(step: ModelProgress) -> None:
        seen.append(step)

    async with client_on(home, fake) as client:
        message = await client.complete(ASK, on_progress=progress)
    assert message == {
        "role": "assistant",
        "content": "Your notes say: buy milk.",
        "finish_reason": "stop",
        "usage": {"prompt_tokens": 42, "completion_tokens": 7, "total_tokens": 49},
    }
    assert [step.tokens for step in seen] == list(range(1, 8))
    assert "".join(step.content for step in seen) == "Your notes say: buy milk."
    sent = fake.requests[-1]
    assert (sent["stream"], sent["stream_options"]) == (True, {"include_usage": True})


async def test_a_streamed_tool_call_is_the_call_with_its_arguments_as_a_string(
    home: Home,
) -> None:
    fake = FakeLlama(script=[{"tool_calls": [READ_NOTES]}])
    seen: list[ModelProgress] = []

    async def progress(step: ModelProgress) -> None:
        seen.append(step)

    async with client_on(home, fake) as client:
        message = await client.complete(ASK, on_progress=progress)
    assert not isinstance(message, ModelFailure)
    assert message["tool_calls"] == [
        {
            "id": "call-0",
            "type": "function",
            "function": {"name": "read_file", "arguments": '{"path":"notes.txt"}'},
        }
    ]
    assert (message["content"], message["finish_reason"]) == ("", "tool_calls")
    assert seen
    assert all(step.content == "" for step in seen)
    assert seen[-1].tokens == len(seen)


async def test_failures_are_said_in_words(home: Home) -> None:
    too_long = {"code": 400, "message": "the prompt is too long", "type": "invalid_request"}
    fake = FakeLlama(script=[{"status": 400, "error": too_long}])
    async with client_on(home, fake) as client:
        error = await client.complete(ASK)
    assert error == ModelFailure(ErrorCode.MODEL_ERROR, "HTTP 400: the prompt is too long")
    nobody = ModelClient(home.infer_sock)
    try:
        gone = await nobody.complete(ASK)
    finally:
        await nobody.aclose()
    assert isinstance(gone, ModelFailure)
    assert gone.code == ErrorCode.MODEL_UNREACHABLE
    assert gone.detail.startswith(f"inferproxy is not running on {home.infer_sock}")


async def test_a_stream_that_breaks_off_is_a_failure_not_half_a_message(home: Home) -> None:
    fake = FakeLlama(script=[{"content": "Your notes say: buy milk.", "cut_after": 3}])
    async with client_on(home, fake) as client:
        message = await client.complete(ASK)
    assert message == ModelFailure(
        ErrorCode.MODEL_UNREACHABLE, "the model's answer broke off before its end"
    )


async def test_a_cancelled_call_frees_the_models_slot_at_once(home: Home) -> None:
    fake = FakeLlama(script=[{"content": "x" * 256}], token_delay=1.0)
    async with client_on(home, fake) as client:
        cancelled = await cancel_once_generating(fake, functools.partial(client.complete, ASK))
    assert trio.current_time() - cancelled < 1.0


async def test_a_failing_progress_reporter_fails_the_call_as_itself(home: Home) -> None:
    fake = FakeLlama(script=[{"content": "one two three"}])

    async def progress(step: ModelProgress) -> None:
        raise trio.BrokenResourceError("the owner's client is gone")

    async with client_on(home, fake) as client:
        with pytest.raises(trio.BrokenResourceError, match="the owner's client is gone"):
            await client.complete(ASK, on_progress=progress)


def call_tokens(call: dict[str, object]) -> int:
    """The scripted model's tokens for writing ``call`` once, up to its end."""
    text = f'{CALL_OPEN}{{"name": "{call["name"]}", "arguments": '
    text += f"{orjson.dumps(call['arguments']).decode()}}}{CALL_CLOSE}"
    return -(-len(text) // TOKEN_CHARS)


async def test_a_tool_step_ends_at_the_end_of_its_call(home: Home) -> None:
    """The scripted model runs on like the built-in one; the step's stop ends it."""
    write_config(home, '[model]\nmax_tokens = 1024\n[loop]\nfirst_step = "tool"\n')
    write_grants(home, grant("notes", "read_file", "auto"))
    (home.default_workspace / "notes.txt").write_text("Buy milk.\n")
    fake = FakeLlama(
        script=[{"tool_calls": [READ_NOTES], "until_stopped": True}, {"content": "Milk."}]
    )
    async with stack(home, fake):
        events = await say(home, 'Read the file at path "notes.txt".')
    assert [event["kind"] for event in events][-1] == "reply"
    first = fake.requests[0]
    assert (first["tool_choice"], first["stop"]) == ("required", list(STOP))
    assert fake.usage[0]["completion_tokens"] <= call_tokens(READ_NOTES) + 16
    assert fake.usage[0]["completion_tokens"] == call_tokens(READ_NOTES)


async def test_without_the_stop_the_scripted_model_writes_max_tokens(home: Home) -> None:
    """What the stop prevents (the check above can fail)."""
    fake = FakeLlama(script=[{"tool_calls": [READ_NOTES], "until_stopped": True}])
    payload = request_payload(
        [{"role": "user", "content": "read notes.txt"}], model_tools(), force_tool=True
    )
    del payload["stop"]
    payload["max_tokens"] = 64
    async with client_on(home, fake) as client:
        message = await client.complete(payload)
    assert not isinstance(message, ModelFailure)
    assert fake.usage[0]["completion_tokens"] == 64
    assert message["finish_reason"] == "length"
    assert len(message["tool_calls"]) > 1
