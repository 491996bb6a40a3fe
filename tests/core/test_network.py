"""core.network: which calls get a way out (network_grants), and a tunnel's request."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from boxmaker.core.catalogue import CheckedArguments, ConnectArgs, check_arguments
from boxmaker.core.grant_parse import parse_grants
from boxmaker.core.grants import GrantSet
from boxmaker.core.network import connect_request, network_grants
from boxmaker.core.vocabulary import ToolRequest

NOW = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)

GRANTS = """
[[grant]]
id = "pip"
tool = "connect"
mode = "auto"
hosts = ["pypi.org", "*.pythonhosted.org"]
via = ["shell"]
commands = ["pip install *"]

[[grant]]
id = "any-shell"
tool = "connect"
mode = "ask"
hosts = ["github.com"]
via = ["shell"]
expires = 2026-06-01T12:00:00Z

[[grant]]
id = "fetch"
tool = "connect"
mode = "auto"
hosts = ["docs.python.org"]
via = ["mcp.fetch.*"]

[[grant]]
id = "nope"
tool = "connect"
mode = "deny"
hosts = ["evil.example"]
via = ["shell", "mcp.*"]

[[grant]]
id = "web"
tool = "http_get"
mode = "auto"
hosts = ["pypi.org"]

[[grant]]
id = "sh"
tool = "shell"
mode = "auto"
"""


def grants() -> GrantSet:
    parsed = parse_grants(GRANTS)
    assert isinstance(parsed, GrantSet), parsed
    return parsed


@pytest.mark.parametrize(
    ("tool", "command", "now", "expected"),
    [
        ("shell", "pip install attrs", NOW, ["pip"]),
        ("shell", "pip install attrs", NOW - dt.timedelta(seconds=1), ["pip", "any-shell"]),
        ("shell", "curl https://pypi.org", NOW - dt.timedelta(seconds=1), ["any-shell"]),
        # expires is exclusive: at the instant itself the ask grant is gone.
        ("shell", "curl https://pypi.org", NOW, []),
        ("shell", None, NOW, []),
        ("mcp.fetch.get", None, NOW, ["fetch"]),
        ("mcp.other.get", None, NOW, []),
        ("http_get", None, NOW, []),
        ("read_file", None, NOW, []),
    ],
)
def test_network_grants(
    tool: str, command: str | None, now: dt.datetime, expected: list[str]
) -> None:
    assert [g.id for g in network_grants(grants(), tool, command, now)] == expected


def test_no_connect_grants_no_way_out() -> None:
    parsed = parse_grants('[[grant]]\nid = "sh"\ntool = "shell"\nmode = "auto"\n')
    assert isinstance(parsed, GrantSet)
    assert network_grants(parsed, "shell", "pip install x", NOW) == ()


@given(st.text(max_size=40))
def test_a_deny_grant_never_opens_a_way_out(command: str) -> None:
    found = network_grants(grants(), "shell", command, NOW)
    assert "nope" not in [g.id for g in found]
    assert all(g.tool == "connect" for g in found)


def test_connect_request_checks_as_the_internal_tool() -> None:
    request = connect_request(
        call="c-00000000000000c1",
        session="s-000000000001",
        via="c-00000000000000a0",
        via_tool="shell",
        via_command="pip install attrs",
        host="pypi.org",
        port=443,
    )
    assert request == ToolRequest(
        call="c-00000000000000c1",
        session="s-000000000001",
        tool="connect",
        arguments={
            "host": "pypi.org",
            "port": 443,
            "scheme": "https",
            "via": "c-00000000000000a0",
            "via_tool": "shell",
            "via_command": "pip install attrs",
        },
    )
    checked = check_arguments(request.tool, request.arguments, internal=True)
    assert checked == CheckedArguments(
        "connect",
        ConnectArgs("pypi.org", 443, "c-00000000000000a0", "shell", "pip install attrs"),
    )


def test_connect_request_without_a_command_leaves_it_out() -> None:
    request = connect_request(
        call="c-00000000000000c1",
        session="s-000000000001",
        via="c-00000000000000a0",
        via_tool="mcp.fetch.get",
        via_command=None,
        host="docs.python.org",
        port=80,
        scheme="http",
    )
    assert "via_command" not in request.arguments
    assert request.arguments["scheme"] == "http"
