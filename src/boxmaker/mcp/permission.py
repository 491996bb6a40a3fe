"""The ``permission_prompt`` tool: a client's own tools decided by brokerd (docs/mcp.md).

A client that asks an MCP tool before it runs one of its own tools (Claude Code's
``--permission-prompt-tool``) calls it with ``{tool_name, input, tool_use_id?}``. The
serve asks brokerd about the tool ``claude.<tool_name>`` with ``input`` as its
arguments; brokerd decides it with the owner's grants (``tool = "claude.Bash"``), asks
the owner where a grant says ``ask``, and records it. Nothing runs in brokerd: the client
runs its tool itself when the answer allows it.

The answer is the text the client reads: JSON ``{"behavior": "allow", "updatedInput":
{...}}`` (the input as it was asked about, never changed) or ``{"behavior": "deny",
"message": "..."}`` with the reason code and detail. Every problem is a deny, never an
error: a client that cannot read the answer must not take it for an allow.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import attrs
import orjson

from boxmaker.core.external_tools import CLAUDE_PREFIX, is_claude_name

PERMISSION_TOOL: Final = "permission_prompt"
BAD_PROMPT: Final = "bad_arguments"

INPUT_SCHEMA: Final[Mapping[str, Any]] = {
    "type": "object",
    "properties": {
        "tool_name": {"type": "string", "description": "The client's tool, e.g. Bash."},
        "input": {"type": "object", "description": "The arguments it would run with."},
        "tool_use_id": {"type": "string", "description": "The client's id of the use."},
    },
    "required": ["tool_name", "input"],
}
DESCRIPTION: Final = (
    "Decide whether the client may run one of its own tools (Bash, Edit, ...): brokerd "
    "decides it with the owner's grants for claude.<tool_name>, asking the owner where "
    'a grant says ask. Answers JSON: {"behavior":"allow","updatedInput":{...}} or '
    '{"behavior":"deny","message":"..."}.'
)


@attrs.frozen
class PermissionRequest:
    """A well-formed permission prompt: the tool brokerd decides and its arguments."""

    tool_name: str
    input: dict[str, Any]

    @property
    def broker_tool(self) -> str:
        return CLAUDE_PREFIX + self.tool_name


def parse_prompt(arguments: Mapping[str, Any]) -> PermissionRequest | str:
    """The request in ``arguments``, or why it is not one (for a deny's message).

    >>> parse_prompt({"tool_name": "Bash", "input": {"command": "ls"}}).broker_tool
    'claude.Bash'
    >>> parse_prompt({"tool_name": "a.b", "input": {}})
    "bad_arguments: tool_name must be 1 to 64 of A-Z a-z 0-9 _ -, not 'a.b'"
    """
    tool_name, tool_input = arguments.get("tool_name"), arguments.get("input")
    if not isinstance(tool_name, str) or not is_claude_name(CLAUDE_PREFIX + tool_name):
        return f"{BAD_PROMPT}: tool_name must be 1 to 64 of A-Z a-z 0-9 _ -, not {tool_name!r:.80}"
    if not isinstance(tool_input, dict):
        return f"{BAD_PROMPT}: input must be a JSON object"
    return PermissionRequest(tool_name, tool_input)


def allow(request: PermissionRequest) -> str:
    """The client may run its tool with the input brokerd decided on.

    >>> allow(PermissionRequest("Bash", {"command": "ls"}))
    '{"behavior":"allow","updatedInput":{"command":"ls"}}'
    """
    return orjson.dumps({"behavior": "allow", "updatedInput": request.input}).decode()


def deny(message: str) -> str:
    """The client must not run its tool; ``message`` says why.

    >>> deny("denied (no_grant): no grant allows claude.Bash")
    '{"behavior":"deny","message":"denied (no_grant): no grant allows claude.Bash"}'
    """
    return orjson.dumps({"behavior": "deny", "message": message}).decode()
