"""grants.toml: parse, validate and match (docs/decisions.md, "Grants"). Pure: text in, values out.

:func:`parse_grants` turns any text into a :class:`GrantSet` or exactly one
:class:`GrantsProblem` (the first one found, in file order) and never raises. The checks
are explicit rather than a cattrs structure because every message must name the grant and
the key, and because a TOML string must not pass for a list (of its characters).

Matching (:meth:`Grant.matches`):

- ``paths``: globs (:mod:`boxmaker.core.paths`) against the normalized workspace path; a
  file-tool grant without ``paths`` matches every workspace path;
- ``commands``: :func:`fnmatch.fnmatchcase` on the whole command line, so ``*`` also
  matches ``;``, ``&&`` and newlines (``git status*`` matches ``git status; rm x``);
- ``hosts``: the URL's host, lower-cased, equals the entry, or the entry is ``*.suffix``
  and the host ends with ``.suffix`` (``*.example.com`` matches ``a.example.com`` and
  ``a.b.example.com``, never ``example.com`` itself); and the URL's port is the entry's
  ``:port``, or without one the scheme's own (80, 443) (:mod:`boxmaker.core.hosts`,
  which also says which resolved addresses an entry must name);
- ``expires``: a grant matches strictly before it (``now >= expires`` → no match).

Precedence (:meth:`GrantSet.in_precedence`): ``deny`` grants first, then ``auto`` grants
with ``wins_over_ask = true`` (what ``bxctl approve --always`` writes: the owner's answer
for that call must beat the ``ask`` grant that asked), then ``ask``, then the other
``auto`` grants; file order within each.

A ``paths`` grant bounds the file a tool actually opens, not only the path it asked
for (:func:`opened_refusal`): a link in the workspace can lead a covered path to an
uncovered file, and a hard link gives an uncovered file a covered name. The runner asks
once it holds the opened file's descriptor, with its real path and link count.
"""

from __future__ import annotations

import datetime as dt
import difflib
import enum
import fnmatch
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import attrs

from boxmaker.core.catalogue import FILE_TOOLS, TOOL_NAMES, CheckedArguments, ToolName
from boxmaker.core.hosts import HostRule, HostSet, host_rules
from boxmaker.core.hosts import host_matches as host_matches
from boxmaker.core.labels import Taint
from boxmaker.core.paths import Glob, any_glob, glob_problem

GRANT_ID: Final = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
RUNBOOK_GRANTS: Final = "docs/runbook.md#grants"


class Mode(enum.StrEnum):
    """A grant's ``mode`` and ``if_untrusted``."""

    AUTO = "auto"
    ASK = "ask"
    DENY = "deny"


@attrs.frozen
class Grant:
    """One ``[[grant]]`` table, validated, globs and command patterns compiled."""

    id: str
    tool: ToolName
    mode: Mode
    paths: tuple[Glob, ...] | None = None
    """File tools: None = every workspace path."""
    commands: tuple[str, ...] | None = None
    """shell: None = every command."""
    hosts: tuple[str, ...] = ()
    """http_get: entries as :class:`~boxmaker.core.hosts.HostRule` parses them
    (host or ``*.suffix``, optional ``:port``), lower-cased."""
    max_taint: Taint = Taint.SECRET
    if_untrusted: Mode = Mode.ASK
    label_taint: Taint | None = None
    hard_links: bool = False
    """read_file under ``paths``: may a regular file with more than one link be read?"""
    wins_over_ask: bool = False
    """An ``auto`` grant that comes before every ``ask`` grant in precedence."""
    expires: dt.datetime | None = None
    note: str | None = None
    # Compiled once, at parse time: one regex per grant keeps decide() fast.
    _path_re: re.Pattern[str] | None = attrs.field(eq=False, repr=False, init=False)
    _command_re: re.Pattern[str] | None = attrs.field(eq=False, repr=False, init=False)
    _host_set: HostSet = attrs.field(eq=False, repr=False, init=False)

    @_path_re.default
    def _compile_paths(self) -> re.Pattern[str] | None:
        return None if self.paths is None else any_glob(self.paths)

    @_command_re.default
    def _compile_commands(self) -> re.Pattern[str] | None:
        if self.commands is None:
            return None
        return re.compile("|".join(fnmatch.translate(p) for p in self.commands))

    @_host_set.default
    def _compile_hosts(self) -> HostSet:
        return HostSet(host_rules(self.hosts))

    def expired(self, now: dt.datetime) -> bool:
        """At or after ``expires`` the grant does not match (the boundary is ``>=``)."""
        return self.expires is not None and now >= self.expires

    def matches(self, tool: str, arguments: CheckedArguments, now: dt.datetime) -> bool:
        """Does this grant cover the call? ``now`` is an aware datetime."""
        return tool == self.tool and self.covers(arguments, now)

    def covers(self, arguments: CheckedArguments, now: dt.datetime) -> bool:
        """:meth:`matches` for arguments already known to be for this grant's tool."""
        expires = self.expires
        if expires is not None and now >= expires:
            return False
        path_re = self._path_re
        if path_re is not None:
            for path in arguments.match_paths:
                if path_re.fullmatch(path) is None:
                    return False
        command_re = self._command_re
        if command_re is not None:
            command = arguments.command
            if command is None or command_re.match(command) is None:
                return False
        if self.tool == "http_get":
            # Fail closed: an http_get grant without hosts (only built by hand) allows none.
            destination = arguments.destination
            return destination is not None and self._host_set.allows(destination)
        return True

    def covers_path(self, path: str) -> bool:
        """Is the workspace path ``path`` within ``paths`` (True when there are none)?"""
        return self.paths is None or any(glob.matches(path) for glob in self.paths)


def opened_refusal(grant: Grant, requested: str, real: str, links: int) -> str | None:
    """Why a file tool may not go on with the file it opened for ``grant``, or None.

    The answer is a ``path_escape`` detail. ``requested`` is the path the call named (the
    grant covers it: decide() checked); ``real`` the opened file's (or directory's, or
    for write_file the target's) real workspace path, symlinks resolved, at open time;
    ``links`` its link count when it is a regular file, else 1 (a directory's count is
    its subdirectories'). Both paths must be covered; and a file with another name
    somewhere might be a file the grant does not cover, so under ``paths`` it needs the
    grant's ``hard_links``. The detail names the grant, not the real path: where the
    link leads is not the model's to learn from a refusal.

    >>> grants = parse_grants('[[grant]]\\nid = "pub"\\ntool = "read_file"\\nmode = "auto"'
    ...                       '\\npaths = ["pub/**"]')
    >>> pub = grants.grants[0]
    >>> opened_refusal(pub, "pub/a", "pub/b", 1) is None
    True
    >>> opened_refusal(pub, "pub/k", "secrets/key", 1)
    "pub/k: a link leads outside grant pub's paths"
    >>> print(opened_refusal(pub, "pub/hard", "pub/hard", 2))
    pub/hard: the file has 2 names (hard links), and grant pub does not set hard_links = true
    """
    if grant.paths is None:
        return None
    if not grant.covers_path(real):
        return f"{requested}: a link leads outside grant {grant.id}'s paths"
    if links > 1 and not grant.hard_links:
        return (
            f"{requested}: the file has {links} names (hard links), "
            f"and grant {grant.id} does not set hard_links = true"
        )
    return None


def precedence_rank(grant: Grant) -> int:
    """Where ``grant`` stands in decide()'s precedence: lower is tried first.

    >>> [precedence_rank(Grant("g", "shell", mode)) for mode in (Mode.DENY, Mode.ASK, Mode.AUTO)]
    [0, 2, 3]
    >>> precedence_rank(Grant("g", "shell", Mode.AUTO, wins_over_ask=True))
    1
    """
    if grant.mode is Mode.DENY:
        return 0
    if grant.mode is Mode.ASK:
        return 2
    return 1 if grant.wins_over_ask else 3


@attrs.frozen
class GrantSet:
    """A valid grants.toml: the grants in file order, indexed by tool for speed."""

    grants: tuple[Grant, ...] = ()
    _by_tool: Mapping[str, tuple[Grant, ...]] = attrs.field(eq=False, repr=False, init=False)
    _by_tool_mode: Mapping[tuple[str, Mode], tuple[Grant, ...]] = attrs.field(
        eq=False, repr=False, init=False
    )
    _by_precedence: Mapping[str, tuple[Grant, ...]] = attrs.field(eq=False, repr=False, init=False)

    @_by_tool.default
    def _index(self) -> Mapping[str, tuple[Grant, ...]]:
        return {tool: tuple(g for g in self.grants if g.tool == tool) for tool in TOOL_NAMES}

    @_by_tool_mode.default
    def _index_modes(self) -> Mapping[tuple[str, Mode], tuple[Grant, ...]]:
        return {
            (tool, mode): tuple(g for g in self.grants if g.tool == tool and g.mode is mode)
            for tool in TOOL_NAMES
            for mode in Mode
        }

    @_by_precedence.default
    def _index_precedence(self) -> Mapping[str, tuple[Grant, ...]]:
        return {
            tool: tuple(sorted(self._by_tool[tool], key=precedence_rank)) for tool in TOOL_NAMES
        }

    def in_precedence(self, tool: str) -> tuple[Grant, ...]:
        """The grants for ``tool`` in the order decide() tries them (the module docstring:
        deny, auto winning over ask, ask, auto; file order within each)."""
        return self._by_precedence.get(tool, ())

    def for_tool(self, tool: str) -> tuple[Grant, ...]:
        """The grants for ``tool``, in file order."""
        return self._by_tool.get(tool, ())

    def for_tool_and_mode(self, tool: str, mode: Mode) -> tuple[Grant, ...]:
        """The grants for ``tool`` with ``mode``, in file order."""
        return self._by_tool_mode.get((tool, mode), ())

    def matching(self, tool: str, arguments: CheckedArguments, now: dt.datetime) -> list[Grant]:
        """Every unexpired grant that matches, in file order."""
        return [g for g in self.for_tool(tool) if g.covers(arguments, now)]


@attrs.frozen
class GrantsProblem:
    """Why grants.toml is invalid: one problem, naming file, grant and key.

    ``index`` (which ``[[grant]]`` table, from 0) and ``suggestion`` (the nearest known
    word to a misspelt key, tool or mode) are for ``bxctl grants check``; two problems
    that differ only in them are the same problem."""

    file: str
    grant_id: str | None
    key: str | None
    message: str
    index: int | None = attrs.field(default=None, eq=False)
    suggestion: str | None = attrs.field(default=None, eq=False)

    def describe(self) -> str:
        """One line for logs, ``bxctl grants check`` and ``grants_invalid`` details.

        >>> GrantsProblem("grants.toml", "read-notes", "mode", "expected auto").describe()
        "grants.toml, grant 'read-notes', key 'mode': expected auto"
        """
        where = [self.file]
        if self.grant_id is not None:
            where.append(f"grant {self.grant_id!r}")
        if self.key is not None:
            where.append(f"key {self.key!r}")
        return ", ".join(where) + ": " + self.full_message()

    def full_message(self) -> str:
        """The message with its "did you mean" when there is one.

        >>> GrantsProblem("g.toml", "a", "path", "unknown key", suggestion="paths").full_message()
        "unknown key (did you mean 'paths'?)"
        """
        if self.suggestion is None:
            return self.message
        return f"{self.message} (did you mean {self.suggestion!r}?)"

    def detail(self) -> str:
        """The ``grants_invalid`` denial detail (docs/runbook.md#grants)."""
        return f"{self.describe()}; see {RUNBOOK_GRANTS}"


class _Invalid(Exception):
    """Internal: carries one problem out of the nested checks."""

    def __init__(
        self, grant_id: str | None, key: str | None, message: str, suggestion: str | None = None
    ) -> None:
        super().__init__(message)
        self.grant_id = grant_id
        self.key = key
        self.message = message
        self.suggestion = suggestion
        self.index: int | None = None

    def problem(self, file: str) -> GrantsProblem:
        return GrantsProblem(
            file, self.grant_id, self.key, self.message, self.index, self.suggestion
        )


def _nearest(word: object, known: Iterable[str]) -> str | None:
    """The known word ``word`` is most likely a misspelling of, or None.

    >>> _nearest("path", _KEYS), _nearest("red_file", TOOL_NAMES), _nearest("colour", _KEYS)
    ('paths', 'read_file', None)
    """
    if not isinstance(word, str):
        return None
    close = difflib.get_close_matches(word.lower(), [str(k) for k in known], n=1, cutoff=0.6)
    return close[0] if close else None


_KEYS: Final = (
    "id",
    "tool",
    "mode",
    "paths",
    "commands",
    "hosts",
    "max_taint",
    "if_untrusted",
    "label_taint",
    "hard_links",
    "wins_over_ask",
    "expires",
    "note",
)
_APPLIES: Final[Mapping[str, Callable[[str], bool]]] = {
    "paths": lambda tool: tool in FILE_TOOLS,
    "commands": lambda tool: tool == "shell",
    "hosts": lambda tool: tool == "http_get",
    "label_taint": lambda tool: tool == "shell",
    # Only read_file opens a file through a name that may be one of several: list_dir
    # opens directories (never hard-linked), and write_file's rename replaces the name,
    # so the other names keep the old content.
    "hard_links": lambda tool: tool == "read_file",
}
_MAX_NOTE: Final = 500


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _type_name(value: object) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a float", str: "a string"}
    names |= {list: "an array", dict: "a table", dt.datetime: "a datetime"}
    names |= {dt.date: "a date", dt.time: "a time"}
    return names.get(type(value), type(value).__name__)


def _enum(gid: str | None, key: str, value: object, kind: type[enum.StrEnum]) -> Any:
    words = ", ".join(m.value for m in kind)
    if not isinstance(value, str):
        raise _Invalid(gid, key, f"expected one of {words} (a string), got {_type_name(value)}")
    try:
        return kind(value)
    except ValueError:
        message = f"expected one of {words}, got {_show(value)}"
        raise _Invalid(gid, key, message, _nearest(value, kind)) from None


def _strings(gid: str | None, key: str, value: object) -> list[str]:
    if not isinstance(value, list):
        raise _Invalid(gid, key, f"expected an array of strings, got {_type_name(value)}")
    if not value:
        raise _Invalid(gid, key, "an empty array matches nothing (leave the key out instead)")
    for item in value:
        if not isinstance(item, str):
            raise _Invalid(gid, key, f"expected an array of strings, got {_type_name(item)} in it")
        if not item:
            raise _Invalid(gid, key, "an empty string in the array")
    return value


def _paths(gid: str | None, value: object) -> tuple[Glob, ...]:
    globs = []
    for pattern in _strings(gid, "paths", value):
        problem = glob_problem(pattern)
        if problem is not None:
            raise _Invalid(gid, "paths", f"{_show(pattern)}: {problem}")
        globs.append(Glob.compile(pattern))
    return tuple(globs)


def _commands(gid: str | None, value: object) -> tuple[str, ...]:
    commands = _strings(gid, "commands", value)
    for pattern in commands:
        if "\x00" in pattern:
            raise _Invalid(gid, "commands", "NUL byte in a command pattern")
    return tuple(commands)


def _hosts(gid: str | None, value: object) -> tuple[str, ...]:
    hosts = []
    for entry in _strings(gid, "hosts", value):
        rule = HostRule.parse(entry)
        if isinstance(rule, str):
            raise _Invalid(gid, "hosts", f"{_show(entry)}: {rule}")
        hosts.append(entry.lower())
    return tuple(hosts)


def _expires(gid: str | None, value: object) -> dt.datetime:
    if not isinstance(value, dt.datetime) or value.tzinfo is None:
        what = (
            "a datetime without an offset" if isinstance(value, dt.datetime) else _type_name(value)
        )
        raise _Invalid(
            gid, "expires", f"expected an offset datetime (e.g. 2026-12-31T00:00:00Z), got {what}"
        )
    return value.astimezone(dt.UTC)


def _boolean(gid: str | None, key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise _Invalid(gid, key, f"expected true or false (a boolean), got {_type_name(value)}")
    return value


def _note(gid: str | None, value: object) -> str:
    if not isinstance(value, str):
        raise _Invalid(gid, "note", f"expected a string, got {_type_name(value)}")
    if len(value) > _MAX_NOTE:
        raise _Invalid(gid, "note", f"at most {_MAX_NOTE} characters")
    return value


def _grant_id(nth: str, raw: Mapping[str, Any], seen: set[str]) -> str:
    if "id" not in raw:
        raise _Invalid(None, "id", f"{nth} has no id")
    gid = raw["id"]
    if not isinstance(gid, str):
        raise _Invalid(None, "id", f"{nth}: expected a string id, got {_type_name(gid)}")
    if not GRANT_ID.fullmatch(gid):
        raise _Invalid(None, "id", f"{nth}: id {_show(gid)} must match [a-z0-9][a-z0-9-]{{0,62}}")
    if gid in seen:
        raise _Invalid(gid, "id", "duplicate id")
    seen.add(gid)
    return gid


def _tool(gid: str | None, value: object) -> ToolName:
    if not isinstance(value, str) or value not in TOOL_NAMES:
        words = ", ".join(TOOL_NAMES)
        message = f"expected one of {words}, got {_show(value)}"
        raise _Invalid(gid, "tool", message, _nearest(value, TOOL_NAMES))
    return TOOL_NAMES[TOOL_NAMES.index(value)]


def _label_taint(gid: str | None, value: object) -> Taint:
    label_taint: Taint = _enum(gid, "label_taint", value, Taint)
    if label_taint is Taint.PUBLIC:
        raise _Invalid(gid, "label_taint", "may only raise shell output: internal or secret")
    return label_taint


_VALUES: Final[Mapping[str, Callable[[str | None, object], Any]]] = {
    # In the order their problems are reported (docs/decisions.md, "Grants").
    "label_taint": _label_taint,
    "paths": _paths,
    "commands": _commands,
    "hosts": _hosts,
    "max_taint": lambda gid, value: _enum(gid, "max_taint", value, Taint),
    "if_untrusted": lambda gid, value: _enum(gid, "if_untrusted", value, Mode),
    "hard_links": lambda gid, value: _boolean(gid, "hard_links", value),
    "wins_over_ask": lambda gid, value: _boolean(gid, "wins_over_ask", value),
    "expires": _expires,
    "note": _note,
}


def _grant(index: int, raw: object, seen: set[str], found: list[_Invalid]) -> Grant | None:
    """The grant, or None with every problem of it added to ``found``, in the order of
    docs/decisions.md ("Grants"): id, unknown keys, tool and mode, keys that do not
    apply, missing ``hosts``, then values. A key has at most one problem."""
    nth = f"[[grant]] #{index + 1}"
    if not isinstance(raw, dict):
        found.append(_Invalid(None, None, f"{nth} must be a table, got {_type_name(raw)}"))
        return None
    problems: list[_Invalid] = []

    def check(key: str, parse: Callable[..., Any], *args: object) -> Any:
        if key not in raw:
            return None
        try:
            return parse(*args, raw[key])
        except _Invalid as invalid:
            problems.append(invalid)
            return None

    try:
        gid: str | None = _grant_id(nth, raw, seen)
    except _Invalid as invalid:
        problems.append(invalid)
        gid = invalid.grant_id
    for key in sorted(key for key in raw if key not in _KEYS):
        problems.append(_Invalid(gid, key, "unknown key", _nearest(key, _KEYS)))
    problems += [
        _Invalid(gid, key, "required key missing") for key in ("tool", "mode") if key not in raw
    ]
    tool: ToolName | None = check("tool", _tool, gid)
    mode: Mode | None = check("mode", lambda value: _enum(gid, "mode", value, Mode))
    skip = {key for key in _KEYS if key not in raw}
    if tool is not None:
        for key in _KEYS:
            if key in raw and key in _APPLIES and not _APPLIES[key](tool):
                problems.append(_Invalid(gid, key, f"does not apply to tool {tool}"))
                skip.add(key)
        if tool == "http_get" and "hosts" not in raw:
            problems.append(_Invalid(gid, "hosts", "required for http_get (there is no default)"))
    values = {key: check(key, parse, gid) for key, parse in _VALUES.items() if key not in skip}
    if values.get("wins_over_ask") and mode is not None and mode is not Mode.AUTO:
        problems.append(_Invalid(gid, "wins_over_ask", "applies to auto grants only"))
    if problems:
        for problem in problems:
            problem.index = index
        found += problems
        return None
    assert gid is not None
    assert tool is not None
    assert mode is not None

    def value(key: str, default: object) -> Any:
        found = values.get(key)
        return default if found is None else found

    return Grant(
        id=gid,
        tool=tool,
        mode=mode,
        paths=values.get("paths"),
        commands=values.get("commands"),
        hosts=value("hosts", ()),
        max_taint=value("max_taint", Taint.SECRET),
        if_untrusted=value("if_untrusted", Mode.ASK),
        label_taint=values.get("label_taint"),
        hard_links=value("hard_links", False),
        wins_over_ask=value("wins_over_ask", False),
        expires=values.get("expires"),
        note=values.get("note"),
    )


def _grant_set(document: Mapping[str, Any]) -> GrantSet | list[_Invalid]:
    found = [
        _Invalid(
            None, key, "unknown top-level key (only [[grant]] tables)", _nearest(key, ["grant"])
        )
        for key in document
        if key != "grant"
    ]
    raw_grants = document.get("grant", [])
    if not isinstance(raw_grants, list):
        found.append(
            _Invalid(None, "grant", f"expected [[grant]] tables, got {_type_name(raw_grants)}")
        )
        return found
    seen: set[str] = set()
    grants = [_grant(i, raw, seen, found) for i, raw in enumerate(raw_grants)]
    if found:
        return found
    return GrantSet(tuple(grant for grant in grants if grant is not None))


def all_problems(
    document: Mapping[str, Any], file: str = "grants.toml"
) -> GrantSet | tuple[GrantsProblem, ...]:
    """Validate a parsed TOML document: the grant set, or every problem in file order
    (at least one); never raises. brokerd uses the first (:func:`grants_from_document`),
    ``bxctl grants check`` shows them all.

    >>> [p.key for p in all_problems({"grant": [{"id": "a", "tool": "x", "mod": "ask"}]})]
    ['mod', 'mode', 'tool']
    """
    checked = _grant_set(document)
    if isinstance(checked, GrantSet):
        return checked
    return tuple(invalid.problem(file) for invalid in checked)


def grants_from_document(
    document: Mapping[str, Any], file: str = "grants.toml"
) -> GrantSet | GrantsProblem:
    """Validate a parsed TOML document; never raises.

    >>> grants_from_document({"grant": [{"id": "a", "tool": "read_file", "mode": "auto"}]})
    GrantSet(grants=(Grant(id='a', tool='read_file', mode=<Mode.AUTO: 'auto'>, ...),))
    >>> grants_from_document({"grants": []}).key
    'grants'
    """
    checked = all_problems(document, file)
    return checked if isinstance(checked, GrantSet) else checked[0]


def parse_grants(text: str, file: str = "grants.toml") -> GrantSet | GrantsProblem:
    """Parse grants.toml text: a GrantSet, or the first problem; never raises.

    ``file`` is how problems name the file (the caller's path, for messages only).

    >>> problem = parse_grants('[[grant]]\\nid = "read-notes"\\ntool = "read_file"\\nmode = "x"')
    >>> problem.grant_id, problem.key, problem.message
    ('read-notes', 'mode', "expected one of auto, ask, deny, got 'x'")
    >>> parse_grants("").grants
    ()
    """
    document = parse_toml(text, file)
    if isinstance(document, GrantsProblem):
        return document
    return grants_from_document(document, file)


def parse_toml(text: str, file: str = "grants.toml") -> dict[str, Any] | GrantsProblem:
    """tomllib's document, or its syntax problem (tomllib's message carries the line and
    column); never raises."""
    try:
        return tomllib.loads(text)
    except (ValueError, RecursionError) as exc:
        return GrantsProblem(file, None, None, f"TOML syntax: {exc}")
