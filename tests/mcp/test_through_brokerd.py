"""MCP calls through the real brokerd (its sockets, its ledger, core's decisions) to a
real server in its sandbox: an auto call recorded with its definition hash after the
server's tool list, the session raised by the server's label, a tool not pinned denied
before anything runs, a withdrawn call cancelled at the server, every server stopped
with brokerd."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import trio
from tests.harness.broker import Client, body, call, records, records_of, running, tool_request
from tests.harness.cli import bxctl_in_process
from tests.harness.homes import grant, write_grants
from tests.harness.mcp_client import connected, serve_on, text_of
from tests.harness.mcp_servers import (
    echo_definition,
    fake_server,
    make_repository,
    pin_all,
    python_server,
    server_toml,
)
from tests.harness.sandbox import processes_with, sandbox_workspace, wait_gone

from boxmaker.core.external_tools import definition_hash
from boxmaker.home.paths import Home
from boxmaker.mcp.pins import read_pins

pytestmark = pytest.mark.slow
LIMIT = 30
SESSION = "s-00000000000a"


@pytest.fixture
def definition(home: Home) -> Iterator[Path]:
    """``home`` with the fake server as [mcp_servers.fake] and a workspace the sandbox
    can use; the file its echo description comes from."""
    with sandbox_workspace() as workspace:
        definition = workspace.parent / "definition" / "echo.txt"
        definition.parent.mkdir()
        server = fake_server(definition, call_timeout_s=5.0)
        config = home.config_toml.read_text()
        home.config_toml.write_text(
            f"workspace = {orjson.dumps(str(workspace)).decode()}\n{config}\n"
            + server_toml("fake", server)
        )
        yield definition


async def test_an_auto_call_is_decided_run_and_recorded_with_its_definition(
    home: Home, definition: Path
) -> None:
    pin_all(home, "fake", {"echo": echo_definition()})
    write_grants(home, grant("echo", "mcp.fake.echo", "auto"))
    digest = definition_hash(echo_definition())
    with trio.fail_after(LIMIT):
        async with running(home):
            [catalogue] = await call(home, {"kind": "catalogue", "v": 1})
            names = [tool["function"]["name"] for tool in catalogue["tools"]]
            assert "mcp.fake.echo" in names
            request = tool_request("mcp.fake.echo", {"text": "hello"}, session=SESSION)
            [answer] = await call(home, request)
            assert (answer["outcome"], answer["content"]) == ("ok", "hello"), answer
    kinds = [record["kind"] for record in records(home)]
    assert kinds.index("mcp_tools") < kinds.index("result")
    [tools] = [record for record in records(home) if record["kind"] == "mcp_tools"]
    assert (tools["server"], tools["tools"]["echo"]) == ("fake", digest)
    decision, result = records_of(home, request["call"])
    assert (decision["verdict"], decision["grant"], decision["definition"]) == (
        "run",
        "echo",
        digest,
    )
    assert body(result)["definition"] == digest
    assert (result["status"], result["label"]) == ("ok", {"taint": "internal", "untrusted": True})
    assert (result["taint_after"], result["untrusted_after"]) == ("internal", True)
    assert await wait_gone(str(definition)) == []  # stopped with brokerd


async def test_a_tool_not_pinned_is_denied_and_nothing_runs(home: Home, definition: Path) -> None:
    pin_all(home, "fake", {"echo": echo_definition()})
    write_grants(home, grant("all", "mcp.fake.*", "auto"))
    with trio.fail_after(LIMIT):
        async with running(home):
            [first] = await call(home, tool_request("mcp.fake.echo", {"text": "x"}))
            assert first["outcome"] == "ok"
            request = tool_request("mcp.fake.crash", {})
            [answer] = await call(home, request)
            assert (answer["outcome"], answer["reason"]) == ("denied", "tool_not_pinned")
            assert answer["detail"] == (
                "mcp.fake.crash is not pinned: run `bxctl mcp pin fake crash`; "
                "see docs/runbook.md#mcp-pin"
            )
            assert processes_with(str(definition))  # not crashed: it never ran
    [decision] = records_of(home, request["call"])
    assert (decision["verdict"], decision["reason"]) == ("deny", "tool_not_pinned")


async def test_a_withdrawn_call_is_cancelled_at_the_server(home: Home, definition: Path) -> None:
    empty = {"type": "object", "properties": {}}
    hang = {"name": "hang", "description": "Never answers.", "inputSchema": empty}
    pin_all(home, "fake", {"echo": echo_definition(), "hang": hang})
    write_grants(home, grant("all", "mcp.fake.*", "auto"))
    with trio.fail_after(LIMIT):
        async with running(home):
            client = await Client.open(home.broker_sock)
            request = tool_request("mcp.fake.hang", {})
            await client.send(request)
            await _logged(home, "hanging ")  # the call reached the server
            await client.aclose()  # the requester leaves while the call runs
            await _logged(home, "cancelled ")  # and the server heard it is cancelled
    _, result = records_of(home, request["call"])
    assert (result["status"], result["reason"], result["stopped"]) == (
        "failed",
        "requester_gone",
        True,
    )


async def _logged(home: Home, words: str) -> None:
    path = home.mcp_log("fake")
    while not path.exists() or words not in path.read_text():  # noqa: ASYNC110
        await trio.sleep(0.05)


async def test_mcp_server_git_pinned_with_bxctl_then_called_through_brokerd(
    home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    with sandbox_workspace() as workspace:
        repository = make_repository(workspace)
        git = python_server(
            "-m",
            "mcp_server_git",
            "--repository",
            str(repository),
            read_only_paths=(str(repository),),
        )
        config = home.config_toml.read_text()
        home.config_toml.write_text(
            f"workspace = {orjson.dumps(str(workspace)).decode()}\n{config}\n"
            + server_toml("git", git)
        )
        with trio.fail_after(LIMIT):
            # The owner pins what the server lists, as bxctl shows it.
            assert await bxctl_in_process(home, "mcp", "pin", "git", "git_status", "--yes") == 0
        assert "not pinned: mcp.git.git_status" in capsys.readouterr().out
        [pin] = read_pins(home.mcp_pins)["git"].values()
        write_grants(home, grant("status", "mcp.git.git_status", "auto"))
        request = tool_request("mcp.git.git_status", {"repo_path": str(repository)})
        with trio.fail_after(LIMIT):
            async with running(home):
                [answer] = await call(home, request)
    assert answer["outcome"] == "ok", answer
    assert "On branch main" in answer["content"]
    assert "notes.txt" in answer["content"]
    decision, result = records_of(home, request["call"])
    assert decision["definition"] == body(result)["definition"] == pin.sha256
    [tools] = [record for record in records(home) if record["kind"] == "mcp_tools"]
    assert tools["tools"]["git_status"] == pin.sha256


async def test_both_ways_an_mcp_client_calls_a_sandboxed_servers_tool_through_brokerd(
    home: Home, definition: Path
) -> None:
    """An MCP client, through `bxctl mcp serve`'s server, calls the fake server's tool:
    the client sees brokerd's catalogue (the gateway's pinned tool under its client
    name), and the call is brokerd's, decided and recorded, run in the server's sandbox."""
    pin_all(home, "fake", {"echo": echo_definition()})
    write_grants(home, grant("echo", "mcp.fake.echo", "auto"))
    with trio.fail_after(LIMIT):
        async with running(home), connected(serve_on(home)) as client:
            listed = {tool.name: tool for tool in (await client.list_tools()).tools}
            assert listed["mcp__fake__echo"].description == "Echo the text back."
            result = await client.call_tool("mcp__fake__echo", {"text": "both ways"})
    assert (result.is_error, text_of(result)) == (False, "both ways")
    [decision] = [r for r in records(home) if r["kind"] == "decision"]
    assert (decision["tool"], decision["verdict"]) == ("mcp.fake.echo", "run")
    assert decision["definition"] == definition_hash(echo_definition())
