"""The whole stack in one trio run, for tests: the scripted model, inferproxy, brokerd
and loopd, each the real thing on its real socket in a temporary home; and its first
pieces alone (the scripted model; inferproxy with loopd's model client on it)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Final

import orjson
import trio
from tests.fakes.llama_server import FakeLlama

from boxmaker.home.paths import Home
from boxmaker.loop.model_client import ModelClient
from boxmaker.loop.serve import Loop, serve_loop
from boxmaker.proxy.serve import ProxyHandle, serve_proxy
from boxmaker.runtime.ndjson import FrameReader

from .broker import running

GUARD: Final = 30.0
READ_NOTES: Final = {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]}
NOTES_AFTER_BREAD: Final = "Buy milk.\nBuy bread.\n"
ADD_BREAD: Final = {
    "tool_calls": [
        {"name": "write_file", "arguments": {"path": "notes.txt", "content": NOTES_AFTER_BREAD}}
    ]
}
# ADD_BREAD waiting, as the owner sees it when notes.txt holds "Buy milk.\n" and the grant
# that asks is 'notes' (mode ask) with the note "my notes".
ADD_BREAD_SHOWN: Final = [
    "  change     replaces 10 bytes with 21 bytes",
    "    --- notes.txt (now)",
    "    +++ notes.txt (written)",
    "    @@ -1 +1,2 @@",
    "     Buy milk.",
    "    +Buy bread.",
    "  grant      notes (mode ask): my notes",
]


@asynccontextmanager
async def served(fake: FakeLlama) -> AsyncIterator[str]:
    """The scripted model serving, until the end: its URL."""
    async with trio.open_nursery() as nursery:
        yield await nursery.start(fake.serve)
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def stack(home: Home, fake: FakeLlama) -> AsyncIterator[Loop]:
    """The fake model, inferproxy, brokerd and loopd, stopped in turn at the end."""
    with trio.fail_after(GUARD):
        async with served(fake) as url, running(home), trio.open_nursery() as daemons:
            proxy: ProxyHandle = await daemons.start(
                functools.partial(serve_proxy, home, upstream=url)
            )
            loop: Loop = await daemons.start(serve_loop, home)
            yield loop
            loop.request_stop()
            proxy.request_stop()


@asynccontextmanager
async def proxied_client(home: Home, upstream: str) -> AsyncIterator[ModelClient]:
    """inferproxy in front of the model at ``upstream``, and loopd's model client on
    infer.sock; both closed at the end."""
    async with trio.open_nursery() as nursery:
        proxy: ProxyHandle = await nursery.start(
            functools.partial(serve_proxy, home, upstream=upstream)
        )
        client = ModelClient(home.infer_sock)
        try:
            yield client
        finally:
            await client.aclose()
            proxy.request_stop()


async def cancel_once_generating(
    fake: FakeLlama, request: Callable[[], Awaitable[object]]
) -> float:
    """Start ``request``, cancel it once ``fake`` generates, and wait until ``fake`` no
    longer does (2 s at most): when the cancel was (``trio.current_time()``)."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(request)
        with trio.fail_after(5):
            while fake.generations == 0:  # noqa: ASYNC110
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    cancelled = trio.current_time()
    with trio.fail_after(2):
        while fake.generations:  # noqa: ASYNC110
            await trio.sleep(0.01)
    return cancelled


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
