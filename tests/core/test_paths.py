"""Workspace paths and globs (docs/decisions.md, "Paths and globs")."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from boxmaker.core.paths import (
    MAX_PATH_BYTES,
    MAX_SEGMENT_BYTES,
    ROOT,
    Glob,
    PathProblem,
    any_glob,
    glob_problem,
    match_form,
    normalize_path,
    path_below,
)

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


@pytest.mark.parametrize("sibling", ["work-evil", "work2", "work.d", "workshop", "wor"])
def test_an_absolute_path_into_a_sibling_named_like_the_workspace_is_outside(
    sibling: str,
) -> None:
    assert normalize_path(f"/home/me/{sibling}/a.txt", WORKSPACE) == PathProblem(
        "absolute path outside the workspace"
    )
    assert normalize_path(f"/home/me/work/../{sibling}/a.txt", WORKSPACE) == PathProblem(
        "absolute path outside the workspace"
    )


@pytest.mark.parametrize(
    ("root", "real", "expected"),
    [
        ("/w/ws", "/w/ws", ROOT),
        ("/w/ws", "/w/ws/a", "a"),
        ("/w/ws", "/w/ws/a/b.txt", "a/b.txt"),
        ("/w/ws", "/w/ws/...", "..."),
        ("/w/ws", "/w/ws/.env", ".env"),
        ("/w/ws", "/w/ws/ws-evil", "ws-evil"),
        ("/", "/", ROOT),
        ("/", "/etc/passwd", "etc/passwd"),
        ("/w/ws/", "/w/ws/a", "a"),
        # Beside the workspace, whatever string they start with.
        ("/w/ws", "/w/ws-evil", None),
        ("/w/ws", "/w/ws-evil/secret", None),
        ("/w/ws", "/w/ws2/secret", None),
        ("/w/ws", "/w/ws.d/secret", None),
        ("/w/ws", "/w/wsx", None),
        ("/w/ws", "/w/w", None),
        ("/w/ws", "/w", None),
        ("/w/ws", "/", None),
        ("/w/ws", "/etc/passwd", None),
        ("/w/ws", "w/ws/a", None),
        # Not normalized: never below, whatever it starts with.
        ("/w/ws", "/w/ws/", None),
        ("/w/ws", "/w/ws//a", None),
        ("/w/ws", "/w/ws/./a", None),
        ("/w/ws", "/w/ws/a/.", None),
        ("/w/ws", "/w/ws/../ws-evil/secret", None),
        ("/w/ws", "/w/ws/a/..", None),
    ],
)
def test_path_below(root: str, real: str, expected: str | None) -> None:
    assert path_below(root, real) == expected


_REAL_SEGMENT = st.sampled_from(["ws", "ws-evil", "ws2", "ws.d", "w", "a", "..", ".", ""])


@given(
    root=st.lists(_REAL_SEGMENT.filter(lambda s: s not in ("", ".", "..")), max_size=3),
    real=st.lists(_REAL_SEGMENT, max_size=5),
)
def test_path_below_agrees_with_whole_segments(root: list[str], real: list[str]) -> None:
    root_path, real_path = "/" + "/".join(root), "/" + "/".join(real)
    real = [] if real_path == "/" else real
    clean = all(segment not in ("", ".", "..") for segment in real)
    below = clean and real[: len(root)] == root
    expected = ("/".join(real[len(root) :]) or ROOT) if below else None
    assert path_below(root_path, real_path) == expected


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
        # A literal segment matches a whole segment, never a prefix of one: in a middle
        # run (matched once, at its leftmost place) a prefix would commit too early.
        ("**/abc/**/x", "abcd/x", False),
        ("**/abc/**/x", "abcd/abc/x", True),
        ("**/abc/**", "xabc", False),
        ("**/a*b/**", "abx", False),
        ("**/a*b/**", "x/ab", True),
        ("**/a*b/**/c", "abx/c", False),
        ("abc", "abcd", False),
        ("abc/d", "abcx/d", False),
        # The last part of a starred segment ends it; the first starts it; they never
        # overlap (``ab*ba`` needs at least four characters).
        ("ab*ba", "aba", False),
        ("ab*ba", "abba", True),
        ("ab*ba", "abxba", True),
        ("a*", "a", True),
        ("*a", "a", True),
        ("*a*", "a", True),
        ("*a*", "b", False),
        ("a*b*c", "abc", True),
        ("a*b*c", "axbxc", True),
        ("a*b*c", "acb", False),
        ("a*b*c", "abcx", False),
        ("*.txt", "a.txt.bak", False),
        ("*b*b", "abab", True),
        ("*b*b", "abba", False),
        ("x*a*a*b", "xaab", True),
        ("x*a*a*b", "xab", False),
        # A starred segment needs one character: it never matches an empty segment.
        ("a/*/b", "a//b", False),
        ("*", "", False),
        # Dotfiles are ordinary names.
        ("*", ".env", True),
        ("**/*", ".git/config", True),
        ("**", ".git/config", True),
        (".*", ".env", True),
        # "**" at the start, in the middle and at the end, and several middles in order.
        ("**/a/b/**", "a/x/a/b", True),
        ("**/a/b/**", "a/x/b", False),
        ("**/a/**/b/**", "a/b", True),
        ("**/a/**/b/**", "b/a", False),
        ("**/a/**/b/**", "x/a/y/b/z", True),
        ("**/a/**/a", "a", False),
        ("**/a/**/a", "a/a", True),
        ("**/a/**/a", "a/x/a", True),
        ("**/a/**/b", "a/b/b", True),
        ("**/a/**/b", "b/a", False),
        ("a/**/a", "a", False),
        ("a/**/a", "a/a", True),
        ("a/**", "a", True),
        ("a/**", "b/a", False),
        ("**/a", "b/a", True),
        ("**/a", "a/b", False),
        ("a/**/b/**/c", "a/b/c", True),
        ("a/**/b/**/c", "a/c/b", False),
        ("**/**", ROOT, True),
        ("**/**/a", "a", True),
        ("a/**/**", "a", True),
        ("**/x/**/**/y/**", "x/y", True),
        ("**/x/**/**/y/**", "y/x", False),
        # Every character but '*' and '/' is literal, regex metacharacters included.
        ("a.b", "axb", False),
        ("(a|b)", "a", False),
        ("(a|b)", "(a|b)", True),
        ("a+", "aa", False),
        ("a+", "a+", True),
        ("^a$", "^a$", True),
        ("\\d", "1", False),
        ("\\d", "\\d", True),
        ("a\nb", "a\nb", True),
        ("*", "a\nb", True),
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


def _reference_segment(pattern: str, name: str) -> bool:
    """One segment, character by character (a starred segment needs one character)."""

    def rest(p: str, n: str) -> bool:
        if not p:
            return not n
        if p[0] == "*":
            return any(rest(p[1:], n[i:]) for i in range(len(n) + 1))
        return bool(n) and n[0] == p[0] and rest(p[1:], n[1:])

    return rest(pattern, name) and (bool(name) or "*" not in pattern)


def _reference_chars(pattern: list[str], path: list[str]) -> bool:
    """The same as :func:`_reference`, with no regex at all."""
    if not pattern:
        return not path
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(_reference_chars(rest, path[i:]) for i in range(len(path) + 1))
    return bool(path) and _reference_segment(head, path[0]) and _reference_chars(rest, path[1:])


glob_segment = st.sampled_from(["a", "b", "*", "**", "a*", "*b", ".env", "a.b"])
path_segment = st.sampled_from(["a", "b", "ab", "ba", ".env", "a.b", "c"])


@given(st.lists(glob_segment, min_size=1, max_size=5), st.lists(path_segment, max_size=5))
def test_glob_agrees_with_a_reference_matcher(pattern: list[str], path: list[str]) -> None:
    text = "/".join(pattern)
    expected = _reference(pattern, path)
    assert Glob.compile(text).matches("/".join(path) if path else ROOT) is expected


# Freer shapes: segments drawn from a small alphabet, so stars, repeats, prefixes and
# overlaps meet often; "**" as a whole segment is common.
free_glob_segment = st.one_of(
    st.just("**"), st.text(alphabet="ab*.", min_size=1, max_size=5).filter(lambda s: s != ".")
).filter(lambda s: s != "..")
free_path_segment = st.text(alphabet="ab.", min_size=1, max_size=5).filter(
    lambda s: s not in (".", "..")
)


@settings(max_examples=1000)
@given(
    st.lists(free_glob_segment, min_size=1, max_size=6),
    st.lists(free_path_segment, max_size=6),
)
@example(["**", "a", "**", "b"], ["ab", "b"])
@example(["**", "ab*ba", "**"], ["aba"])
@example(["a*", "**", "*a"], ["a"])
def test_glob_agrees_with_a_character_reference(pattern: list[str], path: list[str]) -> None:
    expected = _reference_chars(pattern, path)
    assert expected is _reference(pattern, path)
    path_text = "/".join(path) if path else ROOT
    assert Glob.compile("/".join(pattern)).matches(path_text) is expected
    combined = any_glob((Glob.compile("zz/**"), Glob.compile("/".join(pattern))))
    assert (combined.fullmatch(match_form(path_text)) is not None) is expected


def test_match_form() -> None:
    assert match_form(ROOT) == ""
    assert match_form("a") == "/a"
    assert match_form("a/b.txt") == "/a/b.txt"


def test_any_glob_matches_when_any_glob_does() -> None:
    combined = any_glob((Glob.compile("a/**"), Glob.compile("*.md"), Glob.compile("**/x")))
    assert [
        combined.fullmatch(match_form(path)) is not None
        for path in ("a", "a/b", "b.md", "b/c.md", "q/x", "x", "xa", ROOT)
    ] == [True, True, True, False, True, True, False, False]
    assert any_glob((Glob.compile("**"),)).fullmatch(match_form(ROOT)) is not None


# --- matching time: linear in the path --------------------------------------------------

NASTY_GLOBS = (
    "src/**/test/**/*.py",
    "**/a/**/a/**/a/**/b",
    "**/*a*a*a*a*b",
    "a/**/**/*/*/b",
    "**/x*/**/*y/**/z",
    "**/test/**/test/**/test/**/x",
)


def _nasty_paths(size: int) -> list[str]:
    return [
        ("src/" + "test/" * (size // 5))[: size - 4] + "x.pz",
        "/".join(["a"] * (size // 2)),
        "/".join(["a" * 250] * (size // 251)),
        "/".join(["xay"] * (size // 4)),
    ]


def test_matching_a_long_path_takes_time_linear_in_it() -> None:
    # The old backtracking regex took seconds on 64 KiB (brokerd froze meanwhile);
    # greedy atomic steps take well under a millisecond. The bound is generous on
    # purpose: a loaded machine must not fail it, the old matcher always did. Path
    # arguments are capped at 4,096 bytes anyway; Glob itself does not rely on that.
    globs = [Glob.compile(pattern) for pattern in NASTY_GLOBS]
    paths = _nasty_paths(64 * 1024)
    start = time.perf_counter()
    results = [glob.matches(path) for glob in globs for path in paths]
    elapsed = time.perf_counter() - start
    assert not any(results)
    assert elapsed < 1.0, f"{elapsed:.2f} s for {len(results)} matches"


def test_a_long_path_still_matches_where_it_should() -> None:
    deep = "src/" + "test/" * 800 + "x.py"
    assert Glob.compile("src/**/test/**/*.py").matches(deep)
    assert Glob.compile("**/test/**/test/**/test/**/x.py").matches(deep)
    assert not Glob.compile("**/test/**/test/**/test/**/x.py").matches("src/test/test/x.py")


# --- path argument limits ---------------------------------------------------------------


def test_a_path_of_exactly_the_limits_is_accepted() -> None:
    segment = "s" * MAX_SEGMENT_BYTES
    assert normalize_path(segment) == segment
    longest = "a/" * 2047 + "bc"
    assert len(longest) == MAX_PATH_BYTES
    assert normalize_path(longest) == longest
    # Two-byte characters count twice: 127 of them and one byte are 255 bytes.
    assert normalize_path("é" * 127 + "x") == "é" * 127 + "x"
    # A lone surrogate counts as the three bytes it would take, never raises.
    assert normalize_path("\udc80" * 85) == "\udc80" * 85
    assert normalize_path("\udc80" * 86) == PathProblem(
        "a segment of the path is longer than 255 bytes"
    )


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("s" * MAX_SEGMENT_BYTES + "s", "a segment of the path is longer than 255 bytes"),
        ("a/" + "s" * 256 + "/b", "a segment of the path is longer than 255 bytes"),
        ("é" * 128, "a segment of the path is longer than 255 bytes"),
        ("a/" * 2048 + "b", "the path is longer than 4096 bytes"),
        ("é/" * 1365 + "xy", "the path is longer than 4096 bytes"),
        ("src/" + "test/" * 13000 + "x.pz", "the path is longer than 4096 bytes"),
        # The raw argument counts, before '.' and '..' are resolved.
        ("./" * 2048 + "a", "the path is longer than 4096 bytes"),
        ("/home/me/work/" + "a/" * 2042, "the path is longer than 4096 bytes"),
    ],
)
def test_a_path_over_the_limits_is_refused(raw: str, message: str) -> None:
    assert normalize_path(raw, WORKSPACE) == PathProblem(message)


def test_the_limits_are_linux_path_max_and_name_max() -> None:
    assert (MAX_PATH_BYTES, MAX_SEGMENT_BYTES) == (4096, 255)
