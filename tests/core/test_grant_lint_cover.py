"""``bxctl grants check`` in detail: the codes, indices and lines of each finding, what
shadows what (paths, commands, hosts, expiry), the chaining witness, a grant's own text."""

from __future__ import annotations

import datetime as dt

import pytest
from tests.harness.grants import grant_set

from boxmaker.core.grant_lint import (
    WITNESS_COMMAND,
    chaining_witness,
    command_covers,
    glob_covers,
    grant_sources,
    host_covers,
    lint_grants,
    shadows,
)
from boxmaker.core.grants import Grant, Mode
from boxmaker.core.paths import Glob

NOW = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)


def summary(text: str) -> list[tuple[str, str, int | None, int | None, str | None, str | None]]:
    return [
        (f.severity, f.code, f.line, f.grant_index, f.grant_id, f.key)
        for f in lint_grants(text, NOW).findings
    ]


# --- problems -----------------------------------------------------------------------------


def test_problems_are_invalid_with_their_grant_index() -> None:
    text = (
        '[[grant]]\nid = "a"\ntool = "read_file"\nmode = "auto"\n\n'
        '[[grant]]\nid = "b"\ntool = "shel"\nmode = "ask"\n'
    )
    lint = lint_grants(text, NOW)
    assert lint.grants is None
    assert summary(text) == [("problem", "invalid", 8, 1, "b", "tool")]
    assert lint.problems == lint.findings
    assert lint.warnings == ()


def test_a_syntax_error_has_code_syntax_and_no_grants() -> None:
    lint = lint_grants('[[grant]]\nid = "a"\nmode = \n', NOW)
    assert lint.grants is None
    assert summary('[[grant]]\nid = "a"\nmode = \n') == [("problem", "syntax", 3, None, None, None)]


def test_a_syntax_problem_without_a_line_in_its_message_has_no_line() -> None:
    (finding,) = lint_grants("a = " + "[" * 3000 + "]" * 3000 + "\n", NOW).findings
    assert (finding.code, finding.line) == ("syntax", None)
    assert finding.message == "TOML syntax: maximum recursion depth exceeded"


def test_lines_count_a_leading_blank_line() -> None:
    text = '\n[[grant]]\nid = "a"\ntool = "red_file"\nmode = "auto"\n'
    assert summary(text) == [("problem", "invalid", 4, 0, "a", "tool")]


def test_a_key_found_after_its_table_header_not_inside_it() -> None:
    # "rant" is spelt inside "[[grant]]": its line is the key's, not the header's.
    text = '[[grant]]\nrant= 1\nid = "a"\ntool = "read_file"\nmode = "auto"\n'
    assert summary(text) == [("problem", "invalid", 2, 0, "a", "rant")]


def test_other_arrays_of_tables_are_not_grant_tables() -> None:
    text = '[[grants]]\nid = "x"\n\n[[grant]]\ntool = "read_file"\nmode = "auto"\n'
    assert summary(text) == [
        ("problem", "invalid", 1, None, None, "grants"),
        ("problem", "invalid", 4, 0, None, "id"),
    ]


def test_a_top_level_table_is_read_key_by_key_before_the_grants() -> None:
    text = (
        '[settings]\n# a comment\nlevel = 1\n\nname = "x"\n\n'
        '[[grant]]\nid = "a"\ntool = "red_file"\nmode = "auto"\n'
    )
    assert summary(text) == [
        ("problem", "invalid", 1, None, None, "settings"),
        ("problem", "invalid", 9, 0, "a", "tool"),
    ]


def test_a_top_level_table_after_the_grants_has_its_line() -> None:
    text = '[[grant]]\nid = "a"\ntool = "read_file"\nmode = "auto"\n\n[settings]\nlevel = 1\n'
    assert summary(text) == [("problem", "invalid", 6, None, None, "settings")]


def test_grants_written_as_an_inline_array_have_no_lines() -> None:
    text = 'grant = [{tool = "read_file", mode = "auto"}]\n'
    assert summary(text) == [("problem", "invalid", None, 0, None, "id")]


# --- warnings -----------------------------------------------------------------------------


def test_warnings_carry_their_code_and_grant_index_and_the_valid_grants() -> None:
    text = (
        '[[grant]]\nid = "wide"\ntool = "read_file"\nmode = "ask"\n\n'
        '[[grant]]\nid = "narrow"\ntool = "read_file"\nmode = "ask"\npaths = ["a"]\n\n'
        '[[grant]]\nid = "git"\ntool = "shell"\nmode = "auto"\ncommands = ["git *"]\n'
    )
    lint = lint_grants(text, NOW)
    assert lint.grants == grant_set(text)
    assert summary(text) == [
        ("warning", "shadowed", 6, 1, "narrow", None),
        ("warning", "chains", 16, 2, "git", "commands"),
    ]
    assert lint.warnings == lint.findings
    assert lint.problems == ()


def test_warnings_are_in_file_order_even_without_lines() -> None:
    # An inline array of grants: tomlkit gives no table lines, so the order is by grant.
    text = (
        "grant = [\n"
        '  {id = "a", tool = "shell", mode = "ask", commands = ["git *"]},\n'
        '  {id = "b", tool = "shell", mode = "auto", commands = ["git status"]},\n'
        "]\n"
    )
    lint = lint_grants(text, NOW)
    assert [(f.code, f.line, f.grant_index, f.grant_id) for f in lint.findings] == [
        ("chains", None, 0, "a"),
        ("shadowed", None, 1, "b"),
    ]
    # Without the shadowing grant's line, the message names it without one.
    assert lint.findings[1].message == (
        "never decides a call: grant 'a', an ask grant (deny, then auto with wins_over_ask, "
        "then ask, then auto), is tried first and matches every call this one matches"
    )


# --- shadows ------------------------------------------------------------------------------


def test_a_grant_of_another_tool_never_shadows() -> None:
    first = Grant("r", "read_file", Mode.ASK)
    later = Grant("l", "list_dir", Mode.ASK)
    assert not shadows(first, later, NOW)
    assert shadows(first, Grant("r2", "read_file", Mode.AUTO), NOW)


def test_an_expired_grant_never_shadows() -> None:
    ended = Grant("r", "read_file", Mode.ASK, expires=NOW)
    assert not shadows(ended, Grant("r2", "read_file", Mode.AUTO), NOW)


def test_a_grant_ending_at_the_same_time_shadows() -> None:
    end = NOW + dt.timedelta(days=1)
    first = Grant("r", "read_file", Mode.ASK, expires=end)
    assert shadows(first, Grant("r2", "read_file", Mode.AUTO, expires=end), NOW)
    assert not shadows(
        first, Grant("r2", "read_file", Mode.AUTO, expires=end + dt.timedelta(seconds=1)), NOW
    )
    assert not shadows(first, Grant("r2", "read_file", Mode.AUTO), NOW)


def paths(*patterns: str) -> tuple[Glob, ...]:
    return tuple(Glob.compile(p) for p in patterns)


def test_a_grant_without_paths_is_shadowed_only_by_a_grant_matching_every_path() -> None:
    later = Grant("r2", "read_file", Mode.AUTO)
    assert shadows(Grant("r", "read_file", Mode.ASK, paths=paths("**")), later, NOW)
    assert not shadows(Grant("r", "read_file", Mode.ASK, paths=paths("*")), later, NOW)
    assert not shadows(Grant("r", "read_file", Mode.ASK, paths=paths("notes/**")), later, NOW)


@pytest.mark.parametrize(
    ("first", "expected"),
    [(("*",), True), (("git *",), False), (("X*",), False), (("ls", "*"), True)],
)
def test_a_shell_grant_without_commands_is_shadowed_only_by_star(
    first: tuple[str, ...], expected: bool
) -> None:
    later = Grant("s2", "shell", Mode.AUTO)
    assert shadows(Grant("s", "shell", Mode.ASK, commands=first), later, NOW) is expected


def test_a_shell_grant_is_shadowed_when_each_of_its_commands_is_covered() -> None:
    first = Grant("s", "shell", Mode.ASK, commands=("git *", "make test"))
    assert shadows(first, Grant("s2", "shell", Mode.AUTO, commands=("git status",)), NOW)
    assert shadows(first, Grant("s2", "shell", Mode.AUTO, commands=("make test", "git log")), NOW)
    assert not shadows(first, Grant("s2", "shell", Mode.AUTO, commands=("git status", "make")), NOW)


def test_an_http_get_grant_is_shadowed_when_each_of_its_hosts_is_covered() -> None:
    first = Grant("h", "http_get", Mode.ASK, hosts=("*.example.com", "a.org"))
    for hosts, expected in [
        (("a.example.com",), True),
        (("a.example.com", "a.org"), True),
        (("example.com",), False),
        (("a.example.com", "b.org"), False),
        (("a.org:8443",), False),
    ]:
        later = Grant("h2", "http_get", Mode.AUTO, hosts=hosts)
        assert shadows(first, later, NOW) is expected, hosts


def test_an_http_get_grant_is_flagged_as_shadowed_in_the_file() -> None:
    text = (
        '[[grant]]\nid = "docs"\ntool = "http_get"\nmode = "ask"\nhosts = ["*.python.org"]\n\n'
        '[[grant]]\nid = "pypi"\ntool = "http_get"\nmode = "ask"\n'
        'hosts = ["docs.python.org"]\n\n'
        '[[grant]]\nid = "bare"\ntool = "http_get"\nmode = "ask"\nhosts = ["python.org"]\n'
    )
    assert summary(text) == [("warning", "shadowed", 7, 1, "pypi", None)]


# --- host_covers --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wide", "narrow", "expected"),
    [
        ("a.org", "a.org", True),
        ("A.org", "a.ORG", True),
        ("a.org:8443", "a.org:8443", True),
        ("a.org", "a.org:8443", False),
        ("a.org:8443", "a.org", False),
        ("a.org:8443", "a.org:9443", False),
        ("a.org", "b.org", False),
        ("a.org", "b.a.org", False),
        ("*.a.org", "b.a.org", True),
        ("*.a.org", "c.b.a.org", True),
        ("*.a.org", "*.b.a.org", True),
        ("*.a.org:8443", "b.a.org:8443", True),
        ("*.a.org", "b.a.org:8443", False),
        ("*.a.org", "a.org", False),
        ("*.a.org", "xa.org", False),
        ("*.a.org", "a-much-longer-name.net", False),
        ("*.b.a.org", "*.a.org", False),
        ("https://a.org", "a.org", False),
        ("a.org", "https://a.org", False),
    ],
)
def test_host_covers(wide: str, narrow: str, expected: bool) -> None:
    assert host_covers(wide, narrow) is expected


# --- glob_covers and command_covers ----------------------------------------------------------


@pytest.mark.parametrize(
    ("wide", "narrow", "expected"),
    [
        ("a/b", "a/b", True),
        ("notes/a/b.md", "notes/a/b.md", True),
        ("notes/a/b.md", "notes/a/c.md", False),
        ("*.md", "*.md", True),
        ("notes/*.md", "notes/*.md", True),
        ("*", "x*", True),
        ("*", "*.md", True),
        ("*.md", "a.md", True),
        ("notes/*.md", "notes/todo.md", True),
        ("a*.md", "ab.md", True),
        ("notes/a**", "notes/ab.md", True),
        ("*.md", "a.txt", False),
        ("a.md", "*.md", False),
        ("a*", "*", False),
        ("*", "**", False),
        ("notes/*", "notes/**", False),
        ("notes/*", "notes/a/b", False),
        ("**", "a/**/b", True),
        ("notes/**", "notes/a/**", True),
        ("a/**/c", "a/b/c", True),
        ("a/**/c", "a/b/d", False),
    ],
)
def test_glob_covers(wide: str, narrow: str, expected: bool) -> None:
    assert glob_covers(wide, narrow) is expected
    if expected:
        assert Glob.compile(wide).matches(narrow.replace("*", "z"))


@pytest.mark.parametrize(
    ("wide", "narrow", "expected"),
    [
        ("git status", "git status", True),
        ("ls ?", "ls ?", True),
        ("*", "git status", True),
        ("*", "ls ?", True),
        ("git *", "git status", True),
        ("git *", "git status*", True),
        ("git *", "git ?", True),
        ("git *", "git", False),
        ("git *", "gi? status", False),
        ("git status", "git *", False),
        ("git status", "git log", False),
        ("git s?", "git st", False),
        ("g?t *", "g?t status", False),
    ],
)
def test_command_covers(wide: str, narrow: str, expected: bool) -> None:
    assert command_covers(wide, narrow) is expected


# --- chaining_witness ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "witness"),
    [
        ("git *", f"git {WITNESS_COMMAND}"),
        ("git * *", f"git {WITNESS_COMMAND} "),
        ("git *-*", f"git {WITNESS_COMMAND}-"),
        ("git * ?", f"git {WITNESS_COMMAND} a"),
        ("git *?", f"git {WITNESS_COMMAND}a"),
        ("git *[xy]", f"git {WITNESS_COMMAND}x"),
        ("git *[!a-z]", f"git {WITNESS_COMMAND}0"),
        ("git *[\t~]", f"git {WITNESS_COMMAND}~"),
        ("ls [!]]", "ls ;"),
        ("ls [;|]", "ls ;"),
        ("ls [|]x", "ls |x"),
        ("a[]]*", f"a]{WITNESS_COMMAND}"),
        ("ls [ab]", None),
        ("ls [", None),
        ("ls []", None),
        ("ls", None),
    ],
)
def test_chaining_witness(pattern: str, witness: str | None) -> None:
    assert chaining_witness(pattern) == witness


# --- grant_sources ---------------------------------------------------------------------------


def test_grant_sources_of_tables_back_to_back() -> None:
    text = '[[grant]]\nid = "a"\nmode = "ask"\n[[grant]]\nid = "b"\n'
    assert grant_sources(text) == (
        (1, '[[grant]]\nid = "a"\nmode = "ask"'),
        (4, '[[grant]]\nid = "b"'),
    )


def test_grant_sources_drop_the_comments_that_introduce_the_next_table() -> None:
    text = (
        '[[grant]]\nid = "a"\n# about a\nmode = "ask"\n\n  # b, indented:\n# more\n'
        '[[grant]]\nid = "b"\n\n# trailing\n'
    )
    assert grant_sources(text) == (
        (1, '[[grant]]\nid = "a"\n# about a\nmode = "ask"'),
        (8, '[[grant]]\nid = "b"'),
    )


def test_grant_sources_of_three_tables() -> None:
    text = '[[grant]]\nid = "a"\n\n[[grant]]\nid = "b"\n\n[[grant]]\nid = "c"\n'
    assert grant_sources(text) == (
        (1, '[[grant]]\nid = "a"'),
        (4, '[[grant]]\nid = "b"'),
        (7, '[[grant]]\nid = "c"'),
    )


def test_a_table_between_grant_tables_is_reported_with_its_line_or_none() -> None:
    # tomlkit gathers both [[grant]] tables first; [other]'s line is then not found, and a
    # line is either right or not given.
    text = (
        '[[grant]]\nid = "a"\ntool = "read_file"\nmode = "auto"\n'
        "[other]\nx = 1\n"
        '[[grant]]\nid = "b"\ntool = "read_file"\nmode = "auto"\n'
    )
    ((severity, code, line, index, grant_id, key),) = summary(text)
    assert (severity, code, index, grant_id, key) == ("problem", "invalid", None, None, "other")
    assert line in (5, None)


def test_a_sub_table_of_a_grant_is_an_unknown_key_at_its_header() -> None:
    text = (
        '[[grant]]\nid = "a"\ntool = "read_file"\nmode = "auto"\n'
        "[grant.sub]\n# about q\nq = 1\n\n"
        '[[grant]]\nid = "b"\ntool = "red_file"\nmode = "auto"\n'
    )
    assert summary(text) == [
        ("problem", "invalid", 5, 0, "a", "sub"),
        ("problem", "invalid", 11, 1, "b", "tool"),
    ]


def test_each_set_in_a_pattern_is_its_own_token() -> None:
    assert chaining_witness("ls [a]*[b]") == f"ls a{WITNESS_COMMAND}b"
    assert chaining_witness("ls [a]?[b]") == "ls a;b"
