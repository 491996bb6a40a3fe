"""A gateway's tools (``mcp.<server>.<tool>``) offered under names every common client
takes, and each call sent to brokerd under brokerd's own name. brokerd is a double
here that answers at once and keeps each request: the gateway's tools are not in the
real brokerd's catalogue on this branch."""

from __future__ import annotations

from typing import Any

import attrs
import mcp_types as types
import pytest
import trio
import trio.testing
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError
from tests.harness.mcp_client import connected, text_of

from boxmaker.core.catalogue import catalogue_tools
from boxmaker.core.vocabulary import AnswerOutcome, ToolRequest
from boxmaker.loop.broker_port import OnPending, PortAnswer
from boxmaker.mcp.serve import McpServe

Clock = trio.testing.MockClock
GIT_STATUS = {
    "type": "function",
    "function": {
        "name": "mcp.git.git_status",
        "description": "Shows the working tree status.",
        "parameters": {"type": "object", "properties": {"repo_path": {"type": "string"}}},
    },
}


@attrs.define
class RecordingBroker:
    """brokerd's two answers a serve needs: its catalogue, and ok to every call."""

    catalogue_entries: list[dict[str, Any]]
    requests: list[ToolRequest] = attrs.field(factory=list)
    catalogues: int = 0

    async def catalogue(self) -> list[dict[str, Any]]:
        self.catalogues += 1
        await trio.lowlevel.checkpoint()
        return self.catalogue_entries

    async def call(self, request: ToolRequest, on_pending: OnPending | None = None) -> PortAnswer:
        self.requests.append(request)
        await trio.lowlevel.checkpoint()
        return PortAnswer(AnswerOutcome.OK, content=f"ran {request.tool}")


def serve_with(broker: RecordingBroker) -> McpServe:
    return McpServe(broker)  # type: ignore[arg-type]


async def test_a_gateway_tool_is_offered_without_dots_and_called_by_brokerds_name(
    autojump_clock: Clock,
) -> None:
    broker = RecordingBroker([*catalogue_tools(), GIT_STATUS])
    async with connected(serve_with(broker)) as client:
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
        result = await client.call_tool("mcp__git__git_status", {"repo_path": "/w"})
        builtin = await client.call_tool("read_file", {"path": "a"})
    git = listed["mcp__git__git_status"]
    assert (git.title, git.description, git.input_schema, git.annotations) == (
        "mcp.git.git_status",
        "Shows the working tree status.",
        GIT_STATUS["function"]["parameters"],  # type: ignore[index]
        None,
    )
    assert listed["read_file"].title is None
    assert (text_of(result), text_of(builtin)) == ("ran mcp.git.git_status", "ran read_file")
    assert [(r.tool, r.arguments) for r in broker.requests] == [
        ("mcp.git.git_status", {"repo_path": "/w"}),
        ("read_file", {"path": "a"}),
    ]


async def bare_call(client: ClientSession, name: str) -> None:
    """tools/call as a client that kept its list from another time sends it (the SDK's
    call_tool lists the tools first when it has not)."""
    params = types.CallToolRequestParams(name=name, arguments={})
    await client.send_request(types.CallToolRequest(params=params), types.CallToolResult)


async def test_a_call_before_any_list_asks_the_catalogue_once(autojump_clock: Clock) -> None:
    broker = RecordingBroker([GIT_STATUS])
    async with connected(serve_with(broker)) as client:
        await bare_call(client, "read_file")  # no "__": no catalogue needed
        assert broker.catalogues == 0
        await bare_call(client, "mcp__git__git_status")
        await bare_call(client, "mcp__git__git_status")
        await bare_call(client, "mcp__git__gone")
    assert broker.catalogues == 1
    # A name the catalogue does not offer goes to brokerd as it is, for it to decide.
    assert [r.tool for r in broker.requests] == [
        "read_file",
        "mcp.git.git_status",
        "mcp.git.git_status",
        "mcp__git__gone",
    ]


async def test_a_name_two_tools_would_share_offers_only_the_first(autojump_clock: Clock) -> None:
    first = {"type": "function", "function": {"name": "mcp.a__b.c"}}
    second = {"type": "function", "function": {"name": "mcp.a.b__c"}}
    broker = RecordingBroker([first, second])
    async with connected(serve_with(broker)) as client:
        names = [tool.name for tool in (await client.list_tools()).tools]
        await client.call_tool("mcp__a__b__c", {})
    assert names == ["mcp__a__b__c", "permission_prompt"]
    assert [r.tool for r in broker.requests] == ["mcp.a__b.c"]


async def test_a_catalogue_entry_that_is_no_function_is_an_error_naming_the_runbook(
    autojump_clock: Clock,
) -> None:
    broker = RecordingBroker([{"type": "other", "function": {"name": "x"}}])
    async with connected(serve_with(broker)) as client:
        with pytest.raises(MCPError) as raised:
            await client.list_tools()
    assert str(raised.value) == (
        "brokerd's catalogue cannot be offered (not a function: {'type': 'other', "
        "'function': {'name': 'x'}}); see docs/runbook.md#mcp-serve"
    )
