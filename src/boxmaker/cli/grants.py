"""``bxctl grants``: the owner's grants (docs/runbook.md#grants): check, list, test.

- ``check``: every problem of grants.toml with its line, then warnings
  (:mod:`boxmaker.core.grant_lint`);
- ``list``: every grant, what bounds it, its expiry, and how often it decided a call,
  from one streaming pass over the ledger (the ledger reader's fast path, tallied by
  :mod:`boxmaker.core.grant_usage`);
- ``test``: which grant would decide a call now, and why: the same inputs brokerd
  decides with (grants.toml, the session's state file, the workspace's real path) and
  brokerd's own :func:`~boxmaker.broker.decide_now.decide_now`, the look before an ask
  included.

Everything a file or the ledger holds is shown through ``printable``.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Annotated, Any

import attrs
import orjson
from cyclopts import App, Parameter

from boxmaker.broker.decide_now import decide_now
from boxmaker.broker.sandbox_check import sandbox_problem
from boxmaker.broker.workspace_paths import missing_directory
from boxmaker.cli.common import DEFAULT, Common, Exit, fail, print_json
from boxmaker.cli.what_if import what_if
from boxmaker.core.catalogue import (
    INTERNAL_TOOLS,
    ArgumentProblem,
    CheckedArguments,
    check_arguments,
)
from boxmaker.core.decide import Ruling
from boxmaker.core.external_tools import (
    EMPTY_CATALOGUE,
    ExternalCatalogue,
    assumed_catalogue,
    is_mcp_name,
)
from boxmaker.core.grant_lint import Finding, grant_sources, lint_grants
from boxmaker.core.grant_parse import GrantsProblem
from boxmaker.core.grant_usage import GrantUsage, tally_decisions
from boxmaker.core.grants import CONNECT, Grant, GrantSet
from boxmaker.core.labels import FRESH, Label
from boxmaker.core.network import network_grants
from boxmaker.core.state import RUNBOOK_STATE, StateUnreadable
from boxmaker.core.vocabulary import ToolRequest
from boxmaker.formats.clock import format_utc, local_time, parse_utc, utc_now
from boxmaker.formats.convert import SESSION_ID
from boxmaker.formats.printable import printable
from boxmaker.home import state_files
from boxmaker.home.config import ConfigError, load_config
from boxmaker.home.grants_file import GrantsRead, read_grants
from boxmaker.home.paths import Home, HomeError
from boxmaker.ledger.reader import LedgerReader
from boxmaker.ledger.segments import SegmentProblem, ledger_files, ledger_lines

grants_app = App(name="grants", help="The owner's grants (grants.toml).")
grants_app.command("boxmaker.cli.grants_change:revoke", name="revoke")
grants_app.command(what_if)

TEST_CALL = "c-" + "0" * 16
"""The call id of ``grants test``'s request: nothing is recorded or run."""


def _say(text: str) -> None:
    print(printable(text))


# ---------------------------------------------------------------------------------------
# check


@grants_app.command
def check(*, strict: bool = False, common: Common = DEFAULT) -> Exit:
    """Validate grants.toml: every problem with its line, then warnings.

    Exit 0 when valid (warnings are shown), 1 when invalid (brokerd then denies every
    call grants_invalid), or with --strict when there is a warning.

    Parameters
    ----------
    strict
        A warning (a shadowed grant, a shell pattern that chains) fails the check too.
    """
    path = common.resolve().grants_toml
    read = read_grants(path)
    if read.text is None:
        assert isinstance(read.value, GrantsProblem)
        findings: tuple[Finding, ...] = (
            Finding("problem", "invalid", None, None, None, read.value.message),
        )
        grants: GrantSet | None = None
    else:
        lint = lint_grants(read.text, utc_now(), str(path))
        findings, grants = lint.findings, lint.grants
    problems = [f for f in findings if f.severity == "problem"]
    warnings = [f for f in findings if f.severity == "warning"]
    if common.json:
        _check_json(path, grants, problems, warnings)
    else:
        _check_text(path, grants, problems, warnings)
    if problems or (strict and warnings):
        return Exit.FAILED
    return Exit.DONE


def _finding_json(finding: Finding) -> dict[str, Any]:
    return {
        "line": finding.line,
        "grant": finding.grant_id,
        "key": finding.key,
        "code": finding.code,
        "message": finding.message,
        "suggestion": finding.suggestion,
    }


def _check_json(
    path: Path, grants: GrantSet | None, problems: list[Finding], warnings: list[Finding]
) -> None:
    data: dict[str, Any] = {"valid": not problems, "file": str(path)}
    if problems:
        first = problems[0]
        data |= {"grant": first.grant_id, "key": first.key, "problem": first.full_message()}
    if grants is not None:
        data["grants"] = [{"id": g.id, "tool": g.tool, "mode": g.mode} for g in grants.grants]
    data["problems"] = [_finding_json(f) for f in problems]
    data["warnings"] = [_finding_json(f) for f in warnings]
    print_json(data)


def _where(path: Path, finding: Finding) -> str:
    where = f"{path}:{finding.line}" if finding.line is not None else str(path)
    if finding.grant_id is not None:
        where += f": grant {finding.grant_id!r}"
    elif finding.grant_index is not None:
        where += f": [[grant]] #{finding.grant_index + 1}"
    if finding.key is not None:
        where += f", key {finding.key!r}"
    return where


def _check_text(
    path: Path, grants: GrantSet | None, problems: list[Finding], warnings: list[Finding]
) -> None:
    for finding in problems:
        _say(f"{_where(path, finding)}: {finding.full_message()}")
    if problems:
        _say(
            f"invalid: {len(problems)} problem(s); brokerd denies every call grants_invalid "
            "until they are fixed; see docs/runbook.md#grants"
        )
        return
    assert grants is not None
    _say(f"{path}: valid, {len(grants.grants)} grant(s)")
    for grant in grants.grants:
        _say(f"  {grant.id}: {grant.tool} {grant.mode}")
    for finding in warnings:
        _say(f"warning: {_where(path, finding)}: {finding.full_message()}")
    if warnings:
        _say(f"{len(warnings)} warning(s); see docs/runbook.md#grants-warnings")


# ---------------------------------------------------------------------------------------
# list


@grants_app.command(name="list")
def list_grants(*, common: Common = DEFAULT) -> Exit:
    """Every grant: tool, mode, what bounds it, its expiry, and how often it decided a
    call and when last (from the ledger); grants that never decided one are flagged.

    Exit 1 when grants.toml is invalid (`bxctl grants check` says why), 2 when the
    ledger cannot be read.
    """
    home = common.resolve()
    read = read_grants(home.grants_toml)
    if isinstance(read.value, GrantsProblem):
        return fail(
            f"grants.toml is invalid: {read.value.describe()}; run `bxctl grants check`",
            Exit.FAILED,
        )
    grants = read.value
    try:
        # Each file's own lines, chained, as verify_file reads them: no generator
        # resumed per line.
        files = ledger_files(home.ledger_dir)
        reader = LedgerReader(ledger_lines(files))
        usage = tally_decisions(reader.decisions())
        records = reader.read
        counted_in = files.describe()
    except FileNotFoundError:
        usage, records, counted_in = {}, 0, str(home.audit_log)
    except OSError as exc:
        return fail(f"{home.audit_log}: {exc.strerror}", Exit.USAGE)
    except SegmentProblem as exc:
        return fail(f"{home.ledger_dir}: {exc}", Exit.USAGE)
    sources = dict(enumerate(grant_sources(read.text or "")))
    now = utc_now()
    if common.json:
        print_json(
            {
                "file": str(home.grants_toml),
                "ledger": str(home.audit_log),
                "records": records,
                "grants": [
                    _grant_json(g, usage.get(g.id), sources.get(i), now)
                    for i, g in enumerate(grants.grants)
                ],
            }
        )
        return Exit.DONE
    _say(
        f"{home.grants_toml}: {len(grants.grants)} grant(s); "
        f"use counted in {counted_in} ({records} records)"
    )
    for grant in grants.grants:
        for line in _describe_grant(grant, usage.get(grant.id), now):
            _say(line)
    return Exit.DONE


def bounds(grant: Grant) -> list[str]:
    """What limits the calls a grant matches and what it lets them do, one line each."""
    lines = []
    if grant.tool == "shell":
        shown = ", ".join(grant.commands) if grant.commands is not None else "(every command)"
        lines.append(f"commands: {shown}")
    elif grant.tool == "http_get":
        lines.append(f"hosts: {', '.join(grant.hosts)}")
    elif grant.tool == CONNECT:
        lines.append(f"hosts: {', '.join(grant.hosts)}")
        lines.append(f"via: {', '.join(grant.via)}")
        if grant.commands is not None:
            lines.append(f"commands: {', '.join(grant.commands)}")
        if grant.plain_http:
            lines.append("plain_http: true (plain-HTTP requests too, port 80 by default)")
    else:
        paths = grant.paths
        shown = ", ".join(g.pattern for g in paths) if paths is not None else "(every path)"
        lines.append(f"paths: {shown}")
    conditions = f"max_taint: {grant.max_taint}, if_untrusted: {grant.if_untrusted}"
    if grant.label_taint is not None:
        conditions += f", label_taint: {grant.label_taint}"
    if grant.hard_links:
        conditions += ", hard_links: true"
    lines.append(conditions)
    return lines


def expiry(grant: Grant, now: dt.datetime) -> str | None:
    if grant.expires is None:
        return None
    word = "expired" if grant.expired(now) else "expires"
    return f"{word} {local_time(grant.expires, now)}"


def usage_line(usage: GrantUsage | None, now: dt.datetime) -> str:
    if usage is None:
        return "never used: no call in the ledger was decided by it"
    verdicts = ", ".join(f"{v} {n}" for v, n in sorted(usage.verdicts.items()))
    line = f"decided {usage.decisions} call(s) ({verdicts})"
    if usage.last_at is not None:
        try:
            line += f", last {local_time(parse_utc(usage.last_at), now)}"
        except ValueError:
            line += f", last {usage.last_at}"
        if usage.last_call is not None:
            line += f" ({usage.last_call})"
    return line


def _describe_grant(grant: Grant, usage: GrantUsage | None, now: dt.datetime) -> list[str]:
    lines = [f"{grant.id}  {grant.tool}  {grant.mode}"]
    lines += [f"    {line}" for line in bounds(grant)]
    until = expiry(grant, now)
    if until is not None:
        lines.append(f"    {until}")
    lines.append(f"    {usage_line(usage, now)}")
    if grant.note is not None:
        lines.append(f"    note: {grant.note}")
    return lines


def _grant_json(
    grant: Grant, usage: GrantUsage | None, source: tuple[int, str] | None, now: dt.datetime
) -> dict[str, Any]:
    return {
        "id": grant.id,
        "tool": grant.tool,
        "mode": grant.mode,
        "paths": None if grant.paths is None else [g.pattern for g in grant.paths],
        "commands": None if grant.commands is None else list(grant.commands),
        "hosts": list(grant.hosts) if grant.tool in ("http_get", CONNECT) else None,
        "via": list(grant.via) if grant.tool == CONNECT else None,
        "plain_http": grant.plain_http if grant.tool == CONNECT else None,
        "max_taint": grant.max_taint,
        "if_untrusted": grant.if_untrusted,
        "label_taint": grant.label_taint,
        "hard_links": grant.hard_links,
        "expires": None if grant.expires is None else format_utc(grant.expires),
        "expired": grant.expired(now),
        "note": grant.note,
        "line": None if source is None else source[0],
        "decisions": 0 if usage is None else usage.decisions,
        "verdicts": {} if usage is None else dict(usage.verdicts),
        "last_decided": None if usage is None else usage.last_at,
        "last_call": None if usage is None else usage.last_call,
        "never_used": usage is None,
    }


# ---------------------------------------------------------------------------------------
# test


@attrs.frozen
class _AsRead:
    """``grants test``'s sources for :func:`decide_now`: the state file as it was read,
    a ledger taken as usable (nothing is recorded), and the look done here (a command
    may block)."""

    workspace: Path
    read_state: Label | StateUnreadable
    sandbox_uid: int | None
    """config.toml's ``[runner] sandbox_uid``, as brokerd reads it."""
    external: ExternalCatalogue = EMPTY_CATALOGUE
    """An ``mcp.*`` tool taken as accepted (:func:`assumed_catalogue`): bxctl cannot ask
    brokerd's gateway."""

    def ledger_usable(self) -> bool:
        return True

    def witness_lagging(self) -> str | None:
        # A witness's lag is brokerd's, in its memory: the grants' verdict is predicted.
        return None

    def catalogue(self) -> ExternalCatalogue:
        return self.external

    async def state(self, session: str) -> Label | StateUnreadable:
        del session
        return self.read_state

    async def missing_directory(self, path: str) -> str | None:
        return missing_directory(self.workspace, path)

    async def sandbox_problem(self) -> str | None:
        return sandbox_problem(self.workspace, self.sandbox_uid)


@attrs.frozen
class _TestCall:
    """What ``grants test`` decides, and on what: read as brokerd reads it."""

    home: Home
    request: ToolRequest
    session: str | None
    grants: GrantsRead
    sources: _AsRead
    checked: CheckedArguments

    @property
    def internal(self) -> bool:
        return self.request.tool in INTERNAL_TOOLS

    def network(self) -> tuple[Grant, ...] | None:
        """The grants that would give this call's sandbox a way out now; None for a
        call that never has a sandbox with a way out, or when grants.toml is invalid."""
        tool = self.request.tool
        grants = self.grants.value
        if (tool != "shell" and not is_mcp_name(tool)) or not isinstance(grants, GrantSet):
            return None
        return network_grants(grants, tool, self.checked.command, utc_now())


@grants_app.command(name="test")
async def decide_call(
    tool: str,
    arguments: Annotated[str, Parameter(name="ARGS-JSON")],
    /,
    *,
    session: str | None = None,
    common: Common = DEFAULT,
) -> Exit:
    """Which grant would decide this call now, and why: brokerd's own decision
    (grants.toml, the session's taint and trust, the workspace) without running or
    recording anything.

    Exit 0 when decided (whatever the verdict), 2 when the tool is unknown or the
    arguments are not JSON or do not fit the tool.

    Parameters
    ----------
    tool
        read_file, list_dir, write_file, shell, http_get, an mcp.* tool, or connect
        (one tunnel out of a call's sandbox).
    arguments
        The call's arguments as a JSON object, e.g. '{"path": "notes.txt"}'; for
        connect '{"host": "pypi.org", "port": 443, "via_tool": "shell",
        "via_command": "pip install attrs"}' ("via", the calling call, may be left out).
    session
        Decide with this session's state (s-…); default: a new session's.
    """
    call = _test_call(tool, arguments, session, common.resolve())
    if isinstance(call, Exit):
        return call
    verdict = await decide_now(
        call.request, call.grants.value, call.sources, internal=call.internal
    )
    if common.json:
        _test_json(call, verdict.decision)
    else:
        _test_text(call, verdict.decision)
    return Exit.DONE


def _test_call(tool: str, arguments: str, session: str | None, home: Home) -> _TestCall | Exit:
    """The call to decide, the grants and the state; or the exit of a call that is none."""
    try:
        raw = orjson.loads(arguments)
    except orjson.JSONDecodeError as exc:
        return fail(f"the arguments are not JSON: {exc}", Exit.USAGE)
    if session is not None and not SESSION_ID.fullmatch(session):
        return fail(f"not a session id: {session!r} (s- and 12 hex digits)", Exit.USAGE)
    try:
        config = load_config(home)
    except (ConfigError, HomeError) as exc:
        return fail(f"{exc}; see docs/runbook.md#config", Exit.FAILED)
    # The workspace's real path, as brokerd resolves it at start (broker/serve.py).
    workspace = Path(os.path.realpath(config.workspace))
    external = assumed_catalogue(tool)
    # The owner may try a connect: it decides nothing and runs nothing.
    internal = tool in INTERNAL_TOOLS
    if internal and isinstance(raw, dict):
        raw.setdefault("via", TEST_CALL)
    checked = check_arguments(
        tool, raw, workspace=str(workspace), external=external, internal=internal
    )
    if isinstance(checked, ArgumentProblem):
        return fail(f"{checked.reason}: {checked.detail}", Exit.USAGE)
    # The grants before the state, as brokerd reads them.
    grants = read_grants(home.grants_toml)
    state: Label | StateUnreadable = (
        FRESH if session is None else state_files.read_state(home.sessions_dir, session)
    )
    request = ToolRequest(
        call=TEST_CALL, session=session or "s-000000000000", tool=tool, arguments=raw
    )
    sources = _AsRead(workspace, state, config.runner.sandbox_uid, external)
    return _TestCall(home, request, session, grants, sources, checked)


def _grant_source(call: _TestCall, decision: Ruling) -> tuple[int, str] | None:
    """The deciding grant's line and text in grants.toml, if a grant decided."""
    grants = call.grants
    if decision.grant is None or not isinstance(grants.value, GrantSet):
        return None
    index = next(i for i, g in enumerate(grants.value.grants) if g.id == decision.grant)
    sources = grant_sources(grants.text or "")
    return sources[index] if index < len(sources) else None


def _test_json(call: _TestCall, decision: Ruling) -> None:
    source = _grant_source(call, decision)
    state = call.sources.read_state
    network = call.network()
    print_json(
        {
            "tool": decision.tool,
            "arguments": decision.arguments,
            "session": call.session,
            "verdict": decision.verdict,
            "reason": decision.reason,
            "detail": decision.detail,
            "grant": decision.grant,
            "mode": decision.mode,
            "grant_line": None if source is None else source[0],
            "grant_text": None if source is None else source[1],
            "taint": decision.state.taint,
            "untrusted": decision.state.untrusted,
            "state_problem": state.detail if isinstance(state, StateUnreadable) else None,
            "network_grants": None if network is None else [g.id for g in network],
        }
    )


def _test_text(call: _TestCall, decision: Ruling) -> None:
    source = _grant_source(call, decision)
    _say(f"verdict: {decision.verdict}")
    _say(f"reason: {decision.reason or 'none'}")
    if decision.detail is not None:
        _say(f"detail: {decision.detail}")
    if decision.grant is None:
        _say("grant: none")
    else:
        at = "" if source is None else f", line {source[0]}"
        _say(f"grant: {decision.grant} ({call.home.grants_toml}{at})")
        for line in (source[1] if source is not None else "").splitlines():
            _say(f"    {line}")
    session = call.session
    whose = "a new session: no --session given" if session is None else f"session {session}"
    trust = "untrusted" if decision.state.untrusted else "trusted"
    _say(f"state: taint {decision.state.taint}, {trust} ({whose})")
    state = call.sources.read_state
    if isinstance(state, StateUnreadable):
        _say(f"state file: {state.detail}; see {RUNBOOK_STATE}")
    network = call.network()
    if network is not None:
        _say(network_line(network))


def network_line(network: tuple[Grant, ...]) -> str:
    """Whether a call's sandbox gets a way out, in words.

    >>> from boxmaker.core.grants import Mode
    >>> print(network_line(()))
    network: none (no connect grant's via and commands cover this call: no socket at all)
    >>> print(network_line((Grant("pypi", "connect", Mode.AUTO),)))
    network: a way out, each connection decided as a connect call (grants: pypi)
    """
    if not network:
        return (
            "network: none (no connect grant's via and commands cover this call: no socket at all)"
        )
    ids = ", ".join(grant.id for grant in network)
    return f"network: a way out, each connection decided as a connect call (grants: {ids})"
