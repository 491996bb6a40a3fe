"""External tools in the pure core (core/external_tools.py, core/catalogue.py): their
names, the definition hash, the arguments' caps, the input schema, and check_arguments'
exact reasons and details for each (docs/protocol.md, "Tool names")."""

from __future__ import annotations

import hashlib
import urllib.request
from typing import Any, Final

import attrs
import pytest

from boxmaker.core.catalogue import (
    ArgumentProblem,
    CheckedArguments,
    ExternalArgs,
    check_arguments,
    external_catalogue_tools,
    result_label,
)
from boxmaker.core.external_tools import (
    ASSUMED_LABEL,
    EMPTY_CATALOGUE,
    MAX_ARGUMENT_BYTES,
    MAX_NESTING,
    ExternalTool,
    ToolState,
    assumed_catalogue,
    canonical_json,
    claude_tool,
    definition_hash,
    is_claude_name,
    is_external,
    is_mcp_name,
    is_tool_pattern,
    json_problem,
    mcp_name,
    not_pinned_detail,
    server_of,
    tool_patterns,
)
from boxmaker.core.labels import FRESH, Label, LabelRules, Taint
from boxmaker.core.reasons import Reason

UNTRUSTED: Final = Label(Taint.PUBLIC, True)
SCHEMA: Final = {
    "type": "object",
    "properties": {"repo_path": {"type": "string"}, "max_count": {"type": "integer"}},
    "required": ["repo_path"],
    "additionalProperties": False,
}


def tool(
    name: str = "mcp.git.git_log",
    schema: Any = SCHEMA,
    state: ToolState = ToolState.ACCEPTED,
    definition: str | None = "d1",
) -> ExternalTool:
    return ExternalTool(name, "Show the log.", schema, UNTRUSTED, definition, False, state)


def catalogue(*tools: ExternalTool) -> dict[str, ExternalTool]:
    return {each.name: each for each in tools}


# ---------------------------------------------------------------------------------------
# Names


@pytest.mark.parametrize(
    "name",
    ["mcp.git.git_log", "mcp.a.B", "mcp.0-_x.Tool-1_", "mcp." + "s" * 63 + "." + "t" * 64],
)
def test_valid_mcp_names(name: str) -> None:
    assert is_mcp_name(name)
    assert not is_claude_name(name)
    assert is_external(name)


@pytest.mark.parametrize(
    "name",
    [
        "mcp.git",
        "mcp..x",
        "mcp.git.",
        "mcp.Git.x",  # a server name is lower case
        "mcp._git.x",  # and starts with a letter or digit
        "mcp." + "s" * 64 + ".x",
        "mcp.git." + "t" * 65,
        "mcp.git.a.b",
        "mcp.git.*",
        "mcp.git.git log",
        "mcp.git.git_log\n",
        "mcp.g\u0456t.log",  # a Cyrillic i
        "mcp.git.\uff4cog",  # a fullwidth l
        "MCP.git.log",
        " mcp.git.log",
    ],
)
def test_invalid_mcp_names(name: str) -> None:
    assert not is_mcp_name(name)
    assert server_of(name) is None
    assert tool_patterns(name) == ()


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("claude.Bash", True),
        ("claude.mcp__x-1", True),
        ("claude." + "N" * 64, True),
        ("claude." + "N" * 65, False),
        ("claude.", False),
        ("claude.*", False),
        ("claude.Ba sh", False),
        ("claude.Bash.x", False),
        ("claude.B\u0430sh", False),  # a Cyrillic a
        ("Claude.Bash", False),
    ],
)
def test_claude_names(name: str, valid: bool) -> None:
    assert is_claude_name(name) is valid


def test_is_external_is_only_the_prefix() -> None:
    assert [is_external(n) for n in ("mcp.", "claude.", "mcp", "claudeX", "read_file")] == [
        True,
        True,
        False,
        False,
        False,
    ]


def test_mcp_name_joins_what_can_be_a_name_only() -> None:
    assert mcp_name("git", "git_log") == "mcp.git.git_log"
    assert mcp_name("git-2", "A-b_9") == "mcp.git-2.A-b_9"
    assert mcp_name("git", "x" * 65) is None
    assert mcp_name("git", "") is None
    assert mcp_name("git", "a.b") is None
    assert mcp_name("Git", "x") is None
    assert mcp_name("", "x") is None
    assert mcp_name("g" * 64, "x") is None


def test_server_and_patterns_of_a_name() -> None:
    assert server_of("mcp.git-hub.x") == "git-hub"
    assert tool_patterns("mcp.git-hub.x") == ("mcp.git-hub.x", "mcp.git-hub.*", "mcp.*")
    assert tool_patterns("claude.Edit") == ("claude.Edit", "claude.*")
    assert tool_patterns("claude.") == ()


@pytest.mark.parametrize(
    ("pattern", "valid"),
    [
        ("mcp.*", True),
        ("claude.*", True),
        ("mcp.git.*", True),
        ("mcp.git.git_log", True),
        ("claude.Bash", True),
        ("mcp.**", False),
        ("mcp.git.**", False),
        ("mcp.*.git_log", False),
        ("mcp.git.git_*", False),
        ("claude.B*", False),
        ("claude.*.x", False),
        ("mcp.Git.*", False),
        ("*", False),
        ("mcp", False),
        ("read_file", False),
    ],
)
def test_grant_tool_patterns(pattern: str, valid: bool) -> None:
    assert is_tool_pattern(pattern) is valid


# ---------------------------------------------------------------------------------------
# The definition hash and canonical JSON


def test_definition_hash_is_sha256_of_the_canonical_definition() -> None:
    listed = {
        "name": "git_log",
        "title": "Log",
        "description": "Shöw",
        "inputSchema": {"type": "object", "b": 1, "a": [2, None]},
        "outputSchema": {"type": "object"},
        "annotations": {"readOnlyHint": True},
        "_meta": {"left": "out"},
        "icons": [],
    }
    text = (
        '{"annotations":{"readOnlyHint":true},"description":"Shöw",'
        '"inputSchema":{"a":[2,null],"b":1,"type":"object"},"name":"git_log",'
        '"outputSchema":{"type":"object"},"title":"Log"}'
    )
    assert definition_hash(listed) == hashlib.sha256(text.encode()).hexdigest()


def test_every_part_of_the_definition_changes_the_hash() -> None:
    base = {"name": "a", "title": "t", "description": "d", "inputSchema": {}, "outputSchema": {}}
    base["annotations"] = {}
    hashes = {definition_hash(base)}
    for key in base:
        hashes.add(definition_hash(base | {key: "changed"}))
        hashes.add(definition_hash({k: v for k, v in base.items() if k != key}))
    assert len(hashes) == 1 + 2 * len(base)


def test_a_lone_surrogate_in_a_definition_is_hashed_not_refused() -> None:
    # A server's JSON may escape half a surrogate pair; Python's json reads it as is.
    text = '{"name":"\ud800"}'.encode("utf-8", "surrogatepass")
    assert definition_hash({"name": "\ud800"}) == hashlib.sha256(text).hexdigest()


def test_canonical_json_is_sorted_compact_and_not_escaped() -> None:
    assert canonical_json({"b": "é", "a": [1.5, True]}) == '{"a":[1.5,true],"b":"é"}'
    with pytest.raises(ValueError, match="Out of range float"):
        canonical_json(float("inf"))


# ---------------------------------------------------------------------------------------
# The arguments' caps


def nested(depth: int) -> dict[str, Any]:
    """An object ``depth`` levels deep (the object itself is level 1)."""
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def test_nesting_up_to_the_cap_and_one_more() -> None:
    assert json_problem(nested(MAX_NESTING)) is None
    assert json_problem(nested(MAX_NESTING + 1)) == "arguments nest deeper than 32 levels"
    assert json_problem({"a": [[[]]]}) is None
    assert json_problem({"a": [1, "x", None, True, 1.5]}) is None


def test_a_scalar_before_a_deep_value_does_not_end_the_walk() -> None:
    # The walk takes the last value first: here the scalar, then the deep one.
    assert json_problem({"a": nested(MAX_NESTING), "b": 1}) == (
        "arguments nest deeper than 32 levels"
    )


def test_lists_count_as_levels_too() -> None:
    value: Any = "leaf"
    for _ in range(MAX_NESTING):
        value = [value]
    assert json_problem({"a": value}) == "arguments nest deeper than 32 levels"
    assert json_problem({"a": value[0]}) is None


def test_size_up_to_the_cap_and_one_byte_more() -> None:
    overhead = len('{"a":""}')
    exact = {"a": "x" * (MAX_ARGUMENT_BYTES - overhead)}
    assert len(canonical_json(exact).encode()) == MAX_ARGUMENT_BYTES
    assert json_problem(exact) is None
    assert json_problem({"a": "x" * (MAX_ARGUMENT_BYTES - overhead + 1)}) == (
        "arguments are over 1048576 bytes of JSON"
    )
    # Bytes of UTF-8, not characters.
    assert json_problem({"a": "é" * (MAX_ARGUMENT_BYTES // 2)}) == (
        "arguments are over 1048576 bytes of JSON"
    )


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ([], "arguments must be a JSON object"),
        ("x", "arguments must be a JSON object"),
        (None, "arguments must be a JSON object"),
        ({1: "x"}, "arguments must be a JSON object (its keys strings)"),
        ({"a": {2: "x"}}, "arguments must be a JSON object (its keys strings)"),
        ({"a": (1, 2)}, "arguments are not JSON: a tuple"),
        ({"a": {1, 2}}, "arguments are not JSON: a set"),
        ({"a": b"x"}, "arguments are not JSON: a bytes"),
    ],
)
def test_what_is_not_an_arguments_object(arguments: Any, problem: str) -> None:
    assert json_problem(arguments) == problem


# ---------------------------------------------------------------------------------------
# The input schema


def test_a_schema_problem_names_where() -> None:
    log = tool()
    assert log.schema_problem({"repo_path": "/r"}) is None
    assert (
        log.schema_problem({"repo_path": 5}) == "arguments['repo_path']: 5 is not of type 'string'"
    )
    assert log.schema_problem({}) == "arguments: 'repo_path' is a required property"
    assert log.schema_problem({"repo_path": "/r", "x": 1}) == (
        "arguments: Additional properties are not allowed ('x' was unexpected)"
    )


def test_long_messages_are_cut() -> None:
    prefix = "the tool's input schema is invalid: "
    long_schema = tool(schema={"type": "x" * 400}).schema_problem({})
    assert long_schema is not None
    assert long_schema.startswith(prefix + "'xxx")
    assert len(long_schema) == len(prefix) + 200
    long_value = tool().schema_problem({"repo_path": "/r", "max_count": "y" * 400})
    assert long_value is not None
    assert long_value.startswith("arguments['max_count']: 'yyy")
    assert len(long_value) == len("arguments['max_count']: ") + 300


def test_a_schema_too_deep_to_check_says_so() -> None:
    schema: dict[str, Any] = {"type": "object"}
    for _ in range(5000):
        schema = {"type": "object", "properties": {"a": schema}}
    assert tool(schema=schema).schema_problem({}) == (
        "the tool's input schema is invalid: RecursionError"
    )


def test_an_invalid_schema_refuses_every_call() -> None:
    broken = tool(schema={"type": "objekt"})
    problem = broken.schema_problem({})
    assert problem is not None
    assert problem.startswith("the tool's input schema is invalid: 'objekt' is not valid under")
    assert tool(schema=["not", "an", "object"]).schema_problem({}) == (
        "the tool's input schema is invalid: it is not a JSON object"
    )


def test_the_schema_says_its_own_draft() -> None:
    # Draft 7's array form of items: valid there, not in 2020-12 (the default).
    items = {"type": "object", "properties": {"a": {"items": [{"type": "string"}]}}}
    draft7 = tool(schema={"$schema": "http://json-schema.org/draft-07/schema#", **items})
    assert draft7.schema_problem({"a": ["x"]}) is None
    assert draft7.schema_problem({"a": [1]}) == "arguments['a'][0]: 1 is not of type 'string'"
    default = tool(schema=items).schema_problem({"a": ["x"]})
    assert default is not None
    assert default.startswith("the tool's input schema is invalid:")


def test_a_remote_ref_is_never_fetched(monkeypatch: pytest.MonkeyPatch) -> None:
    fetched: list[object] = []

    def urlopen(*args: object, **kwargs: object) -> None:
        fetched.append(args)
        raise AssertionError("fetched")

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    remote = tool(schema={"type": "object", "properties": {"a": {"$ref": "http://127.0.0.1:9/s"}}})
    assert remote.schema_problem({"a": 1}) == (
        "the tool's input schema cannot be applied: _WrappedReferencingError"
    )
    assert fetched == []


def test_local_refs_resolve() -> None:
    schema = {
        "type": "object",
        "$defs": {"path": {"type": "string", "pattern": "^/"}},
        "properties": {"p": {"$ref": "#/$defs/path"}},
    }
    assert tool(schema=schema).schema_problem({"p": "/a"}) is None
    assert (
        tool(schema=schema).schema_problem({"p": "a"}) == "arguments['p']: 'a' does not match '^/'"
    )


# ---------------------------------------------------------------------------------------
# check_arguments for external tools


def test_an_accepted_mcp_tool_checks_and_keeps_its_arguments_as_given() -> None:
    log = tool()
    arguments = {"repo_path": "./x/../y", "max_count": 3}
    checked = check_arguments("mcp.git.git_log", arguments, external=catalogue(log))
    assert isinstance(checked, CheckedArguments)
    assert checked.tool == "mcp.git.git_log"
    assert checked.value == ExternalArgs(arguments)
    assert checked.external is log
    assert checked.definition == "d1"
    assert checked.to_json() == arguments
    assert checked.to_json() is not arguments
    assert (checked.paths, checked.command, checked.host, checked.destination) == (
        (),
        None,
        None,
        None,
    )
    assert checked.subject() == '{"max_count":3,"repo_path":"./x/../y"}'


def test_a_long_subject_is_cut() -> None:
    checked = check_arguments("claude.Bash", {"command": "x" * 300}, external=EMPTY_CATALOGUE)
    assert isinstance(checked, CheckedArguments)
    assert checked.subject() == ('{"command":"' + "x" * 300)[:200] + "…"


@pytest.mark.parametrize(
    ("name", "tools", "reason", "detail"),
    [
        ("mcp.git.git_log", {}, Reason.UNKNOWN_TOOL, "unknown tool 'mcp.git.git_log'"),
        ("mcp.git.other", None, Reason.UNKNOWN_TOOL, "unknown tool 'mcp.git.other'"),
        ("mcp.x", None, Reason.UNKNOWN_TOOL, "unknown tool 'mcp.x'"),
        ("claude.", None, Reason.UNKNOWN_TOOL, "unknown tool 'claude.'"),
        ("claude.*", None, Reason.UNKNOWN_TOOL, "unknown tool 'claude.*'"),
        ("mcp.git.*", None, Reason.UNKNOWN_TOOL, "unknown tool 'mcp.git.*'"),
        ("mcp." + "x" * 200, None, Reason.UNKNOWN_TOOL, f"unknown tool {('mcp.' + 'x' * 96)!r}"),
        (
            "claude." + "B" * 200,
            None,
            Reason.UNKNOWN_TOOL,
            f"unknown tool {('claude.' + 'B' * 93)!r}",
        ),
    ],
)
def test_unknown_external_tools(
    name: str, tools: dict[str, ExternalTool] | None, reason: Reason, detail: str
) -> None:
    external = catalogue(tool()) if tools is None else tools
    assert check_arguments(name, {}, external=external) == ArgumentProblem(reason, detail)


def test_a_catalogue_entry_under_another_name_is_unknown() -> None:
    # A gateway bug must not let one name run another tool.
    external = {"mcp.git.git_log": tool(name="mcp.git.git_push")}
    assert check_arguments("mcp.git.git_log", {"repo_path": "/r"}, external=external) == (
        ArgumentProblem(Reason.UNKNOWN_TOOL, "unknown tool 'mcp.git.git_log'")
    )


@pytest.mark.parametrize(
    ("state", "reason", "detail"),
    [
        (
            ToolState.NOT_PINNED,
            Reason.TOOL_NOT_PINNED,
            "mcp.git.git_log is not pinned: run `bxctl mcp pin git git_log`; "
            "see docs/runbook.md#mcp-pin",
        ),
        (
            ToolState.CHANGED,
            Reason.TOOL_CHANGED,
            "mcp.git.git_log: its definition changed since it was pinned: "
            "run `bxctl mcp pin git git_log`; see docs/runbook.md#mcp-pin",
        ),
    ],
)
def test_a_tool_not_accepted_is_refused_before_its_arguments(
    state: ToolState, reason: Reason, detail: str
) -> None:
    external = catalogue(tool(state=state))
    # Even arguments that are not an object: the pin is checked first.
    assert check_arguments("mcp.git.git_log", [], external=external) == ArgumentProblem(
        reason, detail
    )
    assert not_pinned_detail("mcp.git.git_log", state) == detail


@pytest.mark.parametrize(
    ("arguments", "detail"),
    [
        ([], "arguments must be a JSON object"),
        ({}, "arguments: 'repo_path' is a required property"),
        ({"repo_path": ["/r"]}, "arguments['repo_path']: ['/r'] is not of type 'string'"),
        (nested(40), "arguments nest deeper than 32 levels"),
    ],
)
def test_bad_arguments_of_an_mcp_tool(arguments: Any, detail: str) -> None:
    assert check_arguments("mcp.git.git_log", arguments, external=catalogue(tool())) == (
        ArgumentProblem(Reason.BAD_ARGUMENTS, detail)
    )


def test_a_claude_tool_takes_any_object_without_a_catalogue() -> None:
    arguments = {"command": "ls", "nested": {"a": [1, None]}}
    checked = check_arguments("claude.Bash", arguments)
    assert isinstance(checked, CheckedArguments)
    assert checked.external == claude_tool("claude.Bash")
    assert checked.external is not None
    assert checked.external == ExternalTool("claude.Bash", "", {}, FRESH)
    assert (checked.external.label, checked.external.input_schema) == (FRESH, {})
    assert checked.external.description == ""
    assert checked.definition is None
    assert check_arguments("claude.Bash", ["ls"]) == ArgumentProblem(
        Reason.BAD_ARGUMENTS, "arguments must be a JSON object"
    )


def test_a_built_in_tool_ignores_the_catalogue() -> None:
    # A catalogue entry named like a built-in never replaces it.
    external = {"read_file": tool(name="read_file", schema={})}
    checked = check_arguments("read_file", {"path": "a"}, external=external)
    assert isinstance(checked, CheckedArguments)
    assert checked.external is None
    assert checked.definition is None


def test_result_labels_of_external_tools() -> None:
    rules = LabelRules()
    mcp = check_arguments("mcp.git.git_log", {"repo_path": "/r"}, external=catalogue(tool()))
    assert isinstance(mcp, CheckedArguments)
    assert result_label(mcp, rules, Taint.SECRET) == UNTRUSTED
    claude = check_arguments("claude.Bash", {})
    assert isinstance(claude, CheckedArguments)
    assert result_label(claude, rules, None) == FRESH


def test_the_catalogue_frame_lists_accepted_mcp_tools_by_name() -> None:
    tools = {
        "mcp.z.a": tool(name="mcp.z.a"),
        "mcp.a.b": tool(name="mcp.a.b"),
        "mcp.a.new": tool(name="mcp.a.new", state=ToolState.NOT_PINNED),
        "mcp.a.changed": tool(name="mcp.a.changed", state=ToolState.CHANGED),
        "mcp.a.wrong": tool(name="mcp.a.other"),
        "claude.Bash": claude_tool("claude.Bash"),
    }
    listed = external_catalogue_tools(tools)
    assert [entry["function"]["name"] for entry in listed] == ["mcp.a.b", "mcp.z.a"]
    assert listed[0] == {
        "type": "function",
        "function": {"name": "mcp.a.b", "description": "Show the log.", "parameters": SCHEMA},
    }
    listed[0]["function"]["parameters"]["type"] = "changed"
    listed[0]["function"]["parameters"]["properties"]["repo_path"]["type"] = "changed"
    assert SCHEMA["type"] == "object"
    assert SCHEMA["properties"]["repo_path"] == {"type": "string"}


def test_bxctl_assumes_one_accepted_tool_without_a_schema() -> None:
    assumed = assumed_catalogue("mcp.git.git_log")
    assert assumed == {"mcp.git.git_log": ExternalTool("mcp.git.git_log", "", {}, ASSUMED_LABEL)}
    assert Label(Taint.PUBLIC, True) == ASSUMED_LABEL
    assert assumed_catalogue("claude.Bash") == {}
    assert assumed_catalogue("read_file") == {}
    checked = check_arguments("mcp.git.git_log", {"any": [1]}, external=assumed)
    assert isinstance(checked, CheckedArguments)


def test_an_external_tool_is_a_frozen_value() -> None:
    log = tool()
    assert log == tool()
    assert log.server == "git"
    assert claude_tool("claude.Bash").server is None
    assert attrs.evolve(log, definition="d2") != log
    assert (log.read_only, ExternalTool("mcp.a.b", "", {}, FRESH).state) == (
        False,
        ToolState.ACCEPTED,
    )
