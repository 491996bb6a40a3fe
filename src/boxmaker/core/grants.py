"""The grant model: what a grant is, what it covers, and in what order decide() tries
grants (docs/decisions.md, "Grants"). Pure.

A :class:`Grant` is one validated ``[[grant]]`` table and a :class:`GrantSet` a valid
grants.toml; :mod:`boxmaker.core.grant_parse` makes them from the file's text.

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
- ``arguments`` (external tools only, :mod:`boxmaker.core.external_tools`): each named
  top-level argument must be present, and its value (a string as it is, any other JSON
  value as its canonical JSON, so ``["/work/a", "/etc/x"]`` is the text ``[...]``, never
  its items one by one) must match one of its patterns whole (:func:`fnmatch.fnmatchcase`);
- ``expires``: a grant matches strictly before it (``now >= expires`` → no match).

An external tool's grant names it exactly or by family (``mcp.git.*``, ``mcp.*``,
``claude.*``); a built-in tool's grant never covers an external tool, nor the reverse.

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
import enum
import fnmatch
import re
from collections.abc import Mapping
from typing import Final

import attrs

from boxmaker.core.catalogue import GRANT_TOOLS, CheckedArguments, ConnectArgs, ExternalArgs
from boxmaker.core.external_tools import canonical_json, tool_patterns
from boxmaker.core.hosts import HostSet, host_rules
from boxmaker.core.labels import Taint
from boxmaker.core.paths import Glob, any_glob

GRANT_ID: Final = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
OWNER: Final = "owner"
MCP_CLIENT: Final = "mcp-client"
APPROVERS: Final = (OWNER, MCP_CLIENT)
"""Who may answer a grant's ask: the owner (always), and where the grant says so, the MCP
client's own prompt (elicitation: the client software's answer, not the owner's)."""
_EXTERNAL_CACHE: Final = 1024
"""External tool names whose grants a GrantSet keeps looked up (then it starts over)."""


class Mode(enum.StrEnum):
    """A grant's ``mode`` and ``if_untrusted``."""

    AUTO = "auto"
    ASK = "ask"
    DENY = "deny"


@attrs.frozen
class Grant:
    """One ``[[grant]]`` table, validated, globs and command patterns compiled."""

    id: str
    tool: str
    """A built-in tool's name, or an external tool's name or family (``mcp.git.*``)."""
    mode: Mode
    paths: tuple[Glob, ...] | None = None
    """File tools: None = every workspace path."""
    commands: tuple[str, ...] | None = None
    """shell: None = every command."""
    hosts: tuple[str, ...] = ()
    """http_get: entries as :class:`~boxmaker.core.hosts.HostRule` parses them
    (host or ``*.suffix``, optional ``:port``), lower-cased."""
    max_taint: Taint = Taint.SECRET
    if_untrusted: Mode = attrs.field()
    """What an untrusted session gets; by default ask, for connect deny (an untrusted
    session gets no new hosts unless a grant says so)."""
    label_taint: Taint | None = None
    hard_links: bool = False
    """read_file under ``paths``: may a regular file with more than one link be read?"""
    wins_over_ask: bool = False
    """An ``auto`` grant that comes before every ``ask`` grant in precedence."""
    expires: dt.datetime | None = None
    note: str | None = None
    arguments: tuple[tuple[str, tuple[str, ...]], ...] | None = None
    """External tools: (argument name, its patterns) pairs; None = any arguments."""
    other_arguments: bool = True
    """External tools: may a call carry top-level arguments ``arguments`` does not name?
    approve --always writes false, so its grant is never broader than the call."""
    approvers: tuple[str, ...] = (OWNER,)
    """Ask grants: who may answer (:data:`APPROVERS`)."""
    via: tuple[str, ...] = ()
    """connect: the calls that may use it: "shell", or an external tool's name or family
    (``mcp.fetch.*``); none (only built by hand) allows none."""
    plain_http: bool = False
    """connect: are plain-HTTP requests to ``hosts`` allowed too (port 80 by default)?"""
    # Compiled once, at parse time: one regex per grant keeps decide() fast.
    _path_re: re.Pattern[str] | None = attrs.field(eq=False, repr=False, init=False)
    _command_re: re.Pattern[str] | None = attrs.field(eq=False, repr=False, init=False)
    _host_set: HostSet = attrs.field(eq=False, repr=False, init=False)
    _argument_res: tuple[tuple[str, re.Pattern[str]], ...] | None = attrs.field(
        eq=False, repr=False, init=False
    )

    @if_untrusted.default
    def _if_untrusted(self) -> Mode:
        return Mode.DENY if self.tool == CONNECT else Mode.ASK

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

    @_argument_res.default
    def _compile_arguments(self) -> tuple[tuple[str, re.Pattern[str]], ...] | None:
        if self.arguments is None:
            return None
        return tuple(
            (name, re.compile("|".join(fnmatch.translate(p) for p in patterns)))
            for name, patterns in self.arguments
        )

    def expired(self, now: dt.datetime) -> bool:
        """At or after ``expires`` the grant does not match (the boundary is ``>=``)."""
        return self.expires is not None and now >= self.expires

    def matches(self, tool: str, arguments: CheckedArguments, now: dt.datetime) -> bool:
        """Does this grant cover the call? ``now`` is an aware datetime."""
        named = tool == self.tool or self.tool in tool_patterns(tool)
        return named and self.covers(arguments, now)

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
        if not self.covers_command(arguments.command):
            return False
        argument_res = self._argument_res
        if argument_res is not None and not _arguments_match(argument_res, arguments.value):
            return False
        if not self.other_arguments and not _only_named(self.arguments, arguments.value):
            return False
        if self.tool == CONNECT:
            value = arguments.value
            if not isinstance(value, ConnectArgs) or not self.serves(value.via_tool):
                return False
            if value.scheme != "https" and not self.plain_http:
                return False
        if self.tool in _HOST_TOOLS:
            # Fail closed: a grant without hosts (only built by hand) allows none.
            destination = arguments.destination
            return destination is not None and self._host_set.allows(destination)
        return True

    def covers_command(self, command: str | None) -> bool:
        """Does ``commands`` match ``command`` (True when the grant has none; a call
        without a command matches no pattern)?"""
        command_re = self._command_re
        if command_re is None:
            return True
        return command is not None and command_re.match(command) is not None

    def serves(self, tool: str) -> bool:
        """Does this connect grant's ``via`` name the calling tool ``tool``, exactly or
        by family (``mcp.fetch.*``, ``mcp.*``)?

        >>> grant = Grant("g", "connect", Mode.AUTO, hosts=("a.org",), via=("shell", "mcp.f.*"))
        >>> [grant.serves(t) for t in ("shell", "mcp.f.get", "mcp.g.get", "http_get")]
        [True, True, False, False]
        """
        via = self.via
        return tool in via or any(pattern in via for pattern in tool_patterns(tool))

    def covers_path(self, path: str) -> bool:
        """Is the workspace path ``path`` within ``paths`` (True when there are none)?"""
        return self.paths is None or any(glob.matches(path) for glob in self.paths)


CONNECT: Final = "connect"
_HOST_TOOLS: Final = frozenset({"http_get", CONNECT})


def _arguments_match(patterns: tuple[tuple[str, re.Pattern[str]], ...], value: object) -> bool:
    """Is every named argument present, its value matching its patterns whole? Fails
    closed for a built-in tool's arguments (only a grant built by hand gets here)."""
    if not isinstance(value, ExternalArgs):
        return False
    given = value.arguments
    for name, pattern in patterns:
        if name not in given:
            return False
        found = given[name]
        text = found if isinstance(found, str) else canonical_json(found)
        if pattern.fullmatch(text) is None:
            return False
    return True


def _only_named(named: tuple[tuple[str, tuple[str, ...]], ...] | None, value: object) -> bool:
    """Does the call carry no top-level argument but those ``named``?"""
    if not isinstance(value, ExternalArgs):
        return False
    names = {name for name, _ in named or ()}
    return all(key in names for key in value.arguments)


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

    >>> pub = Grant("pub", "read_file", Mode.AUTO, paths=(Glob.compile("pub/**"),))
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
    _external: dict[str, tuple[tuple[Grant, ...], tuple[Grant, ...]]] = attrs.field(
        factory=dict, eq=False, repr=False, init=False
    )
    """External tool name → (its grants in file order, in precedence), looked up lazily."""

    @_by_tool.default
    def _index(self) -> Mapping[str, tuple[Grant, ...]]:
        return {tool: tuple(g for g in self.grants if g.tool == tool) for tool in GRANT_TOOLS}

    @_by_tool_mode.default
    def _index_modes(self) -> Mapping[tuple[str, Mode], tuple[Grant, ...]]:
        return {
            (tool, mode): tuple(g for g in self.grants if g.tool == tool and g.mode is mode)
            for tool in GRANT_TOOLS
            for mode in Mode
        }

    @_by_precedence.default
    def _index_precedence(self) -> Mapping[str, tuple[Grant, ...]]:
        return {
            tool: tuple(sorted(self._by_tool[tool], key=precedence_rank)) for tool in GRANT_TOOLS
        }

    def _external_grants(self, tool: str) -> tuple[tuple[Grant, ...], tuple[Grant, ...]]:
        """The grants covering the external tool ``tool`` by name or family, in file
        order and in precedence; cached per name (a new name costs one pass)."""
        found = self._external.get(tool)
        if found is None:
            patterns = tool_patterns(tool)
            in_order = tuple(g for g in self.grants if g.tool in patterns)
            found = (in_order, tuple(sorted(in_order, key=precedence_rank)))
            if len(self._external) >= _EXTERNAL_CACHE:
                self._external.clear()
            self._external[tool] = found
        return found

    def in_precedence(self, tool: str) -> tuple[Grant, ...]:
        """The grants for ``tool`` in the order decide() tries them (the module docstring:
        deny, auto winning over ask, ask, auto; file order within each)."""
        found = self._by_precedence.get(tool)
        if found is not None:
            return found
        return self._external_grants(tool)[1]

    def for_tool(self, tool: str) -> tuple[Grant, ...]:
        """The grants for ``tool``, in file order."""
        found = self._by_tool.get(tool)
        if found is not None:
            return found
        return self._external_grants(tool)[0]

    def for_tool_and_mode(self, tool: str, mode: Mode) -> tuple[Grant, ...]:
        """The grants for ``tool`` with ``mode``, in file order."""
        found = self._by_tool_mode.get((tool, mode))
        if found is not None:
            return found
        return tuple(g for g in self._external_grants(tool)[0] if g.mode is mode)

    def matching(self, tool: str, arguments: CheckedArguments, now: dt.datetime) -> list[Grant]:
        """Every unexpired grant that matches, in file order."""
        return [g for g in self.for_tool(tool) if g.covers(arguments, now)]
