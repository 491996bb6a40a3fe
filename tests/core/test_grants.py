"""grants.toml: parsing, every problem (file, grant id, key), matching."""

from __future__ import annotations

import datetime as dt
import json
import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from boxmaker.core.catalogue import CheckedArguments, check_arguments
from boxmaker.core.grant_parse import (
    GrantsProblem,
    all_problems,
    grants_from_document,
    parse_grants,
    parse_toml,
)
from boxmaker.core.grants import Grant, GrantSet, Mode, opened_refusal, precedence_rank
from boxmaker.core.hosts import host_matches
from boxmaker.core.labels import Taint

NOW = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)

FULL = """
[[grant]]
id = "read-notes"
tool = "read_file"
mode = "ask"
paths = ["notes/**", "*.md"]
max_taint = "internal"
if_untrusted = "deny"
expires = 2026-12-31T00:00:00Z
note = "why this grant exists"

[[grant]]
id = "git"
tool = "shell"
mode = "auto"
commands = ["git status*", "ls"]
label_taint = "secret"

[[grant]]
id = "docs"
tool = "http_get"
mode = "auto"
hosts = ["docs.python.org", "*.Example.com"]
if_untrusted = "auto"
"""


def grant_text(**keys: Any) -> str:
    """One [[grant]] with the given keys (values written as TOML via JSON, which agrees
    with TOML for strings, integers, booleans and arrays)."""
    lines = ["[[grant]]"]
    for key, value in keys.items():
        rendered = value if isinstance(value, Raw) else json.dumps(value)
        lines.append(f"{key} = {rendered}")
    return "\n".join(lines) + "\n"


class Raw(str):
    """A TOML value written as is (datetimes, tables)."""


BASE = {"id": "g", "tool": "read_file", "mode": "auto"}


def parsed(text: str) -> GrantSet:
    result = parse_grants(text)
    assert isinstance(result, GrantSet), result
    return result


def problem(text: str) -> GrantsProblem:
    result = parse_grants(text, file="/home/me/grants.toml")
    assert isinstance(result, GrantsProblem), result
    return result


def args(tool: str, **arguments: object) -> CheckedArguments:
    checked = check_arguments(tool, arguments)
    assert isinstance(checked, CheckedArguments), checked
    return checked


def test_full_example_parses_in_file_order() -> None:
    grants = parsed(FULL).grants
    assert [g.id for g in grants] == ["read-notes", "git", "docs"]
    notes, git, docs = grants
    assert notes.tool == "read_file"
    assert notes.mode is Mode.ASK
    assert notes.paths is not None
    assert [g.pattern for g in notes.paths] == ["notes/**", "*.md"]
    assert notes.max_taint is Taint.INTERNAL
    assert notes.if_untrusted is Mode.DENY
    assert notes.expires == dt.datetime(2026, 12, 31, tzinfo=dt.UTC)
    assert notes.note == "why this grant exists"
    assert git.commands == ("git status*", "ls")
    assert git.label_taint is Taint.SECRET
    assert docs.hosts == ("docs.python.org", "*.example.com")


def test_defaults() -> None:
    (grant,) = parsed(grant_text(**BASE)).grants
    assert grant.paths is None
    assert grant.commands is None
    assert grant.hosts == ()
    assert grant.max_taint is Taint.SECRET
    assert grant.if_untrusted is Mode.ASK
    assert grant.label_taint is None
    assert grant.expires is None
    assert grant.note is None
    assert grant.hard_links is False


def test_empty_and_comment_only_files_are_empty_sets() -> None:
    assert parsed("").grants == ()
    assert parsed("# nothing granted yet\n").grants == ()
    assert parsed("grant = []").grants == ()


def test_expires_with_an_offset_is_converted_to_utc() -> None:
    (grant,) = parsed(grant_text(**BASE, expires=Raw("2026-07-01T02:00:00+02:00"))).grants
    assert grant.expires == dt.datetime(2026, 7, 1, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("text", "grant_id", "key", "message"),
    [
        # not a grant at all
        ("[grant\n", None, None, None),
        ('title = "x"\n' + grant_text(**BASE), None, "title", None),
        ('grant = "x"', None, "grant", "expected [[grant]] tables, got a string"),
        ("grant = [1]", None, None, "[[grant]] #1 must be a table, got an integer"),
        # id
        (grant_text(tool="read_file", mode="auto"), None, "id", "[[grant]] #1 has no id"),
        (grant_text(**{**BASE, "id": 5}), None, "id", None),
        (grant_text(**{**BASE, "id": "Read"}), None, "id", None),
        (grant_text(**{**BASE, "id": "-x"}), None, "id", None),
        (grant_text(**{**BASE, "id": "a" * 64}), None, "id", None),
        (grant_text(**{**BASE, "id": ""}), None, "id", None),
        (grant_text(**BASE) + grant_text(**BASE), "g", "id", "duplicate id"),
        # unknown keys, required keys
        (grant_text(**BASE, colour="red"), "g", "colour", "unknown key"),
        (grant_text(**BASE, path=["x"]), "g", "path", "unknown key"),
        (grant_text(id="g", mode="auto"), "g", "tool", "required key missing"),
        (grant_text(id="g", tool="read_file"), "g", "mode", "required key missing"),
        # tool and mode
        (grant_text(**{**BASE, "tool": "rm"}), "g", "tool", None),
        (grant_text(**{**BASE, "tool": 1}), "g", "tool", None),
        (
            grant_text(**{**BASE, "mode": "sometimes"}),
            "g",
            "mode",
            "expected one of auto, ask, deny, got 'sometimes'",
        ),
        (grant_text(**{**BASE, "mode": "AUTO"}), "g", "mode", None),
        (grant_text(**{**BASE, "mode": True}), "g", "mode", None),
        # keys that do not apply to the tool
        (grant_text(**BASE, commands=["ls"]), "g", "commands", "does not apply to tool read_file"),
        (grant_text(**BASE, hosts=["a.org"]), "g", "hosts", "does not apply to tool read_file"),
        (grant_text(**BASE, label_taint="secret"), "g", "label_taint", None),
        (grant_text(id="g", tool="shell", mode="auto", paths=["a"]), "g", "paths", None),
        (grant_text(id="g", tool="http_get", mode="auto", paths=["a"]), "g", "paths", None),
        (grant_text(id="g", tool="http_get", mode="auto", commands=["a"]), "g", "commands", None),
        (
            grant_text(id="g", tool="http_get", mode="auto", label_taint="secret"),
            "g",
            "label_taint",
            "does not apply to tool http_get",
        ),
        (
            grant_text(id="g", tool="http_get", mode="auto"),
            "g",
            "hosts",
            "required for http_get (there is no default)",
        ),
        # lists
        (grant_text(**BASE, paths="notes/**"), "g", "paths", None),
        (grant_text(**BASE, paths=[]), "g", "paths", None),
        (grant_text(**BASE, paths=["notes/**", ""]), "g", "paths", "an empty string in the array"),
        (grant_text(**BASE, paths=["notes/**", 3]), "g", "paths", None),
        (grant_text(**BASE, paths=["/etc/**"]), "g", "paths", None),
        (grant_text(**BASE, paths=["a/../b"]), "g", "paths", None),
        (grant_text(id="g", tool="shell", mode="auto", commands=[""]), "g", "commands", None),
        (grant_text(id="g", tool="shell", mode="auto", commands="ls"), "g", "commands", None),
        (grant_text(id="g", tool="http_get", mode="auto", hosts=[]), "g", "hosts", None),
        (grant_text(id="g", tool="http_get", mode="auto", hosts=[""]), "g", "hosts", None),
        (
            grant_text(id="g", tool="http_get", mode="auto", hosts=["https://a.org/"]),
            "g",
            "hosts",
            None,
        ),
        (grant_text(id="g", tool="http_get", mode="auto", hosts=["a.org:0"]), "g", "hosts", None),
        (
            grant_text(id="g", tool="http_get", mode="auto", hosts=["a.org:65536"]),
            "g",
            "hosts",
            "'a.org:65536': port 65536: expected a number from 1 to 65535",
        ),
        (
            grant_text(id="g", tool="http_get", mode="auto", hosts=["a.org:http"]),
            "g",
            "hosts",
            "'a.org:http': expected a host name, *.suffix or IP address, with an optional "
            ":port (no scheme or path)",
        ),
        (grant_text(id="g", tool="http_get", mode="auto", hosts=["a.org:"]), "g", "hosts", None),
        (
            grant_text(id="g", tool="http_get", mode="auto", hosts=["[a.org]:80"]),
            "g",
            "hosts",
            None,
        ),
        (grant_text(id="g", tool="http_get", mode="auto", hosts=["[::1]x"]), "g", "hosts", None),
        (grant_text(id="g", tool="http_get", mode="auto", hosts=["::1:80:x"]), "g", "hosts", None),
        (grant_text(id="g", tool="http_get", mode="auto", hosts=["*"]), "g", "hosts", None),
        (grant_text(id="g", tool="http_get", mode="auto", hosts=["a.*.org"]), "g", "hosts", None),
        # taints and modes of conditions
        (grant_text(**BASE, max_taint="top"), "g", "max_taint", None),
        (grant_text(**BASE, max_taint=2), "g", "max_taint", None),
        (grant_text(**BASE, if_untrusted="maybe"), "g", "if_untrusted", None),
        (
            grant_text(id="g", tool="shell", mode="auto", label_taint="top"),
            "g",
            "label_taint",
            None,
        ),
        (
            grant_text(id="g", tool="shell", mode="auto", label_taint="public"),
            "g",
            "label_taint",
            "may only raise shell output: internal or secret",
        ),
        # hard_links
        (
            grant_text(**BASE, hard_links="yes"),
            "g",
            "hard_links",
            "expected true or false (a boolean), got a string",
        ),
        (grant_text(**BASE, hard_links=1), "g", "hard_links", None),
        (
            grant_text(id="g", tool="list_dir", mode="auto", hard_links=True),
            "g",
            "hard_links",
            "does not apply to tool list_dir",
        ),
        (
            grant_text(id="g", tool="write_file", mode="auto", hard_links=True),
            "g",
            "hard_links",
            None,
        ),
        (grant_text(id="g", tool="shell", mode="auto", hard_links=True), "g", "hard_links", None),
        # expires
        (grant_text(**BASE, expires="2026-12-31T00:00:00Z"), "g", "expires", None),
        (grant_text(**BASE, expires=Raw("2026-12-31T00:00:00")), "g", "expires", None),
        (grant_text(**BASE, expires=Raw("2026-12-31")), "g", "expires", None),
        (grant_text(**BASE, expires=Raw("00:00:00")), "g", "expires", None),
        (grant_text(**BASE, expires=1), "g", "expires", None),
        # note
        (grant_text(**BASE, note=1), "g", "note", "expected a string, got an integer"),
        (grant_text(**BASE, note="x" * 501), "g", "note", "at most 500 characters"),
    ],
)
def test_each_problem_names_file_grant_and_key(
    text: str, grant_id: str | None, key: str | None, message: str | None
) -> None:
    found = problem(text)
    assert found.file == "/home/me/grants.toml"
    assert (found.grant_id, found.key) == (grant_id, key)
    if message is not None:
        assert found.message == message


def test_a_problem_in_a_later_grant_invalidates_the_whole_set() -> None:
    text = FULL + grant_text(id="bad", tool="read_file", mode="never")
    assert problem(text) == GrantsProblem(
        "/home/me/grants.toml", "bad", "mode", "expected one of auto, ask, deny, got 'never'"
    )


def test_the_first_problem_in_file_order_is_reported() -> None:
    text = grant_text(id="one", tool="read_file", mode="x") + grant_text(id="Two")
    assert (problem(text).grant_id, problem(text).key) == ("one", "mode")


def test_syntax_problem_carries_the_position() -> None:
    found = problem('[[grant]]\nid = "a"\nmode = \n')
    assert found.message.startswith("TOML syntax: ")
    assert "line 3" in found.message


def test_problem_descriptions() -> None:
    found = problem(grant_text(**BASE, colour="red"))
    assert found.describe() == "/home/me/grants.toml, grant 'g', key 'colour': unknown key"
    assert found.detail().endswith("; see docs/runbook.md#grants")
    assert problem("[x").describe().startswith("/home/me/grants.toml: TOML syntax: ")


@pytest.mark.parametrize("good_id", ["a", "0", "read-notes", "a" * 63, "a-", "9-9"])
def test_good_ids(good_id: str) -> None:
    assert parsed(grant_text(**{**BASE, "id": good_id})).grants[0].id == good_id


# --- matching ---------------------------------------------------------------------------


def one(text: str) -> Grant:
    (grant,) = parsed(text).grants
    return grant


def test_paths_match_the_normalized_path() -> None:
    grant = one(grant_text(**BASE, paths=["notes/**"]))
    assert grant.matches("read_file", args("read_file", path="./notes/a/../b.txt"), NOW)
    assert grant.matches("read_file", args("read_file", path="notes"), NOW)
    assert not grant.matches("read_file", args("read_file", path="notesx/b.txt"), NOW)
    assert not grant.matches("read_file", args("read_file", path="."), NOW)


def test_no_paths_matches_every_workspace_path_including_the_root() -> None:
    grant = one(grant_text(id="g", tool="list_dir", mode="auto"))
    assert grant.matches("list_dir", args("list_dir", path="."), NOW)
    assert grant.matches("list_dir", args("list_dir", path="a/b/c"), NOW)


def test_hard_links_is_read_files_opt_in() -> None:
    grant = one(grant_text(**BASE, paths=["pub/**"], hard_links=True))
    assert grant.hard_links is True
    assert one(grant_text(**BASE, hard_links=False)).hard_links is False


PUB = grant_text(**BASE, paths=["pub/**"])


@pytest.mark.parametrize(
    ("text", "requested", "real", "links", "detail"),
    [
        (PUB, "pub/a", "pub/a", 1, None),
        (PUB, "pub/alias", "pub/b/c", 1, None),
        (PUB, "pub", "pub", 1, None),
        (PUB, "pub/k", "secrets/key", 1, "pub/k: a link leads outside grant g's paths"),
        (PUB, "pub/s/key", "secrets/key", 1, "pub/s/key: a link leads outside grant g's paths"),
        (PUB, "pub/up", ".", 1, "pub/up: a link leads outside grant g's paths"),
        (
            PUB,
            "pub/hard",
            "pub/hard",
            2,
            "pub/hard: the file has 2 names (hard links), "
            "and grant g does not set hard_links = true",
        ),
        (grant_text(**BASE, paths=["pub/**"], hard_links=True), "pub/hard", "pub/hard", 2, None),
        # Opting in to hard links never opts in to symlinks out of the paths.
        (
            grant_text(**BASE, paths=["pub/**"], hard_links=True),
            "pub/k",
            "secrets/key",
            2,
            "pub/k: a link leads outside grant g's paths",
        ),
        # Without paths the grant covers every workspace path, whatever its names.
        (grant_text(**BASE), "pub/k", "secrets/key", 3, None),
    ],
)
def test_a_paths_grant_bounds_the_file_opened(
    text: str, requested: str, real: str, links: int, detail: str | None
) -> None:
    assert opened_refusal(one(text), requested, real, links) == detail


opened_paths = st.lists(st.sampled_from(["pub", "secrets", "zq", "key"]), min_size=1, max_size=3)


@given(
    st.sampled_from([["pub/**"], ["pub/**", "*.md"], None]),
    st.booleans(),
    opened_paths.map("/".join),
    st.integers(min_value=0, max_value=4),
)
def test_an_opened_file_is_allowed_only_when_covered_and_its_only_name_or_opted_in(
    paths: list[str] | None, hard_links: bool, real: str, links: int
) -> None:
    keys: dict[str, Any] = {**BASE, "hard_links": hard_links}
    if paths is not None:
        keys["paths"] = paths
    grant = one(grant_text(**keys))
    refusal = opened_refusal(grant, "pub/x", real, links)
    allowed = paths is None or (grant.covers_path(real) and (links <= 1 or hard_links))
    assert (refusal is None) == allowed
    if refusal is not None:
        assert "grant g" in refusal
        assert real not in refusal.removeprefix("pub/x: ")  # where a link leads is not told
    # covers_path agrees with matching a call on that path.
    assert grant.covers_path(real) == grant.matches("read_file", args("read_file", path=real), NOW)


def test_tool_must_be_equal() -> None:
    grant = one(grant_text(**BASE))
    assert not grant.matches("list_dir", args("list_dir", path="a"), NOW)
    assert not grant.matches("write_file", args("write_file", path="a", content=""), NOW)


def test_expiry_boundary_is_ge() -> None:
    expires = dt.datetime(2026, 12, 31, tzinfo=dt.UTC)
    grant = one(grant_text(**BASE, expires=Raw("2026-12-31T00:00:00Z")))
    checked = args("read_file", path="a")
    assert grant.matches("read_file", checked, expires - dt.timedelta(microseconds=1))
    assert not grant.matches("read_file", checked, expires)
    assert not grant.matches("read_file", checked, expires + dt.timedelta(microseconds=1))
    assert not grant.expired(expires - dt.timedelta(microseconds=1))
    assert grant.expired(expires)
    assert not one(grant_text(**BASE)).expired(expires)
    # the same instant in another zone
    paris = dt.timezone(dt.timedelta(hours=1))
    assert not grant.matches("read_file", checked, expires.astimezone(paris))


def test_shell_commands_use_fnmatch_on_the_whole_line() -> None:
    grant = one(grant_text(id="g", tool="shell", mode="auto", commands=["git status*", "ls"]))

    def ok(command: str) -> bool:
        return grant.matches("shell", args("shell", command=command), NOW)

    assert ok("git status")
    assert ok("git status --short")
    assert ok("git status; rm -rf x")  # documented: * matches the rest of the line
    assert ok("ls")
    assert not ok("ls -la")
    assert not ok(" git status")
    assert not ok("Git status")


def test_shell_command_patterns_do_not_backtrack_on_a_long_command() -> None:
    # fnmatch.translate makes each star but the last an atomic group (Python >= 3.11), so
    # matching is linear in the command; a command is at most 64 KiB (catalogue.py).
    patterns = ["*a*a*a*a*b", "*a*b*a*b*a*b*c", "git status*", "make *test*"]
    grant = one(grant_text(id="g", tool="shell", mode="auto", commands=patterns))
    longest = args("shell", command="a" * (64 * 1024))
    also_long = args("shell", command="ab " * (64 * 1024 // 3))
    start = time.perf_counter()
    matched = [grant.matches("shell", checked, NOW) for checked in (longest, also_long) * 5]
    elapsed = time.perf_counter() - start
    assert matched == [False, False] * 5
    assert elapsed < 1.0, f"{elapsed:.2f} s"  # measured: about 2 ms in all
    assert grant.matches("shell", args("shell", command="a" * 1000 + "b"), NOW)


def test_shell_without_commands_matches_every_command() -> None:
    grant = one(grant_text(id="g", tool="shell", mode="auto"))
    assert grant.matches("shell", args("shell", command="anything at all"), NOW)


def test_hosts() -> None:
    grant = one(
        grant_text(id="g", tool="http_get", mode="auto", hosts=["docs.python.org", "*.example.com"])
    )

    def ok(url: str) -> bool:
        return grant.matches("http_get", args("http_get", url=url), NOW)

    assert ok("https://docs.python.org/3/")
    assert ok("http://DOCS.Python.ORG/x")
    assert ok("http://docs.python.org:80/x")
    assert ok("https://docs.python.org:443/x")
    # An entry without a port allows only the scheme's own (it allowed any port before).
    assert not ok("http://DOCS.Python.ORG:8080/x")
    assert not ok("http://docs.python.org:443/x")
    assert not ok("https://docs.python.org:80/x")
    assert ok("https://a.example.com/")
    assert ok("https://a.b.example.com/")
    assert not ok("https://example.com/")
    assert not ok("https://badexample.com/")
    assert not ok("https://docs.python.org.evil.net/")
    assert not ok("https://python.org/")


def test_hosts_with_ports_and_addresses() -> None:
    entries = ["a.org:8443", "*.b.org:8080", "127.0.0.1:9000", "[::1]:9001", "::2", "10.0.0.1"]
    grant = one(grant_text(id="g", tool="http_get", mode="auto", hosts=entries))

    def ok(url: str) -> bool:
        return grant.matches("http_get", args("http_get", url=url), NOW)

    allowed = [
        "https://a.org:8443/",
        "http://a.org:8443/",
        "http://x.b.org:8080/",
        "http://127.0.0.1:9000/",
        "http://[::1]:9001/",
        "http://[0:0::1]:9001/",
        "http://[::2]/",
        "https://[::2]/",
        "http://10.0.0.1/",
    ]
    refused = [
        "https://a.org/",
        "https://a.org:8444/",
        "http://b.org:8080/",
        "http://x.b.org/",
        "http://127.0.0.1/",
        "http://[::1]:9000/",
        "http://[::2]:8080/",
        "http://10.0.0.1:22/",
    ]
    assert [url for url in allowed if not ok(url)] == []
    assert [url for url in refused if ok(url)] == []
    assert grant.hosts == tuple(entries)


def test_an_http_get_grant_without_hosts_matches_nothing() -> None:
    grant = Grant(id="g", tool="http_get", mode=Mode.AUTO)
    assert not grant.matches("http_get", args("http_get", url="https://a.org/"), NOW)


@pytest.mark.parametrize(
    ("pattern", "host", "expected"),
    [
        ("a.org", "a.org", True),
        ("a.org", "b.a.org", False),
        ("*.a.org", "b.a.org", True),
        ("*.a.org", "a.org", False),
        ("*.a.org", "ba.org", False),
    ],
)
def test_host_matches(pattern: str, host: str, expected: bool) -> None:
    assert host_matches(pattern, host) is expected


def test_matching_lists_every_unexpired_match_in_file_order() -> None:
    text = (
        grant_text(id="a", tool="read_file", mode="auto")
        + grant_text(id="b", tool="read_file", mode="deny", paths=["x/**"])
        + grant_text(id="c", tool="read_file", mode="ask", expires=Raw("2026-01-01T00:00:00Z"))
        + grant_text(id="d", tool="list_dir", mode="auto")
        + grant_text(id="e", tool="read_file", mode="ask")
    )
    grants = parsed(text)
    assert [g.id for g in grants.matching("read_file", args("read_file", path="x/y"), NOW)] == [
        "a",
        "b",
        "e",
    ]
    assert [g.id for g in grants.for_tool("list_dir")] == ["d"]
    assert grants.for_tool("nope") == ()


# --- never another exception ---------------------------------------------------------------


@given(st.text(max_size=300))
def test_any_text_gives_a_set_or_one_problem(text: str) -> None:
    assert isinstance(parse_grants(text), GrantSet | GrantsProblem)


toml_ish = st.text(alphabet="[]{}=.\"'#\n abc-_,0123456789tTZ:+grant", max_size=200)


@given(toml_ish)
def test_toml_ish_text_gives_a_set_or_one_problem(text: str) -> None:
    assert isinstance(parse_grants(text), GrantSet | GrantsProblem)


def test_deep_nesting_is_a_problem_not_a_crash() -> None:
    assert isinstance(parse_grants("x = " + "[" * 100_000), GrantsProblem)


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.sampled_from(
        ["read_file", "list_dir", "write_file", "shell", "http_get", "auto", "ask", "deny"]
    ),
    st.sampled_from(["public", "internal", "secret", "notes/**", "", "/x", "*.a.org", "g"]),
    st.datetimes(timezones=st.none() | st.just(dt.UTC)),
    st.dates(),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=8,
)
GRANT_KEYS = ["id", "tool", "mode", "paths", "commands", "hosts", "max_taint", "if_untrusted"]
grant_keys = st.sampled_from([*GRANT_KEYS, "label_taint", "hard_links", "expires", "note", "other"])
grant_dicts = st.dictionaries(grant_keys, values, max_size=8)
documents = st.dictionaries(
    st.sampled_from(["grant", "grants", "x"]),
    st.lists(grant_dicts | values, max_size=4) | values,
    max_size=2,
)


@given(documents)
def test_any_document_gives_a_set_or_one_problem(document: dict[str, Any]) -> None:
    result = grants_from_document(document)
    assert isinstance(result, GrantSet | GrantsProblem)
    if isinstance(result, GrantSet):
        assert all(isinstance(g, Grant) for g in result.grants)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, str):
        # JSON's \uD800-style pairs are not TOML; raw DEL is not allowed in a TOML string.
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return str(value)


toml_scalars = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12),
    st.sampled_from(["read_file", "shell", "http_get", "auto", "ask", "deny", "secret", "g"]),
    st.sampled_from(["public", "notes/**", "", "*.a.org", "docs.python.org", "git *"]),
    st.datetimes(timezones=st.none() | st.just(dt.UTC)),
)
toml_values = toml_scalars | st.lists(toml_scalars, max_size=3)


@given(st.lists(st.dictionaries(grant_keys, toml_values, max_size=9), max_size=4))
def test_documents_written_as_toml_give_a_set_or_one_problem(
    grants: list[dict[str, Any]],
) -> None:
    text = "".join(
        "[[grant]]\n" + "".join(f"{k} = {_toml_value(v)}\n" for k, v in grant.items())
        for grant in grants
    )
    result = parse_grants(text)
    assert isinstance(result, GrantSet | GrantsProblem)
    if isinstance(result, GrantsProblem):
        # Everything written here is valid TOML: the problem is about the content.
        assert not result.message.startswith("TOML syntax")


# --- every problem's exact message and "did you mean" ---------------------------------------

SHELL = {"id": "g", "tool": "shell", "mode": "auto"}
TAINTS = "expected one of public, internal, secret"
EXPIRES = "expected an offset datetime (e.g. 2026-12-31T00:00:00Z), got "


@pytest.mark.parametrize(
    ("text", "grant_id", "key", "message", "suggestion"),
    [
        (
            grant_text(**{**BASE, "id": 5}),
            None,
            "id",
            "[[grant]] #1: expected a string id, got an integer",
            None,
        ),
        (
            grant_text(**{**BASE, "id": "Read"}),
            None,
            "id",
            "[[grant]] #1: id 'Read' must match [a-z0-9][a-z0-9-]{0,62}",
            None,
        ),
        (
            grant_text(**{**BASE, "tool": "rm"}),
            "g",
            "tool",
            "expected one of read_file, list_dir, write_file, shell, http_get, connect, got 'rm'",
            None,
        ),
        (
            grant_text(**{**BASE, "tool": "red_file"}),
            "g",
            "tool",
            "expected one of read_file, list_dir, write_file, shell, http_get, connect, "
            "got 'red_file'",
            "read_file",
        ),
        (
            grant_text(**{**BASE, "tool": 1}),
            "g",
            "tool",
            "expected one of read_file, list_dir, write_file, shell, http_get, connect, got 1",
            None,
        ),
        (
            grant_text(**{**BASE, "mode": "AUTO"}),
            "g",
            "mode",
            "expected one of auto, ask, deny, got 'AUTO'",
            "auto",
        ),
        (
            grant_text(**{**BASE, "mode": True}),
            "g",
            "mode",
            "expected one of auto, ask, deny (a string), got a boolean",
            None,
        ),
        (grant_text(**BASE, colour="red"), "g", "colour", "unknown key", None),
        (grant_text(**BASE, path=["x"]), "g", "path", "unknown key", "paths"),
        (grant_text(**BASE, Note="x"), "g", "Note", "unknown key", "note"),
        ("titl = 1\n", None, "titl", "unknown top-level key (only [[grant]] tables)", None),
        ("grants = 1\n", None, "grants", "unknown top-level key (only [[grant]] tables)", "grant"),
        (
            grant_text(**BASE, paths="notes/**"),
            "g",
            "paths",
            "expected an array of strings, got a string",
            None,
        ),
        (
            grant_text(**BASE, paths=[]),
            "g",
            "paths",
            "an empty array matches nothing (leave the key out instead)",
            None,
        ),
        (
            grant_text(**BASE, paths=["notes/**", 3]),
            "g",
            "paths",
            "expected an array of strings, got an integer in it",
            None,
        ),
        (
            grant_text(**BASE, paths=["/etc/**"]),
            "g",
            "paths",
            "'/etc/**': a glob is relative to the workspace: no leading '/'",
            None,
        ),
        (
            grant_text(**SHELL, commands=["ls", "rm\u0000x"]),
            "g",
            "commands",
            "NUL byte in a command pattern",
            None,
        ),
        (
            grant_text(**SHELL, commands=[]),
            "g",
            "commands",
            "an empty array matches nothing (leave the key out instead)",
            None,
        ),
        (grant_text(**SHELL, label_taint="top"), "g", "label_taint", f"{TAINTS}, got 'top'", None),
        (
            grant_text(**SHELL, label_taint="secrte"),
            "g",
            "label_taint",
            f"{TAINTS}, got 'secrte'",
            "secret",
        ),
        (
            grant_text(**SHELL, label_taint=1),
            "g",
            "label_taint",
            f"{TAINTS} (a string), got an integer",
            None,
        ),
        (
            grant_text(**SHELL, label_taint="public"),
            "g",
            "label_taint",
            "may only raise shell output: internal or secret",
            None,
        ),
        (
            grant_text(**BASE, max_taint=2.5),
            "g",
            "max_taint",
            f"{TAINTS} (a string), got a float",
            None,
        ),
        (
            grant_text(**BASE, max_taint=[1]),
            "g",
            "max_taint",
            f"{TAINTS} (a string), got an array",
            None,
        ),
        (
            grant_text(**BASE, max_taint=Raw("{a = 1}")),
            "g",
            "max_taint",
            f"{TAINTS} (a string), got a table",
            None,
        ),
        (
            grant_text(**BASE, if_untrusted=Raw("2026-01-01T00:00:00Z")),
            "g",
            "if_untrusted",
            "expected one of auto, ask, deny (a string), got a datetime",
            None,
        ),
        (
            grant_text(**BASE, if_untrusted="dney"),
            "g",
            "if_untrusted",
            "expected one of auto, ask, deny, got 'dney'",
            "deny",
        ),
        (
            grant_text(**BASE, wins_over_ask=1),
            "g",
            "wins_over_ask",
            "expected true or false (a boolean), got an integer",
            None,
        ),
        (
            grant_text(**BASE, expires=Raw("2026-12-31T00:00:00")),
            "g",
            "expires",
            EXPIRES + "a datetime without an offset",
            None,
        ),
        (grant_text(**BASE, expires=Raw("2026-12-31")), "g", "expires", EXPIRES + "a date", None),
        (grant_text(**BASE, expires=Raw("00:00:00")), "g", "expires", EXPIRES + "a time", None),
        (grant_text(**BASE, expires="2026-12-31"), "g", "expires", EXPIRES + "a string", None),
        (grant_text(**BASE, expires=True), "g", "expires", EXPIRES + "a boolean", None),
        (
            grant_text(id="g", tool="read_file", mode="ask", wins_over_ask=True),
            "g",
            "wins_over_ask",
            "applies to auto grants only",
            None,
        ),
        (
            grant_text(id="g", tool="read_file", mode="deny", wins_over_ask=True),
            "g",
            "wins_over_ask",
            "applies to auto grants only",
            None,
        ),
    ],
)
def test_each_problems_exact_message_and_suggestion(
    text: str, grant_id: str | None, key: str | None, message: str, suggestion: str | None
) -> None:
    found = problem(text)
    assert (found.file, found.grant_id, found.key) == ("/home/me/grants.toml", grant_id, key)
    assert found.message == message
    assert found.suggestion == suggestion
    assert found.index == (None if grant_id is None and key != "id" else 0)


def test_a_did_you_mean_shows_in_the_description() -> None:
    found = problem(grant_text(**{**BASE, "tool": "red_file"}))
    assert found.describe() == (
        "/home/me/grants.toml, grant 'g', key 'tool': expected one of read_file, list_dir, "
        "write_file, shell, http_get, connect, got 'red_file' (did you mean 'read_file'?)"
    )


@pytest.mark.parametrize(
    ("length", "shown"),
    [(58, "'" + "x" * 58 + "'"), (59, "'" + "x" * 56 + "..."), (200, "'" + "x" * 56 + "...")],
)
def test_a_bad_value_is_shown_up_to_60_characters(length: int, shown: str) -> None:
    found = problem(grant_text(**{**BASE, "mode": "x" * length}))
    assert found.message == f"expected one of auto, ask, deny, got {shown}"


@pytest.mark.parametrize(
    ("value", "named"),
    [(None, "NoneType"), (object(), "object"), (b"x", "bytes"), ((), "tuple")],
)
def test_a_document_value_of_no_toml_type_is_named_by_its_python_type(
    value: object, named: str
) -> None:
    found = grants_from_document({"grant": [{**BASE, "max_taint": value}]})
    assert isinstance(found, GrantsProblem)
    assert found.message == f"{TAINTS} (a string), got {named}"


def test_a_key_that_does_not_apply_has_only_that_problem() -> None:
    document = {"grant": [{**SHELL, "paths": 5, "hosts": [], "hard_links": "x"}]}
    found = all_problems(document)
    assert isinstance(found, tuple)
    assert [(p.key, p.message) for p in found] == [
        ("paths", "does not apply to tool shell"),
        ("hosts", "does not apply to tool shell"),
        ("hard_links", "does not apply to tool shell"),
    ]


def test_all_problems_in_file_order_with_their_index() -> None:
    document = {
        "zz": 1,
        "grant": [
            {"id": "a", "tool": "x", "mod": "ask", "colour": 1},
            {**BASE, "id": "b"},
            {"id": 5, "tool": "shell", "mode": "auto", "label_taint": "public", "note": 1},
        ],
    }
    found = all_problems(document)
    assert isinstance(found, tuple)
    assert [(p.index, p.grant_id, p.key, p.message) for p in found] == [
        (None, None, "zz", "unknown top-level key (only [[grant]] tables)"),
        (0, "a", "colour", "unknown key"),
        (0, "a", "mod", "unknown key"),
        (0, "a", "mode", "required key missing"),
        (
            0,
            "a",
            "tool",
            "expected one of read_file, list_dir, write_file, shell, http_get, connect, got 'x'",
        ),
        (2, None, "id", "[[grant]] #3: expected a string id, got an integer"),
        (2, None, "label_taint", "may only raise shell output: internal or secret"),
        (2, None, "note", "expected a string, got an integer"),
    ]
    assert [p.suggestion for p in found][:3] == [None, None, "mode"]
    assert grants_from_document(document) == found[0]


def test_problems_name_grants_toml_by_default() -> None:
    bad = {"grant": [{**BASE, "mode": "x"}]}
    found = all_problems(bad)
    assert isinstance(found, tuple)
    assert found[0].file == "grants.toml"
    from_document = grants_from_document(bad)
    assert isinstance(from_document, GrantsProblem)
    assert from_document.file == "grants.toml"
    syntax = parse_toml("[grant")
    assert isinstance(syntax, GrantsProblem)
    assert (syntax.file, syntax.grant_id, syntax.key) == ("grants.toml", None, None)
    assert parse_toml("[grant", "/etc/g.toml") == GrantsProblem(
        "/etc/g.toml", None, None, syntax.message
    )
    assert syntax.message.startswith("TOML syntax: ")
    assert parse_toml("a = 1") == {"a": 1}


def test_a_note_of_exactly_500_characters_is_kept() -> None:
    assert one(grant_text(**BASE, note="n" * 500)).note == "n" * 500


def test_expires_is_stored_in_utc() -> None:
    expires = one(grant_text(**BASE, expires=Raw("2026-07-01T02:00:00+02:00"))).expires
    assert expires is not None
    assert expires.tzinfo is dt.UTC
    assert expires.isoformat() == "2026-07-01T00:00:00+00:00"


def test_wins_over_ask_defaults_to_false_and_is_kept_on_auto_grants() -> None:
    assert one(grant_text(**BASE)).wins_over_ask is False
    assert one(grant_text(**BASE, wins_over_ask=False)).wins_over_ask is False
    assert one(grant_text(**BASE, wins_over_ask=True)).wins_over_ask is True


# --- precedence ---------------------------------------------------------------------------


def test_precedence_rank_deny_then_winning_auto_then_ask_then_auto() -> None:
    assert precedence_rank(Grant("d", "shell", Mode.DENY)) == 0
    assert precedence_rank(Grant("w", "shell", Mode.AUTO, wins_over_ask=True)) == 1
    assert precedence_rank(Grant("k", "shell", Mode.ASK)) == 2
    assert precedence_rank(Grant("a", "shell", Mode.AUTO)) == 3


def test_in_precedence_orders_by_rank_then_file_order() -> None:
    text = "".join(
        grant_text(id=gid, tool="read_file", mode=mode, **extra)
        for gid, mode, extra in [
            ("auto-1", "auto", {}),
            ("ask-1", "ask", {}),
            ("win-1", "auto", {"wins_over_ask": True}),
            ("deny-1", "deny", {}),
            ("auto-2", "auto", {}),
            ("ask-2", "ask", {}),
            ("deny-2", "deny", {}),
            ("win-2", "auto", {"wins_over_ask": True}),
        ]
    ) + grant_text(id="ls", tool="list_dir", mode="deny")
    grants = parsed(text)
    assert [g.id for g in grants.in_precedence("read_file")] == [
        "deny-1",
        "deny-2",
        "win-1",
        "win-2",
        "ask-1",
        "ask-2",
        "auto-1",
        "auto-2",
    ]
    assert [g.id for g in grants.in_precedence("list_dir")] == ["ls"]
    assert grants.in_precedence("shell") == ()
    assert grants.in_precedence("rm_rf") == ()
    assert [g.id for g in grants.for_tool_and_mode("read_file", Mode.AUTO)] == [
        "auto-1",
        "win-1",
        "auto-2",
        "win-2",
    ]
    assert grants.for_tool_and_mode("shell", Mode.AUTO) == ()
    assert grants.for_tool_and_mode("rm_rf", Mode.DENY) == ()


@given(st.lists(st.sampled_from([Mode.DENY, Mode.ASK, Mode.AUTO, "win"]), max_size=8))
def test_in_precedence_is_a_stable_sort_by_rank(modes: list[Mode | str]) -> None:
    grants = GrantSet(
        tuple(
            Grant(f"g{i}", "shell", Mode.AUTO, wins_over_ask=True)
            if mode == "win"
            else Grant(f"g{i}", "shell", Mode(mode))
            for i, mode in enumerate(modes)
        )
    )
    ordered = grants.in_precedence("shell")
    assert sorted(ordered, key=lambda g: int(g.id[1:])) == list(grants.grants)
    ranks = [precedence_rank(g) for g in ordered]
    assert ranks == sorted(ranks)
    for rank in set(ranks):
        ids = [int(g.id[1:]) for g in ordered if precedence_rank(g) == rank]
        assert ids == sorted(ids)
