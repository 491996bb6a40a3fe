"""Hostile: the model (or an MCP client, or an MCP server's tools/list) plays with the
names and arguments of external tools (docs/threat-model.md, "The model and loopd").

- A requested name that is not exactly a catalogue tool's or a valid ``claude.NAME``
  is ``unknown_tool``, even where a family grant (``mcp.*``, ``claude.*``) would allow
  the real tool: a path, a wildcard, a look-alike letter, a trailing newline, an empty
  name; and a catalogue entry whose key and tool disagree runs nothing.
- Arguments nested 10,000 deep or 2 MiB long are ``bad_arguments``, quickly: the walk
  stops at level 33, so nothing recurses (without it, canonical JSON raises
  RecursionError out of a decision).
- An ``arguments`` pattern is matched against a non-string value's canonical JSON whole,
  so a list or object holding one allowed string and others does not pass for it; and
  approve --always's grant does not allow one argument more than the call had.
- A server's input schema with a remote ``$ref`` never makes brokerd connect anywhere
  (jsonschema's default registry fetches one; the control below shows it does).

Each attack also runs against what it would get: the same grants allow the honest call.
"""

from __future__ import annotations

import datetime as dt
import socket
import time
from typing import Any, Final

import jsonschema.validators
import pytest

from boxmaker.core.decide import Deny, Run, evaluate
from boxmaker.core.external_tools import ExternalTool
from boxmaker.core.grant_parse import parse_grants
from boxmaker.core.grant_scope import Scope, always_grant, grant_of
from boxmaker.core.grants import Grant, GrantSet, Mode
from boxmaker.core.labels import FRESH, Label, Taint
from boxmaker.core.reasons import Reason
from boxmaker.core.vocabulary import ToolRequest

NOW: Final = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)
LOG: Final = ExternalTool(
    "mcp.git.git_log", "Show the log.", {"type": "object"}, Label(Taint.PUBLIC, True), "d1"
)
CATALOGUE: Final = {"mcp.git.git_log": LOG}
EVERYTHING: Final = """
[[grant]]
id = "all-mcp"
tool = "mcp.*"
mode = "auto"

[[grant]]
id = "all-client"
tool = "claude.*"
mode = "auto"
"""
FAST_S: Final = 0.5
"""A generous bound in real seconds for one hostile decision (measured: a few ms)."""


def grants(text: str) -> GrantSet:
    parsed = parse_grants(text)
    assert isinstance(parsed, GrantSet), parsed
    return parsed


def decide(tool: str, arguments: Any, text: str = EVERYTHING, **catalogue: ExternalTool) -> Any:
    return decide_with(tool, arguments, grants(text), **catalogue)


def decide_with(tool: str, arguments: Any, grant_set: GrantSet, **catalogue: ExternalTool) -> Any:
    request = ToolRequest.__new__(ToolRequest)  # arguments of any shape, as a frame may not
    object.__setattr__(request, "v", 1)
    object.__setattr__(request, "call", "c-0000000000000001")
    object.__setattr__(request, "session", "s-000000000001")
    object.__setattr__(request, "tool", tool)
    object.__setattr__(request, "arguments", arguments)
    return evaluate(
        request,
        ledger_usable=True,
        grants=grant_set,
        state=FRESH,
        now=NOW,
        external=catalogue or CATALOGUE,
    )


def test_the_honest_calls_run() -> None:
    assert isinstance(decide("mcp.git.git_log", {}), Run)
    assert isinstance(decide("claude.Bash", {"command": "ls"}), Run)


@pytest.mark.parametrize(
    "name",
    [
        "mcp.git.git_log/../read_file",
        "mcp.x.../read_file",
        "mcp.git.*",
        "mcp.*",
        "mcp.git.git_log\n",
        "mcp.git.git_log ",
        "mcp.g\u0456t.git_log",  # a Cyrillic i
        "mcp.git.git_l\u03bfg",  # a Greek o
        "mcp.git.git_log\x00",
        "MCP.git.git_log",
        "claude.",
        "claude.*",
        "claude.Bash/../../x",
        "claude.B\u0430sh",  # a Cyrillic a
        "claude.Bash\n",
        "claude." + "B" * 65,
        "read_file.mcp",
    ],
)
def test_a_name_that_is_not_exactly_a_tool_is_unknown(name: str) -> None:
    verdict = decide(name, {})
    assert isinstance(verdict, Deny)
    assert (verdict.decision.reason, verdict.decision.detail) == (
        Reason.UNKNOWN_TOOL,
        f"unknown tool {name[:100]!r}",
    )


def test_a_catalogue_entry_under_another_name_runs_nothing() -> None:
    # A server that lists a tool whose own name is a built-in, filed under an mcp name
    # by a gateway bug: the name asked and the tool run must be one.
    smuggled = ExternalTool("read_file", "", {}, FRESH, "d1")
    verdict = decide("mcp.git.git_log", {}, **{"mcp.git.git_log": smuggled})
    assert isinstance(verdict, Deny)
    assert verdict.decision.reason is Reason.UNKNOWN_TOOL


def deep(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    ("tool", "arguments", "detail"),
    [
        ("claude.Bash", deep(10_000), "arguments nest deeper than 32 levels"),
        ("mcp.git.git_log", deep(10_000), "arguments nest deeper than 32 levels"),
        (
            "claude.Bash",
            {"a": [[[[[[]]]]]] * 3, "b": deep(40)},
            "arguments nest deeper than 32 levels",
        ),
        ("claude.Bash", {"command": "x" * (2 << 20)}, "arguments are over 1048576 bytes of JSON"),
        ("mcp.git.git_log", {"a": ["y" * 1024] * 2048}, "arguments are over 1048576 bytes of JSON"),
    ],
    ids=["deep-claude", "deep-mcp", "deep-inside", "2mib-string", "2mib-list"],
)
def test_huge_arguments_are_bad_arguments_quickly(tool: str, arguments: Any, detail: str) -> None:
    started = time.perf_counter()
    verdict = decide(tool, arguments)
    elapsed = time.perf_counter() - started
    assert isinstance(verdict, Deny)
    assert (verdict.decision.reason, verdict.decision.detail) == (Reason.BAD_ARGUMENTS, detail)
    assert elapsed < FAST_S


PATTERN_GRANT: Final = """
[[grant]]
id = "work-only"
tool = "mcp.git.*"
mode = "auto"
arguments = { repo_path = ["/work/*"] }
"""


@pytest.mark.parametrize(
    "value",
    [
        ["/work/a", "/etc/passwd"],
        ["/work/a"],
        {"path": "/work/a", "also": "/etc"},
        {"/work/a": 1},
        1,
        None,
        True,
    ],
)
def test_a_non_string_value_does_not_pass_for_an_allowed_string(value: Any) -> None:
    assert isinstance(decide("mcp.git.git_log", {"repo_path": "/work/a"}, PATTERN_GRANT), Run)
    verdict = decide("mcp.git.git_log", {"repo_path": value}, PATTERN_GRANT)
    assert isinstance(verdict, Deny)
    assert verdict.decision.reason is Reason.NO_GRANT


def test_an_always_grant_does_not_allow_one_argument_more() -> None:
    call = decide("mcp.git.git_log", {"repo_path": "/work/a"})
    assert isinstance(call, Run)
    table = always_grant(
        approval="a-01234567",
        call="c-0000000000000001",
        arguments=call.checked,
        asking=Grant("ask", "mcp.git.*", Mode.ASK),
        scope=Scope.EXACT,
        lasting=None,
        owner="ada",
        now=NOW,
    )
    assert isinstance(table, dict)
    written = GrantSet((grant_of(table),))
    assert isinstance(decide_with("mcp.git.git_log", {"repo_path": "/work/a"}, written), Run)
    for more in ({"repo_path": "/work/a", "force": True}, {"repo_path": "/work/a", "": ""}):
        verdict = decide_with("mcp.git.git_log", more, written)
        assert isinstance(verdict, Deny)
        assert verdict.decision.reason is Reason.NO_GRANT


@pytest.fixture
def listener() -> Any:
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.setblocking(False)
        yield server


def _connected(server: socket.socket) -> bool:
    try:
        peer, _ = server.accept()
    except BlockingIOError:
        return False
    peer.close()
    return True


def test_a_remote_ref_in_a_servers_schema_connects_nowhere(listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    schema = {"type": "object", "properties": {"a": {"$ref": f"http://127.0.0.1:{port}/s.json"}}}
    hostile = ExternalTool("mcp.git.git_log", "", schema, FRESH, "d1")
    verdict = decide("mcp.git.git_log", {"a": 1}, **{"mcp.git.git_log": hostile})
    assert isinstance(verdict, Deny)
    assert (verdict.decision.reason, verdict.decision.detail) == (
        Reason.BAD_ARGUMENTS,
        "the tool's input schema cannot be applied: _WrappedReferencingError",
    )
    assert not _connected(listener)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_control_jsonschemas_default_registry_does_connect(listener: socket.socket) -> None:
    """The attack is real: validated the library's default way, the same schema makes the
    process connect to the address the server chose."""
    port = listener.getsockname()[1]
    schema = {"type": "object", "properties": {"a": {"$ref": f"http://127.0.0.1:{port}/s.json"}}}
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(0.3)
    try:
        with pytest.raises(Exception):  # noqa: B017, PT011 - any failure: nobody answers
            list(jsonschema.validators.Draft202012Validator(schema).iter_errors({"a": 1}))
    finally:
        socket.setdefaulttimeout(previous)
    assert _connected(listener)
