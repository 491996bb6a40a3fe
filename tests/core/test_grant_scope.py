"""The grant approve-always writes (core/grant_scope.py): it runs the approved call, and
covers nothing broader than its scope; it keeps the asking grant's conditions."""

from __future__ import annotations

import datetime as dt
import posixpath
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from boxmaker.core.catalogue import CheckedArguments, check_arguments
from boxmaker.core.decide import CheckedRequest, Run, decide
from boxmaker.core.grant_scope import Scope, ScopeProblem, always_grant, grant_of, parse_duration
from boxmaker.core.grants import Grant, GrantSet, Mode, parse_grants
from boxmaker.core.labels import FRESH, Label, Taint

NOW = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)
APPROVAL, CALL = "a-1f2e3d4c", "c-00000000000000c1"

# Path segments: anything a file name may hold but '/', NUL and '*' (which no glob names
# exactly: refused, tested below), with the characters that break TOML or fnmatch.
SEGMENT = st.text(
    st.characters(exclude_characters="/\x00*", codec="utf-8") | st.sampled_from("?[]!'\"\\\n]]"),
    min_size=1,
    max_size=12,
).filter(lambda s: s not in (".", ".."))
PATH = st.lists(SEGMENT, min_size=1, max_size=4).map("/".join)
COMMAND = st.text(
    st.characters(exclude_characters="\x00", codec="utf-8") | st.sampled_from("*?[]!\"'\n;&|"),
    min_size=1,
    max_size=40,
)
LABEL = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)
HOST = st.lists(LABEL, min_size=1, max_size=4).map(".".join).filter(lambda h: not h.isdigit())
URL = st.builds(
    lambda scheme, host, port, path: (
        f"{scheme}://{host}{'' if port is None else f':{port}'}/{path}"
    ),
    st.sampled_from(["http", "https"]),
    HOST,
    st.none() | st.integers(1, 65535),
    st.from_regex(r"[a-z0-9/]{0,10}", fullmatch=True),
)
FILE_TOOLS = st.sampled_from(["read_file", "list_dir", "write_file"])


def _arguments(tool: str, value: str) -> CheckedArguments:
    key = {"shell": "command", "http_get": "url"}.get(tool, "path")
    raw: dict[str, Any] = {key: value}
    if tool == "write_file":
        raw["content"] = "x"
    checked = check_arguments(tool, raw)
    assert isinstance(checked, CheckedArguments), checked
    return checked


def _asking(tool: str, **extra: Any) -> Grant:
    return Grant("asks", tool, Mode.ASK, **extra)  # type: ignore[arg-type]


def _written(
    arguments: CheckedArguments, scope: Scope = Scope.EXACT, asking: Grant | None = None
) -> Grant:
    fields = always_grant(
        approval=APPROVAL,
        call=CALL,
        arguments=arguments,
        asking=asking or _asking(arguments.tool),
        scope=scope,
        lasting=None,
        owner="owner",
        now=NOW,
    )
    assert not isinstance(fields, ScopeProblem), fields
    return grant_of(fields)


def _runs_on(grant: Grant, arguments: CheckedArguments, state: Label = FRESH) -> bool:
    """decide() with the asking grant first in the file and the new one after it."""
    grants = GrantSet((_asking(arguments.tool), grant))
    verdict = decide(CheckedRequest(CALL, "s-0000000000a1", arguments), grants, state, NOW)
    return isinstance(verdict, Run) and verdict.grant.id == grant.id


@given(tool=FILE_TOOLS, path=PATH, other=PATH)
def test_an_exact_file_grant_runs_its_path_and_no_other(tool: str, path: str, other: str) -> None:
    arguments = _arguments(tool, path)
    grant = _written(arguments)
    assert _runs_on(grant, arguments)
    other_arguments = _arguments(tool, other)
    assume(other_arguments.paths != arguments.paths)
    assert not grant.covers(other_arguments, NOW)


@given(tool=FILE_TOOLS, path=PATH, other=PATH)
def test_a_dir_grant_runs_its_directory_and_nothing_outside_or_below(
    tool: str, path: str, other: str
) -> None:
    arguments = _arguments(tool, path)
    grant = _written(arguments, Scope.DIR)
    assert _runs_on(grant, arguments)
    other_arguments = _arguments(tool, other)
    inside = posixpath.dirname(other_arguments.paths[0]) == posixpath.dirname(path)
    assert grant.covers(other_arguments, NOW) is (inside and other_arguments.paths[0] != ".")


@given(command=COMMAND, other=COMMAND)
def test_a_shell_grant_runs_exactly_its_command_line(command: str, other: str) -> None:
    arguments = _arguments("shell", command)
    grant = _written(arguments)
    assert _runs_on(grant, arguments)
    # What the command's glob syntax would match if it were not escaped, and another line.
    expanded = command.replace("*", "anything").replace("?", "y").replace("[", "")
    for different in (expanded, other, command + "; rm -rf ~"):
        if different and different != command:
            assert not grant.covers(_arguments("shell", different), NOW)


@given(url=URL, other=URL)
def test_an_http_get_grant_runs_its_host_and_port_only(url: str, other: str) -> None:
    arguments = _arguments("http_get", url)
    grant = _written(arguments)
    assert _runs_on(grant, arguments)
    theirs = _arguments("http_get", other)
    mine, their = arguments.destination, theirs.destination
    assert mine is not None
    assert their is not None
    default = {"http": 80, "https": 443}
    if mine.port == default[mine.scheme]:
        port_allowed = their.port == default[their.scheme]
    else:
        port_allowed = their.port == mine.port
    assert grant.covers(theirs, NOW) is (their.host == mine.host and port_allowed)


def test_a_grant_that_matches_fnmatch_syntax_literally() -> None:
    grant = _written(_arguments("shell", "ls [ab]*"))
    assert grant.commands == ("ls [[]ab][*]",)
    assert grant.covers(_arguments("shell", "ls [ab]*"), NOW)
    assert not grant.covers(_arguments("shell", "ls a"), NOW)
    assert not grant.covers(_arguments("shell", "ls [ab]*; rm -rf ~"), NOW)


@pytest.mark.parametrize(
    ("tool", "value", "scope", "message"),
    [
        ("read_file", "a*b.txt", Scope.EXACT, "the path has a '*'"),
        ("read_file", "d*/b.txt", Scope.DIR, "the directory's name has a '*'"),
        ("list_dir", ".", Scope.EXACT, "a glob cannot name the workspace root alone"),
        ("shell", "ls", Scope.DIR, "--scope dir applies to file tools only, not shell"),
        ("http_get", "https://a.example/", Scope.DIR, "--scope dir applies to file tools only"),
    ],
)
def test_no_grant_where_no_pattern_names_the_call_exactly(
    tool: str, value: str, scope: Scope, message: str
) -> None:
    problem = always_grant(
        approval=APPROVAL,
        call=CALL,
        arguments=_arguments(tool, value),
        asking=_asking(tool),
        scope=scope,
        lasting=None,
        owner="owner",
        now=NOW,
    )
    assert isinstance(problem, ScopeProblem)
    assert problem.message.startswith(message)


def test_the_grant_keeps_the_asking_grants_conditions_and_names_the_approval() -> None:
    asking = Grant(
        "asks",
        "shell",
        Mode.AUTO,
        max_taint=Taint.INTERNAL,
        if_untrusted=Mode.AUTO,
        label_taint=Taint.SECRET,
        expires=NOW + dt.timedelta(hours=1),
    )
    fields = always_grant(
        approval=APPROVAL,
        call=CALL,
        arguments=_arguments("shell", "make test"),
        asking=asking,
        scope=Scope.EXACT,
        lasting=dt.timedelta(days=7),
        owner="alice",
        now=NOW,
    )
    assert fields == {
        "id": "always-a-1f2e3d4c",
        "tool": "shell",
        "mode": "auto",
        "wins_over_ask": True,
        "commands": ["make test"],
        "max_taint": "internal",
        # Never auto for an untrusted session, whatever the asking grant said.
        "if_untrusted": "ask",
        "label_taint": "secret",
        # The asking grant's end comes before --for's.
        "expires": NOW + dt.timedelta(hours=1),
        "note": "approved always by alice at 2026-06-01T12:00:00Z for approval a-1f2e3d4c "
        "(call c-00000000000000c1)",
    }
    grant = grant_of(fields)
    secret = Label(Taint.SECRET, False)
    assert not _runs_on(grant, _arguments("shell", "make test"), secret)  # taint_exceeded
    assert not _runs_on(grant, _arguments("shell", "make test"), Label(Taint.PUBLIC, True))


def test_for_sets_expires_and_a_deny_grant_still_wins() -> None:
    arguments = _arguments("read_file", "notes/a.txt")
    fields = always_grant(
        approval=APPROVAL,
        call=CALL,
        arguments=arguments,
        asking=_asking("read_file", if_untrusted=Mode.DENY),
        scope=Scope.EXACT,
        lasting=dt.timedelta(minutes=30),
        owner="alice",
        now=NOW,
    )
    assert not isinstance(fields, ScopeProblem)
    assert fields["expires"] == NOW + dt.timedelta(minutes=30)
    assert fields["if_untrusted"] == "deny"
    grant = grant_of(fields)
    assert not grant.covers(arguments, NOW + dt.timedelta(minutes=30))
    deny = Grant("no", "read_file", Mode.DENY)
    verdict = decide(
        CheckedRequest(CALL, "s-0000000000a1", arguments), GrantSet((grant, deny)), FRESH, NOW
    )
    assert verdict.decision.grant == "no"


def test_wins_over_ask_is_for_auto_grants_only() -> None:
    problem = parse_grants(
        '[[grant]]\nid = "x"\ntool = "shell"\nmode = "ask"\nwins_over_ask = true'
    )
    assert not isinstance(problem, GrantSet)
    assert (problem.key, problem.message) == ("wins_over_ask", "applies to auto grants only")


def test_without_wins_over_ask_an_auto_grant_loses_to_the_ask_grant() -> None:
    arguments = _arguments("read_file", "a.txt")
    plain = Grant("plain", "read_file", Mode.AUTO)
    verdict = decide(
        CheckedRequest(CALL, "s-0000000000a1", arguments),
        GrantSet((_asking("read_file"), plain)),
        FRESH,
        NOW,
    )
    assert verdict.decision.grant == "asks"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("45s", 45), ("30m", 1800), ("2h", 7200), ("7d", 604800), ("1w1d", 691200)],
)
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text) == dt.timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "2", "h", "2x", "-1h", "1.5h", "2h ", "367d"])
def test_bad_durations(text: str) -> None:
    assert isinstance(parse_duration(text), ScopeProblem)
