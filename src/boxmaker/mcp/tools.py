"""What ``bxctl mcp serve`` shows an MCP client: brokerd's catalogue as MCP tools, with
annotations that are true, and brokerd's answers as tool results.

Annotations are hints a client shows or uses to skip its own prompt; they never grant
anything (brokerd decides every call). So only what holds of the tool itself is
claimed, from :data:`ANNOTATIONS`; a tool this table does not know (a gateway's
``mcp.*`` tool) is offered with no annotations, which a client reads as the worst case
(not read-only, destructive, open world).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

import attrs
import mcp_types as types

from boxmaker.core.vocabulary import AnswerOutcome
from boxmaker.loop.broker_port import PortAnswer

ANNOTATIONS: Final[Mapping[str, types.ToolAnnotations]] = {
    # Reads of the workspace: nothing changes, nothing leaves the machine.
    "read_file": types.ToolAnnotations(read_only_hint=True, open_world_hint=False),
    "list_dir": types.ToolAnnotations(read_only_hint=True, open_world_hint=False),
    # Replaces a file of the workspace: the same call twice leaves the same file.
    "write_file": types.ToolAnnotations(
        read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False
    ),
    # Any command in the sandbox, on the workspace, with no network.
    "shell": types.ToolAnnotations(
        read_only_hint=False, destructive_hint=True, open_world_hint=False
    ),
    # Reaches outside hosts; a GET can have effects there, so nothing else is claimed.
    "http_get": types.ToolAnnotations(read_only_hint=False, open_world_hint=True),
}
"""The annotations of brokerd's built-in tools (docs/mcp.md, "What a client is told")."""


CLIENT_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""A tool name that Claude Code, Claude Desktop, Codex CLI and the model APIs behind them
all take."""


class CatalogueProblem(ValueError):
    """brokerd's catalogue holds an entry that is not an OpenAI-format function."""


def client_name(broker_name: str) -> str:
    """The name a client is offered for brokerd's tool ``broker_name``: dots become
    ``__``, since the model APIs behind the common clients refuse a dot in a tool name
    (and one such name withholds a client's whole tool list).

    >>> client_name("mcp.git.git_status"), client_name("read_file")
    ('mcp__git__git_status', 'read_file')
    """
    return broker_name.replace(".", "__")


@attrs.frozen
class Offered:
    """The tools a client is offered, and how its names map back to brokerd's."""

    tools: list[types.Tool]
    broker_names: Mapping[str, str]
    """The client's name of each offered tool -> brokerd's name for it."""
    left_out: list[str]
    """Each of brokerd's tools not offered, and why (for the serve's log)."""


def offered_tools(catalogue: list[dict[str, Any]]) -> Offered:
    """brokerd's catalogue as the client sees it. A tool whose client name would not be a
    name every common client takes (:data:`CLIENT_NAME`), or would be another tool's, is
    left out: offering it would break the client's whole list, or call the wrong tool.

    >>> entry = lambda name: {"type": "function", "function": {"name": name}}
    >>> offered = offered_tools([entry("mcp.a__b.c"), entry("mcp.a.b__c"), entry("a b")])
    >>> [tool.name for tool in offered.tools], dict(offered.broker_names)
    (['mcp__a__b__c'], {'mcp__a__b__c': 'mcp.a__b.c'})
    >>> offered.left_out[0]
    'mcp.a.b__c: its name for clients, mcp__a__b__c, already names mcp.a__b.c'
    >>> offered.left_out[1]
    'a b: its name for clients, a b, is not [A-Za-z0-9_-]{1,64}'
    """
    tools: list[types.Tool] = []
    names: dict[str, str] = {}
    left_out: list[str] = []
    for entry in catalogue:
        tool = mcp_tool(entry)
        offered = client_name(tool.name)
        if not CLIENT_NAME.fullmatch(offered):
            left_out.append(
                f"{tool.name}: its name for clients, {offered}, is not {CLIENT_NAME.pattern}"
            )
        elif offered in names:
            left_out.append(
                f"{tool.name}: its name for clients, {offered}, already names {names[offered]}"
            )
        else:
            names[offered] = tool.name
            title = None if offered == tool.name else tool.name
            tools.append(tool.model_copy(update={"name": offered, "title": title}))
    return Offered(tools, names, left_out)


def mcp_tool(entry: Mapping[str, Any]) -> types.Tool:
    """One entry of brokerd's ``catalogue`` frame (OpenAI's tool format) as an MCP tool.

    >>> tool = mcp_tool({"type": "function", "function": {"name": "list_dir",
    ...     "description": "List.", "parameters": {"type": "object"}}})
    >>> (tool.name, tool.input_schema, tool.annotations.read_only_hint)
    ('list_dir', {'type': 'object'}, True)
    """
    function = entry.get("function")
    if entry.get("type") != "function" or not isinstance(function, Mapping):
        raise CatalogueProblem(f"not a function: {entry!r:.200}")
    name, parameters = function.get("name"), function.get("parameters", {"type": "object"})
    if not isinstance(name, str) or not isinstance(parameters, Mapping):
        raise CatalogueProblem(f"a function without a name or parameters: {entry!r:.200}")
    description = function.get("description")
    return types.Tool(
        name=name,
        description=description if isinstance(description, str) else None,
        input_schema=dict(parameters),
        annotations=ANNOTATIONS.get(name),
    )


def tool_result(answer: PortAnswer) -> types.CallToolResult:
    """brokerd's answer as a tool result: ``ok`` is the tool's output; ``denied`` and
    ``failed`` are an error result whose text starts with the outcome and the reason
    code, then the detail (what the model can act on), then any output.

    An error *result*, not an exception: a client shows an exception raised in a tool
    only as "Error executing tool …", and the reason would be lost.

    >>> denied = PortAnswer(AnswerOutcome.DENIED, reason="no_grant", detail="No.")
    >>> tool_result(denied).content[0].text
    'denied (no_grant): No.'
    """
    if answer.outcome is AnswerOutcome.OK:
        return text_result(answer.content or "")
    return text_result(error_text(answer), is_error=True)


def error_text(answer: PortAnswer) -> str:
    """``denied (reason): detail``, and below it what output there was."""
    text = f"{answer.outcome} ({answer.reason})"
    if answer.detail:
        text += f": {answer.detail}"
    if answer.content:
        text += f"\n{answer.content}"
    return text


def text_result(text: str, *, is_error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], is_error=is_error
    )
