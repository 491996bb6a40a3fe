"""Deciding (docs/architecture.md): every denial's exact reason, the pipeline's order,
precedence, and properties of decide() against a literal reading of its rules."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.harness.grants import checked
from tests.harness.grants import grant_set as grants
from tests.harness.homes import grant_table

from boxmaker.core.decide import (
    Ask,
    CheckedRequest,
    Deny,
    Ruling,
    Run,
    Verdict,
    approval_outcome,
    decide,
    evaluate,
)
from boxmaker.core.grant_parse import GrantsProblem
from boxmaker.core.grants import Grant, GrantSet, Mode
from boxmaker.core.labels import FRESH, UNKNOWN, Label, Taint
from boxmaker.core.paths import Glob
from boxmaker.core.reasons import AUDIT_UNAVAILABLE_DETAIL, Reason
from boxmaker.core.state import StateUnreadable
from boxmaker.core.vocabulary import ToolRequest

NOW = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)
CALL = "c-0123456789abcdef"
SESSION = "s-0123456789ab"
INTERNAL = Label(Taint.INTERNAL, False)
SECRET = Label(Taint.SECRET, False)
UNTRUSTED = Label(Taint.PUBLIC, True)


def g(gid: str, mode: str, tool: str = "read_file", **extra: str) -> str:
    return grant_table(gid, tool, mode, **extra)


def request(tool: str = "read_file", **arguments: Any) -> ToolRequest:
    return ToolRequest(
        call=CALL, session=SESSION, tool=tool, arguments=arguments or {"path": "notes.txt"}
    )


def run_evaluate(
    req: ToolRequest,
    grant_set: GrantSet | GrantsProblem,
    state: Label | StateUnreadable = FRESH,
    *,
    ledger_usable: bool = True,
    now: dt.datetime = NOW,
) -> Verdict:
    return evaluate(req, ledger_usable=ledger_usable, grants=grant_set, state=state, now=now)


def denied(verdict: Verdict) -> Ruling:
    assert isinstance(verdict, Deny), verdict
    assert verdict.decision.verdict == "deny"
    return verdict.decision


# --- the pipeline's steps 2-5, and their order ---------------------------------------------

BAD_GRANTS = GrantsProblem("grants.toml", "read-notes", "mode", "expected one of auto, ask, deny")


def test_audit_unavailable_first_and_not_recordable() -> None:
    decision = denied(
        run_evaluate(request("rm_rf"), BAD_GRANTS, StateUnreadable("gone"), ledger_usable=False)
    )
    assert decision.reason is Reason.AUDIT_UNAVAILABLE
    assert decision.detail == AUDIT_UNAVAILABLE_DETAIL
    assert decision.recordable is False
    assert decision.state == UNKNOWN
    assert decision.arguments == {"path": "notes.txt"}


def test_every_other_denial_is_recordable() -> None:
    for verdict in (
        run_evaluate(request("rm_rf"), GrantSet()),
        run_evaluate(request(path="../x"), GrantSet()),
        run_evaluate(request(), BAD_GRANTS),
        run_evaluate(request(), GrantSet(), StateUnreadable("bad JSON")),
        run_evaluate(request(), GrantSet()),
    ):
        assert denied(verdict).recordable is True


def test_unknown_tool_before_grants_and_state() -> None:
    decision = denied(run_evaluate(request("rm_rf"), BAD_GRANTS, StateUnreadable("x")))
    assert decision.reason is Reason.UNKNOWN_TOOL
    assert decision.detail == "unknown tool 'rm_rf'"
    assert decision.tool == "rm_rf"


def test_bad_arguments_before_grants_and_state_keeps_the_raw_arguments() -> None:
    req = request(path="../etc/passwd")
    decision = denied(run_evaluate(req, BAD_GRANTS, StateUnreadable("x")))
    assert decision.reason is Reason.BAD_ARGUMENTS
    assert decision.detail == "argument 'path': '..' leaves the workspace"
    assert decision.arguments == {"path": "../etc/passwd"}
    assert decision.state == UNKNOWN


def test_grants_invalid_before_state_unreadable() -> None:
    decision = denied(run_evaluate(request(path="./notes.txt"), BAD_GRANTS, StateUnreadable("x")))
    assert decision.reason is Reason.GRANTS_INVALID
    assert decision.detail == (
        "grants.toml, grant 'read-notes', key 'mode': expected one of auto, ask, deny; "
        "see docs/runbook.md#grants"
    )
    assert decision.grant is None
    assert decision.arguments == {"path": "notes.txt"}
    assert decision.state == UNKNOWN


def test_grants_invalid_carries_a_readable_state() -> None:
    assert denied(run_evaluate(request(), BAD_GRANTS, SECRET)).state == SECRET


def test_state_unreadable_decides_on_unknown() -> None:
    everything = grants(g("all", "auto"))
    decision = denied(run_evaluate(request(), everything, StateUnreadable("bad JSON")))
    assert decision.reason is Reason.STATE_UNREADABLE
    assert decision.detail == "bad JSON; see docs/runbook.md#state"
    assert decision.state == Label(Taint.SECRET, True)


def test_evaluate_passes_the_workspace_on() -> None:
    req = request(path="/w/notes.txt")
    verdict = evaluate(
        req, ledger_usable=True, grants=grants(g("a", "auto")), state=FRESH, now=NOW, workspace="/w"
    )
    assert isinstance(verdict, Run)
    assert verdict.decision.arguments == {"path": "notes.txt"}
    assert denied(run_evaluate(req, grants(g("a", "auto")))).reason is Reason.BAD_ARGUMENTS


# --- decide(): the pipeline's step 6 ------------------------------------------------------


def test_no_grant() -> None:
    decision = denied(run_evaluate(request(), GrantSet()))
    assert decision.reason is Reason.NO_GRANT
    assert decision.detail == "no grant allows read_file on notes.txt"
    assert (decision.grant, decision.mode, decision.state) == (None, None, FRESH)


def test_no_grant_details_for_shell_and_http_get() -> None:
    shell = denied(run_evaluate(request("shell", command="rm -rf x"), GrantSet()))
    assert shell.detail == "no grant allows shell on rm -rf x"
    http = denied(run_evaluate(request("http_get", url="https://Evil.net/x"), GrantSet()))
    assert http.detail == "no grant allows http_get on evil.net"


def test_a_grant_for_another_path_or_tool_is_no_grant() -> None:
    text = g("other", "auto", paths='["docs/**"]') + g("ls", "auto", tool="list_dir")
    assert denied(run_evaluate(request(), grants(text))).reason is Reason.NO_GRANT


def test_run_with_an_auto_grant() -> None:
    verdict = run_evaluate(request(path="./notes.txt"), grants(g("read-all", "auto", note='"n"')))
    assert isinstance(verdict, Run)
    decision = verdict.decision
    assert decision == Ruling(
        call=CALL,
        session=SESSION,
        tool="read_file",
        arguments={"path": "notes.txt"},
        verdict="run",
        reason=None,
        detail=None,
        grant="read-all",
        mode=Mode.AUTO,
        note="n",
        state=FRESH,
        recordable=True,
    )


def test_ask_with_an_ask_grant() -> None:
    verdict = run_evaluate(request(), grants(g("read-notes", "ask", note='"why"')))
    assert isinstance(verdict, Ask)
    assert (verdict.decision.verdict, verdict.decision.grant) == ("ask", "read-notes")
    assert (verdict.decision.mode, verdict.decision.note) == (Mode.ASK, "why")
    assert verdict.decision.reason is None


def test_denied_by_grant_names_it() -> None:
    text = g("read-all", "auto") + g("no-notes", "deny", paths='["notes*"]', note='"private"')
    decision = denied(run_evaluate(request(), grants(text)))
    assert decision.reason is Reason.DENIED_BY_GRANT
    assert decision.grant == "no-notes"
    assert decision.mode is Mode.DENY
    assert decision.note == "private"
    assert decision.detail == "grant no-notes denies read_file on notes.txt"


def test_precedence_deny_over_ask_over_auto_and_file_order() -> None:
    auto1, auto2 = g("auto-1", "auto"), g("auto-2", "auto")
    ask1, ask2 = g("ask-1", "ask"), g("ask-2", "ask")
    deny1, deny2 = g("deny-1", "deny"), g("deny-2", "deny")
    assert run_evaluate(request(), grants(auto1 + auto2)).decision.grant == "auto-1"
    assert run_evaluate(request(), grants(auto2 + auto1)).decision.grant == "auto-2"
    assert run_evaluate(request(), grants(auto1 + ask2 + ask1)).decision.grant == "ask-2"
    assert run_evaluate(request(), grants(ask1 + auto1)).decision.grant == "ask-1"
    assert run_evaluate(request(), grants(auto1 + ask1 + deny2 + deny1)).decision.grant == "deny-2"
    assert run_evaluate(request(), grants(deny1 + ask1 + auto1)).decision.grant == "deny-1"


def test_an_expired_deny_grant_does_not_win() -> None:
    text = g("deny-old", "deny", expires="2026-06-01T12:00:00Z") + g("read", "auto")
    verdict = run_evaluate(request(), grants(text))
    assert isinstance(verdict, Run)
    assert verdict.decision.grant == "read"


def test_expiry_boundary_exactly_at_expires() -> None:
    text = g("read", "auto", expires="2026-06-01T12:00:00Z")
    before = NOW - dt.timedelta(microseconds=1)
    assert isinstance(run_evaluate(request(), grants(text), now=before), Run)
    assert denied(run_evaluate(request(), grants(text), now=NOW)).reason is Reason.NO_GRANT


@pytest.mark.parametrize(
    ("max_taint", "state", "allowed"),
    [
        ("public", FRESH, True),
        ("public", INTERNAL, False),
        ("internal", INTERNAL, True),
        ("internal", SECRET, False),
        ("secret", SECRET, True),
    ],
)
def test_taint_boundary(max_taint: str, state: Label, allowed: bool) -> None:
    text = g("read", "auto", max_taint=f'"{max_taint}"')
    verdict = run_evaluate(request(), grants(text), state)
    if allowed:
        assert isinstance(verdict, Run)
    else:
        decision = denied(verdict)
        assert decision.reason is Reason.TAINT_EXCEEDED
        assert decision.grant == "read"
        assert decision.mode is Mode.AUTO
        assert decision.state == state
        assert decision.detail == (
            f"the session's taint {state.taint} is above grant read's max_taint {max_taint}"
        )


def test_taint_is_checked_before_untrusted() -> None:
    text = g("read", "auto", max_taint='"public"', if_untrusted='"deny"')
    decision = denied(run_evaluate(request(), grants(text), Label(Taint.SECRET, True)))
    assert decision.reason is Reason.TAINT_EXCEEDED


@pytest.mark.parametrize(
    ("mode", "if_untrusted", "expected"),
    [
        ("auto", "auto", "run"),
        ("auto", "ask", "ask"),
        ("auto", "deny", "deny"),
        ("ask", "auto", "ask"),
        ("ask", "ask", "ask"),
        ("ask", "deny", "deny"),
    ],
)
def test_untrusted_conditions(mode: str, if_untrusted: str, expected: str) -> None:
    text = g("read", mode, if_untrusted=f'"{if_untrusted}"')
    trusted = run_evaluate(request(), grants(text), FRESH)
    assert trusted.decision.verdict == ("run" if mode == "auto" else "ask")
    decision = run_evaluate(request(), grants(text), UNTRUSTED).decision
    assert decision.verdict == expected
    assert decision.grant == "read"
    if expected == "deny":
        assert decision.reason is Reason.UNTRUSTED
        assert decision.detail == "the session is untrusted and grant read says if_untrusted = deny"
    else:
        assert decision.reason is None


def test_untrusted_turns_auto_into_ask_with_the_default() -> None:
    verdict = run_evaluate(request(), grants(g("read", "auto")), UNTRUSTED)
    assert isinstance(verdict, Ask)
    assert verdict.decision.mode is Mode.ASK
    assert verdict.decision.detail == (
        "the session is untrusted and grant read says if_untrusted = ask"
    )


def test_only_the_picked_grant_is_held_to_its_conditions() -> None:
    # The ask grant wins precedence; its max_taint denies; the auto grant is not tried.
    text = g("ask-narrow", "ask", max_taint='"internal"') + g("auto-wide", "auto")
    decision = denied(run_evaluate(request(), grants(text), SECRET))
    assert (decision.reason, decision.grant) == (Reason.TAINT_EXCEEDED, "ask-narrow")


def test_shell_and_http_get_grants() -> None:
    text = g("git", "auto", tool="shell", commands='["git status*"]') + g(
        "docs", "ask", tool="http_get", hosts='["*.python.org"]'
    )
    assert isinstance(run_evaluate(request("shell", command="git status -s"), grants(text)), Run)
    assert isinstance(
        run_evaluate(request("http_get", url="https://docs.python.org/3/"), grants(text)), Ask
    )
    no = denied(run_evaluate(request("http_get", url="https://python.org/"), grants(text)))
    assert no.reason is Reason.NO_GRANT
    # A port the grant does not name is the ordinary no_grant.
    port = denied(
        run_evaluate(request("http_get", url="https://docs.python.org:8443/"), grants(text))
    )
    assert (port.reason, port.grant) == (Reason.NO_GRANT, None)


# --- approve's re-decision (docs/protocol.md) ---------------------------------------------


def test_redecision_on_approve() -> None:
    asked = grants(g("read-notes", "ask"))
    first = run_evaluate(request(), asked)
    assert approval_outcome(first) == "ask"
    now_auto = grants(g("read-notes", "auto"))
    assert approval_outcome(run_evaluate(request(), now_auto)) == "allowed"
    removed = run_evaluate(request(), GrantSet())
    assert approval_outcome(removed) == "denied"
    assert denied(removed).reason is Reason.NO_GRANT
    deny_added = run_evaluate(request(), grants(g("read-notes", "ask") + g("stop", "deny")))
    assert denied(deny_added).reason is Reason.DENIED_BY_GRANT
    risen = run_evaluate(request(), grants(g("read-notes", "ask", max_taint='"public"')), INTERNAL)
    assert denied(risen).reason is Reason.TAINT_EXCEEDED
    invalid = run_evaluate(request(), BAD_GRANTS)
    assert denied(invalid).reason is Reason.GRANTS_INVALID
    unreadable = run_evaluate(request(), asked, StateUnreadable("x"))
    assert approval_outcome(unreadable) == "denied"


# --- properties --------------------------------------------------------------------------------

GLOBS = ["notes/**", "*.txt", "**/.env", "secrets/**", "**", "a/*/b"]
PATHS = ["notes.txt", "notes/a.txt", ".env", "a/.env", "secrets/k", "a/x/b", ".", "z"]
COMMANDS = ["git status*", "ls", "*", "make *"]
COMMAND_ARGS = ["git status", "git status; rm x", "ls", "ls -la", "make test", "rm -rf /"]
HOSTS = ["a.org", "*.a.org", "b.net"]
URLS = ["https://a.org/", "https://x.a.org/", "http://b.net/x", "https://c.com/"]
TIMES = [NOW - dt.timedelta(days=1), NOW, NOW + dt.timedelta(microseconds=1), None]

taints = st.sampled_from(list(Taint))
modes = st.sampled_from(list(Mode))


@st.composite
def grant_lists(draw: st.DrawFn) -> list[Grant]:
    count = draw(st.integers(min_value=0, max_value=8))
    result = []
    for index in range(count):
        tool = draw(st.sampled_from(["read_file", "list_dir", "shell", "http_get"]))
        paths = commands = None
        hosts: tuple[str, ...] = ()
        if tool in ("read_file", "list_dir") and draw(st.booleans()):
            chosen = draw(st.lists(st.sampled_from(GLOBS), min_size=1, max_size=2))
            paths = tuple(Glob.compile(p) for p in chosen)
        if tool == "shell" and draw(st.booleans()):
            commands = tuple(draw(st.lists(st.sampled_from(COMMANDS), min_size=1, max_size=2)))
        if tool == "http_get":
            hosts = tuple(draw(st.lists(st.sampled_from(HOSTS), min_size=1, max_size=2)))
        result.append(
            Grant(
                id=f"g{index}",
                tool=tool,  # type: ignore[arg-type]
                mode=draw(modes),
                paths=paths,
                commands=commands,
                hosts=hosts,
                max_taint=draw(taints),
                if_untrusted=draw(modes),
                label_taint=None,
                expires=draw(st.sampled_from(TIMES)),
                note=draw(st.none() | st.just("n")),
            )
        )
    return result


@st.composite
def checked_requests(draw: st.DrawFn) -> CheckedRequest:
    tool = draw(st.sampled_from(["read_file", "list_dir", "shell", "http_get"]))
    if tool in ("read_file", "list_dir"):
        arguments: dict[str, Any] = {"path": draw(st.sampled_from(PATHS))}
    elif tool == "shell":
        arguments = {"command": draw(st.sampled_from(COMMAND_ARGS))}
    else:
        arguments = {"url": draw(st.sampled_from(URLS))}
    return CheckedRequest(CALL, SESSION, checked(tool, arguments))


states = st.builds(Label, taints, st.booleans())
nows = st.sampled_from([NOW - dt.timedelta(microseconds=1), NOW, NOW + dt.timedelta(days=2)])


def reference(
    req: CheckedRequest, grant_list: list[Grant], state: Label, now: dt.datetime
) -> tuple[str, Reason | None, str | None]:
    """decide()'s rules (step 6), read literally: (verdict, reason, grant)."""
    matching = [
        grant
        for grant in grant_list
        if grant.tool == req.tool
        and (grant.expires is None or now < grant.expires)
        and grant.matches(req.tool, req.arguments, now)
    ]
    for mode in (Mode.DENY, Mode.ASK, Mode.AUTO):
        picked = [grant for grant in matching if grant.mode == mode]
        if picked:
            grant = picked[0]
            break
    else:
        return ("deny", Reason.NO_GRANT, None)
    if grant.mode == Mode.DENY:
        return ("deny", Reason.DENIED_BY_GRANT, grant.id)
    order = [Taint.PUBLIC, Taint.INTERNAL, Taint.SECRET]
    if order.index(state.taint) > order.index(grant.max_taint):
        return ("deny", Reason.TAINT_EXCEEDED, grant.id)
    if state.untrusted and grant.if_untrusted == Mode.DENY:
        return ("deny", Reason.UNTRUSTED, grant.id)
    if grant.mode == Mode.ASK or (state.untrusted and grant.if_untrusted == Mode.ASK):
        return ("ask", None, grant.id)
    return ("run", None, grant.id)


@given(checked_requests(), grant_lists(), states, nows)
def test_decide_agrees_with_the_spec_read_literally(
    req: CheckedRequest, grant_list: list[Grant], state: Label, now: dt.datetime
) -> None:
    verdict = decide(req, GrantSet(tuple(grant_list)), state, now)
    decision = verdict.decision
    assert (decision.verdict, decision.reason, decision.grant) == reference(
        req, grant_list, state, now
    )
    kind = {"run": Run, "ask": Ask, "deny": Deny}[decision.verdict]
    assert isinstance(verdict, kind)
    assert decision.state == state
    assert (decision.call, decision.session, decision.tool) == (CALL, SESSION, req.tool)
    assert decision.arguments == req.arguments.to_json()


@given(checked_requests(), grant_lists(), states, nows)
def test_decide_is_deterministic(
    req: CheckedRequest, grant_list: list[Grant], state: Label, now: dt.datetime
) -> None:
    grant_set = GrantSet(tuple(grant_list))
    assert decide(req, grant_set, state, now) == decide(req, grant_set, state, now)
    assert decide(req, GrantSet(tuple(grant_list)), state, now) == decide(
        req, grant_set, state, now
    )


def covering(req: CheckedRequest, gid: str, mode: Mode) -> Grant:
    """A grant that matches ``req`` whatever its arguments."""
    host = req.arguments.host
    return Grant(id=gid, tool=req.arguments.tool, mode=mode, hosts=(host,) if host else ())


@given(checked_requests(), grant_lists(), states, nows)
def test_a_matching_deny_grant_always_wins(
    req: CheckedRequest, grant_list: list[Grant], state: Label, now: dt.datetime
) -> None:
    deny_all = covering(req, "deny-all", Mode.DENY)
    for position in (0, len(grant_list)):
        with_deny = [*grant_list[:position], deny_all, *grant_list[position:]]
        decision = decide(req, GrantSet(tuple(with_deny)), state, now).decision
        assert decision.reason is Reason.DENIED_BY_GRANT
        earlier_denies = [
            grant.id
            for grant in with_deny
            if grant.mode is Mode.DENY and grant.matches(req.tool, req.arguments, now)
        ]
        assert decision.grant == earlier_denies[0]


@given(checked_requests(), grant_lists(), states, nows)
def test_an_ask_grant_beats_every_auto_grant(
    req: CheckedRequest, grant_list: list[Grant], state: Label, now: dt.datetime
) -> None:
    no_denies = [grant for grant in grant_list if grant.mode is not Mode.DENY]
    ask_all = covering(req, "ask-all", Mode.ASK)
    decision = decide(req, GrantSet((*no_denies, ask_all)), state, now).decision
    assert decision.grant is not None
    picked = next(grant for grant in (*no_denies, ask_all) if grant.id == decision.grant)
    assert picked.mode is Mode.ASK


@given(
    st.sampled_from(["read_file", "list_dir", "write_file", "shell", "http_get", "x"]),
    st.dictionaries(
        st.sampled_from(["path", "command", "url", "content", "max_bytes", "y"]),
        st.none() | st.integers() | st.text(max_size=12) | st.sampled_from(PATHS + URLS),
        max_size=3,
    ),
    grant_lists(),
    states | st.builds(StateUnreadable, st.text(max_size=5)),
    st.booleans(),
    nows,
)
def test_evaluate_is_total(
    tool: str,
    arguments: dict[str, Any],
    grant_list: list[Grant],
    state: Label | StateUnreadable,
    ledger_usable: bool,
    now: dt.datetime,
) -> None:
    req = ToolRequest(call=CALL, session=SESSION, tool=tool, arguments=arguments)
    verdict = evaluate(
        req, ledger_usable=ledger_usable, grants=GrantSet(tuple(grant_list)), state=state, now=now
    )
    assert isinstance(verdict, Run | Ask | Deny)
    decision = verdict.decision
    assert decision.recordable is ledger_usable
    if isinstance(state, StateUnreadable):
        assert decision.state == UNKNOWN
        assert isinstance(verdict, Deny)
    if isinstance(verdict, Deny):
        assert decision.reason is not None
    else:
        assert decision.grant is not None


# --- what an ask becomes when it is denied before the owner is asked -----------------------


def test_an_ask_that_cannot_run_is_denied_not_found_on_its_grant_and_state() -> None:
    text = g("write-docs", "ask", tool="write_file", note='"drafts"')
    req = request("write_file", path="docs/new/a.txt", content="x")
    ask = run_evaluate(req, grants(text), INTERNAL)
    assert isinstance(ask, Ask)
    deny = ask.cannot_run("docs/new")
    assert isinstance(deny, Deny)
    assert deny.decision == Ruling(
        call=CALL,
        session=SESSION,
        tool="write_file",
        arguments=ask.decision.arguments,
        verdict="deny",
        reason=Reason.NOT_FOUND,
        detail=(
            "docs/new/a.txt: the directory docs/new does not exist "
            "(write_file does not create directories)"
        ),
        grant="write-docs",
        mode=Mode.ASK,
        note="drafts",
        state=INTERNAL,
        recordable=True,
    )
    # The ask itself is unchanged.
    assert ask.decision.verdict == "ask"
    assert ask.decision.reason is None


def test_an_ask_denied_too_many_pending_keeps_everything_but_verdict_reason_detail() -> None:
    ask = run_evaluate(request(), grants(g("read-notes", "ask")), SECRET)
    assert isinstance(ask, Ask)
    decision = ask.too_many_pending("3 asks are pending").decision
    assert decision == Ruling(
        call=CALL,
        session=SESSION,
        tool="read_file",
        arguments={"path": "notes.txt"},
        verdict="deny",
        reason=Reason.TOO_MANY_PENDING,
        detail="3 asks are pending",
        grant="read-notes",
        mode=Mode.ASK,
        state=SECRET,
    )


def test_run_and_ask_carry_the_picked_grant_and_the_checked_arguments() -> None:
    text = g("read-all", "auto") + g("ask-notes", "ask", paths='["notes*"]')
    run = run_evaluate(request(path="docs/a.md"), grants(text))
    assert isinstance(run, Run)
    assert run.grant.id == "read-all"
    assert run.checked == checked("read_file", {"path": "docs/a.md"})
    ask = run_evaluate(request(path="./notes.txt"), grants(text))
    assert isinstance(ask, Ask)
    assert ask.grant.id == "ask-notes"
    assert ask.checked == checked("read_file", {"path": "notes.txt"})


def test_an_untrusted_deny_keeps_the_grants_mode_and_the_state() -> None:
    for mode in ("auto", "ask"):
        text = g("read", mode, if_untrusted='"deny"', note='"n"')
        decision = denied(run_evaluate(request(), grants(text), UNTRUSTED))
        assert decision.reason is Reason.UNTRUSTED
        assert (decision.grant, decision.mode, decision.note) == ("read", Mode(mode), "n")
        assert decision.state == UNTRUSTED
        assert (decision.call, decision.session) == (CALL, SESSION)


def test_every_early_denial_names_the_call_and_session() -> None:
    for verdict in (
        run_evaluate(request(), BAD_GRANTS, ledger_usable=False),
        run_evaluate(request("rm_rf"), GrantSet()),
        run_evaluate(request(path="../x"), GrantSet()),
        run_evaluate(request(), BAD_GRANTS),
        run_evaluate(request(), GrantSet(), StateUnreadable("bad JSON")),
    ):
        decision = denied(verdict)
        assert (decision.call, decision.session) == (CALL, SESSION)
        assert (decision.grant, decision.mode, decision.note) == (None, None, None)


def test_state_unreadable_records_the_checked_arguments() -> None:
    decision = denied(run_evaluate(request(path="./a//b.txt"), GrantSet(), StateUnreadable("x")))
    assert decision.reason is Reason.STATE_UNREADABLE
    assert decision.arguments == {"path": "a/b.txt"}
