"""Before the owner is asked (core/before_asking.py): which verdicts need a look on disk,
and what each becomes given what the look found."""

from __future__ import annotations

import datetime as dt
from typing import Any

import attrs
from hypothesis import given
from hypothesis import strategies as st
from tests.harness.grants import grant_set
from tests.harness.homes import grant

from boxmaker.core.before_asking import before_asking, needs_sandbox, path_to_look
from boxmaker.core.decide import Ask, Deny, Ruling, Run, Verdict, evaluate
from boxmaker.core.grants import Mode
from boxmaker.core.labels import Label, Taint
from boxmaker.core.reasons import Reason
from boxmaker.core.vocabulary import ToolRequest

NOW = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)
CALL = "c-0123456789abcdef"
SESSION = "s-0123456789ab"
INTERNAL = Label(Taint.INTERNAL, False)
GRANTS = grant_set(
    grant("write-drafts", "write_file", "ask", paths=["drafts/**"], note="drafts")
    + grant("write-out", "write_file", "auto", paths=["out/**"])
    + grant("no-env", "write_file", "deny", paths=["**/.env"])
    + grant("read-any", "read_file", "ask")
    + grant("list-any", "list_dir", "ask")
    + grant("git", "shell", "ask", commands=["git status"])
    + grant("web", "http_get", "ask", hosts=["docs.python.org"])
)


def verdict(tool: str, **arguments: Any) -> Verdict:
    request = ToolRequest(call=CALL, session=SESSION, tool=tool, arguments=arguments)
    return evaluate(request, ledger_usable=True, grants=GRANTS, state=INTERNAL, now=NOW)


def write(path: str) -> Verdict:
    return verdict("write_file", path=path, content="# plan\n")


def test_a_write_ask_is_looked_at_by_its_normalized_path() -> None:
    ask = write("./drafts/2026/../2026/plan.md")
    assert isinstance(ask, Ask)
    assert path_to_look(ask) == "drafts/2026/plan.md"


def test_nothing_else_needs_a_look() -> None:
    run, deny = write("out/a.txt"), write("drafts/.env")
    assert (type(run), type(deny)) == (Run, Deny)
    assert path_to_look(run) is None
    assert path_to_look(deny) is None
    others = [
        verdict("read_file", path="drafts/plan.md"),
        verdict("list_dir", path="drafts"),
        verdict("shell", command="git status"),
        verdict("http_get", url="https://docs.python.org/3/"),
    ]
    assert [type(each) for each in others] == [Ask] * 4
    assert [path_to_look(each) for each in others] == [None] * 4


def test_a_write_ask_into_a_missing_directory_is_denied_not_found_naming_it() -> None:
    ask = write("drafts/2026/plan.md")
    assert isinstance(ask, Ask)
    deny = before_asking(ask, "drafts")
    assert isinstance(deny, Deny)
    assert deny.decision == Ruling(
        call=CALL,
        session=SESSION,
        tool="write_file",
        arguments={"path": "drafts/2026/plan.md", "content": "# plan\n"},
        verdict="deny",
        reason=Reason.NOT_FOUND,
        detail=(
            "drafts/2026/plan.md: the directory drafts does not exist "
            "(write_file does not create directories)"
        ),
        grant="write-drafts",
        mode=Mode.ASK,
        note="drafts",
        state=INTERNAL,
        recordable=True,
    )
    assert before_asking(ask, "drafts/2026").decision.detail == (
        "drafts/2026/plan.md: the directory drafts/2026 does not exist "
        "(write_file does not create directories)"
    )


def test_a_write_ask_whose_directories_exist_is_asked() -> None:
    ask = write("drafts/2026/plan.md")
    assert before_asking(ask, None) is ask


def test_a_missing_directory_changes_no_other_verdict() -> None:
    """A look is only taken for a write ask; were one found for anything else, it is
    not that verdict's business: a run fails not_found by itself, a denial stays."""
    for each in (
        write("out/new/a.txt"),
        write("drafts/.env"),
        verdict("read_file", path="drafts/plan.md"),
        verdict("list_dir", path="drafts/2026"),
        verdict("shell", command="git status"),
    ):
        assert before_asking(each, "drafts") is each


@given(
    tool=st.sampled_from(["read_file", "list_dir", "write_file"]),
    path=st.sampled_from(["drafts/a", "drafts/x/y", "out/z", "a/.env", "other", "."]),
    taint=st.sampled_from(list(Taint)),
    untrusted=st.booleans(),
    missing=st.none() | st.sampled_from(["drafts", "drafts/x", "out"]),
)
def test_only_a_write_ask_with_a_missing_directory_changes(
    tool: str, path: str, taint: Taint, untrusted: bool, missing: str | None
) -> None:
    arguments: dict[str, Any] = {"path": path}
    if tool == "write_file":
        arguments["content"] = "x"
    request = ToolRequest(call=CALL, session=SESSION, tool=tool, arguments=arguments)
    state = Label(taint, untrusted)
    decided = evaluate(request, ledger_usable=True, grants=GRANTS, state=state, now=NOW)
    after = before_asking(decided, missing)
    if missing is None or path_to_look(decided) is None:
        assert after is decided
        return
    assert isinstance(decided, Ask)
    assert isinstance(after, Deny)
    # The same decision on the same grant and state, denied not_found.
    assert after.decision == attrs.evolve(
        decided.decision,
        verdict="deny",
        reason=Reason.NOT_FOUND,
        detail=f"{path_to_look(decided)}: the directory {missing} does not exist "
        "(write_file does not create directories)",
    )


# --- a shell ask whose sandbox cannot run --------------------------------------------

NO_SANDBOX = "bubblewrap (bwrap) is not available; see docs/runbook.md#sandbox"


def test_only_a_shell_ask_needs_the_sandbox_looked_at() -> None:
    shell_ask = verdict("shell", command="git status")
    shell_deny = verdict("shell", command="rm -rf /")
    assert (type(shell_ask), type(shell_deny)) == (Ask, Deny)
    assert needs_sandbox(shell_ask)
    assert not needs_sandbox(shell_deny)
    others = [
        write("drafts/plan.md"),
        verdict("read_file", path="drafts/plan.md"),
        verdict("http_get", url="https://docs.python.org/3/"),
    ]
    assert [needs_sandbox(each) for each in others] == [False] * 3


def test_a_shell_ask_whose_sandbox_cannot_run_is_denied_with_the_finding() -> None:
    ask = verdict("shell", command="git status")
    assert isinstance(ask, Ask)
    deny = before_asking(ask, None, NO_SANDBOX)
    assert isinstance(deny, Deny)
    # The same decision on the same grant and state, denied sandbox_unavailable with the
    # finding's own words (they name the runbook entry).
    assert deny.decision == attrs.evolve(
        ask.decision, verdict="deny", reason=Reason.SANDBOX_UNAVAILABLE, detail=NO_SANDBOX
    )
    assert (deny.decision.grant, deny.decision.mode) == ("git", Mode.ASK)
    assert before_asking(ask, None, None) is ask


def test_a_sandbox_problem_changes_no_other_verdict() -> None:
    for each in (
        write("drafts/plan.md"),
        write("out/a.txt"),
        verdict("shell", command="rm -rf /"),
        verdict("read_file", path="drafts/plan.md"),
        verdict("http_get", url="https://docs.python.org/3/"),
    ):
        assert before_asking(each, None, NO_SANDBOX) is each
