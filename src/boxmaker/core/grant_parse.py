"""grants.toml's text → a :class:`~boxmaker.core.grants.GrantSet` or its problems:
parse and validate (docs/decisions.md, "Grants"). Pure: text in, values out.

:func:`parse_grants` turns any text into a :class:`GrantSet` or exactly one
:class:`GrantsProblem` (the first one found, in file order) and never raises;
:func:`all_problems` gives every problem, for ``bxctl grants check``. The checks
are explicit rather than a cattrs structure because every message must name the grant and
the key, and because a TOML string must not pass for a list (of its characters).
"""

from __future__ import annotations

import datetime as dt
import difflib
import enum
import tomllib
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import attrs

from boxmaker.core.catalogue import FILE_TOOLS, GRANT_TOOLS
from boxmaker.core.external_tools import MCP_PREFIX, is_external, is_tool_pattern
from boxmaker.core.grants import APPROVERS, CONNECT, GRANT_ID, OWNER, Grant, GrantSet, Mode
from boxmaker.core.hosts import HostRule
from boxmaker.core.labels import Taint
from boxmaker.core.paths import Glob, glob_problem

RUNBOOK_GRANTS: Final = "docs/runbook.md#grants"


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

    >>> _nearest("path", _KEYS), _nearest("red_file", GRANT_TOOLS), _nearest("colour", _KEYS)
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
    "arguments",
    "other_arguments",
    "approvers",
    "via",
    "plain_http",
)
_APPLIES: Final[Mapping[str, Callable[[str], bool]]] = {
    "paths": lambda tool: tool in FILE_TOOLS,
    "commands": lambda tool: tool in ("shell", CONNECT),
    "hosts": lambda tool: tool in ("http_get", CONNECT),
    "label_taint": lambda tool: tool == "shell",
    # Only read_file opens a file through a name that may be one of several: list_dir
    # opens directories (never hard-linked), and write_file's rename replaces the name,
    # so the other names keep the old content.
    "hard_links": lambda tool: tool == "read_file",
    "arguments": is_external,
    "other_arguments": is_external,
    "via": lambda tool: tool == CONNECT,
    "plain_http": lambda tool: tool == CONNECT,
}
_REQUIRED: Final[Mapping[str, tuple[str, ...]]] = {
    "http_get": ("hosts",),
    CONNECT: ("hosts", "via"),
}
"""The keys a tool's grant must have (there is no default)."""
VIA_SHELL: Final = "shell"
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


def _tool(gid: str | None, value: object) -> str:
    if isinstance(value, str) and is_external(value):
        if not is_tool_pattern(value):
            message = (
                f"{_show(value)} is not an external tool's name or family "
                "(mcp.SERVER.TOOL, mcp.SERVER.*, mcp.*, claude.NAME, claude.*)"
            )
            raise _Invalid(gid, "tool", message)
        return value
    if not isinstance(value, str) or value not in GRANT_TOOLS:
        words = ", ".join(GRANT_TOOLS)
        message = f"expected one of {words}, got {_show(value)}"
        raise _Invalid(gid, "tool", message, _nearest(value, GRANT_TOOLS))
    return GRANT_TOOLS[GRANT_TOOLS.index(value)]


def _via(gid: str | None, value: object) -> tuple[str, ...]:
    via = _strings(gid, "via", value)
    for entry in via:
        if entry != VIA_SHELL and not (entry.startswith(MCP_PREFIX) and is_tool_pattern(entry)):
            message = (
                f"{_show(entry)}: expected shell, or an external tool's name or family "
                "(mcp.SERVER.TOOL, mcp.SERVER.*, mcp.*)"
            )
            raise _Invalid(gid, "via", message, _nearest(entry, (VIA_SHELL,)))
    if len(set(via)) != len(via):
        raise _Invalid(gid, "via", "a tool named twice")
    return tuple(via)


def _arguments(gid: str | None, value: object) -> tuple[tuple[str, tuple[str, ...]], ...]:
    if not isinstance(value, dict):
        raise _Invalid(gid, "arguments", f"expected a table of arrays, got {_type_name(value)}")
    if not value:
        raise _Invalid(gid, "arguments", "an empty table (leave the key out instead)")
    pairs = []
    # Any JSON key is an argument's name, and an empty pattern matches the empty string:
    # approve --always writes a call's names and values as they are.
    for name, patterns in value.items():
        if not isinstance(patterns, list):
            message = f"{_show(name)}: expected an array of strings, got {_type_name(patterns)}"
            raise _Invalid(gid, "arguments", message)
        if not patterns:
            message = f"{_show(name)}: an empty array matches nothing (leave the name out instead)"
            raise _Invalid(gid, "arguments", message)
        for pattern in patterns:
            if not isinstance(pattern, str):
                message = (
                    f"{_show(name)}: expected an array of strings, got {_type_name(pattern)} in it"
                )
                raise _Invalid(gid, "arguments", message)
            if "\x00" in pattern:
                raise _Invalid(gid, "arguments", f"{_show(name)}: NUL byte in a pattern")
        pairs.append((name, tuple(patterns)))
    return tuple(pairs)


def _approvers(gid: str | None, value: object) -> tuple[str, ...]:
    approvers = _strings(gid, "approvers", value)
    for approver in approvers:
        if approver not in APPROVERS:
            words = ", ".join(APPROVERS)
            message = f"expected some of {words}, got {_show(approver)}"
            raise _Invalid(gid, "approvers", message, _nearest(approver, APPROVERS))
    if len(set(approvers)) != len(approvers):
        raise _Invalid(gid, "approvers", "an approver named twice")
    if OWNER not in approvers:
        raise _Invalid(gid, "approvers", 'the owner can always answer: name "owner" too')
    return tuple(approvers)


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
    "arguments": _arguments,
    "other_arguments": lambda gid, value: _boolean(gid, "other_arguments", value),
    "approvers": _approvers,
    "via": _via,
    "plain_http": lambda gid, value: _boolean(gid, "plain_http", value),
}


def _connect_problems(gid: str | None, values: Mapping[str, Any]) -> list[_Invalid]:
    """What a connect grant's values may not say together."""
    problems = []
    via = values.get("via")
    if values.get("commands") and via is not None and VIA_SHELL not in via:
        message = 'matched against a shell call\'s command: applies only when via has "shell"'
        problems.append(_Invalid(gid, "commands", message))
    approvers = values.get("approvers")
    if approvers is not None and approvers != (OWNER,):
        # A tunnel's ask waits inside a shell call: only the owner's prompt can answer it.
        problems.append(_Invalid(gid, "approvers", 'only the owner answers a connect: "owner"'))
    return problems


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
    tool: str | None = check("tool", _tool, gid)
    mode: Mode | None = check("mode", lambda value: _enum(gid, "mode", value, Mode))
    skip = {key for key in _KEYS if key not in raw}
    if tool is not None:
        for key in _KEYS:
            if key in raw and key in _APPLIES and not _APPLIES[key](tool):
                problems.append(_Invalid(gid, key, f"does not apply to tool {tool}"))
                skip.add(key)
        for key in _REQUIRED.get(tool, ()):
            if key not in raw:
                message = f"required for {tool} (there is no default)"
                problems.append(_Invalid(gid, key, message))
    values = {key: check(key, parse, gid) for key, parse in _VALUES.items() if key not in skip}
    if values.get("wins_over_ask") and mode is not None and mode is not Mode.AUTO:
        problems.append(_Invalid(gid, "wins_over_ask", "applies to auto grants only"))
    if values.get("approvers") and mode is not None and mode is not Mode.ASK:
        problems.append(_Invalid(gid, "approvers", "applies to ask grants only"))
    if tool == CONNECT:
        problems += _connect_problems(gid, values)
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

    default_untrusted = Mode.DENY if tool == CONNECT else Mode.ASK

    return Grant(
        id=gid,
        tool=tool,
        mode=mode,
        paths=values.get("paths"),
        commands=values.get("commands"),
        hosts=value("hosts", ()),
        max_taint=value("max_taint", Taint.SECRET),
        if_untrusted=value("if_untrusted", default_untrusted),
        label_taint=values.get("label_taint"),
        hard_links=value("hard_links", False),
        wins_over_ask=value("wins_over_ask", False),
        expires=values.get("expires"),
        note=values.get("note"),
        arguments=values.get("arguments"),
        other_arguments=value("other_arguments", True),
        approvers=value("approvers", (OWNER,)),
        via=value("via", ()),
        plain_http=value("plain_http", False),
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
