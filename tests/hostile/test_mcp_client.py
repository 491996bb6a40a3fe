"""A hostile MCP client of ``bxctl mcp serve`` (docs/threat-model.md, "An MCP client"):
whatever software drives the model's tool calls. It can call any tool name with any
arguments, as many at once as it likes; it must get no more than loopd can, and no
other session's standing.

In process: the serve's server with the SDK's ClientSession on memory streams, the
real brokerd, the autojump clock."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap
from pathlib import Path

import mcp_types as types
import orjson
import pytest
import trio
import trio.testing
from tests.harness.broker import (
    Brokerd,
    Client,
    admin,
    records,
    tool_request,
    waiting_approvals,
)
from tests.harness.homes import grant, grant_table, write_config, write_grants
from tests.harness.mcp_client import SERVE_ARGV, connected, serve_on, text_of

from boxmaker.home.paths import Home
from boxmaker.mcp.serve import MAX_CALLS
from boxmaker.mcp.stdio import MAX_MESSAGE
from boxmaker.runtime.ndjson import MAX_FRAME

pytestmark = pytest.mark.usefixtures("inline_threads")

Clock = trio.testing.MockClock
FLOOD = 40
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "hostile", "version": "0"},
    },
}
SRC = Path(__file__).resolve().parents[2] / "src" / "boxmaker"


def decisions(home: Home) -> list[dict[str, object]]:
    return [r for r in records(home) if r["kind"] == "decision"]


async def test_a_flood_of_asks_leaves_brokerds_pending_slots_to_others(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    """40 asks at once from one client: only MAX_CALLS reach brokerd, the rest wait in
    the serve, and loopd's ask still finds a pending slot (max_pending is 20 here).
    Before the cap, the client's 40 calls took all 20 slots and loopd's ask was denied
    too_many_pending."""
    write_config(home, "[broker]\npending_timeout = 30\nmax_pending = 20\n")
    write_grants(home, grant("asked", "read_file", "ask"))
    await brokerd.start()
    serve = serve_on(home)
    async with connected(serve) as client, trio.open_nursery() as nursery:
        for n in range(FLOOD):
            nursery.start_soon(client.call_tool, "read_file", {"path": f"f{n}.txt"})
        await waiting_approvals(home, MAX_CALLS, within=5)
        await trio.sleep(1)
        loopd = await Client.open(home.broker_sock)
        await loopd.send(tool_request("read_file", {"path": "loopd.txt"}))
        assert (await loopd.final())["kind"] == "pending"
        # The attack ran: every call reached the serve; those over the cap wait there.
        assert serve.limiter.statistics().tasks_waiting == FLOOD - MAX_CALLS
        entries = (await admin(home, {"kind": "approvals"}))["entries"]
        assert len(entries) == MAX_CALLS + 1
        mine = [d for d in decisions(home) if d["session"] == serve.session]
        assert len(mine) == MAX_CALLS
        await loopd.aclose()
        nursery.cancel_scope.cancel()


async def test_oversized_arguments_are_refused_before_brokerd_reads_them(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    write_grants(home, grant("notes", "read_file", "auto"))
    (home.default_workspace / "notes.txt").write_text("Buy milk.\n")
    await brokerd.start()
    content = "x" * (2 * MAX_FRAME)
    async with connected(serve_on(home)) as client:
        big = await client.call_tool("write_file", {"path": "big.txt", "content": content})
        after = await client.call_tool("read_file", {"path": "notes.txt"})
    size = len(orjson.dumps({"path": "big.txt", "content": content}))
    assert big.is_error
    text = text_of(big)
    assert text.startswith("denied (bad_frame): the request is ")
    # The request really was over the cap: its arguments alone are twice it.
    request_bytes = int(text.split("the request is ")[1].split(" bytes")[0])
    assert request_bytes > size > 2 * MAX_FRAME
    assert text.endswith(f"broker.sock takes at most {MAX_FRAME}; see docs/runbook.md#mcp-serve")
    assert [d["tool"] for d in decisions(home)] == ["read_file"]
    assert text_of(after) == "Buy milk.\n"


async def test_a_client_cannot_ride_another_connections_session(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    """Connection A reads a secret and its session's taint rises; B names A's session in
    its arguments and in the request's _meta. B's calls stay in B's session: its write
    is allowed where A's is denied, and nothing is recorded in A's name."""
    write_grants(
        home,
        grant("reads", "read_file", "auto")
        + grant_table("writes", "write_file", "auto", max_taint='"internal"'),
    )
    (home.default_workspace / ".env").write_text("TOKEN=1\n")
    await brokerd.start()
    a, b = serve_on(home), serve_on(home)
    async with connected(a) as one, connected(b) as two:
        assert not (await one.call_tool("read_file", {"path": ".env"})).is_error
        denied = await one.call_tool("write_file", {"path": "a.txt", "content": "a"})
        riding = await two.call_tool(
            "write_file", {"path": "b.txt", "content": "b", "session": a.session}
        )
        claimed = await two.send_request(
            types.CallToolRequest(
                params=types.CallToolRequestParams(
                    name="write_file",
                    arguments={"path": "b.txt", "content": "b"},
                    _meta={"session": a.session},  # type: ignore[typeddict-unknown-key]
                )
            ),
            types.CallToolResult,
        )
    assert text_of(denied).startswith("denied (taint_exceeded): ")
    assert text_of(riding).startswith("denied (bad_arguments): ")
    assert (claimed.is_error, text_of(claimed)) == (False, "wrote 1 bytes to b.txt")
    sessions = [(d["tool"], d["session"]) for d in decisions(home)]
    assert sessions == [
        ("read_file", a.session),
        ("write_file", a.session),
        ("write_file", b.session),
        ("write_file", b.session),
    ]


@pytest.mark.parametrize(
    "name", ["approve", "admin.approve", "../shell", "shell ", "read_file\n", "é" * 70, ""]
)
async def test_a_tool_outside_the_catalogue_is_denied_by_brokerd(
    home: Home, brokerd: Brokerd, autojump_clock: Clock, name: str
) -> None:
    write_grants(home, grant("notes", "read_file", "auto"))
    (home.default_workspace / "notes.txt").write_text("Buy milk.\n")
    await brokerd.start()
    async with connected(serve_on(home)) as client:
        result = await client.call_tool(name, {"path": "notes.txt"})
        after = await client.call_tool("read_file", {"path": "notes.txt"})
    assert result.is_error
    assert text_of(result).startswith("denied (unknown_tool): ")
    # brokerd saw the name as sent, decided it, and goes on answering.
    assert [(d["tool"], d["reason"]) for d in decisions(home)] == [
        (name, "unknown_tool"),
        ("read_file", None),
    ]
    assert text_of(after) == "Buy milk.\n"


def test_the_serve_loads_no_way_to_admin_sock() -> None:
    """The serve holds a BrokerPort and nothing else: none of its modules loads the
    owner's admin client (checked in a fresh interpreter, on what is really loaded)."""
    script = textwrap.dedent(
        """
        import sys, orjson
        import boxmaker.mcp.serve, boxmaker.mcp.tools, boxmaker.mcp.permission
        loaded = sorted(m for m in sys.modules if m.startswith("boxmaker."))
        sys.stdout.buffer.write(orjson.dumps(loaded))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, check=True, timeout=60
    )
    loaded = orjson.loads(done.stdout)
    assert "boxmaker.mcp.serve" in loaded
    assert "boxmaker.loop.broker_port" in loaded
    assert not [m for m in loaded if m.startswith(("boxmaker.cli", "boxmaker.broker"))]
    sources = [
        (SRC / "mcp" / f"{module}.py").read_text() for module in ("serve", "tools", "permission")
    ]
    assert not [s for s in sources if "admin_sock" in s or "admin_client" in s]


def test_an_endless_line_ends_the_connection_and_the_serve_holds_at_most_its_cap(
    home: Home,
) -> None:
    """A client that writes a line without end: the serve reads at most MAX_MESSAGE of it,
    says why on stderr and ends the connection (exit 0). A line that is not JSON first is
    answered a parse error and the connection goes on. Before the serve's own transport,
    the SDK's read the whole line into memory, for as long as the client wrote."""
    with subprocess.Popen(
        [sys.executable, *SERVE_ARGV, "--home", str(home.root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=0,
    ) as serve:
        assert serve.stdin is not None
        assert serve.stdout is not None
        assert serve.stderr is not None
        try:
            serve.stdin.write(b"not json\n" + orjson.dumps(INITIALIZE) + b"\n")
            answer = orjson.loads(serve.stdout.readline())
            assert (answer["id"], answer["result"]["serverInfo"]["name"]) == (1, "boxmaker")
            sent = 0
            chunk = b"x" * 65536
            with contextlib.suppress(BrokenPipeError):
                while sent <= 2 * MAX_MESSAGE:
                    serve.stdin.write(chunk)
                    sent += len(chunk)
            # The attack ran: more than the cap was written, or the serve hung up first.
            assert sent > MAX_MESSAGE
            assert serve.wait(timeout=30) == 0
        finally:
            serve.kill()
        stderr = serve.stderr.read().decode()
    assert f"the client's message cannot be read (frame longer than {MAX_MESSAGE} bytes)" in stderr
