"""The grant ``bxctl approve --always`` writes, from the call the owner approved. Pure.

The grant is never broader than the approved call, in any key:

- its patterns are the narrowest the grant keys can say: with scope ``exact`` the path
  itself (``paths``), the whole command line with every fnmatch metacharacter escaped
  (``commands``), the URL's host and its port, always written (``hosts``: an entry
  without a port would also allow the other scheme's own port, 80 or 443); with scope
  ``dir`` (file tools only) ``DIR/*``, the files and directories directly in the path's
  directory, never below it;
- it keeps the conditions of the grant that asked (``max_taint``, ``label_taint``,
  ``hard_links``, and its ``expires`` when that comes before ``--for``'s), and never
  runs an untrusted session's call without asking: its ``if_untrusted`` is ``ask``, or
  ``deny`` where the asking grant's was;
- an external tool's (``mcp.*``, ``claude.*``): ``tool`` its exact name, ``arguments``
  every top-level argument's exact value (a string as it is, any other value as its
  canonical JSON) escaped for fnmatch, and ``other_arguments = false``, so a call with
  one argument more does not match it either;
- it is ``mode = "auto"`` with ``wins_over_ask = true``, so it decides before the ask
  grant that asked (a deny grant still wins: core.grants' precedence).
- a ``connect`` (one tunnel of a call's sandbox): ``hosts`` the one ``host:port`` it
  went to, ``via`` the calling call's tool alone, ``plain_http = true`` only for a plain
  HTTP request; and the asking grant's ``commands``, kept as its conditions are. It is
  not bound to the calling command line itself: a host is what the owner approves
  (docs/decisions.md, "Network").

A path a glob cannot name exactly (one with a ``*``, or the workspace root itself), or a
host that is not one exact host (:func:`boxmaker.core.hosts.url_host_problem`; the
argument check refuses such a URL first), has no exact grant: the owner is told so, and
may approve the call once instead.
"""

from __future__ import annotations

import datetime as dt
import enum
import re
from collections.abc import Mapping
from typing import Any, Final

import attrs

from boxmaker.core import durations
from boxmaker.core.catalogue import (
    FILE_TOOLS,
    INTERNAL_TOOLS,
    ArgumentProblem,
    CheckedArguments,
    ConnectArgs,
    ExternalArgs,
    check_arguments,
)
from boxmaker.core.external_tools import EMPTY_CATALOGUE, ExternalCatalogue, canonical_json
from boxmaker.core.grant_parse import GrantsProblem, grants_from_document
from boxmaker.core.grants import GRANT_ID, Grant, GrantSet, Mode
from boxmaker.core.hosts import url_host_problem
from boxmaker.core.paths import ROOT

MAX_FOR: Final = dt.timedelta(days=366)
"""The longest ``--for``: a grant meant to last longer is one to write by hand."""


class Scope(enum.StrEnum):
    """How far approve-always's grant reaches."""

    EXACT = "exact"
    DIR = "dir"


@attrs.frozen
class ScopeProblem:
    """Why no grant can be written for this call and scope (the owner may approve once)."""

    message: str


def parse_duration(text: str) -> dt.timedelta | ScopeProblem:
    """``--for`` (:func:`boxmaker.core.durations.parse_duration`), at most
    :data:`MAX_FOR`.

    >>> parse_duration("30m"), parse_duration("400d").message
    (datetime.timedelta(seconds=1800), 'at most 366 days')
    >>> parse_duration("0s").message
    'a duration must be longer than 0 s'
    """
    try:
        duration = durations.parse_duration(text)
    except ValueError as exc:
        return ScopeProblem(str(exc))
    if duration > MAX_FOR:
        return ScopeProblem(f"at most {MAX_FOR.days} days")
    return duration


def escape_command(command: str) -> str:
    """An fnmatch pattern that matches ``command`` and nothing else: ``*``, ``?`` and
    ``[`` each become a one-character class (``]`` alone is already literal).

    >>> escape_command("ls *.txt [a]?")
    'ls [*].txt [[]a][?]'
    """
    return re.sub(r"([*?\[])", r"[\1]", command)


def grant_id(approval: str) -> str:
    """The id of the grant written for ``approval``: it names the approval.

    >>> grant_id("a-1f2e3d4c")
    'always-a-1f2e3d4c'
    """
    return f"always-{approval}"


def _patterns(
    arguments: CheckedArguments, scope: Scope, asking: Grant
) -> dict[str, Any] | ScopeProblem:
    tool = arguments.tool
    if scope is Scope.DIR and tool not in FILE_TOOLS:
        return ScopeProblem(f"--scope dir applies to file tools only, not {tool}")
    value = arguments.value
    if isinstance(value, ExternalArgs):
        exact = {
            name: [escape_command(given if isinstance(given, str) else canonical_json(given))]
            for name, given in value.arguments.items()
        }
        if any("\x00" in pattern[0] for pattern in exact.values()):
            return ScopeProblem(
                "an argument holds a NUL byte, which a grant cannot name; approve it once"
            )
        patterns: dict[str, Any] = {"arguments": exact} if exact else {}
        return {**patterns, "other_arguments": False}
    if tool in FILE_TOOLS:
        path = arguments.paths[0]
        if path == ROOT:
            return ScopeProblem("a glob cannot name the workspace root alone; approve it once")
        if scope is Scope.DIR:
            directory, _, _ = path.rpartition("/")
            pattern = f"{directory}/*" if directory else "*"
            if "*" in directory:
                return ScopeProblem(
                    "the directory's name has a '*', which a glob cannot name exactly; "
                    "approve it once"
                )
            return {"paths": [pattern]}
        if "*" in path:
            return ScopeProblem(
                "the path has a '*', which a glob cannot name exactly; approve it once"
            )
        return {"paths": [path]}
    if tool == "shell":
        assert arguments.command is not None
        return {"commands": [escape_command(arguments.command)]}
    destination = arguments.destination
    assert destination is not None
    # check_arguments refuses such a URL already; a host written here must never be a
    # '*.suffix' or anything else an entry reads as more than that one host.
    address = ":" in destination.host
    if url_host_problem(destination.host, bracketed=address) is not None:
        return ScopeProblem(
            f"the host {destination.host[:100]!r} is not one exact host; approve it once"
        )
    host = f"[{destination.host}]" if address else destination.host
    hosts: dict[str, Any] = {"hosts": [f"{host}:{destination.port}"]}
    if isinstance(value, ConnectArgs):
        hosts["via"] = [value.via_tool]
        if asking.commands is not None:
            hosts["commands"] = list(asking.commands)
        if value.scheme == "http":
            hosts["plain_http"] = True
    return hosts


@attrs.frozen
class Asked:
    """What an approve-always's grant is made from: the grant that asked, as grants.toml
    says it now, and the call's arguments checked again."""

    asking: Grant
    arguments: CheckedArguments


def asked(
    grants: GrantSet | GrantsProblem,
    *,
    grant: str,
    tool: str,
    arguments: Mapping[str, Any],
    workspace: str,
    external: ExternalCatalogue = EMPTY_CATALOGUE,
) -> Asked | ScopeProblem:
    """The grant ``grant`` that asked for a waiting call of ``tool`` with ``arguments``,
    and those arguments checked in ``workspace`` (a real path) with the external tools'
    catalogue ``external``; or why no grant can be made from them. brokerd's approve and
    bxctl's confirmation both start here."""
    if isinstance(grants, GrantsProblem):
        return ScopeProblem(f"grants.toml is invalid: {grants.describe()}")
    asking = next((each for each in grants.grants if each.id == grant), None)
    if asking is None:
        return ScopeProblem(f"grant {grant}, which asked, is no longer in grants.toml")
    # The tool is the waiting entry's, which brokerd decided: a connect there is its own.
    internal = tool in INTERNAL_TOOLS
    checked = check_arguments(
        tool, dict(arguments), workspace=workspace, external=external, internal=internal
    )
    if isinstance(checked, ArgumentProblem):
        return ScopeProblem(checked.detail)
    return Asked(asking, checked)


def always_grant(
    *,
    approval: str,
    call: str,
    arguments: CheckedArguments,
    asking: Grant,
    scope: Scope,
    lasting: dt.timedelta | None,
    owner: str,
    now: dt.datetime,
) -> dict[str, Any] | ScopeProblem:
    """The new ``[[grant]]`` table's keys, in the order they are written (the module
    docstring says what each is); or why there is none. ``asking`` is the grant that
    asked, as grants.toml says it now; ``lasting`` is ``--for``; ``now`` is aware."""
    patterns = _patterns(arguments, scope, asking)
    if isinstance(patterns, ScopeProblem):
        return patterns
    gid = grant_id(approval)
    if not GRANT_ID.fullmatch(gid):  # pragma: no cover - approval ids are a- and 8 hex
        return ScopeProblem(f"no grant id can be made of {approval!r}")
    expires = None if lasting is None else now + lasting
    if asking.expires is not None and (expires is None or asking.expires < expires):
        expires = asking.expires
    if expires is not None and expires <= now:
        return ScopeProblem(f"grant {asking.id}, which asked, has expired")
    table: dict[str, Any] = {
        "id": gid,
        "tool": arguments.tool,
        "mode": Mode.AUTO.value,
        "wins_over_ask": True,
        **patterns,
        "max_taint": asking.max_taint.value,
        "if_untrusted": (Mode.DENY if asking.if_untrusted is Mode.DENY else Mode.ASK).value,
    }
    if asking.label_taint is not None and arguments.tool == "shell":
        table["label_taint"] = asking.label_taint.value
    if asking.hard_links and arguments.tool == "read_file":
        table["hard_links"] = True
    if expires is not None:
        table["expires"] = expires.astimezone(dt.UTC).replace(microsecond=0)
    when = now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    table["note"] = (
        f"approved always by {owner[:64]} at {when} for approval {approval} (call {call})"
    )
    return table


def grant_of(table: dict[str, Any]) -> Grant:
    """The :class:`Grant` a table from :func:`always_grant` makes (as brokerd would read
    it): for tests and for checking a file written with it."""
    parsed = grants_from_document({"grant": [table]})
    if isinstance(parsed, GrantsProblem):  # pragma: no cover - always_grant's are valid
        raise TypeError(parsed.describe())
    return parsed.grants[0]
