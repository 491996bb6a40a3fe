"""The built-in model itself (llama.cpp's server with SmolLM2-135M), through the real
inferproxy and loopd's real model client: a tool step ends at the end of its call with
the call parsed by llama-server; a call that is cancelled frees the model's slot at
once; inferproxy follows the model when it restarts. It needs the optional model
(``nox -s gate`` installs it); without it, it is skipped and says so."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest
import trio
from tests.harness.homes import short_home
from tests.harness.model import MISSING, builtin_model, call_text, slot_busy, tokens_of
from tests.harness.stack import proxied_client

from boxmaker.home.paths import Home
from boxmaker.loop.model_client import ModelClient, ModelFailure, ModelProgress
from boxmaker.loop.turn import ToolCall, model_tools, parse_tool_calls, request_payload

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(MISSING), reason=f"the built-in model is not installed: {MISSING}"),
]

GUARD = 90.0
READ_NOTES = [{"role": "user", "content": 'Read the file at path "notes.txt".'}]
CALL_MARGIN = 16
"""Tokens a tool step may write beyond its call's own (docs/performance.md)."""


@pytest.fixture
def home() -> Iterator[Home]:
    with short_home("bx-model-") as fresh:
        fresh.config_toml.write_text("")
        yield fresh


def proxied(home: Home) -> AbstractAsyncContextManager[ModelClient]:
    """inferproxy in front of the model of ``home``, and loopd's client on it."""
    return proxied_client(home, f"unix://{home.model_sock}")


async def test_a_tool_step_stops_at_the_end_of_its_call(home: Home) -> None:
    seen: list[ModelProgress] = []

    async def progress(step: ModelProgress) -> None:
        seen.append(step)

    payload = request_payload(READ_NOTES, model_tools(), force_tool=True)
    with builtin_model(home), trio.fail_after(GUARD):
        async with proxied(home) as client:
            message = await client.complete(payload, on_progress=progress)
        assert not isinstance(message, ModelFailure), message
        # llama-server still parses the call (the stop string is not in its text).
        calls = parse_tool_calls(message)
        assert calls, message
        assert isinstance(calls[0], ToolCall), calls
        assert calls[0].name == "read_file"
        assert calls[0].arguments.get("path") == "notes.txt"
        own = tokens_of(home, call_text(message["tool_calls"][0]))
    written = message["usage"]["completion_tokens"]
    assert written <= own + CALL_MARGIN, (written, own, message)
    assert message["finish_reason"] == "tool_calls"
    assert [step.tokens for step in seen] == list(range(1, len(seen) + 1))
    assert 0 < len(seen) <= written


async def test_a_cancelled_call_frees_the_models_slot_at_once(home: Home) -> None:
    payload: dict[str, Any] = request_payload(READ_NOTES, model_tools(), force_tool=True)
    del payload["stop"]  # without it the model writes max_tokens: a long generation
    with builtin_model(home), trio.fail_after(GUARD):
        async with proxied(home) as client:
            started = trio.Event()

            async def progress(step: ModelProgress) -> None:
                if step.tokens >= 5:
                    started.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    functools.partial(client.complete, payload, on_progress=progress)
                )
                await started.wait()
                assert await trio.to_thread.run_sync(slot_busy, home)
                nursery.cancel_scope.cancel()
            cancelled = trio.current_time()
            while await trio.to_thread.run_sync(slot_busy, home):  # noqa: ASYNC110
                await trio.sleep(0.02)
            freed_after = trio.current_time() - cancelled
    # Under a second on a quiet machine; the bound allows a loaded one. Without the
    # cancel reaching llama-server the slot stays busy until max_tokens (25 s and more).
    assert freed_after < 3.0


async def test_inferproxy_follows_the_model_when_it_restarts(home: Home) -> None:
    hello = request_payload([{"role": "user", "content": "hi"}], [], force_tool=False)
    hello["max_tokens"] = 4
    with trio.fail_after(GUARD):
        async with proxied(home) as client:
            with builtin_model(home):
                before = await client.complete(hello)
            # Back before inferproxy noticed: its kept connection is to the old process.
            with builtin_model(home):
                restarted = await client.complete(hello)
            gone = await client.complete(hello)
            with builtin_model(home):
                after = await client.complete(hello)
    for answer in (before, restarted, after):
        assert not isinstance(answer, ModelFailure), answer
        assert answer["usage"]["completion_tokens"] <= 4
    assert isinstance(gone, ModelFailure)
    assert gone.code == "model_unreachable"
