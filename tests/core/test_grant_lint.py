"""grants.toml's analysis for ``bxctl grants check``: every problem with its line and a
"did you mean", shadowed grants, shell patterns that chain. (The ledger's usage tally is
tested over the ledger's reader: tests/ledger/test_ledger_reader.py.)"""

from __future__ import annotations

import datetime as dt
import fnmatch

from hypothesis import given
from hypothesis import strategies as st
from tests.harness.grants import grant_set

from boxmaker.core.grant_lint import (
    CHAIN_CHARACTERS,
    chaining_witness,
    command_covers,
    glob_covers,
    grant_sources,
    lint_grants,
    shadows,
)
from boxmaker.core.grant_parse import parse_grants
from boxmaker.core.grants import GrantSet
from boxmaker.core.paths import Glob

NOW = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)

SEVERAL_PROBLEMS = """\
# the owner's grants
[[grant]]
id = "notes"
tool = "read_file"
mode = "ask"
# path = ["old/**"]
path = ["notes/**"]

[[grant]]
id = "Bad"
tool = "shel"
mode = "auot"
note = \"\"\"
[[grant]]
max_taint = 1
\"\"\"
max_taint = "secrett"

[[grant]]
id = "notes"
tool = "shell"
mode = "auto"
paths = ["x"]
"""


def found(text: str) -> list[tuple[str, int | None, str | None, str | None, str]]:
    return [
        (f.severity, f.line, f.grant_id, f.key, f.full_message())
        for f in lint_grants(text, NOW).findings
    ]


def test_every_problem_with_its_line_and_a_suggestion() -> None:
    assert found(SEVERAL_PROBLEMS) == [
        ("problem", 7, "notes", "path", "unknown key (did you mean 'paths'?)"),
        ("problem", 10, None, "id", "[[grant]] #2: id 'Bad' must match [a-z0-9][a-z0-9-]{0,62}"),
        (
            "problem",
            11,
            None,
            "tool",
            "expected one of read_file, list_dir, write_file, shell, http_get, connect, got 'shel' "
            "(did you mean 'shell'?)",
        ),
        (
            "problem",
            12,
            None,
            "mode",
            "expected one of auto, ask, deny, got 'auot' (did you mean 'auto'?)",
        ),
        (
            "problem",
            17,
            None,
            "max_taint",
            "expected one of public, internal, secret, got 'secrett' (did you mean 'secret'?)",
        ),
        ("problem", 20, "notes", "id", "duplicate id"),
        ("problem", 23, "notes", "paths", "does not apply to tool shell"),
    ]


def test_brokerd_still_reports_the_first_problem_only() -> None:
    problem = parse_grants(SEVERAL_PROBLEMS)
    assert not isinstance(problem, GrantSet)
    assert (problem.grant_id, problem.key, problem.message) == ("notes", "path", "unknown key")
    assert problem.describe() == (
        "grants.toml, grant 'notes', key 'path': unknown key (did you mean 'paths'?)"
    )


def test_a_top_level_key_and_a_missing_id() -> None:
    text = 'grants = 1\n\n[[grant]]\ntool = "read_file"\nmode = "auto"\n'
    assert found(text) == [
        (
            "problem",
            1,
            None,
            "grants",
            "unknown top-level key (only [[grant]] tables) (did you mean 'grant'?)",
        ),
        ("problem", 3, None, "id", "[[grant]] #1 has no id"),
    ]


def test_a_syntax_error_is_the_one_problem_at_its_line() -> None:
    ((severity, line, grant_id, key, message),) = found('[[grant]]\nid = "a"\nmode = \n')
    assert (severity, line, grant_id, key) == ("problem", 3, None, None)
    assert message.startswith("TOML syntax: ")


SHADOWED = """\
[[grant]]
id = "notes"
tool = "read_file"
mode = "ask"
paths = ["notes/**"]

[[grant]]
id = "notes-md"
tool = "read_file"
mode = "ask"
paths = ["notes/*/*.md", "notes/todo.md"]

[[grant]]
id = "no-secrets"
tool = "read_file"
mode = "deny"
paths = ["**/.env"]

[[grant]]
id = "env-auto"
tool = "read_file"
mode = "auto"
paths = ["app/.env"]

[[grant]]
id = "other-tool"
tool = "list_dir"
mode = "ask"
paths = ["notes/a"]

[[grant]]
id = "git"
tool = "shell"
mode = "ask"
commands = ["git status", "git log --oneline"]
"""


def test_shadowed_grants_are_flagged_and_others_not() -> None:
    assert found(SHADOWED) == [
        (
            "warning",
            7,
            "notes-md",
            None,
            "never decides a call: grant 'notes' (line 1), an earlier grant of the same mode, "
            "is tried first and matches every call this one matches",
        ),
        (
            "warning",
            19,
            "env-auto",
            None,
            "never decides a call: grant 'no-secrets' (line 13), a deny grant (deny, then auto "
            "with wins_over_ask, then ask, then auto), is tried first and matches every call "
            "this one matches",
        ),
    ]


ALWAYS_FIRST = """\
[[grant]]
id = "notes"
tool = "read_file"
mode = "ask"
paths = ["notes.txt"]

[[grant]]
id = "always-a-1f2e3d4c"
tool = "read_file"
mode = "auto"
wins_over_ask = true
paths = ["notes.txt"]
"""


def test_an_approve_always_grant_shadows_the_ask_grant_below_it_in_precedence() -> None:
    assert found(ALWAYS_FIRST) == [
        (
            "warning",
            1,
            "notes",
            None,
            "never decides a call: grant 'always-a-1f2e3d4c' (line 7), an auto grant that wins "
            "over ask (deny, then auto with wins_over_ask, then ask, then auto), is tried first "
            "and matches every call this one matches",
        ),
    ]


def test_a_grant_that_expires_first_does_not_shadow() -> None:
    text = """
[[grant]]
id = "wide"
tool = "read_file"
mode = "ask"
expires = 2026-07-01T00:00:00Z
[[grant]]
id = "narrow"
tool = "read_file"
mode = "ask"
paths = ["a"]
"""
    wide, narrow = grant_set(text).grants
    assert not shadows(wide, narrow, NOW)
    assert found(text) == []
    forever = grant_set(text.replace("expires = 2026-07-01T00:00:00Z", "")).grants
    assert shadows(forever[0], forever[1], NOW)


CHAINS = """\
[[grant]]
id = "git"
tool = "shell"
mode = "auto"
commands = ["git status", "git log *"]

[[grant]]
id = "never-rm"
tool = "shell"
mode = "deny"
commands = ["rm *"]

[[grant]]
id = "ls"
tool = "shell"
mode = "ask"
commands = ["ls [ab]", "ls ?"]
"""


def test_shell_patterns_that_chain_are_flagged_exact_and_deny_ones_not() -> None:
    assert found(CHAINS) == [
        (
            "warning",
            5,
            "git",
            "commands",
            "'git log *' also matches a command line that runs another command (its wildcard "
            "matches ';', '&&', '|', '$(' and backticks), e.g. 'git log ; other-command'; "
            'prefer exact command lines, or mode = "ask"',
        ),
        (
            "warning",
            17,
            "ls",
            "commands",
            "'ls ?' also matches a command line that runs another command (its wildcard "
            "matches ';', '&&', '|', '$(' and backticks), e.g. 'ls ;'; "
            'prefer exact command lines, or mode = "ask"',
        ),
    ]


def test_a_safe_file_has_no_finding() -> None:
    text = (
        '[[grant]]\nid = "git"\ntool = "shell"\nmode = "auto"\n'
        'commands = ["git status", "ls [ab]", "make test"]\n'
        '[[grant]]\nid = "r"\ntool = "read_file"\nmode = "auto"\npaths = ["src/**"]\n'
        '[[grant]]\nid = "r2"\ntool = "read_file"\nmode = "ask"\npaths = ["docs/**"]\n'
    )
    assert found(text) == []
    # The same ask grant over src/** is tried before the auto one, which never decides.
    ((severity, line, grant_id, _, message),) = found(text.replace("docs/**", "src/**"))
    assert (severity, line, grant_id) == ("warning", 6, "r")
    assert message.startswith("never decides a call: grant 'r2' (line 11), an ask grant (")


def test_grant_sources_are_each_tables_lines() -> None:
    assert grant_sources(SHADOWED)[1] == (
        7,
        '[[grant]]\nid = "notes-md"\ntool = "read_file"\nmode = "ask"\n'
        'paths = ["notes/*/*.md", "notes/todo.md"]',
    )


# --- the conservative coverage checks are sound -------------------------------------------

SEGMENT = st.sampled_from(["a", "b", "x.md", "*", "*.md", "a*", "**"])
PATH_SEGMENT = st.sampled_from(["a", "b", "x.md", "ab.md", "a1"])


@given(
    st.lists(SEGMENT, min_size=1, max_size=4),
    st.lists(SEGMENT, min_size=1, max_size=4),
    st.lists(PATH_SEGMENT, min_size=0, max_size=5),
)
def test_glob_covers_only_when_every_path_matched_is(
    wide: list[str], narrow: list[str], path: list[str]
) -> None:
    wide_glob, narrow_glob = Glob.compile("/".join(wide)), Glob.compile("/".join(narrow))
    as_path = "/".join(path) or "."
    if glob_covers(wide_glob.pattern, narrow_glob.pattern) and narrow_glob.matches(as_path):
        assert wide_glob.matches(as_path)


COMMAND = st.sampled_from(["git", "git status", "git *", "git status*", "*", "ls ?", "ls"])


@given(COMMAND, COMMAND, st.sampled_from(["git", "git status", "git status; rm x", "ls a", "ls"]))
def test_command_covers_only_when_every_line_matched_is(wide: str, narrow: str, line: str) -> None:
    if command_covers(wide, narrow) and fnmatch.fnmatchcase(line, narrow):
        assert fnmatch.fnmatchcase(line, wide)


@given(st.text(alphabet="ab *?[]!;|-", max_size=12))
def test_a_chaining_witness_matches_its_pattern_and_chains(pattern: str) -> None:
    witness = chaining_witness(pattern)
    if witness is not None:
        assert fnmatch.fnmatchcase(witness, pattern)
        assert any(char in witness for char in CHAIN_CHARACTERS)
    elif all(char not in "*?[" for char in pattern):
        assert witness is None


def test_a_pattern_with_a_set_that_matches_nothing_has_no_chaining_witness() -> None:
    # `[?-;]` runs backwards (0x3F to 0x3B): fnmatch matches nothing with it.
    assert chaining_witness("[?-;]?") is None
    assert chaining_witness("git *[?-;]") is None
