"""Workspace paths and globs (spec §4.2)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from boxmaker.core.paths import ROOT, Glob, PathProblem, glob_problem, normalize_path

WORKSPACE = "/home/me/work"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("notes.txt", "notes.txt"),
        ("./notes.txt", "notes.txt"),
        ("notes//a/./b.txt", "notes/a/b.txt"),
        ("notes/", "notes"),
        ("a/b/../c", "a/c"),
        ("a/..", ROOT),
        ("", ROOT),
        (".", ROOT),
        ("./", ROOT),
        ("...", "..."),
        ("a..b", "a..b"),
        ("/home/me/work", ROOT),
        ("/home/me/work/", ROOT),
        ("/home/me/work/notes/x.txt", "notes/x.txt"),
        ("/home/me/./work/notes/../y", "y"),
    ],
)
def test_normalize_accepts(raw: str, expected: str) -> None:
    assert normalize_path(raw, WORKSPACE) == expected


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("..", "'..' leaves the workspace"),
        ("../x", "'..' leaves the workspace"),
        ("a/../../x", "'..' leaves the workspace"),
        ("a/b/../../..", "'..' leaves the workspace"),
        ("/etc/passwd", "absolute path outside the workspace"),
        ("/home/me/workshop/x", "absolute path outside the workspace"),
        ("/home/me/work/../other/x", "absolute path outside the workspace"),
        ("/home/me", "absolute path outside the workspace"),
        ("/..", "absolute path outside the workspace"),
        ("a\x00b", "NUL byte in path"),
        ("/home/me/work/a\x00", "NUL byte in path"),
    ],
)
def test_normalize_refuses(raw: str, message: str) -> None:
    assert normalize_path(raw, WORKSPACE) == PathProblem(message)


def test_absolute_refused_without_a_workspace() -> None:
    assert normalize_path("/home/me/work/x") == PathProblem("absolute path outside the workspace")


segment = st.text(alphabet="ab.-_*", min_size=0, max_size=4)
raw_path = st.lists(st.sampled_from(["a", "b", ".", "..", "", "c.txt", ".env"]), max_size=8).map(
    "/".join
)


@given(raw_path)
def test_a_normalized_path_is_clean_and_stable(raw: str) -> None:
    result = normalize_path(raw)
    if isinstance(result, PathProblem):
        return
    assert normalize_path(result) == result
    if result != ROOT:
        assert not result.startswith("/")
        assert all(part not in ("", ".", "..") for part in result.split("/"))


@given(raw_path)
def test_absolute_inside_equals_relative(raw: str) -> None:
    relative = normalize_path(raw)
    if isinstance(relative, str):
        assert normalize_path(WORKSPACE + "/" + raw, WORKSPACE) == relative


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [
        ("notes/**", "notes", True),
        ("notes/**", "notes/a.txt", True),
        ("notes/**", "notes/a/b/c.txt", True),
        ("notes/**", "notesx/a", False),
        ("notes/**", "x/notes/a", False),
        ("**/.env", ".env", True),
        ("**/.env", "a/.env", True),
        ("**/.env", "a/b/.env", True),
        ("**/.env", "a/x.env", False),
        ("**/.env", ".envrc", False),
        ("**/*.pem", "k.pem", True),
        ("**/*.pem", "d/e/k.pem", True),
        ("**/*.pem", "d/e/k.pem.bak", False),
        ("*.txt", "a.txt", True),
        ("*.txt", ".txt", True),
        ("*.txt", "d/a.txt", False),
        ("*", "a", True),
        ("*", "a/b", False),
        ("*", ROOT, False),
        ("**", ROOT, True),
        ("**", "a/b/c", True),
        ("a/**/b", "a/b", True),
        ("a/**/b", "a/x/b", True),
        ("a/**/b", "a/x/y/b", True),
        ("a/**/b", "a/xb", False),
        ("a/**/**/b", "a/b", True),
        ("a/*/b", "a/b", False),
        ("a/*/b", "a/x/b", True),
        ("a**b", "axyb", True),
        ("a**b", "ax/yb", False),
        ("a.txt", "aXtxt", False),
        ("a?.txt", "ab.txt", False),
        ("a?.txt", "a?.txt", True),
        ("[ab]", "a", False),
        ("notes/**", ROOT, False),
    ],
)
def test_glob(pattern: str, path: str, expected: bool) -> None:
    assert Glob.compile(pattern).matches(path) is expected


@pytest.mark.parametrize(
    ("pattern", "problem"),
    [
        ("", "an empty glob"),
        ("/etc/**", "a glob is relative to the workspace: no leading '/'"),
        ("a//b", "no empty, '.' or '..' segments in a glob"),
        ("a/", "no empty, '.' or '..' segments in a glob"),
        ("./a", "no empty, '.' or '..' segments in a glob"),
        ("a/../b", "no empty, '.' or '..' segments in a glob"),
        ("a\x00", "NUL byte in glob"),
    ],
)
def test_bad_globs(pattern: str, problem: str) -> None:
    assert glob_problem(pattern) == problem
    with pytest.raises(ValueError, match=re.escape(problem)):
        Glob.compile(pattern)


def _reference(pattern: list[str], path: list[str]) -> bool:
    """Segment-wise matching, written the slow and obvious way."""
    if not pattern:
        return not path
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(_reference(rest, path[i:]) for i in range(len(path) + 1))
    if not path:
        return False
    regex = ".*".join(re.escape(part) for part in head.split("*"))
    return re.fullmatch(regex, path[0], re.DOTALL) is not None and _reference(rest, path[1:])


glob_segment = st.sampled_from(["a", "b", "*", "**", "a*", "*b", ".env", "a.b"])
path_segment = st.sampled_from(["a", "b", "ab", "ba", ".env", "a.b", "c"])


@given(st.lists(glob_segment, min_size=1, max_size=5), st.lists(path_segment, max_size=5))
def test_glob_agrees_with_a_reference_matcher(pattern: list[str], path: list[str]) -> None:
    text = "/".join(pattern)
    expected = _reference(pattern, path)
    assert Glob.compile(text).matches("/".join(path) if path else ROOT) is expected
