"""The decision's step 3 (core/decide.py): while a witness lags and the owner chose
``[ledger] witness_lag = "deny_risky"``, every risky call is denied ``witness_lagging``
with the detail brokerd passes; read-only built-ins go on. Its place among the other
denials, and approve's re-decision."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from tests.harness.grants import grant_set
from tests.harness.homes import grant_table

from boxmaker.core.catalogue import GRANT_TOOLS, READ_ONLY_TOOLS, TOOL_NAMES
from boxmaker.core.decide import Ask, Deny, Run, Verdict, approval_outcome, evaluate, risky
from boxmaker.core.grant_parse import GrantsProblem
from boxmaker.core.grants import GrantSet
from boxmaker.core.labels import FRESH, UNKNOWN, Label
from boxmaker.core.reasons import AUDIT_UNAVAILABLE_DETAIL, Reason
from boxmaker.core.state import StateUnreadable
from boxmaker.core.vocabulary import ApprovalOutcome, ToolRequest

NOW = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)
LAGGING = (
    "witness w1 is 12 records behind the ledger's newest checkpoint (it last cosigned "
    "size 40), more than witness_max_lag 10: risky calls are denied until it cosigns; "
    "see docs/runbook.md#witness"
)
BAD_GRANTS = GrantsProblem("grants.toml", "g", "mode", "expected one of auto, ask, deny")
ARGUMENTS: dict[str, dict[str, Any]] = {
    "read_file": {"path": "notes.txt"},
    "list_dir": {"path": "."},
    "write_file": {"path": "notes.txt", "content": "x"},
    "shell": {"command": "true"},
    "http_get": {"url": "https://a.example/"},
    "connect": {"host": "a.example", "port": 443, "via": "c-0123456789abcdef", "via_tool": "shell"},
}


def request(tool: str, arguments: dict[str, Any] | None = None) -> ToolRequest:
    return ToolRequest(
        call="c-00000000000000aa",
        session="s-0123456789ab",
        tool=tool,
        arguments=ARGUMENTS.get(tool, {}) if arguments is None else arguments,
    )


def run(
    req: ToolRequest,
    grants: GrantSet | GrantsProblem,
    state: Label | StateUnreadable = FRESH,
    *,
    lagging: str | None = LAGGING,
    ledger_usable: bool = True,
    **extra: Any,
) -> Verdict:
    return evaluate(
        req,
        ledger_usable=ledger_usable,
        witness_lagging=lagging,
        grants=grants,
        state=state,
        now=NOW,
        **extra,
    )


EXTRA: dict[str, dict[str, str]] = {
    "http_get": {"hosts": '["a.example"]'},
    "connect": {"hosts": '["a.example"]', "via": '["shell"]'},
}


def everything(mode: str = "auto") -> GrantSet:
    """A grant of ``mode`` for every built-in tool."""
    tables = (
        grant_table(f"g-{tool.replace('_', '-')}", tool, mode, **EXTRA.get(tool, {}))
        for tool in GRANT_TOOLS
    )
    return grant_set("".join(tables))


def test_only_the_read_only_built_ins_are_not_risky() -> None:
    assert {"read_file", "list_dir"} == READ_ONLY_TOOLS
    assert {tool for tool in GRANT_TOOLS if risky(tool)} == {
        "write_file",
        "shell",
        "http_get",
        "connect",
    }
    for external in ("mcp.git.git_log", "mcp.fs.read_file", "claude.Read", "claude.Bash"):
        assert risky(external)
    # A name the catalogue does not know is risky too (denied before it is looked up).
    assert all(risky(name) for name in ("read_file ", "READ_FILE", ""))


@pytest.mark.parametrize("tool", sorted(set(GRANT_TOOLS) - READ_ONLY_TOOLS))
def test_a_risky_built_in_is_denied_witness_lagging(tool: str) -> None:
    verdict = run(request(tool), everything(), internal=tool == "connect")
    assert isinstance(verdict, Deny)
    decision = verdict.decision
    assert (decision.reason, decision.detail) == (Reason.WITNESS_LAGGING, LAGGING)
    assert decision.recordable is True
    assert decision.tool == tool
    assert decision.arguments == ARGUMENTS[tool]
    assert (decision.grant, decision.mode) == (None, None)
    assert decision.state == FRESH
    # Without a lagging witness the same call runs: the step alone denied it.
    assert isinstance(
        run(request(tool), everything(), lagging=None, internal=tool == "connect"), Run
    )


@pytest.mark.parametrize(
    ("tool", "otherwise"),
    [
        ("mcp.git.git_log", Reason.UNKNOWN_TOOL),  # no MCP server offers it here
        ("claude.Read", Reason.NO_GRANT),
        ("claude.Bash", Reason.NO_GRANT),
    ],
)
def test_an_external_tool_is_denied_before_the_catalogue_is_asked(
    tool: str, otherwise: Reason
) -> None:
    decision = run(request(tool, {"x": 1}), everything()).decision
    assert (decision.reason, decision.detail) == (Reason.WITNESS_LAGGING, LAGGING)
    assert decision.arguments == {"x": 1}
    assert run(request(tool, {"x": 1}), everything(), lagging=None).decision.reason is otherwise


@pytest.mark.parametrize("tool", sorted(READ_ONLY_TOOLS))
def test_a_read_only_built_in_goes_on(tool: str) -> None:
    assert tool in TOOL_NAMES
    assert isinstance(run(request(tool), everything()), Run)
    assert isinstance(run(request(tool), everything("ask")), Ask)
    no_grant = run(request(tool), GrantSet()).decision
    assert no_grant.reason is Reason.NO_GRANT


def test_audit_unavailable_comes_first() -> None:
    decision = run(request("write_file"), everything(), ledger_usable=False).decision
    assert (decision.reason, decision.detail) == (
        Reason.AUDIT_UNAVAILABLE,
        AUDIT_UNAVAILABLE_DETAIL,
    )
    assert decision.recordable is False


@pytest.mark.parametrize(
    ("req", "grants", "state", "otherwise"),
    [
        (request("rm_rf"), GrantSet(), FRESH, Reason.UNKNOWN_TOOL),
        (
            request("write_file", {"path": "../x", "content": ""}),
            GrantSet(),
            FRESH,
            Reason.BAD_ARGUMENTS,
        ),
        (request("shell"), BAD_GRANTS, FRESH, Reason.GRANTS_INVALID),
        (request("shell"), GrantSet(), StateUnreadable("bad JSON"), Reason.STATE_UNREADABLE),
        (request("shell"), GrantSet(), FRESH, Reason.NO_GRANT),
        (request("shell"), everything("deny"), FRESH, Reason.DENIED_BY_GRANT),
    ],
)
def test_it_comes_before_every_later_denial(
    req: ToolRequest,
    grants: GrantSet | GrantsProblem,
    state: Label | StateUnreadable,
    otherwise: Reason,
) -> None:
    assert run(req, grants, state, lagging=None).decision.reason is otherwise
    lagged = run(req, grants, state).decision
    assert (lagged.reason, lagged.detail) == (Reason.WITNESS_LAGGING, LAGGING)
    assert lagged.state == (UNKNOWN if isinstance(state, StateUnreadable) else state)


def test_a_read_only_call_meets_the_later_denials_as_before() -> None:
    bad = request("read_file", {"path": "../x"})
    assert run(bad, GrantSet()).decision.reason is Reason.BAD_ARGUMENTS
    assert run(request("list_dir"), BAD_GRANTS).decision.reason is Reason.GRANTS_INVALID


def test_an_ask_approved_while_a_witness_lags_is_denied_at_its_re_decision() -> None:
    asked = run(request("write_file"), everything("ask"), lagging=None)
    assert isinstance(asked, Ask)
    again = run(request("write_file"), everything("ask"), asked=asked.decision)
    assert approval_outcome(again) is ApprovalOutcome.DENIED
    assert (again.decision.reason, again.decision.detail) == (Reason.WITNESS_LAGGING, LAGGING)
    # Caught up by the time the owner approves: it runs.
    caught_up = run(request("write_file"), everything("ask"), lagging=None, asked=asked.decision)
    assert approval_outcome(caught_up) is ApprovalOutcome.ASK
