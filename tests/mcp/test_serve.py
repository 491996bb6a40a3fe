"""``bxctl mcp serve``'s server in process: the SDK's own ``ClientSession`` on memory
streams, the real brokerd on its sockets, the autojump clock (docs/mcp.md)."""

from __future__ import annotations

import functools

import mcp_types as types
import orjson
import pytest
import trio
import trio.testing
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError
from mcp.shared.memory import create_client_server_memory_streams
from tests.harness.broker import (
    PENDING_TIMEOUT,
    Brokerd,
    admin,
    eventually,
    records,
    records_of,
    waiting_approvals,
)
from tests.harness.homes import grant, write_grants
from tests.harness.mcp_client import connected, serve_on, text_of

from boxmaker.core.catalogue import catalogue_tools
from boxmaker.home.paths import Home
from boxmaker.mcp.serve import PROGRESS_S
from boxmaker.mcp.tools import ANNOTATIONS

pytestmark = pytest.mark.usefixtures("inline_threads")

Clock = trio.testing.MockClock


def decision_of(home: Home, tool: str) -> dict[str, object]:
    [decision] = [r for r in records(home) if r.get("tool") == tool]
    return decision


async def test_the_tools_are_brokerds_catalogue_and_the_permission_prompt(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    await brokerd.start()
    async with connected(serve_on(home)) as client:
        listed = (await client.list_tools()).tools
    catalogue = [entry["function"] for entry in catalogue_tools()]
    assert [tool.name for tool in listed] == [
        *(function["name"] for function in catalogue),
        "permission_prompt",
    ]
    for tool, function in zip(listed, catalogue, strict=False):
        assert (tool.description, tool.input_schema) == (
            function["description"],
            function["parameters"],
        )
        assert tool.annotations == ANNOTATIONS[tool.name]
    hints = {t.name: t.annotations for t in listed}
    assert [name for name, a in hints.items() if a and a.read_only_hint] == [
        "read_file",
        "list_dir",
    ]
    assert [name for name, a in hints.items() if a and a.destructive_hint] == [
        "write_file",
        "shell",
    ]
    assert [name for name, a in hints.items() if a and a.open_world_hint] == ["http_get"]
    assert hints["permission_prompt"] is None


async def test_an_auto_read_is_the_files_text_in_the_serves_own_session(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    write_grants(home, grant("notes", "read_file", "auto"))
    (home.default_workspace / "notes.txt").write_text("Buy milk.\n")
    await brokerd.start()
    first, second = serve_on(home), serve_on(home)
    assert first.session != second.session
    async with connected(first) as one, connected(second) as two:
        read = await one.call_tool("read_file", {"path": "notes.txt"})
        await two.call_tool("read_file", {"path": "notes.txt"})
    assert (read.is_error, text_of(read)) == (False, "Buy milk.\n")
    sessions = [r["session"] for r in records(home) if r["kind"] == "decision"]
    assert sessions == [first.session, second.session]


async def test_a_denial_is_an_error_result_with_the_reason_code_and_detail(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    await brokerd.start()
    async with connected(serve_on(home)) as client:
        denied = await client.call_tool("shell", {"command": "ls"})
        unknown = await client.call_tool("rm_rf", {})
    assert (denied.is_error, text_of(denied)) == (
        True,
        "denied (no_grant): no grant allows shell on ls",
    )
    assert unknown.is_error
    assert text_of(unknown).startswith("denied (unknown_tool): ")
    assert decision_of(home, "rm_rf")["reason"] == "unknown_tool"


async def test_an_ask_waits_with_progress_until_the_owner_approves(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    write_grants(home, grant("notes", "read_file", "ask"))
    (home.default_workspace / "notes.txt").write_text("Buy milk.\n")
    await brokerd.start()
    progress: list[tuple[float, float | None, str | None]] = []

    async def heard(done: float, total: float | None, message: str | None) -> None:
        progress.append((done, total, message))

    async with connected(serve_on(home)) as client, trio.open_nursery() as nursery:
        results: list[types.CallToolResult] = []

        async def ask() -> None:
            results.append(
                await client.call_tool("read_file", {"path": "notes.txt"}, progress_callback=heard)
            )

        nursery.start_soon(ask)
        [entry] = await waiting_approvals(home, within=1)
        await trio.sleep(2 * PROGRESS_S + 0.5)
        approved = await admin(home, {"kind": "approve", "approval": entry["approval"]})
        assert approved["outcome"] == "ask", approved
    [result] = results
    assert (result.is_error, text_of(result)) == (False, "Buy milk.\n")
    assert [round(done) for done, _, _ in progress] == [0, 5, 10]
    assert [total for _, total, _ in progress] == [pytest.approx(PENDING_TIMEOUT, abs=0.5)] * 3
    message = progress[0][2]
    assert message is not None
    assert message.startswith(
        f"waiting for the owner: bxctl approve {entry['approval']} (grant notes)"
    )


async def test_a_refusal_and_an_expiry_reach_the_client_with_their_reasons(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    write_grants(home, grant("notes", "read_file", "ask"))
    await brokerd.start()
    async with connected(serve_on(home)) as client, trio.open_nursery() as nursery:
        results: dict[str, types.CallToolResult] = {}

        async def ask(path: str) -> None:
            results[path] = await client.call_tool("read_file", {"path": path})

        nursery.start_soon(ask, "refused.txt")
        [entry] = await waiting_approvals(home, within=1)
        await admin(home, {"kind": "refuse", "approval": entry["approval"], "reason": "not now"})
        await eventually(lambda: "refused.txt" in results)
        nursery.start_soon(ask, "expired.txt")
    assert text_of(results["refused.txt"]) == "denied (refused): not now"
    assert results["expired.txt"].is_error
    expired = text_of(results["expired.txt"])
    assert expired == f"denied (expired): no approval within {PENDING_TIMEOUT:g} s"


async def test_a_call_the_client_cancels_is_withdrawn_at_brokerd(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    write_grants(home, grant("notes", "read_file", "ask"))
    broker = await brokerd.start()
    async with connected(serve_on(home)) as client:
        with trio.move_on_after(3) as waited:
            await client.call_tool("read_file", {"path": "notes.txt"})
        assert waited.cancelled_caught
        [decision] = [r for r in records(home) if r["kind"] == "decision"]
        await eventually(lambda: len(records_of(home, decision["call"])) == 2)
        # The connection goes on: the next call is answered.
        assert (await client.call_tool("shell", {"command": "ls"})).is_error
    [_, withdrawn] = records_of(home, decision["call"])
    assert (withdrawn["kind"], withdrawn["outcome"], withdrawn["reason"], withdrawn["by"]) == (
        "approval",
        "withdrawn",
        "requester_gone",
        "broker",
    )
    assert len(broker.table) == 0


async def test_a_client_that_hangs_up_withdraws_its_waiting_call(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    """The client's end of the wire closes (EOF at the server) while a call waits."""
    write_grants(home, grant("notes", "read_file", "ask"))
    await brokerd.start()
    server = serve_on(home).server()
    async with (
        create_client_server_memory_streams() as (client_streams, server_streams),
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(
            functools.partial(server.run, *server_streams, server.create_initialization_options())
        )
        async with ClientSession(*client_streams) as client:
            await client.initialize()

            async def call_left_unanswered() -> None:
                with pytest.raises(MCPError, match="Connection closed"):
                    await client.call_tool("read_file", {"path": "notes.txt"})

            nursery.start_soon(call_left_unanswered)
            await waiting_approvals(home, within=1)
            await client_streams[1].aclose()
            [decision] = [r for r in records(home) if r["kind"] == "decision"]
            await eventually(lambda: len(records_of(home, decision["call"])) == 2)
            nursery.cancel_scope.cancel()
    assert records_of(home, decision["call"])[1]["reason"] == "requester_gone"


async def test_brokerd_down_is_an_error_that_says_to_start_it(
    home: Home, autojump_clock: Clock
) -> None:
    async with connected(serve_on(home)) as client:
        read = await client.call_tool("read_file", {"path": "notes.txt"})
        with pytest.raises(
            MCPError, match=r"denied \(broker_unreachable\): brokerd is not running"
        ):
            await client.list_tools()
    assert read.is_error
    assert text_of(read).startswith("denied (broker_unreachable): brokerd is not running (")
    assert text_of(read).endswith("start the daemons with `bxctl up`")


async def test_a_malformed_permission_prompt_is_denied_without_asking_brokerd(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    await brokerd.start()
    async with connected(serve_on(home)) as client:
        result = await client.call_tool(
            "permission_prompt", {"tool_name": "mcp.git.x", "input": {}}
        )
    assert not result.is_error  # the client reads the answer, never an error
    assert orjson.loads(text_of(result)) == {
        "behavior": "deny",
        "message": "bad_arguments: tool_name must be 1 to 64 of A-Z a-z 0-9 _ -, not 'mcp.git.x'",
    }
    assert [r for r in records(home) if r["kind"] == "decision"] == []
