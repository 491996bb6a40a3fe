"""Workspace paths and globs (docs/decisions.md, "Paths and globs"). Pure: lexical only,
never touches the disk.

A tool's path argument becomes a *workspace path*: relative, POSIX, no ``.`` or ``..``
segments, no empty segments, ``"."`` for the workspace root. Symlinks are not resolved
here; a link that leaves the workspace is caught when the file is opened (the runner).

Globs (grants' ``paths``, the label rules of config.toml ``[labels]``):

- ``*`` matches any run of characters within one segment (dotfiles included);
- ``**`` as a whole segment matches zero or more segments, so ``notes/**`` matches
  ``notes`` itself and everything below it, and ``**/.env`` matches ``.env`` at the root;
- ``**`` inside a segment (``a**b``) is the same as ``*``;
- every other character is literal (no ``?`` or ``[...]``);
- the root ``"."`` is matched only by globs that match the empty path (``**``).

Matching is greedy, segment by segment, compiled to regular expressions whose steps are
atomic: time linear in the path (the comment above :func:`_compile` says why). A grant
such as ``src/**/test/**/*.py`` once took seconds on a long path, with brokerd frozen
meanwhile. A path argument is also capped (:data:`MAX_PATH_BYTES`,
:data:`MAX_SEGMENT_BYTES`) before anything matches it.
"""

from __future__ import annotations

import re
from typing import Final

import attrs

ROOT: Final = "."
"""The workspace root as a workspace path."""

MAX_PATH_BYTES: Final = 4096
"""The longest path argument, in bytes of UTF-8 (Linux's PATH_MAX). A bound on the
work of normalizing and matching one path, and no real file needs more."""
MAX_SEGMENT_BYTES: Final = 255
"""The longest segment of a path argument, in bytes of UTF-8 (Linux's NAME_MAX)."""


@attrs.frozen
class PathProblem:
    """Why a path argument is not a workspace path (a ``bad_arguments`` detail)."""

    message: str


def _segments(text: str) -> list[str] | None:
    """Resolve ``.``/``..``/empty segments lexically; None when ``..`` climbs above the start."""
    out: list[str] = []
    for segment in text.split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            if not out:
                return None
            out.pop()
        else:
            out.append(segment)
    return out


def _utf8_length(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _length_problem(raw: str) -> PathProblem | None:
    """Over :data:`MAX_PATH_BYTES` in all or :data:`MAX_SEGMENT_BYTES` in one segment:
    refused before any normalizing or matching, so their cost stays bounded."""
    if _utf8_length(raw) > MAX_PATH_BYTES:
        return PathProblem(f"the path is longer than {MAX_PATH_BYTES} bytes")
    if any(_utf8_length(segment) > MAX_SEGMENT_BYTES for segment in raw.split("/")):
        return PathProblem(f"a segment of the path is longer than {MAX_SEGMENT_BYTES} bytes")
    return None


def normalize_path(raw: str, workspace: str | None = None) -> str | PathProblem:
    """The workspace path for a tool's path argument, or why there is none.

    ``workspace`` is the absolute workspace root; an absolute argument inside it is made
    relative. Without it every absolute argument is refused.

    >>> normalize_path("notes/./a//b.txt")
    'notes/a/b.txt'
    >>> normalize_path("notes/../todo.txt")
    'todo.txt'
    >>> normalize_path(""), normalize_path("."), normalize_path("notes/..")
    ('.', '.', '.')
    >>> normalize_path("../etc/passwd")
    PathProblem(message="'..' leaves the workspace")
    >>> normalize_path("/home/me/work/notes/a.txt", workspace="/home/me/work")
    'notes/a.txt'
    >>> normalize_path("/home/me/workshop/a.txt", workspace="/home/me/work")
    PathProblem(message='absolute path outside the workspace')
    >>> normalize_path("a\\x00b")
    PathProblem(message='NUL byte in path')
    >>> normalize_path("a/" + "b" * 256)
    PathProblem(message='a segment of the path is longer than 255 bytes')
    """
    if "\x00" in raw:
        return PathProblem("NUL byte in path")
    problem = _length_problem(raw)
    if problem is not None:
        return problem
    if raw.startswith("/"):
        if workspace is None:
            return PathProblem("absolute path outside the workspace")
        root = _segments(workspace)
        full = _segments(raw)
        if root is None or full is None or full[: len(root)] != root:
            return PathProblem("absolute path outside the workspace")
        relative = full[len(root) :]
    else:
        resolved = _segments(raw)
        if resolved is None:
            return PathProblem("'..' leaves the workspace")
        relative = resolved
    return "/".join(relative) if relative else ROOT


def path_below(root: str, real: str) -> str | None:
    """The workspace path of the real path ``real`` when it is the real path ``root`` or
    below it, else None. Both are absolute (``realpath``, ``/proc/self/fd``); what is
    below is decided on whole segments, never on a string prefix: ``/w/ws-evil``,
    ``/w/ws2`` and ``/w/ws.d`` are beside ``/w/ws``, not in it. A path that is not
    normalized (an empty, ``.`` or ``..`` segment) is never below.

    >>> path_below("/w/ws", "/w/ws/notes/a.txt"), path_below("/w/ws", "/w/ws")
    ('notes/a.txt', '.')
    >>> path_below("/w/ws", "/w/ws-evil/secret"), path_below("/w/ws", "/w/ws/../ws-evil")
    (None, None)
    >>> path_below("/", "/etc/passwd")
    'etc/passwd'
    """
    if real == root:
        return ROOT
    prefix = root if root.endswith("/") else root + "/"
    if not real.startswith(prefix):
        return None
    relative = real[len(prefix) :]
    if any(segment in ("", ".", "..") for segment in relative.split("/")):
        return None
    return relative


def glob_problem(pattern: str) -> str | None:
    """Why ``pattern`` cannot be a glob, or None.

    >>> glob_problem("notes/**") is None
    True
    >>> glob_problem("")
    'an empty glob'
    >>> glob_problem("/etc/*")
    "a glob is relative to the workspace: no leading '/'"
    >>> glob_problem("notes/../x")
    "no empty, '.' or '..' segments in a glob"
    """
    if not pattern:
        return "an empty glob"
    if "\x00" in pattern:
        return "NUL byte in glob"
    if pattern.startswith("/"):
        return "a glob is relative to the workspace: no leading '/'"
    if any(segment in ("", ".", "..") for segment in pattern.split("/")):
        return "no empty, '.' or '..' segments in a glob"
    return None


# How globs become regular expressions that cannot backtrack catastrophically.
#
# A path is matched in its match form: each segment with a '/' before it ("/a/b.txt"),
# the root as "". A run of '/' + non-'/' characters is then exactly one segment, so
# there is only ever one way to split the path into segments.
#
# A pattern is split at its "**" segments: ``head ** middle1 ** ... ** tail``. The head
# matches at the start, the tail at the end, and each middle run at its *leftmost*
# place in between: lazily (``*?``) and inside an atomic group (``(?>...)``), so once
# found it is never revisited. Leftmost is never worse: a run's match depends only on
# the segments it covers and "**" absorbs any number of segments, so taking each run
# as early as it fits leaves the most room for the rest. Inside a segment the stars
# work the same way: each middle part at its leftmost place, atomically; the last part
# ends the segment. A regex engine still backtracks, but only within one step of this
# greedy scan, never across steps.
#
# Cost: each middle run, and then the tail, is tried at most once at each segment
# boundary, a try costing at most the run's length times the segments' it covers (a
# segment is at most 255 bytes): O(len(path) * len(pattern)) in all, linear in the
# path for a given glob, and the path is at most MAX_PATH_BYTES. Never exponential,
# never cubic in the path (tests/core/test_paths.py times 64 KiB paths).

_ANY_SEGMENTS: Final = ".*"
"""Zero or more whole segments: what follows it starts with a '/', at a boundary."""


def _segment_regex(segment: str) -> str:
    """One pattern segment, with its leading '/', matching one whole path segment.

    The end check ``(?![^/])`` matters inside an atomic middle run: without it ``abc``
    would commit to the start of a segment ``abcd`` and never look further."""
    parts = [re.escape(part) for part in segment.split("*")]
    if len(parts) == 1:
        return f"/{parts[0]}(?![^/])"
    # A segment is never empty, so a starred segment must still match one character.
    middle = "".join(f"(?>[^/]*?{part})" for part in parts[1:-1])
    return f"/(?=[^/]){parts[0]}{middle}[^/]*{parts[-1]}(?![^/])"


def _run_regex(run: list[str]) -> str:
    return "".join(_segment_regex(segment) for segment in run)


def _compile(pattern: str) -> re.Pattern[str]:
    runs: list[list[str]] = [[]]
    for segment in pattern.split("/"):
        if segment == "**":
            runs.append([])
        else:
            runs[-1].append(segment)
    if len(runs) == 1:
        return re.compile(_run_regex(runs[0]), re.DOTALL)
    head, *middle, tail = runs
    pieces = [_run_regex(head)]
    # Empty runs, between consecutive "**", change nothing: "**/**" is "**".
    pieces += [f"(?>{_ANY_SEGMENTS}?{_run_regex(run)})" for run in middle if run]
    pieces.append(f"{_ANY_SEGMENTS}{_run_regex(tail)}" if tail else "(?:/.*)?")
    return re.compile("".join(pieces), re.DOTALL)


@attrs.frozen
class Glob:
    """A compiled glob; build with :meth:`compile` (once, at parse time).

    >>> Glob.compile("notes/**").matches("notes/a/b.txt")
    True
    >>> Glob.compile("notes/**").matches("notes"), Glob.compile("notes/**").matches("notesx")
    (True, False)
    >>> Glob.compile("**/.env").matches(".env"), Glob.compile("**/.env").matches("a/b/.env")
    (True, True)
    >>> Glob.compile("*.txt").matches("a.txt"), Glob.compile("*.txt").matches("d/a.txt")
    (True, False)
    >>> Glob.compile("a/**/b").matches("a/b"), Glob.compile("a/**/b").matches("a/x/y/b")
    (True, True)
    >>> Glob.compile("**").matches("."), Glob.compile("*").matches(".")
    (True, False)
    """

    pattern: str
    _regex: re.Pattern[str] = attrs.field(eq=False, repr=False)

    @classmethod
    def compile(cls, pattern: str) -> Glob:
        """Raises ValueError for a pattern that :func:`glob_problem` rejects."""
        problem = glob_problem(pattern)
        if problem is not None:
            raise ValueError(problem)
        return cls(pattern, _compile(pattern))

    def matches(self, path: str) -> bool:
        """``path`` is a workspace path from :func:`normalize_path`. Time linear in the
        path (see how globs are compiled, above)."""
        return self._regex.fullmatch(match_form(path)) is not None


def match_form(path: str) -> str:
    """The string a glob's regex is matched against: every segment with a '/' before it,
    the root as the empty string.

    >>> match_form("notes/a.txt"), match_form(".")
    ('/notes/a.txt', '')
    """
    return "" if path == ROOT else "/" + path


def any_glob(globs: tuple[Glob, ...]) -> re.Pattern[str]:
    """One regex that fully matches :func:`match_form` of a path when any glob matches.

    One regex per grant, not one per glob, keeps decide() fast (tools/bench_decide.py);
    each alternative is linear in the path, so the whole is too.

    >>> combined = any_glob((Glob.compile("a/**"), Glob.compile("*.md")))
    >>> [bool(combined.fullmatch(match_form(p))) for p in ("a/x", "b.md", "b/c.md")]
    [True, True, False]
    """
    return re.compile("|".join(f"(?:{glob._regex.pattern})" for glob in globs), re.DOTALL)
