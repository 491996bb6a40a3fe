"""What the serve shows a client: catalogue entries as MCP tools, answers as results, and
the permission prompt's input and answers (pure functions, no brokerd)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from tests.harness.mcp_client import text_of

from boxmaker.core.catalogue import catalogue_tools
from boxmaker.core.vocabulary import AnswerOutcome
from boxmaker.loop.broker_port import PortAnswer
from boxmaker.mcp.permission import PermissionRequest, allow, deny, parse_prompt
from boxmaker.mcp.tools import ANNOTATIONS, CatalogueProblem, mcp_tool, tool_result


def test_every_builtin_tool_has_its_annotations_and_no_other_does() -> None:
    names = [entry["function"]["name"] for entry in catalogue_tools()]
    assert sorted(ANNOTATIONS) == sorted(names)
    gateway = {
        "type": "function",
        "function": {"name": "mcp.git.git_status", "parameters": {"type": "object"}},
    }
    tool = mcp_tool(gateway)
    # A tool the table does not know claims nothing, whatever its server said.
    assert (tool.name, tool.annotations, tool.description) == ("mcp.git.git_status", None, None)


@pytest.mark.parametrize(
    "entry",
    [
        {"type": "other", "function": {"name": "x"}},
        {"type": "function"},
        {"type": "function", "function": {"parameters": {}}},
        {"type": "function", "function": {"name": "x", "parameters": []}},
    ],
)
def test_an_entry_that_is_not_a_function_is_a_catalogue_problem(entry: dict[str, Any]) -> None:
    with pytest.raises(CatalogueProblem):
        mcp_tool(entry)


def test_answers_as_results() -> None:
    ok = tool_result(PortAnswer(AnswerOutcome.OK, content="Buy milk.\n"))
    assert (ok.is_error, text_of(ok)) == (False, "Buy milk.\n")
    empty = tool_result(PortAnswer(AnswerOutcome.OK))
    assert (empty.is_error, text_of(empty)) == (False, "")
    failed = tool_result(
        PortAnswer(AnswerOutcome.FAILED, content="partial", reason="tool_error", detail="boom")
    )
    assert (failed.is_error, text_of(failed)) == (True, "failed (tool_error): boom\npartial")
    bare = tool_result(PortAnswer(AnswerOutcome.DENIED, reason="no_grant"))
    assert (bare.is_error, text_of(bare)) == (True, "denied (no_grant)")


def test_a_claude_code_prompt_is_parsed_to_a_claude_tool() -> None:
    prompt = {"tool_name": "Bash", "input": {"command": "ls -la"}, "tool_use_id": "toolu_01"}
    request = parse_prompt(prompt)
    assert request == PermissionRequest("Bash", {"command": "ls -la"})
    assert isinstance(request, PermissionRequest)
    assert request.broker_tool == "claude.Bash"
    assert orjson.loads(allow(request)) == {
        "behavior": "allow",
        "updatedInput": {"command": "ls -la"},
    }


@pytest.mark.parametrize(
    ("prompt", "problem"),
    [
        ({"input": {}}, "bad_arguments: tool_name must be 1 to 64 of A-Z a-z 0-9 _ -, not None"),
        (
            {"tool_name": "", "input": {}},
            "bad_arguments: tool_name must be 1 to 64 of A-Z a-z 0-9 _ -, not ''",
        ),
        (
            {"tool_name": "x" * 65, "input": {}},
            f"bad_arguments: tool_name must be 1 to 64 of A-Z a-z 0-9 _ -, not {'x' * 65!r}",
        ),
        (
            {"tool_name": "mcp.git", "input": {}},
            "bad_arguments: tool_name must be 1 to 64 of A-Z a-z 0-9 _ -, not 'mcp.git'",
        ),
        (
            {"tool_name": "Bash\n", "input": {}},
            "bad_arguments: tool_name must be 1 to 64 of A-Z a-z 0-9 _ -, not 'Bash\\n'",
        ),
        ({"tool_name": "Bash"}, "bad_arguments: input must be a JSON object"),
        ({"tool_name": "Bash", "input": ["ls"]}, "bad_arguments: input must be a JSON object"),
    ],
)
def test_a_malformed_prompt_is_a_problem(prompt: dict[str, Any], problem: str) -> None:
    assert parse_prompt(prompt) == problem


def test_a_deny_carries_its_message() -> None:
    assert orjson.loads(deny('denied (no_grant): "x"')) == {
        "behavior": "deny",
        "message": 'denied (no_grant): "x"',
    }
