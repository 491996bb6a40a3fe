"""MCP's stdio wire for the serve, on trio's own pipes (docs/decisions.md, "bxctl mcp serve").

The SDK's ``stdio_server`` reads and writes through worker threads (three thread hops a
call); this transport reads stdin and writes
stdout as trio streams, and reads each line through the system's one frame reader, so a
client's line has a cap (:data:`MAX_MESSAGE`): a longer one ends the connection, the
serve never holds it. As the SDK does, it keeps the wire on private descriptors and
points fd 0 at /dev/null and fd 1 at stderr while it serves, so nothing else in the
process can read the client's messages or write into the wire.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator, Iterator
from typing import Final

import mcp_types as types
import trio
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from boxmaker.runtime.ndjson import MAX_FRAME, FrameError, FrameReader

log = logging.getLogger("boxmaker.mcp")

MAX_MESSAGE: Final = 4 * MAX_FRAME
"""Bytes of one message from the client: room for a call whose arguments brokerd would
take (1 MiB of them, JSON-escaped), no more."""

Incoming = SessionMessage | Exception


@contextlib.contextmanager
def _wire_descriptors() -> Iterator[tuple[int, int]]:
    """The wire's private copies of fd 0 and 1; meanwhile 0 reads /dev/null and 1 writes
    to stderr. Put back as they were at the end."""
    wire_in = os.dup(0)
    wire_out = os.dup(1)
    saved_in, saved_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
        os.dup2(2, 1)
        yield wire_in, wire_out
    finally:
        os.close(null)
        os.dup2(saved_in, 0)
        os.dup2(saved_out, 1)
        os.close(saved_in)
        os.close(saved_out)


@contextlib.asynccontextmanager
async def stdio_wire() -> AsyncIterator[
    tuple[trio.MemoryReceiveChannel[Incoming], trio.MemorySendChannel[SessionMessage]]
]:
    """The server's two streams on stdin and stdout, as ``Server.run`` takes them. The
    read side ends when the client closes stdin (or sends a line over the cap)."""
    with _wire_descriptors() as (wire_in, wire_out):
        async with (
            trio.lowlevel.FdStream(wire_in) as stdin,
            trio.lowlevel.FdStream(wire_out) as stdout,
            trio.open_nursery() as nursery,
        ):
            incoming_send, incoming = trio.open_memory_channel[Incoming](0)
            outgoing, outgoing_receive = trio.open_memory_channel[SessionMessage](0)
            nursery.start_soon(_read, FrameReader(stdin, max_frame=MAX_MESSAGE), incoming_send)
            nursery.start_soon(_write, outgoing_receive, stdout)
            yield incoming, outgoing
            nursery.cancel_scope.cancel()


async def _read(reader: FrameReader, sink: trio.MemorySendChannel[Incoming]) -> None:
    async with sink:
        while True:
            try:
                line = await reader.receive_line()
            except (FrameError, trio.BrokenResourceError) as exc:
                log.error("the client's message cannot be read (%s): ending the connection", exc)  # noqa: TRY400 - the client's fault, not ours
                return
            if line is None:
                return
            try:
                message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
            except ValidationError as exc:
                # Passed on as the SDK's own transport does (the SDK drops it); a client
                # that cannot frame its messages is worth a line in the log.
                log.warning("a message from the client is not JSON-RPC: %s", exc.errors()[0]["msg"])
                await sink.send(exc)
                continue
            await sink.send(SessionMessage(message))


async def _write(
    source: trio.MemoryReceiveChannel[SessionMessage], stdout: trio.lowlevel.FdStream
) -> None:
    async with source:
        async for session_message in source:
            data = session_message.message.model_dump_json(by_alias=True, exclude_unset=True)
            try:
                await stdout.send_all(data.encode() + b"\n")
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
