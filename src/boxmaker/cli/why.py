"""``bxctl why CALL``: one call's story from the ledger, in sentences a person reads
(with --json, the same as an object): the decision with the grant that decided it and
the session's taint it saw, the owner's answer (who, when, why), the result.

It reads the records ``bxctl audit show --call`` reads (:func:`~boxmaker.cli.audit.
select_with_policies`). A record holds a grant's id, not its mode or note: those are
read from grants.toml as it is now, and said so; and the grant's text as it was when it
decided, from the version the last ``policy`` record before the decision names, kept
beside the ledger (docs/protocol.md, "Policy records"). Times are the owner's local ones
(:func:`~boxmaker.clock.local_time`). What the ledger says is outside text (the model
chose the tool and arguments, the owner the reasons): it is printed through
``printable``.
"""

from __future__ import annotations

from typing import Any, Final

import attrs
import orjson

from boxmaker.cli.admin_client import DaemonUnreachable, ask_broker
from boxmaker.cli.audit import grant_then_lines, select_with_policies
from boxmaker.cli.common import DEFAULT, Common, Exit, fail, print_json
from boxmaker.clock import local_time, parse_utc, utc_now
from boxmaker.convert import CALL_ID
from boxmaker.core.grants import GrantSet
from boxmaker.core.reasons import reason_words
from boxmaker.grants_file import load_grants
from boxmaker.home import Home
from boxmaker.ledger.policies import GrantThen, grant_then, policies_dir
from boxmaker.printable import printable
from boxmaker.wire import ApprovalsAnswer, ApprovalsRequest, ApprovalView


def _because(reason: object) -> str:
    code = str(reason)
    words = reason_words(code)
    return f"{code} ({words})" if words else code


def _grant(grants: GrantSet | None, grant_id: object) -> dict[str, Any] | None:
    """The grant as grants.toml has it now (mode, note), or only its id."""
    if grant_id is None:
        return None
    found = {"id": grant_id, "mode": None, "note": None, "in_grants_now": False}
    for grant in grants.grants if grants is not None else ():
        if grant.id == grant_id:
            found.update(mode=grant.mode.value, note=grant.note, in_grants_now=True)
    return found


def call_story(home: Home, call: str) -> list[dict[str, Any]]:
    """The lives of ``call`` in the ledger (one per decision: an id may be used again
    in a later boot), each ``{decision, approval, result}`` as recorded."""
    loaded = load_grants(home.grants_toml)
    grants = loaded if isinstance(loaded, GrantSet) else None
    lives: list[dict[str, Any]] = []
    selected, policy_of = select_with_policies(home.audit_log, call, None, None)
    for _, record in selected:
        if record is None:
            continue
        kind = record.get("kind")
        fields = {k: v for k, v in record.items() if k not in ("seq", "prev", "kind", "call")}
        if kind == "decision":
            fields["grant"] = _grant(grants, fields.get("grant"))
            if fields["grant"] is not None:
                seq = record.get("seq")
                policy = policy_of.get(seq) if type(seq) is int else None
                then = grant_then(policies_dir(home.audit_log), policy, str(record["grant"]))
                fields["grant"]["then"] = attrs.asdict(then)
            lives.append({"call": call, "decision": fields, "approval": None, "result": None})
        elif kind in ("approval", "result") and lives:
            lives[-1][str(kind)] = fields
    return lives


def _trust(untrusted: object) -> str:
    return "untrusted" if untrusted else "trusted"


def _when(at: object, now: Any) -> str:
    try:
        return local_time(parse_utc(str(at)), now)
    except ValueError:
        return str(at)


def _decision_words(decision: dict[str, Any], now: Any) -> list[str]:
    arguments = orjson.dumps(decision.get("arguments"), option=orjson.OPT_SORT_KEYS).decode()
    lines = [
        f"{decision.get('tool')} {arguments}, asked by session {decision.get('session')}",
        f"decided {_when(decision.get('at'), now)}: {decision.get('verdict')}",
    ]
    grant = decision.get("grant")
    if grant is not None:
        line = f"  grant {grant['id']}"
        if grant["in_grants_now"]:
            line += f" (in grants.toml now: mode {grant['mode']}"
            line += f', note "{grant["note"]}")' if grant["note"] else ")"
        else:
            line += " (no longer in grants.toml)"
        lines.append(line)
        lines += grant_then_lines(GrantThen(**grant["then"]), grant["id"], indent="    ")
    else:
        lines.append("  no grant decided it")
    if decision.get("reason") is not None:
        lines.append(f"  denied because {_because(decision['reason'])}")
    taint, untrusted = decision.get("taint"), decision.get("untrusted")
    lines.append(f"  the session was taint {taint}, {_trust(untrusted)}")
    return lines


APPROVAL_WORDS: Final = {
    "ask": "approved by the owner; it ran on their word",
    "allowed": "approved by the owner; a grant then allowed it without asking",
    "denied": "approved by the owner, but brokerd decided again and denied it",
    "withdrawn": "withdrawn; nothing ran",
    "refused": "refused by the owner",
    "expired": "expired: nobody answered in time",
}


def _approval_words(approval: dict[str, Any], now: Any) -> list[str]:
    outcome = str(approval.get("outcome"))
    line = f"{APPROVAL_WORDS.get(outcome, outcome)} {_when(approval.get('at'), now)}"
    line += f" (approval {approval.get('approval')}, by {approval.get('by')})"
    lines = [line]
    reason = approval.get("reason")
    if outcome == "refused" and reason is not None:
        lines.append(f'  the reason the model was told: "{reason}"')
    elif reason is not None and outcome != "expired":
        lines.append(f"  because {_because(reason)}")
    written = approval.get("grant_written")
    if written is not None:
        lines.append(f"  approved always: grant {written} was written to grants.toml first")
    if outcome in ("ask", "allowed", "denied"):
        taint, untrusted = approval.get("taint"), approval.get("untrusted")
        lines.append(f"  decided again on the session at taint {taint}, {_trust(untrusted)}")
    return lines


def _result_words(result: dict[str, Any], now: Any) -> list[str]:
    when = _when(result.get("at"), now)
    label = result.get("label") or {}
    size = result.get("output_bytes")
    if result.get("status") == "ok":
        line = f"ran {when}: ok, {size} bytes of output, labelled {label.get('taint')}"
        if label.get("untrusted"):
            line += " and untrusted"
        lines = [line]
    elif result.get("reason") == "requester_gone" and result.get("stopped"):
        lines = [f"began {when} and was stopped: requester_gone (its requester left while it ran)"]
    elif result.get("reason") == "requester_gone":
        lines = [f"did not run {when}: requester_gone (the requester left before it began)"]
    else:
        lines = [f"ran {when} and failed: {_because(result.get('reason'))}"]
    after = f"{result.get('taint_after')}, {_trust(result.get('untrusted_after'))}"
    lines.append(f"  the session is now taint {after}")
    return lines


def describe_life(life: dict[str, Any], now: Any, waiting: ApprovalView | None = None) -> list[str]:
    """The sentences of one life of a call; ``waiting``: its entry when it waits now."""
    lines = [f"call {life['call']}: ", *_decision_words(life["decision"], now)]
    lines[0] += lines.pop(1)
    if life["approval"] is not None:
        lines += _approval_words(life["approval"], now)
    elif waiting is not None:
        lines.append(
            f"waits for you now: approval {waiting.approval}, expires "
            f"{local_time(waiting.expires_at, now)}; bxctl approve {waiting.approval}"
        )
    elif life["decision"].get("verdict") == "ask":
        lines.append("no answer recorded yet: it waits, or brokerd stopped first")
    if life["result"] is not None:
        lines += _result_words(life["result"], now)
    elif life["decision"].get("verdict") == "run" or (
        life["approval"] is not None and life["approval"].get("outcome") in ("ask", "allowed")
    ):
        lines.append("no result recorded yet: it runs, or brokerd stopped first")
    return lines


async def _waiting(home: Home, call: str) -> ApprovalView | None:
    """The call's pending entry, when brokerd answers and the call waits."""
    try:
        answer = await ask_broker(home, ApprovalsRequest())
    except DaemonUnreachable:
        return None
    if not isinstance(answer, ApprovalsAnswer):
        return None
    return next((entry for entry in answer.entries if entry.call == call), None)


async def why(call: str, /, *, common: Common = DEFAULT) -> Exit:
    """Why a call ended as it did, from the ledger: the decision and the grant that
    decided it, the session's taint and trust, the owner's answer, the result.

    Parameters
    ----------
    call
        The call id (c-…), as chat, approvals and the ledger show it.
    """
    if not CALL_ID.fullmatch(call):
        return fail(f"not a call id: {call!r} (c- and 16 hex digits)", Exit.USAGE)
    home = common.resolve()
    try:
        lives = call_story(home, call)
    except OSError as exc:
        return fail(f"{home.audit_log}: {exc.strerror}", Exit.USAGE)
    if not lives:
        return fail(f"no call {call} in the ledger ({home.audit_log})", Exit.FAILED)
    if common.json:
        # The latest life; an id used again in a later boot keeps the earlier ones.
        print_json({**lives[-1], "earlier": lives[:-1]})
        return Exit.DONE
    last = lives[-1]
    pending = last["approval"] is None and last["decision"].get("verdict") == "ask"
    waiting = await _waiting(home, call) if pending else None
    now = utc_now()
    stories = [describe_life(life, now) for life in lives[:-1]]
    stories.append(describe_life(last, now, waiting))
    print("\n\n".join("\n".join(printable(line) for line in story) for story in stories))
    return Exit.DONE
