"""The grant approve-always writes (core/grant_scope.py): it runs the approved call, and
covers nothing broader than its scope; it keeps the asking grant's conditions."""

from __future__ import annotations

import datetime as dt
import posixpath
import time
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from boxmaker.core.catalogue import (
    FILE_TOOLS,
    TOOL_NAMES,
    ArgumentProblem,
    CheckedArguments,
    HttpGetArgs,
    check_arguments,
)
from boxmaker.core.decide import CheckedRequest, Run, decide
from boxmaker.core.grant_parse import GrantsProblem, grants_from_document, parse_grants
from boxmaker.core.grant_scope import (
    Asked,
    Scope,
    ScopeProblem,
    always_grant,
    asked,
    grant_of,
    parse_duration,
)
from boxmaker.core.grants import Grant, GrantSet, Mode
from boxmaker.core.hosts import HostRule
from boxmaker.core.labels import FRESH, Label, Taint
from boxmaker.core.paths import ROOT
from boxmaker.core.reasons import Reason

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
FILE_TOOL = st.sampled_from(["read_file", "list_dir", "write_file"])


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


@given(tool=FILE_TOOL, path=PATH, other=PATH)
def test_an_exact_file_grant_runs_its_path_and_no_other(tool: str, path: str, other: str) -> None:
    arguments = _arguments(tool, path)
    grant = _written(arguments)
    assert _runs_on(grant, arguments)
    other_arguments = _arguments(tool, other)
    assume(other_arguments.paths != arguments.paths)
    assert not grant.covers(other_arguments, NOW)


@given(tool=FILE_TOOL, path=PATH, other=PATH)
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
    # The port is always written: the scheme's other default port is not the call's.
    assert grant.covers(theirs, NOW) is (their.host == mine.host and their.port == mine.port)


def test_a_grant_that_matches_fnmatch_syntax_literally() -> None:
    grant = _written(_arguments("shell", "ls [ab]*"))
    assert grant.commands == ("ls [[]ab][*]",)
    assert grant.covers(_arguments("shell", "ls [ab]*"), NOW)
    assert not grant.covers(_arguments("shell", "ls a"), NOW)
    assert not grant.covers(_arguments("shell", "ls [ab]*; rm -rf ~"), NOW)


@pytest.mark.parametrize(
    ("tool", "value", "scope", "message"),
    [
        (
            "read_file",
            "a*b.txt",
            Scope.EXACT,
            "the path has a '*', which a glob cannot name exactly; approve it once",
        ),
        (
            "read_file",
            "d*/b.txt",
            Scope.DIR,
            "the directory's name has a '*', which a glob cannot name exactly; approve it once",
        ),
        (
            "list_dir",
            ".",
            Scope.EXACT,
            "a glob cannot name the workspace root alone; approve it once",
        ),
        ("shell", "ls", Scope.DIR, "--scope dir applies to file tools only, not shell"),
        (
            "http_get",
            "https://a.example/",
            Scope.DIR,
            "--scope dir applies to file tools only, not http_get",
        ),
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
    assert problem == ScopeProblem(message)


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


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0s", "a duration must be longer than 0 s"),
        ("367d", "at most 366 days"),
        ("53w", "at most 366 days"),
    ],
)
def test_bad_durations_say_why(text: str, message: str) -> None:
    assert parse_duration(text) == ScopeProblem(message)


def test_the_longest_for_is_366_days_exactly() -> None:
    assert parse_duration("366d") == dt.timedelta(days=366)
    assert parse_duration("52w2d") == dt.timedelta(days=366)


@pytest.mark.parametrize(
    ("url", "hosts"),
    [
        ("http://[::1]:8080/x", ["[::1]:8080"]),
        ("https://[2001:DB8::1]/", ["[2001:db8::1]:443"]),
        ("https://[2001:db8::1]:80/", ["[2001:db8::1]:80"]),
        ("http://10.0.0.1:8080/", ["10.0.0.1:8080"]),
        ("https://a.example:8443/", ["a.example:8443"]),
        ("http://A.Example/", ["a.example:80"]),
        ("https://a.example:443/", ["a.example:443"]),
    ],
)
def test_an_ip_v6_host_is_bracketed_before_its_port(url: str, hosts: list[str]) -> None:
    arguments = _arguments("http_get", url)
    fields = always_grant(
        approval=APPROVAL,
        call=CALL,
        arguments=arguments,
        asking=_asking("http_get"),
        scope=Scope.EXACT,
        lasting=None,
        owner="owner",
        now=NOW,
    )
    assert not isinstance(fields, ScopeProblem)
    assert fields["hosts"] == hosts
    assert _runs_on(grant_of(fields), arguments)


def _table(
    *,
    tool: str = "read_file",
    value: str = "notes/a.txt",
    asking: Grant | None = None,
    lasting: dt.timedelta | None = None,
    owner: str = "owner",
    now: dt.datetime = NOW,
    approval: str = APPROVAL,
) -> dict[str, Any] | ScopeProblem:
    return always_grant(
        approval=approval,
        call=CALL,
        arguments=_arguments(tool, value),
        asking=asking or _asking(tool),
        scope=Scope.EXACT,
        lasting=lasting,
        owner=owner,
        now=now,
    )


def test_no_grant_for_an_approval_that_makes_no_valid_grant_id() -> None:
    assert _table(approval="a 1") == ScopeProblem("no grant id can be made of 'a 1'")


@pytest.mark.parametrize(
    ("asking_ends", "lasting", "ends"),
    [
        # --for alone, the asking grant's end alone, and whichever comes first.
        (None, dt.timedelta(days=1), NOW + dt.timedelta(days=1)),
        (NOW + dt.timedelta(days=30), None, NOW + dt.timedelta(days=30)),
        (NOW + dt.timedelta(days=30), dt.timedelta(days=1), NOW + dt.timedelta(days=1)),
        (NOW + dt.timedelta(hours=1), dt.timedelta(days=1), NOW + dt.timedelta(hours=1)),
        (NOW + dt.timedelta(days=1), dt.timedelta(days=1), NOW + dt.timedelta(days=1)),
    ],
)
def test_the_grant_ends_when_for_or_the_asking_grant_ends_whichever_is_first(
    asking_ends: dt.datetime | None, lasting: dt.timedelta | None, ends: dt.datetime
) -> None:
    fields = _table(asking=_asking("read_file", expires=asking_ends), lasting=lasting)
    assert not isinstance(fields, ScopeProblem)
    assert fields["expires"] == ends


def test_no_grant_without_an_end_has_an_expires() -> None:
    fields = _table()
    assert not isinstance(fields, ScopeProblem)
    assert "expires" not in fields


@pytest.mark.parametrize(
    "ends", [NOW, NOW - dt.timedelta(microseconds=1), NOW - dt.timedelta(days=1)]
)
def test_no_grant_when_the_asking_grant_has_expired(ends: dt.datetime) -> None:
    problem = _table(asking=_asking("read_file", expires=ends), lasting=dt.timedelta(days=1))
    assert problem == ScopeProblem("grant asks, which asked, has expired")


def test_a_grant_that_would_end_as_it_is_written_is_refused() -> None:
    assert _table(lasting=dt.timedelta(0)) == ScopeProblem("grant asks, which asked, has expired")


def test_a_grant_ending_a_microsecond_after_now_is_written() -> None:
    fields = _table(lasting=dt.timedelta(microseconds=1))
    assert not isinstance(fields, ScopeProblem)
    assert "expires" in fields


@pytest.mark.parametrize(
    ("tool", "value", "asking_hard_links", "written"),
    [
        ("read_file", "notes/a.txt", True, True),
        ("read_file", "notes/a.txt", False, None),
        ("list_dir", "notes", True, None),
        ("write_file", "notes/a.txt", True, None),
        ("shell", "ls", True, None),
    ],
)
def test_hard_links_is_kept_for_read_file_only(
    tool: str, value: str, asking_hard_links: bool, written: bool | None
) -> None:
    fields = _table(tool=tool, value=value, asking=_asking(tool, hard_links=asking_hard_links))
    assert not isinstance(fields, ScopeProblem)
    assert fields.get("hard_links") is written
    assert grant_of(fields).hard_links is bool(written)


@pytest.fixture
def local_zone_five_hours_behind(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("TZ", "XST+05")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.usefixtures("local_zone_five_hours_behind")
def test_expires_and_the_note_are_in_utc_whatever_the_local_zone() -> None:
    assert dt.datetime(2026, 6, 1, 12, 0).astimezone().utcoffset() == dt.timedelta(hours=-5)
    paris = dt.timezone(dt.timedelta(hours=2))
    fields = _table(lasting=dt.timedelta(hours=1, microseconds=5), now=NOW.astimezone(paris))
    assert not isinstance(fields, ScopeProblem)
    expires = fields["expires"]
    assert expires == NOW + dt.timedelta(hours=1)
    assert expires.utcoffset() == dt.timedelta(0)
    assert expires.microsecond == 0
    assert " at 2026-06-01T12:00:00Z " in fields["note"]


def test_the_note_names_the_owner_cut_to_64_characters() -> None:
    owner = "o" * 63 + "xyz"
    fields = _table(owner=owner)
    assert not isinstance(fields, ScopeProblem)
    assert fields["note"] == (
        f"approved always by {'o' * 63}x at 2026-06-01T12:00:00Z for approval {APPROVAL} "
        f"(call {CALL})"
    )


def test_grant_of_says_why_a_table_is_not_a_valid_grant() -> None:
    table = {"id": "always-a-1f2e3d4c", "tool": "read_file", "mode": "sometimes"}
    problem = grants_from_document({"grant": [table]})
    assert isinstance(problem, GrantsProblem)
    with pytest.raises(TypeError) as raised:
        grant_of(table)
    assert str(raised.value) == problem.describe()
    assert "sometimes" in str(raised.value)


# --- exact is exact, for every tool, whatever the model chose ---------------------------
#
# Hostile values: the syntax of every pattern language a grant key has (globs, fnmatch,
# hosts entries), and what makes two spellings of one thing or one spelling of two.

_HOST_LABEL = st.from_regex(r"[a-zA-Z0-9]([a-zA-Z0-9_-]{0,8}[a-zA-Z0-9])?", fullmatch=True)
_HOST_NAME = st.lists(_HOST_LABEL, min_size=1, max_size=4).map(".".join)
_GLOBBED = st.builds(
    lambda name, at, char: name[:at] + char + name[at:],
    _HOST_NAME,
    st.integers(0, 30),
    st.sampled_from(["*", "?", "[", "]", "[a-z]", "*.", "%2a", "%2e", "%", "%25"]),
)
HOSTILE_HOST = st.one_of(
    _HOST_NAME,
    _HOST_NAME.map(lambda name: "*." + name),
    _GLOBBED,
    _HOST_NAME.map(lambda name: name + "."),
    _HOST_NAME.map(lambda name: name + ".."),
    _HOST_NAME.map(str.upper),
    st.sampled_from(["xn--bcher-kva.example", "bücher.example", "xn--", "a.xn--p1ai"]),
    st.ip_addresses(v=4).map(str),
    st.ip_addresses(v=6).map(lambda address: f"[{address}]"),
    st.sampled_from(["[fe80::1%25eth0]", "[v1.fe]", "[1.2.3.4]", "::1", "[::1", "0x7f.1"]),
    st.sampled_from(["1.2.3", "2130706433", "017.0.0.1", "a.123", "a.0x1f", "localhost"]),
    st.builds(lambda user, name: f"{user}@{name}", st.sampled_from(["a", "a:b", ""]), _HOST_NAME),
)
HOSTILE_URL = st.builds(
    lambda scheme, host, port, rest: f"{scheme}://{host}{port}{rest}",
    st.sampled_from(["http", "https", "HTTPS", "ftp"]),
    HOSTILE_HOST,
    st.sampled_from(["", ":", ":0", ":1", ":80", ":443", ":8080", ":65535", ":65536", ":x"])
    | st.integers(0, 70000).map(lambda port: f":{port}"),
    st.sampled_from(["/", "", "/x?y=*", "?q", "#f", "/a/../b"]),
)

_PATH_PIECE = st.sampled_from(
    [*"*?[]\\\n~ Aa\u202e", "**", "[!a]", "..", ".", "", "$HOME", "é", "e\u0301", "x" * 200]
) | st.text(st.characters(exclude_characters="/\x00", codec="utf-8"), min_size=1, max_size=6)
_PATH_SEGMENT = st.lists(_PATH_PIECE, min_size=1, max_size=4).map("".join)
HOSTILE_PATH = st.builds(
    lambda head, segments, tail: head + "/".join(segments) + tail,
    st.sampled_from(["", "./", "a/../"]),
    st.lists(_PATH_SEGMENT, min_size=1, max_size=5)
    | st.integers(1, 25).map(lambda n: ["s" * 200] * n),  # up to the 4,096 bytes and past
    st.sampled_from(["", "/", "/."]),
)
HOSTILE_COMMAND = st.lists(
    st.sampled_from([*"*?[]!^-\\\n\r\t'\"$`;&|", "[!a]", "[a-z]", "**", "\\*", "\u2028"])
    | st.text(st.characters(exclude_characters="\x00", codec="utf-8"), max_size=6),
    min_size=1,
    max_size=12,
).map("".join)
HOSTILE: dict[str, st.SearchStrategy[str]] = {
    "read_file": HOSTILE_PATH,
    "list_dir": HOSTILE_PATH,
    "write_file": HOSTILE_PATH,
    "shell": HOSTILE_COMMAND,
    "http_get": HOSTILE_URL,
}
_KEY = {"shell": "command", "http_get": "url"}


def _raw(tool: str, value: str) -> dict[str, Any]:
    raw: dict[str, Any] = {_KEY.get(tool, "path"): value}
    if tool == "write_file":
        raw["content"] = "x"
    return raw


def _near(tool: str, value: str) -> st.SearchStrategy[str]:
    """Other calls close to ``value``: what its pattern syntax would also match if it
    were read as a pattern, a case or a character away, a step up or down, or any."""
    edits = [
        value + "x",
        "x" + value,
        value[1:],
        value[:-1],
        value.swapcase(),
        value.replace("*", "anything").replace("?", "y").replace("[", ""),
        value.replace("**", "a/b"),
    ]
    if tool in FILE_TOOLS:
        edits += [f"{value}/x", f"x/{value}", posixpath.dirname(value), f"a/../{value}"]
    elif tool == "http_get":
        edits += [
            value.replace("://", "://sub.", 1),
            value.replace("://", "://a.b.", 1),
            value.replace("http://", "https://", 1),
            value.replace("https://", "http://", 1),
            value.replace("://*.", "://", 1),
            value.replace("://", "://x", 1),
        ]
    else:
        edits += [value + "; rm -rf ~", value + "\n", value.replace("\\", "")]
    return st.sampled_from(edits) | HOSTILE[tool]


def _same_call(mine: CheckedArguments, theirs: CheckedArguments) -> bool:
    """What an exact grant may cover besides the call itself: the same path, the same
    command line, the same host and port (the hosts key names no scheme or path)."""
    if mine.tool in FILE_TOOLS:
        return mine.paths == theirs.paths
    if mine.tool == "shell":
        return mine.command == theirs.command
    assert mine.destination is not None
    assert theirs.destination is not None
    return (mine.destination.host, mine.destination.port) == (
        theirs.destination.host,
        theirs.destination.port,
    )


def _exact_or_refused(tool: str, value: str) -> CheckedArguments | None:
    """The checked arguments, or None when the check refused them (as it must: with
    ``bad_arguments`` and a detail naming the argument)."""
    checked = check_arguments(tool, _raw(tool, value))
    if isinstance(checked, ArgumentProblem):
        assert checked.reason is Reason.BAD_ARGUMENTS
        assert checked.detail.startswith(f"argument '{_KEY.get(tool, 'path')}'"), checked
        return None
    return checked


@pytest.mark.parametrize("tool", TOOL_NAMES)
@given(data=st.data())
def test_an_exact_grant_covers_the_approved_call_and_nothing_else(
    tool: str, data: st.DataObject
) -> None:
    value = data.draw(HOSTILE[tool], label="value")
    arguments = _exact_or_refused(tool, value)
    if arguments is None:
        return
    fields = always_grant(
        approval=APPROVAL,
        call=CALL,
        arguments=arguments,
        asking=_asking(tool),
        scope=Scope.EXACT,
        lasting=None,
        owner="owner",
        now=NOW,
    )
    if isinstance(fields, ScopeProblem):
        # Only a path no glob names exactly has no exact grant.
        assert tool in FILE_TOOLS, fields
        assert "*" in arguments.paths[0] or arguments.paths[0] == ROOT, fields
        return
    grant = grant_of(fields)
    assert _runs_on(grant, arguments)
    if tool == "http_get":
        destination = arguments.destination
        assert destination is not None
        [entry] = fields["hosts"]
        assert HostRule.parse(entry) == HostRule(destination.host, destination.port)
        assert not entry.startswith("*")
    for other in data.draw(st.lists(_near(tool, value), min_size=1, max_size=8), label="others"):
        theirs = _exact_or_refused(tool, other)
        if theirs is not None:
            assert grant.covers(theirs, NOW) is _same_call(arguments, theirs), other


@given(url=HOSTILE_URL)
def test_a_url_whose_host_has_pattern_syntax_is_refused(url: str) -> None:
    authority = url.partition("://")[2].split("/")[0].split("?")[0].split("#")[0]
    checked = _exact_or_refused("http_get", url)
    if checked is None:
        return
    assert checked.host is not None
    assert not any(char in authority for char in "*%"), url
    assert not checked.host.endswith("."), url
    assert "@" not in authority, url


@given(tool=FILE_TOOL, path=HOSTILE_PATH, other=HOSTILE_PATH)
def test_a_dir_grant_covers_exactly_its_directorys_entries(
    tool: str, path: str, other: str
) -> None:
    arguments = _exact_or_refused(tool, path)
    theirs = _exact_or_refused(tool, other)
    assume(arguments is not None)
    assert arguments is not None
    fields = always_grant(
        approval=APPROVAL,
        call=CALL,
        arguments=arguments,
        asking=_asking(tool),
        scope=Scope.DIR,
        lasting=None,
        owner="owner",
        now=NOW,
    )
    mine = arguments.paths[0]
    directory = posixpath.dirname(mine)
    if isinstance(fields, ScopeProblem):
        assert "*" in directory or mine == ROOT, fields
        return
    grant = grant_of(fields)
    assert _runs_on(grant, arguments)
    for candidate in (theirs, _exact_or_refused(tool, f"{directory}/{other}")):
        if candidate is not None:
            their = candidate.paths[0]
            inside = their != ROOT and posixpath.dirname(their) == directory
            assert grant.covers(candidate, NOW) is inside, their


def test_no_grant_names_a_host_that_is_not_one_exact_host() -> None:
    # check_arguments refuses such a URL first; the grant is not written even so.
    long = "http://*." + "a" * 120 + ".example.com/"
    for url in ("http://*.example.com/", "http://example.com./", "http://[fe80::1%25eth0]/", long):
        arguments = CheckedArguments("http_get", HttpGetArgs(url))
        problem = always_grant(
            approval=APPROVAL,
            call=CALL,
            arguments=arguments,
            asking=_asking("http_get"),
            scope=Scope.EXACT,
            lasting=None,
            owner="owner",
            now=NOW,
        )
        assert arguments.destination is not None
        assert problem == ScopeProblem(
            f"the host {arguments.destination.host[:100]!r} is not one exact host; approve it once"
        )


# --- what approve-always starts from (brokerd's approve and bxctl's confirmation) -----


def _grant_set(*grants: Grant) -> GrantSet:
    return GrantSet(grants)


def test_asked_finds_the_grant_that_asked_and_checks_the_arguments_again() -> None:
    other, asking = _asking("shell"), Grant("notes", "read_file", Mode.ASK)
    found = asked(
        _grant_set(other, asking),
        grant="notes",
        tool="read_file",
        arguments={"path": "/w/a/../notes.txt"},
        workspace="/w",
    )
    # An absolute path inside the workspace is checked against it: the workspace counts.
    assert found == Asked(asking, _arguments("read_file", "notes.txt"))


def test_asked_says_why_no_grant_can_be_made() -> None:
    refused = check_arguments("read_file", {"path": "/elsewhere/notes.txt"}, workspace="/w")
    assert isinstance(refused, ArgumentProblem)
    problem = GrantsProblem("grants.toml", None, "tool", "unknown tool 'x'")
    arguments = {"path": "notes.txt"}
    assert asked(
        problem, grant="notes", tool="read_file", arguments=arguments, workspace="/w"
    ) == ScopeProblem(f"grants.toml is invalid: {problem.describe()}")
    assert asked(
        _grant_set(_asking("read_file")),
        grant="notes",
        tool="read_file",
        arguments=arguments,
        workspace="/w",
    ) == ScopeProblem("grant notes, which asked, is no longer in grants.toml")
    assert asked(
        _grant_set(Grant("notes", "read_file", Mode.ASK)),
        grant="notes",
        tool="read_file",
        arguments={"path": "/elsewhere/notes.txt"},
        workspace="/w",
    ) == ScopeProblem(refused.detail)
