"""Workspace paths and globs (spec §4.2). Pure: lexical only, never touches the disk.

A tool's path argument becomes a *workspace path*: relative, POSIX, no ``.`` or ``..``
segments, no empty segments, ``"."`` for the workspace root. Symlinks are not resolved
here; a link that leaves the workspace is caught when the file is opened (spec §8).

Globs (grants' ``paths``, the label rules of config.toml ``[labels]``):

- ``*`` matches any run of characters within one segment (dotfiles included);
- ``**`` as a whole segment matches zero or more segments, so ``notes/**`` matches
  ``notes`` itself and everything below it, and ``**/.env`` matches ``.env`` at the root;
- ``**`` inside a segment (``a**b``) is the same as ``*``;
- every other character is literal (no ``?`` or ``[...]``);
- the root ``"."`` is matched only by globs that match the empty path (``**``).
"""

from __future__ import annotations

import re
from typing import Final

import attrs

ROOT: Final = "."
"""The workspace root as a workspace path."""


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


def normalize_path(raw: str, workspace: str | None = None) -> str | PathProblem:
    """The workspace path for a tool's path argument, or why there is none (spec §4.2).

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
    """
    if "\x00" in raw:
        return PathProblem("NUL byte in path")
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


def _segment_regex(segment: str) -> str:
    if "*" not in segment:
        return re.escape(segment)
    # A segment is never empty, so a starred segment must still match one character.
    return "(?=[^/])" + "[^/]*".join(re.escape(part) for part in segment.split("*"))


def _compile(pattern: str) -> re.Pattern[str]:
    parts: list[str] = []
    for segment in pattern.split("/"):
        if not (segment == "**" and parts and parts[-1] == "**"):
            parts.append(segment)
    pieces: list[str] = []
    last = len(parts) - 1
    for index, segment in enumerate(parts):
        if segment == "**":
            # Each form eats the slashes next to it, so zero segments leave no stray '/'.
            if index == 0 and index == last:
                pieces.append(".*")
            elif index == 0:
                pieces.append("(?:.*/)?")
            elif index == last:
                pieces.append("(?:/.*)?")
            else:
                pieces.append("/(?:.*/)?")
        else:
            if index > 0 and parts[index - 1] != "**":
                pieces.append("/")
            pieces.append(_segment_regex(segment))
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
        """``path`` is a workspace path from :func:`normalize_path`."""
        return self._regex.fullmatch(match_form(path)) is not None


def match_form(path: str) -> str:
    """The string a glob's regex is matched against: the root is the empty path."""
    return "" if path == ROOT else path


def any_glob(globs: tuple[Glob, ...]) -> re.Pattern[str]:
    """One regex that fully matches :func:`match_form` of a path when any glob matches.

    One regex per grant, not one per glob, keeps decide() fast (tools/bench_decide.py).

    >>> combined = any_glob((Glob.compile("a/**"), Glob.compile("*.md")))
    >>> [bool(combined.fullmatch(p)) for p in ("a/x", "b.md", "b/c.md")]
    [True, True, False]
    """
    return re.compile("|".join(f"(?:{glob._regex.pattern})" for glob in globs), re.DOTALL)
