"""``bxctl why CALL``: one call's story from the ledger, in sentences a person reads
(with --json, the same as an object): the decision with the grant that decided it and
the session's taint it saw, the owner's answer (who, when, why), the result.

It reads the records ``bxctl audit show --call`` reads (:func:`~boxmaker.cli.audit.
select_with_policies`). A record holds a grant's id, not its mode or note: those are
read from grants.toml as it is now, and said so; and the grant's text as it was when it
decided, from the version the last ``policy`` record before the decision names, kept
beside the ledger (docs/protocol.md, "Policy records"). Times are the owner's local ones
(:func:`~boxmaker.formats.clock.local_time`). What the ledger says is outside text (the model
chose the tool and arguments, the owner the reasons): it is printed through
``printable``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Final

import attrs
import orjson

from boxmaker.cli.admin_client import DaemonUnreachable, ask_broker
from boxmaker.cli.audit import grant_of, grant_then_lines, select_with_policies
from boxmaker.cli.common import DEFAULT, Common, Exit, fail, print_json
from boxmaker.core.catalogue import (
    INTERNAL_TOOLS,
    CheckedArguments,
    ConnectArgs,
    check_arguments,
    connect_target,
)
from boxmaker.core.external_tools import server_of
from boxmaker.core.grants import GrantSet
from boxmaker.core.reasons import Reason, reason_words
from boxmaker.core.vocabulary import (
    Approval,
    ApprovalBy,
    ApprovalOutcome,
    Decision,
    Record,
    Result,
    ResultStatus,
    VerdictCode,
    holds,
)
from boxmaker.formats.clock import local_time, parse_utc, utc_now
from boxmaker.formats.convert import APPROVAL_ID, CALL_ID
from boxmaker.formats.printable import printable
from boxmaker.home.grants_file import load_grants
from boxmaker.home.paths import Home
from boxmaker.ledger.policies import GrantThen
from boxmaker.ledger.reader import LedgerReader, NotARecord
from boxmaker.ledger.records import Body, Connection, ConnectionEnd, body_fields, call_of
from boxmaker.ledger.segments import SegmentProblem, ledger_files, ledger_lines
from boxmaker.wire import ApprovalsAnswer, ApprovalsRequest, ApprovalView


def _because(reason: object) -> str:
    code = str(reason)
    words = reason_words(code)
    return f"{code} ({words})" if words else code


@attrs.frozen
class GrantNow:
    """The grant that decided a call: as grants.toml has it now (mode, note; None when it
    is no longer there), and as it was then."""

    id: str
    mode: str | None
    note: str | None
    in_grants_now: bool
    then: GrantThen


@attrs.define
class Tunnel:
    """One connect call a call's sandbox made: its decision, and its connection record
    when the tunnel opened and closed."""

    decision: Record[Decision]
    connection: Record[Connection] | None = None


@attrs.define
class Life:
    """One life of a call in the ledger: its decision, and the grant that decided it,
    its approval and its result when recorded; a connect's connection record; a
    calling call's tunnels, by their connect call."""

    call: str
    decision: Record[Decision]
    grant: GrantNow | None = None
    approval: Record[Approval] | None = None
    result: Record[Result] | None = None
    connection: Record[Connection] | None = None
    tunnels: dict[str, Tunnel] = attrs.field(factory=dict)


def _grant_now(grants: GrantSet | None, grant_id: str, then: GrantThen) -> GrantNow:
    for grant in grants.grants if grants is not None else ():
        if grant.id == grant_id:
            return GrantNow(grant_id, grant.mode.value, grant.note, True, then)
    return GrantNow(grant_id, None, None, False, then)


def call_story(home: Home, call: str) -> list[Life]:
    """The lives of ``call`` in the ledger (one per decision: an id may be used again
    in a later boot), as recorded."""
    loaded = load_grants(home.grants_toml)
    grants = loaded if isinstance(loaded, GrantSet) else None
    lives: list[Life] = []
    selected, policy_of = select_with_policies(home.audit_log, call, None, None, tunnels=True)
    for _, record in selected:
        if isinstance(record, NotARecord):
            continue
        if call_of(record.body) != call:  # a tunnel of this call
            if lives:
                _add_tunnel(lives[-1], record)
            continue
        if holds(record, Decision):
            then = grant_of(home.audit_log, record, policy_of)
            grant = record.body.grant
            now = None if grant is None or then is None else _grant_now(grants, grant, then)
            lives.append(Life(call, record, now))
        elif holds(record, Approval) and lives:
            lives[-1].approval = record
        elif holds(record, Result) and lives:
            lives[-1].result = record
        elif holds(record, Connection) and lives:
            lives[-1].connection = record
    return lives


def _add_tunnel(life: Life, record: Record[Body]) -> None:
    if holds(record, Decision):
        life.tunnels[record.body.call] = Tunnel(record)
    elif holds(record, Connection):
        tunnel = life.tunnels.get(record.body.call)
        if tunnel is not None:
            tunnel.connection = record


def _fields(record: Record[Decision | Approval | Result | Connection]) -> dict[str, Any]:
    """A record as ``--json`` shows it: its time and its body's fields but the call."""
    fields = {"at": record.at, **body_fields(record.body)}
    del fields["call"]
    return dict(sorted(fields.items()))


def life_json(life: Life) -> dict[str, Any]:
    """One life as ``bxctl why --json`` prints it."""
    decision = _fields(life.decision)
    decision["grant"] = None if life.grant is None else attrs.asdict(life.grant)
    return {
        "call": life.call,
        "decision": decision,
        "approval": None if life.approval is None else _fields(life.approval),
        "result": None if life.result is None else _fields(life.result),
        "connection": None if life.connection is None else _fields(life.connection),
        "tunnels": [
            {
                "call": call,
                "decision": _fields(tunnel.decision),
                "connection": None if tunnel.connection is None else _fields(tunnel.connection),
            }
            for call, tunnel in life.tunnels.items()
        ],
    }


def _trust(untrusted: bool) -> str:
    return "untrusted" if untrusted else "trusted"


def _when(at: str, now: dt.datetime) -> str:
    try:
        return local_time(parse_utc(at), now)
    except ValueError:
        return at


def _definition_words(tool: str, definition: str | None) -> list[str]:
    """An MCP tool's server and the definition (hash) it was decided on or ran with.

    >>> _definition_words("mcp.git.git_log", "ab12")
    ['  MCP server git, tool definition sha256 ab12']
    >>> _definition_words("read_file", None)
    []
    """
    server = server_of(tool)
    if server is None and definition is None:
        return []
    where = f"MCP server {server}, " if server is not None else ""
    return [f"  {where}tool definition sha256 {definition or '(none recorded)'}"]


def _subject(decision: Decision) -> str:
    """What a decided call was: its tool and arguments; a connect's destination and the
    call whose sandbox asked for it."""
    checked = None
    if decision.tool in INTERNAL_TOOLS:
        checked = check_arguments(decision.tool, decision.arguments, internal=True)
    if isinstance(checked, CheckedArguments) and isinstance(checked.value, ConnectArgs):
        value = checked.value
        plain = " (plain HTTP)" if value.scheme == "http" else ""
        words = f"connect to {connect_target(value)}{plain}, a tunnel of {value.via_tool} "
        words += f"call {value.via}"
        if value.via_command is not None:
            command = value.via_command
            words += f" ({command if len(command) <= 200 else command[:200] + '…'})"
        return words
    arguments = orjson.dumps(decision.arguments, option=orjson.OPT_SORT_KEYS).decode()
    return f"{decision.tool} {arguments}"


ENDED_WORDS: Final = {
    ConnectionEnd.CLOSED: "closed (either side ended it)",
    ConnectionEnd.IDLE: "idle (nothing went either way for the idle timeout)",
    ConnectionEnd.BYTE_CAP: "byte_cap (the calling call's bytes were spent)",
    ConnectionEnd.CALL_ENDED: "call_ended (the calling call finished)",
    ConnectionEnd.SERVER_NAME_MISMATCH: (
        "server_name_mismatch (the TLS server name was not the host asked for)"
    ),
    ConnectionEnd.NOT_TLS: "not_tls (what the sandbox sent was not TLS)",
    ConnectionEnd.LEDGER_FAILED: "ledger_failed (a ledger write failed: every tunnel closed)",
    ConnectionEnd.STOPPING: "stopping (brokerd stopped)",
    ConnectionEnd.UPSTREAM_ERROR: "upstream_error (the host's side failed)",
}
"""How a tunnel ended, in words (every end: tests/cli/test_why_connect.py checks)."""


def connection_words(connection: Connection) -> str:
    """One tunnel's figures in a sentence."""
    target = f"[{connection.host}]" if ":" in connection.host else connection.host
    name = connection.server_name
    tls = "no TLS server name" if name is None else f"TLS server name {name}"
    return (
        f"tunnel to {target}:{connection.port} at {connection.address} ({tls}): "
        f"{connection.bytes_up} bytes up, {connection.bytes_down} bytes down, "
        f"{connection.duration_ms} ms; ended {ENDED_WORDS[connection.ended]}"
    )


def _tunnel_words(call: str, tunnel: Tunnel) -> str:
    decision = tunnel.decision.body
    target = decision.arguments.get("host"), decision.arguments.get("port")
    line = f"  {call} {target[0]}:{target[1]}: {decision.verdict.value}"
    if decision.reason is not None:
        line += f" {decision.reason.value}"
    if decision.grant is not None:
        line += f" (grant {decision.grant})"
    connection = tunnel.connection
    if connection is not None:
        body = connection.body
        line += f"; {body.bytes_up} bytes up, {body.bytes_down} down, ended {body.ended.value}"
    elif decision.verdict is VerdictCode.RUN:
        line += "; no connection record: it did not open, or is open still"
    return line


def _decision_words(life: Life, now: dt.datetime) -> list[str]:
    decision = life.decision.body
    lines = [
        f"{_subject(decision)}, asked by session {decision.session}",
        f"decided {_when(life.decision.at, now)}: {decision.verdict.value}",
    ]
    grant = life.grant
    if grant is not None:
        line = f"  grant {grant.id}"
        if grant.in_grants_now:
            line += f" (in grants.toml now: mode {grant.mode}"
            line += f', note "{grant.note}")' if grant.note else ")"
        else:
            line += " (no longer in grants.toml)"
        lines.append(line)
        lines += grant_then_lines(grant.then, grant.id, indent="    ")
    else:
        lines.append("  no grant decided it")
    lines += _definition_words(decision.tool, decision.definition)
    if decision.reason is not None:
        lines.append(f"  denied because {_because(decision.reason.value)}")
    lines.append(f"  the session was taint {decision.taint.value}, {_trust(decision.untrusted)}")
    return lines


APPROVAL_WORDS: Final = {
    ApprovalOutcome.ASK: "approved by the owner; it ran on their word",
    ApprovalOutcome.ALLOWED: "approved by the owner; a grant then allowed it without asking",
    ApprovalOutcome.DENIED: "approved by the owner, but brokerd decided again and denied it",
    ApprovalOutcome.WITHDRAWN: "withdrawn; nothing ran",
    ApprovalOutcome.REFUSED: "refused by the owner",
    ApprovalOutcome.EXPIRED: "expired: nobody answered in time",
}
"""Each outcome of an ask in words (every outcome: tests/cli/test_bxctl.py checks)."""
CLIENT_APPROVAL_WORDS: Final = {
    ApprovalOutcome.ASK: "approved in the MCP client, not by the owner; it ran on its word",
    ApprovalOutcome.ALLOWED: "approved in the MCP client; a grant then allowed it without asking",
    ApprovalOutcome.DENIED: "approved in the MCP client, but brokerd decided again and denied it",
    ApprovalOutcome.WITHDRAWN: "approved in the MCP client, then withdrawn; nothing ran",
    ApprovalOutcome.REFUSED: "refused in the MCP client",
}
"""An answer from the MCP client's own prompt (``by`` ``mcp-client``), in words: never
the owner's (docs/threat-model.md)."""


def _approval_words(record: Record[Approval], now: dt.datetime) -> list[str]:
    approval = record.body
    outcome = approval.outcome
    words = APPROVAL_WORDS[outcome]
    if approval.by is ApprovalBy.MCP_CLIENT:
        words = CLIENT_APPROVAL_WORDS.get(outcome, words)
    line = f"{words} {_when(record.at, now)}"
    line += f" (approval {approval.approval}, by {approval.by.value})"
    lines = [line]
    reason = approval.reason
    if outcome is ApprovalOutcome.REFUSED and reason is not None:
        lines.append(f'  the reason the model was told: "{reason}"')
    elif reason is not None and outcome is not ApprovalOutcome.EXPIRED:
        lines.append(f"  because {_because(reason)}")
    if approval.approver is not None:
        lines.append(f"  answered from {approval.approver}, not at bxctl")
    if approval.note is not None:
        lines.append(f'  the owner\'s note: "{approval.note}"')
    written = approval.grant_written
    if written is not None:
        lines.append(f"  approved always: grant {written} was written to grants.toml first")
    if outcome in _DECIDED_AGAIN:
        state = f"{approval.taint.value}, {_trust(approval.untrusted)}"
        lines.append(f"  decided again on the session at taint {state}")
        if approval.definition is not None:
            lines.append(f"  on tool definition sha256 {approval.definition}")
    return lines


_DECIDED_AGAIN: Final = {ApprovalOutcome.ASK, ApprovalOutcome.ALLOWED, ApprovalOutcome.DENIED}
_RAN: Final = {ApprovalOutcome.ASK, ApprovalOutcome.ALLOWED}


def _result_words(record: Record[Result], now: dt.datetime) -> list[str]:
    result = record.body
    when = _when(record.at, now)
    if result.status is ResultStatus.OK:
        line = f"ran {when}: ok, {result.output_bytes} bytes of output, labelled "
        line += result.label.taint.value
        if result.label.untrusted:
            line += " and untrusted"
        lines = [line]
    elif result.reason is Reason.REQUESTER_GONE and result.stopped:
        lines = [f"began {when} and was stopped: requester_gone (its requester left while it ran)"]
    elif result.reason is Reason.REQUESTER_GONE:
        lines = [f"did not run {when}: requester_gone (the requester left before it began)"]
    else:
        reason = None if result.reason is None else result.reason.value
        lines = [f"ran {when} and failed: {_because(reason)}"]
    after = f"{result.taint_after.value}, {_trust(result.untrusted_after)}"
    lines.append(f"  the session is now taint {after}")
    return lines


def describe_life(life: Life, now: dt.datetime, waiting: ApprovalView | None = None) -> list[str]:
    """The sentences of one life of a call; ``waiting``: its entry when it waits now."""
    lines = [f"call {life.call}: ", *_decision_words(life, now)]
    lines[0] += lines.pop(1)
    verdict = life.decision.body.verdict
    if life.approval is not None:
        lines += _approval_words(life.approval, now)
    elif waiting is not None:
        lines.append(
            f"waits for you now: approval {waiting.approval}, expires "
            f"{local_time(waiting.expires_at, now)}; bxctl approve {waiting.approval}"
        )
    elif verdict is VerdictCode.ASK:
        lines.append("no answer recorded yet: it waits, or brokerd stopped first")
    if life.connection is not None:
        lines.append(connection_words(life.connection.body))
    if life.tunnels:
        lines.append("its connections, each a connect call (bxctl why CALL tells more):")
        lines += [_tunnel_words(call, tunnel) for call, tunnel in life.tunnels.items()]
    if life.result is not None:
        lines += _result_words(life.result, now)
    elif verdict is VerdictCode.RUN or (
        life.approval is not None and life.approval.body.outcome in _RAN
    ):
        lines.append("no result recorded yet: it runs, or brokerd stopped first")
    return lines


async def _waiting_now(home: Home) -> tuple[ApprovalView, ...]:
    """The calls waiting now, when brokerd answers (none when it does not)."""
    try:
        answer = await ask_broker(home, ApprovalsRequest())
    except DaemonUnreachable:
        return ()
    return tuple(answer.entries) if isinstance(answer, ApprovalsAnswer) else ()


async def _waiting(home: Home, call: str) -> ApprovalView | None:
    """The call's pending entry, when brokerd answers and the call waits."""
    return next((entry for entry in await _waiting_now(home) if entry.call == call), None)


def call_of_approval(home: Home, approval: str) -> str | None:
    """The call whose ask ``approval`` ended, from its approval record (the last, should
    a later boot have drawn the same id); None when no record names it."""
    found = None
    for _, record in LedgerReader(ledger_lines(ledger_files(home.ledger_dir))).records(
        mentioning=(approval.encode(),)
    ):
        if isinstance(record, NotARecord):
            continue
        if holds(record, Approval) and record.body.approval == approval:
            found = record.body.call
    return found


async def _waiting_call_of(home: Home, approval: str) -> str | None:
    """The call that waits under ``approval`` now, when brokerd answers."""
    entries = await _waiting_now(home)
    return next((entry.call for entry in entries if entry.approval == approval), None)


async def why(call: str, /, *, common: Common = DEFAULT) -> Exit:
    """Why a call ended as it did, from the ledger: the decision and the grant that
    decided it, the session's taint and trust, the owner's answer, the result.

    Parameters
    ----------
    call
        The call id (c-…), as chat and the ledger show it, or its approval id (a-…),
        as the approval screens show it.
    """
    if not CALL_ID.fullmatch(call) and not APPROVAL_ID.fullmatch(call):
        return fail(
            f"not a call or approval id: {call!r} (c- and 16 hex digits, or a- and 8)",
            Exit.USAGE,
        )
    home = common.resolve()
    try:
        if APPROVAL_ID.fullmatch(call):
            approval = call
            found = call_of_approval(home, approval) or await _waiting_call_of(home, approval)
            if found is None:
                return fail(
                    f"no approval {approval} in the ledger "
                    f"({ledger_files(home.ledger_dir).describe()}) nor waiting now",
                    Exit.FAILED,
                )
            call = found
        lives = call_story(home, call)
    except OSError as exc:
        return fail(f"{home.audit_log}: {exc.strerror}", Exit.USAGE)
    except SegmentProblem as exc:
        return fail(f"{home.ledger_dir}: {exc}", Exit.USAGE)
    if not lives:
        where = ledger_files(home.ledger_dir).describe()
        return fail(f"no call {call} in the ledger ({where})", Exit.FAILED)
    if common.json:
        # The latest life; an id used again in a later boot keeps the earlier ones.
        print_json({**life_json(lives[-1]), "earlier": [life_json(life) for life in lives[:-1]]})
        return Exit.DONE
    last = lives[-1]
    pending = last.approval is None and last.decision.body.verdict is VerdictCode.ASK
    waiting = await _waiting(home, call) if pending else None
    now = utc_now()
    stories = [describe_life(life, now) for life in lives[:-1]]
    stories.append(describe_life(last, now, waiting))
    print("\n\n".join("\n".join(printable(line) for line in story) for story in stories))
    return Exit.DONE
