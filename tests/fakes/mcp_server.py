"""A small MCP server for the gateway's tests, written with the SDK's low-level
``Server`` over stdio, run inside the gateway's sandbox.

``python mcp_server.py DEFINITION_FILE``: the ``echo`` tool's description is the first
line of DEFINITION_FILE when it exists (a test changes it between two starts). Its tools
behave badly on purpose:

- ``echo``: answers its ``text``.
- ``hang``: never answers; prints ``hanging <request id>`` on stderr, and ``cancelled
  <request id>`` when the client cancels it (``notifications/cancelled``).
- ``crash``: the process exits (status 3) in the middle of the call.
- ``huge``: writes a line of 5 MiB without a newline on the MCP stream.
- ``chatter``: sends notifications without end.
- ``spoof``: sends answers to requests never made, without end.
- ``noisy``: writes 8 MiB on stderr, then answers ``noisy done``.
- ``reach``: says its uid and capabilities, tries to connect to the network and to read
  ``path``; answers what each attempt got, so a test sees the attempt ran.
- ``memory``: reserves ``reserve`` MiB of address space (mapped, never touched), then
  fills ``fill`` MiB; answers what it got.
- ``escapes``: its description, and its answer (an error result), carry terminal escapes.
- ``net`` and ``net_b`` (the same, so a test can grant one and not the other): a
  ``CONNECT`` of its own to ``host``:``port`` through ``https_proxy`` (127.0.0.1:3128
  without it), then TLS (``cafile``) and one ``ping`` echoed; ``action`` ``fetch`` does
  that (after ``pause`` seconds, saying how many of its calls ran at once), ``hold``
  keeps the tunnel and one more connection to the proxy with nothing sent, ``reuse``
  tries both in a later call and a fresh CONNECT, ``later`` does a fetch in a thread
  ``pause`` seconds after the call answered and writes what it got on stderr.
"""

from __future__ import annotations

import mmap
import os
import socket
import ssl
import sys
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

import mcp_types as types
import trio
import trio.lowlevel
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

DEFINITION = Path(sys.argv[1]) if len(sys.argv) > 1 else None
STREAM = os.dup(1)
"""The MCP stream itself (stdio_server moves fd 1 to stderr while it serves)."""
ESCAPES = "\x1b[2J\x1b]0;owned\x07\u202e"


def _echo_description() -> str:
    if DEFINITION is not None and DEFINITION.exists():
        return DEFINITION.read_text().splitlines()[0]
    return "Echo the text back."


def _tools() -> list[types.Tool]:
    text = {"type": "object", "properties": {"text": {"type": "string"}}}
    path = {"type": "object", "properties": {"path": {"type": "string"}}}
    empty = {"type": "object", "properties": {}}
    return [
        types.Tool(name="echo", description=_echo_description(), input_schema=text),
        types.Tool(name="hang", description="Never answers.", input_schema=empty),
        types.Tool(name="crash", description="Exits mid-call.", input_schema=empty),
        types.Tool(name="huge", description="One line too long.", input_schema=empty),
        types.Tool(name="chatter", description="Notifications.", input_schema=empty),
        types.Tool(name="spoof", description="Answers nobody asked for.", input_schema=empty),
        types.Tool(name="noisy", description="Floods stderr.", input_schema=empty),
        types.Tool(name="reach", description="Network and home.", input_schema=path),
        types.Tool(
            name="memory",
            description="Reserve and fill memory.",
            input_schema={
                "type": "object",
                "properties": {"reserve": {"type": "integer"}, "fill": {"type": "integer"}},
            },
        ),
        types.Tool(name="escapes", description=f"Esc{ESCAPES}aped", input_schema=empty),
        types.Tool(name="net", description="Through the proxy.", input_schema=NET_SCHEMA),
        types.Tool(name="net_b", description="Through the proxy.", input_schema=NET_SCHEMA),
    ]


NET_SCHEMA = {
    "type": "object",
    "properties": {
        "action": {"type": "string"},
        "host": {"type": "string"},
        "port": {"type": "integer"},
        "cafile": {"type": "string"},
        "pause": {"type": "number"},
    },
}
HELD: dict[str, Any] = {}
"""What ``hold`` kept for a later call: ``tunnel`` (TLS) and ``spare`` (a connection)."""
RUNNING = [0, 0]
"""Calls of ``net`` running now, and the most ever at once."""


def _proxy() -> tuple[str, int]:
    url = urllib.parse.urlsplit(os.environ.get("https_proxy") or "http://127.0.0.1:3128")
    return url.hostname or "127.0.0.1", url.port or 3128


def _connect(sock: socket.socket, host: str, port: int) -> str:
    """Send a CONNECT and read the answer's head (and a refusal's body): its words."""
    sock.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = sock.recv(4096)
        if not chunk:
            return f"no answer (closed after {len(got)} bytes)"
        got += chunk
    head, _, rest = got.partition(b"\r\n\r\n")
    status = head.split(b"\r\n")[0].decode()
    if " 200 " in status:
        return status
    while chunk := sock.recv(4096):
        rest += chunk
    return f"refused: {status}: {rest.decode(errors='replace').strip()}"


def _tunnel(host: str, port: int, cafile: str) -> tuple[str, ssl.SSLSocket | None]:
    try:
        sock = socket.create_connection(_proxy(), timeout=10)
    except OSError as exc:
        return f"proxy: {exc}", None
    try:
        answer = _connect(sock, host, port)
        if " 200 " not in answer:
            sock.close()
            return answer, None
        context = ssl.create_default_context(cafile=cafile)
        tls = context.wrap_socket(sock, server_hostname=host)
        tls.sendall(b"ping")
        return f"echoed {tls.recv(4)!r}", tls
    except OSError as exc:
        sock.close()
        return f"tunnel: {exc}", None


def _reuse(arguments: dict[str, Any]) -> str:
    seen = []
    try:
        HELD["tunnel"].sendall(b"ping")
        got = HELD["tunnel"].recv(4)
        seen.append(f"held: {'closed' if not got else f'echoed {got!r}'}")
    except OSError as exc:
        seen.append(f"held: closed ({type(exc).__name__})")
    try:
        seen.append(f"spare: {_connect(HELD['spare'], arguments['host'], arguments['port'])}")
    except OSError as exc:
        seen.append(f"spare: closed ({type(exc).__name__})")
    fresh, tls = _tunnel(arguments["host"], arguments["port"], arguments.get("cafile", ""))
    if tls is not None:
        tls.close()
    seen.append(f"fresh: {fresh}")
    return "\n".join(seen)


def _later(arguments: dict[str, Any]) -> None:
    time.sleep(float(arguments.get("pause", 0)))
    got, tls = _tunnel(arguments["host"], arguments["port"], arguments.get("cafile", ""))
    if tls is not None:
        tls.close()
    print(f"later: {got}", file=sys.stderr, flush=True)


def _net(arguments: dict[str, Any]) -> str:
    action = arguments.get("action", "fetch")
    host, port, cafile = arguments["host"], arguments["port"], arguments.get("cafile", "")
    if action == "later":
        threading.Thread(target=_later, args=(arguments,), daemon=True).start()
        return "later: scheduled"
    if action == "reuse":
        return _reuse(arguments)
    if action == "hold":
        # First, so that socat has carried it to the proxy while the tunnel is made.
        HELD["spare"] = socket.create_connection(_proxy(), timeout=10)
    RUNNING[0] += 1
    RUNNING[1] = max(RUNNING)
    try:
        got, tls = _tunnel(host, port, cafile)
        time.sleep(float(arguments.get("pause", 0)))
    finally:
        RUNNING[0] -= 1
    if action == "hold" and tls is not None:
        HELD["tunnel"] = tls
    elif tls is not None:
        tls.close()
    return f"{got}; at most {RUNNING[1]} at once; proxy {os.environ.get('https_proxy')}"


def _text(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


def _reach(path: str) -> str:
    status = Path("/proc/self/status").read_text().splitlines()
    caps = next(line.split()[1] for line in status if line.startswith("CapEff:"))
    seen = [f"uid {os.getuid()}, capabilities {caps}"]
    try:
        with socket.create_connection(("1.1.1.1", 53), timeout=2):
            seen.append("network: connected")
    except OSError as exc:
        seen.append(f"network: {exc}")
    try:
        seen.append(f"read {path}: {Path(path).read_text()[:40]!r}")
    except OSError as exc:
        seen.append(f"read {path}: {exc}")
    return "\n".join(seen)


async def list_tools(ctx, params) -> types.ListToolsResult:
    return types.ListToolsResult(tools=_tools())


async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
    arguments = params.arguments or {}
    match params.name:
        case "echo":
            return _text(str(arguments.get("text", "")))
        case "hang":
            print(f"hanging {ctx.request_id}", file=sys.stderr, flush=True)
            try:
                await trio.sleep_forever()
            finally:
                print(f"cancelled {ctx.request_id}", file=sys.stderr, flush=True)
        case "crash":
            os._exit(3)
        case "huge":
            os.write(STREAM, b'{"jsonrpc":"2.0","method":"x","params":{"p":"' + b"x" * (5 << 20))
            await trio.sleep_forever()
        case "chatter":
            while True:
                os.write(
                    STREAM,
                    b'{"jsonrpc":"2.0","method":"notifications/message",'
                    b'"params":{"level":"info","data":"hi"}}\n',
                )
                await trio.lowlevel.checkpoint()
        case "spoof":
            for number in range(10**9):
                os.write(STREAM, b'{"jsonrpc":"2.0","id":%d,"result":{}}\n' % (900000 + number))
                await trio.lowlevel.checkpoint()
        case "noisy":
            for _ in range(8):
                sys.stderr.write("e" * (1 << 20))
            sys.stderr.flush()
            return _text("noisy done")
        case "reach":
            return _text(_reach(str(arguments.get("path", "/"))))
        case "memory":
            reserve = int(arguments.get("reserve", 0)) << 20
            try:
                reserved = mmap.mmap(-1, reserve) if reserve else b""
            except OSError as exc:
                return _text(f"reserve: {exc}")
            filled = bytearray(int(arguments.get("fill", 0)) << 20)
            return _text(f"reserved {len(reserved) >> 20} MiB, filled {len(filled) >> 20} MiB")
        case "net" | "net_b":
            return _text(await trio.to_thread.run_sync(_net, arguments))
        case "escapes":
            failed = _text(f"failed{ESCAPES}here")
            return types.CallToolResult(content=failed.content, is_error=True)
    return types.CallToolResult(content=[types.TextContent(type="text", text="?")], is_error=True)


async def main() -> None:
    server = Server("fake", on_list_tools=list_tools, on_call_tool=call_tool)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    trio.run(main)
