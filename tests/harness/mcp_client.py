"""MCP clients for tests: the SDK's own ``ClientSession``, connected to ``bxctl mcp serve``
in process (memory streams, so the autojump clock runs the whole call) or as a real
process over stdio (``stdio_client``, real time)."""

from __future__ import annotations

import functools
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Final

import mcp_types as types
import trio
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.memory import create_client_server_memory_streams

from boxmaker.home.paths import Home
from boxmaker.loop.broker_port import BrokerPort
from boxmaker.mcp.serve import McpServe

SERVE_ARGV: Final = ("-m", "boxmaker.cli.app", "mcp", "serve")


def serve_on(home: Home) -> McpServe:
    """The serve's server for one connection, a broker.sock client of ``home``."""
    return McpServe(BrokerPort(home.broker_sock, reply_timeout=10.0))


@asynccontextmanager
async def connected(serve: McpServe) -> AsyncIterator[ClientSession]:
    """A client session, initialized, on ``serve``'s server in this trio run; the
    server stops when the client leaves (its streams close)."""
    server = serve.server()
    async with (
        create_client_server_memory_streams() as (client_streams, server_streams),
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(
            functools.partial(server.run, *server_streams, server.create_initialization_options())
        )
        async with ClientSession(*client_streams) as session:
            await session.initialize()
            yield session
        nursery.cancel_scope.cancel()


def serve_parameters(home: Home) -> StdioServerParameters:
    """``bxctl mcp serve --home HOME`` as a client starts it (this interpreter's bxctl)."""
    return StdioServerParameters(
        command=sys.executable, args=[*SERVE_ARGV, "--home", str(home.root)]
    )


@asynccontextmanager
async def served(home: Home, errlog: Any = None) -> AsyncIterator[ClientSession]:
    """A client session, initialized, on a ``bxctl mcp serve`` process it started."""
    async with (
        stdio_client(serve_parameters(home), errlog=errlog or sys.stderr) as streams,
        ClientSession(*streams) as session,
    ):
        await session.initialize()
        yield session


def text_of(result: types.CallToolResult) -> str:
    """The one text content of a tool result."""
    [content] = result.content
    assert isinstance(content, types.TextContent), content
    return content.text
