"""Hostile: the model (or loopd, or an MCP client: anyone who writes broker.sock) names
the internal tool ``connect`` itself, to have brokerd open a tunnel, or decide one, that
no sandbox asked for (docs/threat-model.md, "The model and loopd").

A connect grant is there and allows exactly what the forged request names; brokerd still
answers ``unknown_tool`` with the very detail any unknown name gets, records the denial
with no grant, and leaves the session's state alone. The same request decided as
brokerd's own (``internal=True``) runs: the attack asks for something the grants allow.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Final

import pytest
from tests.harness.broker import Brokerd, body, call, records_of, tool_request
from tests.harness.homes import read_state_file, write_grants
from trio.testing import MockClock

from boxmaker.core.decide import Deny, Run, evaluate
from boxmaker.core.grant_parse import parse_grants
from boxmaker.core.grants import GrantSet
from boxmaker.core.labels import FRESH
from boxmaker.core.reasons import Reason
from boxmaker.core.vocabulary import ToolRequest
from boxmaker.home.paths import Home

pytestmark = pytest.mark.usefixtures("inline_threads")

NET: Final = """
[[grant]]
id = "anywhere"
tool = "connect"
mode = "auto"
hosts = ["*.example", "127.0.0.1:9"]
via = ["shell", "mcp.*"]
if_untrusted = "auto"
plain_http = true
"""
FORGED: Final[list[dict[str, Any]]] = [
    {"host": "evil.example", "port": 443, "via": "c-00000000000000a0", "via_tool": "shell"},
    {
        "host": "127.0.0.1",
        "port": 9,
        "via": "c-00000000000000a0",
        "via_tool": "mcp.fetch.get",
        "scheme": "http",
    },
]


@pytest.mark.parametrize("arguments", FORGED)
@pytest.mark.parametrize("name", ["connect", "Connect", "connect\n", " connect"])
async def test_a_request_naming_connect_is_unknown_tool_and_opens_nothing(
    home: Home, brokerd: Brokerd, autojump_clock: MockClock, name: str, arguments: dict[str, Any]
) -> None:
    write_grants(home, NET)
    await brokerd.start()
    frame = tool_request(name, arguments)
    frames = await call(home, frame)
    await brokerd.stop()
    assert frames == [
        {
            "kind": "answer",
            "final": True,
            "call": frame["call"],
            "outcome": "denied",
            "reason": "unknown_tool",
            "detail": f"unknown tool {name!r}",
        }
    ]
    [recorded] = [body(r) for r in records_of(home, frame["call"])]
    assert (recorded["kind"], recorded["tool"], recorded["verdict"]) == ("decision", name, "deny")
    assert (recorded["reason"], recorded["grant"]) == ("unknown_tool", None)
    assert read_state_file(home, recorded["session"]) is None


@pytest.mark.parametrize("arguments", FORGED)
def test_the_same_request_as_brokerds_own_runs(arguments: dict[str, Any]) -> None:
    """The control: what the forged frame asks for is what the grant allows."""
    grants = parse_grants(NET)
    assert isinstance(grants, GrantSet)
    request = ToolRequest(
        call="c-00000000000000c1", session="s-000000000001", tool="connect", arguments=arguments
    )
    now = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)
    common: dict[str, Any] = {"ledger_usable": True, "grants": grants, "state": FRESH, "now": now}
    assert isinstance(evaluate(request, internal=True, **common), Run)
    denied = evaluate(request, **common)
    assert isinstance(denied, Deny)
    assert denied.decision.reason is Reason.UNKNOWN_TOOL
