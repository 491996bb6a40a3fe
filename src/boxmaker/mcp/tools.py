"""What ``bxctl mcp serve`` shows an MCP client: brokerd's catalogue as MCP tools, with
annotations that are true, and brokerd's answers as tool results.

Annotations are hints a client shows or uses to skip its own prompt; they never grant
anything (brokerd decides every call). So only what holds of the tool itself is
claimed, from :data:`ANNOTATIONS`; a tool this table does not know (a gateway's
``mcp.*`` tool) is offered with no annotations, which a client reads as the worst case
(not read-only, destructive, open world).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

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


class CatalogueProblem(ValueError):
    """brokerd's catalogue holds an entry that is not an OpenAI-format function."""


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
