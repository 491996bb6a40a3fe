"""``bxctl grants check``'s analysis of grants.toml: every problem with its line, and
warnings about grants that do less or more than they seem to. Pure: text in, values out.

Problems are :func:`boxmaker.core.grant_parse.all_problems`' (the checks brokerd applies,
which stops at the first). Lines come from a second reading of the same text with
tomlkit, which keeps every comment and space: its pieces are found in the text in order
(:class:`_Lines`), so a line is either right or not given. A TOML syntax error stops
both parsers at once: it is the one problem, at the line tomllib names.

Warnings, only for a valid file (docs/decisions.md, "Grants"):

- ``shadowed``: :func:`boxmaker.core.decide.decide` takes the first matching grant in
  the order deny, auto with ``wins_over_ask``, ask, auto, file order within each; a
  grant that comes later in that order than a grant of the same tool (or of a family
  holding it: :func:`tool_covers`) matching every call it matches (for at least as long:
  see :func:`_outlives`) never decides anything.
  "Matches every call" is judged from the patterns alone and conservatively (:func:`glob_covers`,
  :func:`command_covers`, :func:`host_covers`): a warning is always true; a shadowed
  grant whose patterns are too clever may go unflagged.
- ``chains``: a ``shell`` pattern of an ``auto`` or ``ask`` grant whose wildcard can
  match ``;``, ``&&``, ``|``, ``$(``, a backtick or a newline, and so a command line that
  runs another command after the one meant. A ``deny`` grant's wider match only denies
  more, so it is not flagged.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import re
from collections.abc import Iterator, Mapping
from typing import Final, Literal

import attrs
import tomlkit
import tomlkit.exceptions
from tomlkit.items import AoT, Item, Table

from boxmaker.core.grant_parse import GrantsProblem, all_problems, parse_toml
from boxmaker.core.grants import CONNECT, Grant, GrantSet, Mode, precedence_rank
from boxmaker.core.hosts import HostRule
from boxmaker.core.paths import Glob

Severity = Literal["problem", "warning"]


CHAIN_CHARACTERS: Final = (";", "&", "|", "$", "`", "\n")
"""What lets one command line run another: ``;``, ``&&`` (and ``&``), ``|``, ``$(``,
backticks, a newline."""
WITNESS_COMMAND: Final = "; other-command"


@attrs.frozen
class Finding:
    """One thing ``bxctl grants check`` reports: a problem (the file is invalid) or a
    warning (valid, but likely not what the owner meant)."""

    severity: Severity
    code: str
    """``invalid``, ``syntax``, ``shadowed`` or ``chains``."""
    line: int | None
    grant_id: str | None
    key: str | None
    message: str
    suggestion: str | None = None
    grant_index: int | None = None

    def full_message(self) -> str:
        if self.suggestion is None:
            return self.message
        return f"{self.message} (did you mean {self.suggestion!r}?)"


@attrs.frozen
class Lint:
    """What ``bxctl grants check`` found: the grants when valid, and every finding,
    problems first, then warnings, each in file order."""

    grants: GrantSet | None
    findings: tuple[Finding, ...]

    @property
    def problems(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity == "problem")

    @property
    def warnings(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity == "warning")


_SYNTAX_LINE: Final = re.compile(r"\(at line (\d+), column \d+\)")


def lint_grants(text: str, now: dt.datetime, file: str = "grants.toml") -> Lint:
    """Every problem of ``text`` with its line, or, when it is valid, every warning.

    >>> lint = lint_grants('[[grant]]\\nid = "a"\\ntool = "red_file"\\nmode = "auto"\\n',
    ...                    dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    >>> [(f.line, f.key, f.suggestion) for f in lint.findings]
    [(3, 'tool', 'read_file')]
    """
    document = parse_toml(text, file)
    if isinstance(document, GrantsProblem):
        match = _SYNTAX_LINE.search(document.message)
        line = int(match.group(1)) if match else None
        return Lint(None, (Finding("problem", "syntax", line, None, None, document.message),))
    lines = _Lines.read(text)
    checked = all_problems(document, file)
    if not isinstance(checked, GrantSet):
        return Lint(None, tuple(_problem(problem, lines) for problem in checked))
    warnings = [*_shadowed(checked, now, lines), *_chains(checked, lines)]
    warnings.sort(key=lambda f: (f.grant_index or 0, f.line or 0))
    return Lint(checked, tuple(warnings))


def _problem(problem: GrantsProblem, lines: _Lines) -> Finding:
    return Finding(
        "problem",
        "invalid",
        lines.line(problem.index, problem.key),
        problem.grant_id,
        problem.key,
        problem.message,
        problem.suggestion,
        problem.index,
    )


# ---------------------------------------------------------------------------------------
# Lines


@attrs.frozen
class _Lines:
    """Where each ``[[grant]]`` table and each of its keys starts (1-based lines), and
    each top-level key. Empty when tomlkit cannot read the text."""

    tables: tuple[int, ...] = ()
    keys: Mapping[tuple[int | None, str], int] = attrs.Factory(dict)

    @classmethod
    def read(cls, text: str) -> _Lines:
        try:
            document = tomlkit.parse(text)
        except (tomlkit.exceptions.TOMLKitError, ValueError, RecursionError):
            return cls()
        finder = _Finder(text)
        tables: list[int] = []
        keys: dict[tuple[int | None, str], int] = {}
        for key, item in document.body:
            if key is None:
                finder.skip(item.as_string())
                continue
            name = key.key
            if name == "grant" and isinstance(item, AoT):
                for table in item.body:
                    header = finder.find("[[")
                    if header is None:
                        return cls(tuple(tables), keys)
                    tables.append(header)
                    finder.skip("]]")
                    index = len(tables) - 1
                    for inner_key, inner in table.value.body:
                        if inner_key is None:
                            finder.skip(inner.as_string())
                            continue
                        found = finder.item(inner_key.as_string(), inner)
                        if found is None:
                            return cls(tuple(tables), keys)
                        keys.setdefault((index, inner_key.key), found)
                continue
            found = finder.item(key.as_string(), item)
            if found is None:
                break
            keys.setdefault((None, name), found)
        return cls(tuple(tables), keys)

    def line(self, index: int | None, key: str | None) -> int | None:
        """The line of ``key`` in grant ``index`` (its table's line when the key is not
        there), or of a top-level key; None when unknown."""
        if key is not None and (index, key) in self.keys:
            return self.keys[(index, key)]
        if index is not None and index < len(self.tables):
            return self.tables[index]
        return None


class _Finder:
    """Finds tomlkit's pieces in the text, in order: each search starts where the last
    piece ended, so a key commented out above the real one is never taken for it."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.at = 0

    def find(self, piece: str) -> int | None:
        """The line where ``piece`` next starts, the cursor moved past it."""
        start = self.text.find(piece, self.at)
        if start < 0:
            return None
        self.at = start + len(piece)
        return self.text.count("\n", 0, start) + 1

    def skip(self, piece: str) -> None:
        if piece.strip():
            self.find(piece)

    def item(self, key: str, item: Item) -> int | None:
        """A key and its value (a table's body is skipped key by key)."""
        line = self.find(key)
        if line is None:
            return None
        if isinstance(item, Table):
            for inner_key, inner in item.value.body:
                if inner_key is None:
                    self.skip(inner.as_string())
                elif self.item(inner_key.as_string(), inner) is None:
                    return None
        elif not isinstance(item, AoT):
            self.skip(item.as_string())
        return line


# ---------------------------------------------------------------------------------------
# Shadowed grants


def decide_order(grants: GrantSet) -> list[Grant]:
    """The grants in the order decide() tries them (:func:`precedence_rank`: deny, auto
    grants that win over ask, ask, auto), then file order."""
    return sorted(grants.grants, key=precedence_rank)


def _shadowed(grants: GrantSet, now: dt.datetime, lines: _Lines) -> Iterator[Finding]:
    order = decide_order(grants)
    index = {g.id: i for i, g in enumerate(grants.grants)}
    for position, grant in enumerate(order):
        for earlier in order[:position]:
            if shadows(earlier, grant, now):
                why = (
                    "an earlier grant of the same mode"
                    if precedence_rank(earlier) == precedence_rank(grant)
                    else f"{'a' if earlier.mode is Mode.DENY else 'an'} {earlier.mode} grant "
                    f"{'that wins over ask ' if earlier.wins_over_ask else ''}"
                    "(deny, then auto with wins_over_ask, then ask, then auto)"
                )
                where = lines.line(index[earlier.id], None)
                at = f" (line {where})" if where is not None else ""
                yield Finding(
                    "warning",
                    "shadowed",
                    lines.line(index[grant.id], None),
                    grant.id,
                    None,
                    f"never decides a call: grant {earlier.id!r}{at}, {why}, is tried first "
                    "and matches every call this one matches",
                    grant_index=index[grant.id],
                )
                break


def shadows(first: Grant, later: Grant, now: dt.datetime) -> bool:
    """Does ``first`` (tried before ``later``, same tool) match every call ``later``
    matches, for as long as ``later`` can match? Conservative: True only when sure."""
    if not tool_covers(first.tool, later.tool):
        return False
    if first.expired(now) or not _outlives(first, later):
        return False
    if first.arguments is not None and not _arguments_cover(first.arguments, later.arguments):
        return False
    if not first.other_arguments and (
        later.other_arguments
        or not {name for name, _ in later.arguments or ()}
        <= {name for name, _ in first.arguments or ()}
    ):
        return False
    if first.paths is not None and not _globs_cover(first.paths, later.paths):
        return False
    if first.commands is not None:
        wanted = ("*",) if later.commands is None else later.commands
        if not all(any(command_covers(a, b) for a in first.commands) for b in wanted):
            return False
    if first.tool == CONNECT:
        if later.plain_http and not first.plain_http:
            return False
        if not all(any(tool_covers(a, b) for a in first.via) for b in later.via):
            return False
    if first.tool in ("http_get", CONNECT):
        return all(any(host_covers(a, b) for a in first.hosts) for b in later.hosts)
    return True


def tool_covers(wide: str, narrow: str) -> bool:
    """Does a grant for ``wide`` cover every tool a grant for ``narrow`` covers (equal
    names, or an external family holding the other: ``mcp.*`` ⊇ ``mcp.git.*`` ⊇
    ``mcp.git.log``)?

    >>> tool_covers("mcp.*", "mcp.git.*"), tool_covers("mcp.git.*", "mcp.git.log")
    (True, True)
    >>> tool_covers("mcp.git.*", "mcp.*"), tool_covers("claude.*", "mcp.git.x")
    (False, False)
    >>> tool_covers("shell", "shell"), tool_covers("mcp.git.*", "mcp.github.x")
    (True, False)
    """
    if wide == narrow:
        return True
    return wide.endswith(".*") and narrow.startswith(wide[:-1])


def _arguments_cover(
    first: tuple[tuple[str, tuple[str, ...]], ...],
    later: tuple[tuple[str, tuple[str, ...]], ...] | None,
) -> bool:
    """Does every argument ``first`` names have patterns in ``later`` that ``first``'s
    patterns cover (:func:`command_covers`: the same fnmatch rules, whole value)?"""
    wanted = dict(later or ())
    for name, patterns in first:
        narrow = wanted.get(name)
        if narrow is None:
            return False
        if not all(any(command_covers(a, b) for a in patterns) for b in narrow):
            return False
    return True


def _outlives(first: Grant, later: Grant) -> bool:
    if first.expires is None:
        return True
    return later.expires is not None and first.expires >= later.expires


def _globs_cover(first: tuple[Glob, ...], later: tuple[Glob, ...] | None) -> bool:
    wanted = ("**",) if later is None else tuple(glob.pattern for glob in later)
    return all(any(glob_covers(g.pattern, want) for g in first) for want in wanted)


def glob_covers(wide: str, narrow: str) -> bool:
    """Does the glob ``wide`` match every path the glob ``narrow`` matches? True only
    when sure (core/paths.py's globs: ``*`` in a segment, ``**`` whole segments).

    >>> glob_covers("**", "a/*.md"), glob_covers("notes/**", "notes/a/**")
    (True, True)
    >>> glob_covers("notes/*", "notes/**"), glob_covers("*.md", "a.md"), glob_covers("a/*", "b/c")
    (False, True, False)
    """
    return _segments_cover(wide.split("/"), narrow.split("/"))


def _segments_cover(wide: list[str], narrow: list[str]) -> bool:
    if not wide:
        return not narrow
    head, rest = wide[0], wide[1:]
    if head == "**":
        # Zero or more of the narrow's segments, whatever they are.
        return any(_segments_cover(rest, narrow[i:]) for i in range(len(narrow) + 1))
    if not narrow or narrow[0] == "**":
        return False
    return _segment_covers(head, narrow[0]) and _segments_cover(rest, narrow[1:])


def _segment_covers(wide: str, narrow: str) -> bool:
    if wide == narrow or wide.replace("**", "*") == "*":
        return True
    if "*" in narrow:
        return False
    parts = [re.escape(part) for part in wide.replace("**", "*").split("*")]
    return re.fullmatch("[^/]*".join(parts), narrow) is not None


_SPECIAL: Final = re.compile(r"[*?\[]")


def command_covers(wide: str, narrow: str) -> bool:
    """Does the shell pattern ``wide`` match every command line ``narrow`` matches
    (fnmatch, on the whole line)? True only when sure: equal, ``*``, or a literal prefix
    and ``*`` that the narrow one's literal start begins with.

    >>> command_covers("git *", "git status*"), command_covers("git status", "git *")
    (True, False)
    """
    if wide == narrow:
        return True
    if wide.endswith("*") and not _SPECIAL.search(wide[:-1]):
        prefix = wide[:-1]
        return narrow.startswith(prefix) and not _SPECIAL.search(narrow[: len(prefix)])
    return False


def host_covers(wide: str, narrow: str) -> bool:
    """Does the ``hosts`` entry ``wide`` allow every destination ``narrow`` allows?

    >>> host_covers("*.example.com", "a.example.com"), host_covers("*.a.org", "*.b.a.org")
    (True, True)
    >>> host_covers("*.example.com", "example.com"), host_covers("a.org", "a.org:8443")
    (False, False)
    """
    first, later = HostRule.parse(wide), HostRule.parse(narrow)
    if isinstance(first, str) or isinstance(later, str) or first.port != later.port:
        return False
    if first.host == later.host:
        return True
    if not first.host.startswith("*."):
        return False
    suffix = first.host[1:]
    return later.host.endswith(suffix) and len(later.host) > len(suffix)


# ---------------------------------------------------------------------------------------
# Shell patterns that let another command through


def _chains(grants: GrantSet, lines: _Lines) -> Iterator[Finding]:
    for index, grant in enumerate(grants.grants):
        if grant.commands is None or grant.mode is Mode.DENY:
            continue
        for pattern in grant.commands:
            witness = chaining_witness(pattern)
            if witness is None:
                continue
            yield Finding(
                "warning",
                "chains",
                lines.line(index, "commands"),
                grant.id,
                "commands",
                f"{pattern!r} also matches a command line that runs another command "
                f"(its wildcard matches ';', '&&', '|', '$(' and backticks), e.g. {witness!r}; "
                'prefer exact command lines, or mode = "ask"',
                grant_index=index,
            )


def chaining_witness(pattern: str) -> str | None:
    """A command line ``pattern`` matches (fnmatch) that chains another command after
    what the pattern spells out, or None when there is none.

    >>> chaining_witness("git status*"), chaining_witness("git status")
    ('git status; other-command', None)
    >>> chaining_witness("ls [ab]"), chaining_witness("ls ?x")
    (None, 'ls ;x')
    """
    out: list[str] = []
    chained = False
    for piece in _fnmatch_tokens(pattern):
        if piece == "*":
            out.append("" if chained else WITNESS_COMMAND)
            chained = True
        elif piece == "?" or (piece.startswith("[") and len(piece) > 1):
            allowed = [c for c in CHAIN_CHARACTERS if _class_matches(piece, c)]
            if allowed and not chained:
                out.append(allowed[0])
                chained = True
            elif (other := _any_other(piece)) is not None:
                out.append(other)
            else:
                return None  # a set that matches nothing (`[?-;]`): so does the pattern
        else:
            out.append(piece)
    return "".join(out) if chained else None


def _fnmatch_tokens(pattern: str) -> Iterator[str]:
    """fnmatch's tokens: ``*``, ``?``, a ``[...]`` set, or one literal character (an
    unclosed ``[`` is literal, as in fnmatch)."""
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "[":
            j = i + 1
            if j < len(pattern) and pattern[j] == "!":
                j += 1
            if j < len(pattern) and pattern[j] == "]":
                j += 1
            j = pattern.find("]", j)
            if j >= 0:
                yield pattern[i : j + 1]
                i = j + 1
                continue
        yield char
        i += 1


def _class_matches(token: str, char: str) -> bool:
    return fnmatch.fnmatchcase(char, token)


def _any_other(token: str) -> str | None:
    """A harmless character ``token`` (``?`` or a set) matches, or None when it matches
    none (a set with a backwards range matches nothing at all)."""
    for char in "abcdefghijklmnopqrstuvwxyz0123456789-_./ ":
        if _class_matches(token, char):
            return char
    for code in range(32, 0x250):
        if _class_matches(token, chr(code)):
            return chr(code)
    return None


# ---------------------------------------------------------------------------------------
# A grant's own text


def grant_sources(text: str) -> tuple[tuple[int, str], ...]:
    """Each ``[[grant]]`` table's first line and its text as written, in file order
    (without the blank and comment lines that follow it, which usually introduce the
    next one). Empty when tomlkit cannot read the text.

    >>> grant_sources('# mine\\n[[grant]]\\nid = "a"\\n\\n# b:\\n[[grant]]\\nid = "b"\\n')
    ((2, '[[grant]]\\nid = "a"'), (6, '[[grant]]\\nid = "b"'))
    """
    starts = _Lines.read(text).tables
    lines = text.splitlines()
    sources = []
    for number, start in enumerate(starts):
        end = starts[number + 1] - 1 if number + 1 < len(starts) else len(lines)
        own = lines[start - 1 : end]
        while own and (not own[-1].strip() or own[-1].lstrip().startswith("#")):
            own.pop()
        sources.append((start, "\n".join(own)))
    return tuple(sources)
