"""Grants for external tools (core/grants.py, grant_parse.py, grant_lint.py,
grant_scope.py, decide.py): the ``tool`` families, ``arguments``, ``other_arguments``,
``approvers``, precedence across families, approve --always's exact grant, and approve's
re-decision binding the definition (docs/decisions.md, "External tools")."""

from __future__ import annotations

import datetime as dt
from typing import Any, Final

import attrs
import pytest

from boxmaker.core.catalogue import CheckedArguments, check_arguments
from boxmaker.core.decide import Deny, Ruling, Run, evaluate
from boxmaker.core.external_tools import ExternalTool, ToolState
from boxmaker.core.grant_lint import lint_grants, shadows, tool_covers
from boxmaker.core.grant_parse import GrantsProblem, parse_grants
from boxmaker.core.grant_scope import Scope, ScopeProblem, always_grant, asked, grant_of
from boxmaker.core.grants import Grant, GrantSet, Mode
from boxmaker.core.labels import FRESH, Label, Taint
from boxmaker.core.reasons import Reason
from boxmaker.core.vocabulary import ToolRequest, VerdictCode

NOW: Final = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)
UNTRUSTED: Final = Label(Taint.PUBLIC, True)


def mcp(name: str, definition: str = "d1") -> ExternalTool:
    return ExternalTool(name, "", {"type": "object"}, UNTRUSTED, definition)


CATALOGUE: Final = {
    name: mcp(name) for name in ("mcp.git.git_log", "mcp.git.git_push", "mcp.github.issue")
}


def checked(tool: str, arguments: dict[str, Any]) -> CheckedArguments:
    found = check_arguments(tool, arguments, external=CATALOGUE)
    assert isinstance(found, CheckedArguments), found
    return found


def grants(text: str) -> GrantSet:
    parsed = parse_grants(text)
    assert isinstance(parsed, GrantSet), parsed
    return parsed


def problem(text: str) -> tuple[str | None, str]:
    parsed = parse_grants(text)
    assert isinstance(parsed, GrantsProblem), parsed
    assert parsed.grant_id == "g"  # every table here has id "g": the problem names it
    return parsed.key, parsed.full_message()


def table(gid: str, tool: str, mode: str, *extra: str) -> str:
    return (
        "\n".join(["[[grant]]", f'id = "{gid}"', f'tool = "{tool}"', f'mode = "{mode}"', *extra])
        + "\n"
    )


# ---------------------------------------------------------------------------------------
# Parsing


@pytest.mark.parametrize(
    "tool", ["mcp.*", "mcp.git.*", "mcp.git.git_log", "claude.*", "claude.Bash"]
)
def test_external_tool_names_and_families_parse(tool: str) -> None:
    [grant] = grants(table("g", tool, "auto")).grants
    assert (grant.tool, grant.arguments, grant.other_arguments, grant.approvers) == (
        tool,
        None,
        True,
        ("owner",),
    )


@pytest.mark.parametrize(
    "tool", ["mcp.git", "mcp.*.git_log", "mcp.git.git_*", "claude.", "claude.B*", "mcp.Git.*"]
)
def test_other_dotted_tools_are_problems(tool: str) -> None:
    assert problem(table("g", tool, "auto")) == (
        "tool",
        f"{tool!r} is not an external tool's name or family "
        "(mcp.SERVER.TOOL, mcp.SERVER.*, mcp.*, claude.NAME, claude.*)",
    )


def test_a_built_in_name_still_gets_its_suggestion() -> None:
    assert problem(table("g", "red_file", "auto")) == (
        "tool",
        "expected one of read_file, list_dir, write_file, shell, http_get, connect, got 'red_file' "
        "(did you mean 'read_file'?)",
    )


def test_arguments_parse_in_file_order() -> None:
    [grant] = grants(
        table("g", "mcp.git.*", "auto", 'arguments = { repo_path = ["/work/**"], n = ["1", "2"] }')
    ).grants
    assert grant.arguments == (("repo_path", ("/work/**",)), ("n", ("1", "2")))


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('arguments = ["x"]', "expected a table of arrays, got an array"),
        ("arguments = {}", "an empty table (leave the key out instead)"),
        ('arguments = { a = "x" }', "'a': expected an array of strings, got a string"),
        (
            "arguments = { a = [] }",
            "'a': an empty array matches nothing (leave the name out instead)",
        ),
        ("arguments = { a = [1] }", "'a': expected an array of strings, got an integer in it"),
        ('arguments = { a = ["x\\u0000"] }', "'a': NUL byte in a pattern"),
        ('other_arguments = "no"', "expected true or false (a boolean), got a string"),
    ],
)
def test_arguments_problems(line: str, message: str) -> None:
    key, found = problem(table("g", "mcp.git.*", "auto", line))
    assert (key, found) == (line.split(" ")[0], message)


@pytest.mark.parametrize("key", ['arguments = { a = ["x"] }', "other_arguments = false"])
def test_arguments_apply_to_external_tools_only(key: str) -> None:
    assert problem(table("g", "shell", "auto", key)) == (
        key.split(" ")[0],
        "does not apply to tool shell",
    )


@pytest.mark.parametrize(
    "key", ['paths = ["a"]', 'commands = ["a"]', 'hosts = ["a.org"]', "hard_links = true"]
)
def test_built_in_keys_do_not_apply_to_external_tools(key: str) -> None:
    assert problem(table("g", "mcp.git.*", "auto", key)) == (
        key.split(" ")[0],
        "does not apply to tool mcp.git.*",
    )


def test_approvers_parse() -> None:
    [grant] = grants(table("g", "mcp.*", "ask", 'approvers = ["owner", "mcp-client"]')).grants
    assert grant.approvers == ("owner", "mcp-client")
    [built_in] = grants(table("g", "read_file", "ask", 'approvers = ["owner"]')).grants
    assert built_in.approvers == ("owner",)


@pytest.mark.parametrize(
    ("mode", "line", "message"),
    [
        ("ask", 'approvers = ["mcp-client"]', 'the owner can always answer: name "owner" too'),
        ("ask", 'approvers = ["owner", "owner"]', "an approver named twice"),
        (
            "ask",
            'approvers = ["owner", "mcp-clinet"]',
            "expected some of owner, mcp-client, got 'mcp-clinet' (did you mean 'mcp-client'?)",
        ),
        ("ask", "approvers = []", "an empty array matches nothing (leave the key out instead)"),
        ("auto", 'approvers = ["owner"]', "applies to ask grants only"),
        ("deny", 'approvers = ["owner"]', "applies to ask grants only"),
    ],
)
def test_approvers_problems(mode: str, line: str, message: str) -> None:
    assert problem(table("g", "mcp.*", mode, line)) == ("approvers", message)


# ---------------------------------------------------------------------------------------
# Matching


@pytest.mark.parametrize(
    ("grant_tool", "covered"),
    [
        ("mcp.*", {"mcp.git.git_log", "mcp.git.git_push", "mcp.github.issue"}),
        ("mcp.git.*", {"mcp.git.git_log", "mcp.git.git_push"}),
        ("mcp.git.git_log", {"mcp.git.git_log"}),
        ("claude.*", {"claude.Bash"}),
        ("claude.Bash", {"claude.Bash"}),
        ("shell", set()),
    ],
)
def test_a_family_covers_its_tools_only(grant_tool: str, covered: set[str]) -> None:
    grant_set = grants(table("g", grant_tool, "auto"))
    for name in ["mcp.git.git_log", "mcp.git.git_push", "mcp.github.issue", "claude.Bash"]:
        call = checked(name, {})
        found = grant_set.in_precedence(name)
        assert (len(found) == 1) is (name in covered), name
        assert grant_set.grants[0].matches(name, call, NOW) is (name in covered), name
        assert grant_set.for_tool(name) == found


def test_a_built_in_grant_never_covers_an_external_call() -> None:
    shell = Grant("s", "shell", Mode.AUTO)
    call = checked("claude.Bash", {"command": "ls"})
    assert not shell.matches("claude.Bash", call, NOW)
    assert not Grant("m", "mcp.*", Mode.AUTO).matches(
        "shell", check_arguments("shell", {"command": "ls"}), NOW
    )  # type: ignore[arg-type]


def arguments_grant(*pairs: tuple[str, tuple[str, ...]], other: bool = True) -> Grant:
    return Grant("g", "mcp.git.*", Mode.AUTO, arguments=pairs, other_arguments=other)


@pytest.mark.parametrize(
    ("arguments", "matches"),
    [
        ({"repo_path": "/work/a"}, True),
        ({"repo_path": "/work/a/b", "extra": 1}, True),
        ({"repo_path": "/etc/passwd"}, False),
        ({"repo_path": "/work"}, False),
        ({}, False),
        ({"other": "/work/a"}, False),
        # A value that is not a string is matched as its canonical JSON, whole.
        ({"repo_path": ["/work/a", "/etc/passwd"]}, False),
        ({"repo_path": {"p": "/work/a"}}, False),
        ({"repo_path": None}, False),
    ],
)
def test_arguments_match_whole_values(arguments: dict[str, Any], matches: bool) -> None:
    grant = arguments_grant(("repo_path", ("/work/*",)))
    assert grant.covers(checked("mcp.git.git_log", arguments), NOW) is matches


def test_non_string_values_match_as_canonical_json() -> None:
    # fnmatch's own rules: a '[' to match is written '[[]'.
    grant = arguments_grant(
        ("n", ("3",)), ("flags", ('[[]"-a","-b"]',)), ("o", ('{"a":1,"b":null}',))
    )
    call = {"n": 3, "flags": ["-a", "-b"], "o": {"b": None, "a": 1}}
    assert grant.covers(checked("mcp.git.git_log", call), NOW)
    assert not grant.covers(checked("mcp.git.git_log", call | {"n": "3 "}), NOW)
    assert not grant.covers(checked("mcp.git.git_log", call | {"n": 3.0}), NOW)


def test_every_named_argument_must_match() -> None:
    grant = arguments_grant(("a", ("x", "y")), ("b", ("z",)))
    assert grant.covers(checked("mcp.git.git_log", {"a": "y", "b": "z"}), NOW)
    assert not grant.covers(checked("mcp.git.git_log", {"a": "y", "b": "q"}), NOW)
    assert not grant.covers(checked("mcp.git.git_log", {"a": "q", "b": "z"}), NOW)
    assert not grant.covers(checked("mcp.git.git_log", {"a": "y"}), NOW)


def test_other_arguments_false_allows_only_the_named_ones() -> None:
    grant = arguments_grant(("a", ("*",)), other=False)
    assert grant.covers(checked("mcp.git.git_log", {"a": "x"}), NOW)
    assert not grant.covers(checked("mcp.git.git_log", {"a": "x", "b": "y"}), NOW)
    bare = Grant("g", "mcp.git.*", Mode.AUTO, other_arguments=False)
    assert bare.covers(checked("mcp.git.git_log", {}), NOW)
    assert not bare.covers(checked("mcp.git.git_log", {"a": "x"}), NOW)


def test_argument_patterns_fail_closed_on_built_in_arguments() -> None:
    grant = Grant("g", "shell", Mode.AUTO, arguments=(("command", ("*",)),))
    assert not grant.covers(check_arguments("shell", {"command": "ls"}), NOW)  # type: ignore[arg-type]
    other = Grant("g", "shell", Mode.AUTO, other_arguments=False)
    assert not other.covers(check_arguments("shell", {"command": "ls"}), NOW)  # type: ignore[arg-type]


def test_an_expired_external_grant_does_not_match() -> None:
    grant = attrs.evolve(arguments_grant(), expires=NOW)
    assert not grant.covers(checked("mcp.git.git_log", {}), NOW)
    assert grant.covers(checked("mcp.git.git_log", {}), NOW - dt.timedelta(seconds=1))


# ---------------------------------------------------------------------------------------
# Precedence across families


PRECEDENCE_TEXT: Final = (
    table("all-auto", "mcp.*", "auto")
    + table("git-ask", "mcp.git.*", "ask")
    + table("log-deny", "mcp.git.git_log", "deny")
    + table("push-won", "mcp.git.git_push", "auto", "wins_over_ask = true")
    + table("shell", "shell", "auto")
    + table("claude", "claude.*", "ask")
)


def test_precedence_is_the_built_ins_across_families() -> None:
    grant_set = grants(PRECEDENCE_TEXT)

    def ids(tool: str) -> list[str]:
        return [g.id for g in grant_set.in_precedence(tool)]

    assert ids("mcp.git.git_log") == ["log-deny", "git-ask", "all-auto"]
    assert ids("mcp.git.git_push") == ["push-won", "git-ask", "all-auto"]
    assert ids("mcp.github.issue") == ["all-auto"]
    assert ids("claude.Bash") == ["claude"]
    assert ids("shell") == ["shell"]
    assert [g.id for g in grant_set.for_tool("mcp.git.git_push")] == [
        "all-auto",
        "git-ask",
        "push-won",
    ]
    assert [g.id for g in grant_set.for_tool_and_mode("mcp.git.git_push", Mode.AUTO)] == [
        "all-auto",
        "push-won",
    ]
    assert grant_set.for_tool_and_mode("mcp.git.git_push", Mode.DENY) == ()


def test_external_lookups_are_cached_per_name_and_bounded() -> None:
    grant_set = grants(PRECEDENCE_TEXT)
    first = grant_set.in_precedence("mcp.git.git_log")
    assert grant_set.in_precedence("mcp.git.git_log") is first
    for n in range(1100):
        assert [g.id for g in grant_set.in_precedence(f"claude.T{n}")] == ["claude"]
    assert [g.id for g in grant_set.in_precedence("mcp.git.git_log")] == [g.id for g in first]
    # The bound, exactly: 1,024 names kept, and the next one starts it over.
    fresh = grants(PRECEDENCE_TEXT)
    cache = fresh._external  # the bound is the point of this test
    for n in range(1024):
        fresh.in_precedence(f"claude.T{n}")
    assert len(cache) == 1024
    fresh.in_precedence("claude.T0")
    assert len(cache) == 1024
    fresh.in_precedence("claude.Other")
    assert list(cache) == ["claude.Other"]


def evaluate_now(tool: str, arguments: dict[str, Any], text: str, **kwargs: Any) -> Any:
    return evaluate(
        ToolRequest(
            call="c-0000000000000001", session="s-000000000001", tool=tool, arguments=arguments
        ),
        ledger_usable=True,
        grants=grants(text),
        state=FRESH,
        now=NOW,
        external=CATALOGUE,
        **kwargs,
    )


def test_decide_takes_the_most_precedent_family_grant() -> None:
    verdict = evaluate_now("mcp.git.git_log", {"a": 1}, PRECEDENCE_TEXT)
    assert isinstance(verdict, Deny)
    ruling = verdict.decision
    assert (ruling.reason, ruling.grant, ruling.detail, ruling.definition) == (
        Reason.DENIED_BY_GRANT,
        "log-deny",
        'grant log-deny denies mcp.git.git_log on {"a":1}',
        "d1",
    )
    run = evaluate_now("mcp.github.issue", {}, PRECEDENCE_TEXT)
    assert isinstance(run, Run)
    assert (run.decision.grant, run.decision.definition, run.checked.external) == (
        "all-auto",
        "d1",
        CATALOGUE["mcp.github.issue"],
    )


def test_no_grant_for_an_external_tool_names_its_arguments() -> None:
    verdict = evaluate_now("claude.Bash", {"command": "ls"}, table("s", "shell", "auto"))
    assert isinstance(verdict, Deny)
    assert (verdict.decision.reason, verdict.decision.detail) == (
        Reason.NO_GRANT,
        'no grant allows claude.Bash on {"command":"ls"}',
    )


# ---------------------------------------------------------------------------------------
# Approve's re-decision binds the definition


def asked_ruling(definition: str | None) -> Ruling:
    return Ruling(
        "c-0000000000000001",
        "s-000000000001",
        "mcp.git.git_log",
        {},
        VerdictCode.ASK,
        definition=definition,
    )


def test_a_re_decision_on_another_definition_is_tool_changed() -> None:
    verdict = evaluate_now(
        "mcp.git.git_log", {}, table("a", "mcp.*", "auto"), asked=asked_ruling("d0")
    )
    assert isinstance(verdict, Deny)
    ruling = verdict.decision
    assert (ruling.reason, ruling.detail, ruling.definition, ruling.arguments, ruling.grant) == (
        Reason.TOOL_CHANGED,
        "mcp.git.git_log: its definition changed since the owner was asked "
        "(asked about d0, now d1)",
        "d1",
        {},
        None,
    )


def test_a_re_decision_on_the_same_definition_decides_as_usual() -> None:
    verdict = evaluate_now(
        "mcp.git.git_log", {}, table("a", "mcp.*", "auto"), asked=asked_ruling("d1")
    )
    assert isinstance(verdict, Run)
    assert verdict.decision.definition == "d1"


def test_the_binding_is_for_external_tools_only() -> None:
    # A built-in call's ask has no definition: its re-decision is not held to one.
    verdict = evaluate_now(
        "shell", {"command": "ls"}, table("s", "shell", "auto"), asked=asked_ruling("d1")
    )
    assert isinstance(verdict, Run)
    claude = evaluate_now(
        "claude.Bash", {}, table("c", "claude.*", "auto"), asked=asked_ruling(None)
    )
    assert isinstance(claude, Run)
    # A claude.* tool has no definition either, so an ask said to have one is changed.
    changed = evaluate_now(
        "claude.Bash", {}, table("c", "claude.*", "auto"), asked=asked_ruling("d1")
    )
    assert isinstance(changed, Deny)
    assert changed.decision.reason is Reason.TOOL_CHANGED


def test_without_asked_nothing_is_bound() -> None:
    verdict = evaluate_now("mcp.git.git_log", {}, table("a", "mcp.*", "auto"))
    assert isinstance(verdict, Run)


# ---------------------------------------------------------------------------------------
# approve --always


def always(tool: str, arguments: dict[str, Any], asking: Grant, scope: Scope = Scope.EXACT) -> Any:
    return always_grant(
        approval="a-01234567",
        call="c-0000000000000001",
        arguments=checked(tool, arguments),
        asking=asking,
        scope=scope,
        lasting=None,
        owner="ada",
        now=NOW,
    )


def test_always_writes_the_exact_tool_and_escaped_arguments() -> None:
    asking = Grant("git-ask", "mcp.git.*", Mode.ASK, max_taint=Taint.INTERNAL)
    arguments = {"repo_path": "/work/[a]*?", "n": 3, "flags": ["-a"]}
    fields = always("mcp.git.git_log", arguments, asking)
    assert fields == {
        "id": "always-a-01234567",
        "tool": "mcp.git.git_log",
        "mode": "auto",
        "wins_over_ask": True,
        "arguments": {"repo_path": ["/work/[[]a][*][?]"], "n": ["3"], "flags": ['[[]"-a"]']},
        "other_arguments": False,
        "max_taint": "internal",
        "if_untrusted": "ask",
        "note": "approved always by ada at 2026-06-01T00:00:00Z for approval a-01234567 "
        "(call c-0000000000000001)",
    }
    grant = grant_of(fields)
    assert grant.covers(checked("mcp.git.git_log", arguments), NOW)
    assert not grant.covers(checked("mcp.git.git_log", arguments | {"n": 4}), NOW)
    assert not grant.covers(
        checked("mcp.git.git_log", arguments | {"repo_path": "/work/[a]xy"}), NOW
    )
    assert not grant.covers(checked("mcp.git.git_log", arguments | {"force": True}), NOW)
    assert not grant.covers(checked("mcp.git.git_log", {"repo_path": "/work/[a]*?", "n": 3}), NOW)
    assert not grant.matches("mcp.git.git_push", checked("mcp.git.git_push", arguments), NOW)


def test_always_names_empty_names_and_values_exactly() -> None:
    arguments = {"": "", "x": ""}
    fields = always("mcp.git.git_log", arguments, Grant("g", "mcp.git.*", Mode.ASK))
    assert fields["arguments"] == {"": [""], "x": [""]}
    grant = grant_of(fields)
    assert grant.covers(checked("mcp.git.git_log", arguments), NOW)
    assert not grant.covers(checked("mcp.git.git_log", {"": "", "x": " "}), NOW)


def test_always_refuses_a_nul_it_cannot_write() -> None:
    found = always("mcp.git.git_log", {"a": "x\x00y"}, Grant("g", "mcp.git.*", Mode.ASK))
    assert found == ScopeProblem(
        "an argument holds a NUL byte, which a grant cannot name; approve it once"
    )
    # Inside a list or object the NUL is canonical JSON's escape: written as text.
    nested = always("mcp.git.git_log", {"a": ["\x00"]}, Grant("g", "mcp.git.*", Mode.ASK))
    assert nested["arguments"] == {"a": ['[[]"\\u0000"]']}
    assert grant_of(nested).covers(checked("mcp.git.git_log", {"a": ["\x00"]}), NOW)


def test_an_empty_name_or_pattern_parses() -> None:
    [grant] = grants(table("g", "mcp.*", "auto", 'arguments = { "" = [""] }')).grants
    assert grant.arguments == (("", ("",)),)


def test_always_for_a_call_without_arguments_allows_none() -> None:
    fields = always("claude.Bash", {}, Grant("c", "claude.*", Mode.ASK))
    assert "arguments" not in fields
    assert (fields["tool"], fields["other_arguments"]) == ("claude.Bash", False)
    grant = grant_of(fields)
    assert grant.covers(checked("claude.Bash", {}), NOW)
    assert not grant.covers(checked("claude.Bash", {"command": "ls"}), NOW)


def test_always_has_no_dir_scope_for_external_tools() -> None:
    assert always("claude.Bash", {}, Grant("c", "claude.*", Mode.ASK), Scope.DIR) == ScopeProblem(
        "--scope dir applies to file tools only, not claude.Bash"
    )


def test_asked_checks_with_the_catalogue() -> None:
    grant_set = grants(table("git-ask", "mcp.git.*", "ask"))
    found = asked(
        grant_set,
        grant="git-ask",
        tool="mcp.git.git_log",
        arguments={},
        workspace="/w",
        external=CATALOGUE,
    )
    assert not isinstance(found, ScopeProblem)
    assert found.arguments.external == CATALOGUE["mcp.git.git_log"]
    assert asked(
        grant_set, grant="git-ask", tool="mcp.git.git_log", arguments={}, workspace="/w"
    ) == (ScopeProblem("unknown tool 'mcp.git.git_log'"))
    changed = {
        "mcp.git.git_log": attrs.evolve(CATALOGUE["mcp.git.git_log"], state=ToolState.CHANGED)
    }
    problem = asked(
        grant_set,
        grant="git-ask",
        tool="mcp.git.git_log",
        arguments={},
        workspace="/w",
        external=changed,
    )
    assert isinstance(problem, ScopeProblem)
    assert problem.message.startswith("mcp.git.git_log: its definition changed since it was pinned")


# ---------------------------------------------------------------------------------------
# grants check: shadowing across families


@pytest.mark.parametrize(
    ("wide", "narrow", "covers"),
    [
        ("mcp.*", "mcp.git.*", True),
        ("mcp.*", "mcp.git.x", True),
        ("mcp.git.*", "mcp.git.x", True),
        ("mcp.git.*", "mcp.github.x", False),
        ("mcp.git.*", "mcp.*", False),
        ("mcp.git.x", "mcp.git.*", False),
        ("claude.*", "claude.Bash", True),
        ("claude.*", "mcp.git.x", False),
        ("mcp.*", "claude.Bash", False),
        ("shell", "shell", True),
        ("shell", "read_file", False),
    ],
)
def test_tool_covers(wide: str, narrow: str, covers: bool) -> None:
    assert tool_covers(wide, narrow) is covers


def test_a_family_deny_shadows_a_tool_grant() -> None:
    lint = lint_grants(
        table("deny-all", "mcp.*", "deny") + table("log", "mcp.git.git_log", "auto"), NOW
    )
    [warning] = lint.warnings
    assert (warning.code, warning.grant_id) == ("shadowed", "log")


def test_argument_patterns_in_shadowing() -> None:
    first = Grant("a", "mcp.git.*", Mode.DENY, arguments=(("p", ("/work/*",)),))
    narrower = Grant("b", "mcp.git.x", Mode.AUTO, arguments=(("p", ("/work/a*",)), ("q", ("1",))))
    wider = Grant("c", "mcp.git.x", Mode.AUTO, arguments=(("p", ("*",)),))
    unnamed = Grant("d", "mcp.git.x", Mode.AUTO)
    assert shadows(first, narrower, NOW)
    assert not shadows(first, wider, NOW)
    assert not shadows(first, unnamed, NOW)
    exact = Grant("e", "mcp.git.*", Mode.DENY, other_arguments=False, arguments=(("p", ("*",)),))
    assert not shadows(exact, narrower, NOW)  # narrower may carry q too
    closed = Grant("f", "mcp.git.x", Mode.AUTO, other_arguments=False, arguments=(("p", ("/a",)),))
    assert shadows(exact, closed, NOW)
    two = attrs.evolve(closed, arguments=(("p", ("/a",)), ("q", ("1",))))
    assert not shadows(exact, two, NOW)  # two allows q, which exact does not
    assert not shadows(exact, attrs.evolve(closed, other_arguments=True), NOW)
