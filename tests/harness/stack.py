"""The whole stack in one trio run, for tests: the scripted model, inferproxy, brokerd
and loopd, each the real thing on its real socket in a temporary home."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Final

import orjson
import trio
from tests.fakes.llama_server import FakeLlama

from boxmaker.home import Home
from boxmaker.loop.serve import Loop, serve_loop
from boxmaker.ndjson import FrameReader
from boxmaker.proxy.serve import ProxyHandle, serve_proxy

from .broker import running

GUARD: Final = 30.0
READ_NOTES: Final = {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]}


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
