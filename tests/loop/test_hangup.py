"""A loop.sock client that leaves mid-turn ends the turn at once (Ctrl-C in bxctl chat):
loopd watches the connection while the turn runs, cancels the model request, and keeps
what the turn added to the history."""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import orjson
import trio

from boxmaker.home.config import load_config
from boxmaker.home.paths import Home
from boxmaker.loop.conversations import load_history
from boxmaker.loop.model_client import ModelFailure, OnProgress
from boxmaker.loop.serve import Loop, handle_loop_connection
from boxmaker.loop.turn import PROGRESS_S
from boxmaker.runtime.ndjson import FrameReader

SESSION = "s-0123456789ab"


@attrs.define
class HangingModel:
    """A model that never answers, and says when its request was dropped."""

    started: trio.Event = attrs.Factory(trio.Event)
    cancelled: trio.Event = attrs.Factory(trio.Event)

    async def complete(
        self, payload: dict[str, Any], *, on_progress: OnProgress | None = None
    ) -> dict[str, Any] | ModelFailure:
        self.started.set()
        try:
            await trio.sleep_forever()
        finally:
            self.cancelled.set()
        raise AssertionError("unreachable")


class NoBroker:
    async def call(self, request: Any, on_pending: Any = None) -> Any:
        raise AssertionError("no tool call in this turn")


async def serve_once(loop: Loop, stream: trio.SocketStream) -> None:
    async with stream:
        await handle_loop_connection(loop, stream)


@asynccontextmanager
async def connected(home: Home) -> AsyncIterator[tuple[HangingModel, trio.SocketStream]]:
    """loopd's connection handler on one end of a socket pair, with a model that never
    answers: (the model, the client's end)."""
    home.create()
    model = HangingModel()
    loop = Loop(
        home=home, config=load_config(home), owner_uid=os.getuid(), broker=NoBroker(), model=model
    )
    ours, theirs = trio.socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    client, server = trio.SocketStream(ours), trio.SocketStream(theirs)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_once, loop, server)
        yield model, client


async def test_a_client_that_leaves_cancels_the_model_request_at_once(home: Home) -> None:
    async with connected(home) as (model, client):
        say = {"kind": "say", "session": SESSION, "text": "tell me a long story"}
        await client.send_all(orjson.dumps(say) + b"\n")
        reader = FrameReader(client)
        kinds = []
        with trio.fail_after(10):
            while (line := await reader.receive_line()) is not None:
                kinds.append(orjson.loads(line)["kind"])
                if kinds[-1] == "model":
                    break
            await model.started.wait()
        await client.aclose()
        # Sooner than the first progress event, whose send would find the client gone.
        with trio.fail_after(PROGRESS_S / 2):
            await model.cancelled.wait()
    assert kinds == ["session", "model"]
    assert load_history(home, SESSION) == [{"role": "user", "content": "tell me a long story"}]


async def test_bytes_after_the_say_do_not_end_the_turn(home: Home) -> None:
    async with connected(home) as (model, client):
        say = {"kind": "say", "session": SESSION, "text": "hi"}
        await client.send_all(orjson.dumps(say) + b"\nmore bytes\n")
        with trio.fail_after(10):
            await model.started.wait()
        await trio.sleep(0.2)
        assert not model.cancelled.is_set()
        await client.aclose()
        with trio.fail_after(PROGRESS_S / 2):
            await model.cancelled.wait()
