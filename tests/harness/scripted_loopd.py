"""A stand-in for loopd on loop.sock, for the client's tests: it sends a scripted list of
events, so a test can show bxctl chat what the real loopd cannot produce yet (a streamed
reply before the model client streams) or should never produce (hostile frames)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
import trio

from boxmaker.home.paths import Home
from boxmaker.runtime.ndjson import FrameReader
from boxmaker.runtime.unix_sockets import open_unix_listener


@asynccontextmanager
async def scripted_loopd(
    home: Home, events: list[dict[str, Any] | trio.Event]
) -> AsyncIterator[None]:
    """A stand-in for loopd on loop.sock that sends ``events`` to its one client, waiting
    on each :class:`trio.Event` in the list (the test sets it once it saw the screen)."""
    home.create()
    listener = await open_unix_listener(home.loop_sock)

    async def serve() -> None:
        stream = await listener.listener.accept()
        async with stream:
            await FrameReader(stream).receive_line()
            for event in events:
                if isinstance(event, trio.Event):
                    await event.wait()
                else:
                    await stream.send_all(orjson.dumps(event) + b"\n")

    async with listener.listener, trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        yield
    listener.remove_path()
