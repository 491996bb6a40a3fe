"""The bxctl commands that talk to brokerd's admin.sock (docs/protocol.md):
approvals, approve, refuse, status, sessions."""

from __future__ import annotations

import datetime as dt
from typing import Any, TypeVar

import attrs
import orjson
import trio

from boxmaker.cli.admin_client import DaemonUnreachable, ask_broker
from boxmaker.cli.common import DEFAULT, Common, Exit, fail, print_json
from boxmaker.cli.daemons import daemon_states
from boxmaker.cli.terminal import is_interactive
from boxmaker.clock import format_utc, utc_now
from boxmaker.convert import APPROVAL_ID, converter
from boxmaker.printable import printable
from boxmaker.wire import (
    AdminAnswer,
    AdminRequest,
    ApprovalsAnswer,
    ApprovalsRequest,
    ApprovalView,
    Approve,
    Approved,
    ErrorFrame,
    Refuse,
    Refused,
    SessionsAnswer,
    SessionsRequest,
    StatusAnswer,
    StatusRequest,
)

WATCH_INTERVAL = 1.0

AnswerT = TypeVar("AnswerT", bound=AdminAnswer)


class _Failed(Exception):
    def __init__(self, code: Exit, message: str) -> None:
        super().__init__(message)
        self.code = code


async def _request(common: Common, request: AdminRequest, expected: type[AnswerT]) -> AnswerT:
    try:
        answer = await ask_broker(common.resolve(), request)
    except DaemonUnreachable as exc:
        raise _Failed(Exit.UNREACHABLE, str(exc)) from None
    if isinstance(answer, ErrorFrame):
        raise _Failed(Exit.FAILED, printable(f"{answer.code}: {answer.detail}"))
    if not isinstance(answer, expected):
        raise _Failed(Exit.FAILED, f"brokerd answered {type(answer).__name__}, not {expected}")
    return answer


def _approval_id(text: str) -> str:
    """Accept the id as printed (``a-1f2e3d4c``) or without its prefix."""
    candidate = text if text.startswith("a-") else "a-" + text
    if not APPROVAL_ID.fullmatch(candidate):
        raise _Failed(Exit.USAGE, f"not an approval id: {text!r} (a- and 8 hex digits)")
    return candidate


def _time_left(expires_at: dt.datetime, now: dt.datetime) -> str:
    """
    >>> now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    >>> _time_left(now + dt.timedelta(seconds=272.4), now)
    '4m 32s left'
    >>> _time_left(now - dt.timedelta(seconds=1), now)
    'expired'
    """
    seconds = int((expires_at - now).total_seconds())
    if seconds < 0:
        return "expired"
    minutes, seconds = divmod(seconds, 60)
    return f"{minutes}m {seconds:02d}s left" if minutes else f"{seconds}s left"


def approval_block(entry: ApprovalView, now: dt.datetime) -> str:
    """What the owner sees of one pending entry: enough to decide on."""
    grant = f"{entry.grant.id} (mode {entry.grant.mode})"
    if entry.grant.note:
        grant += f": {entry.grant.note}"
    trust = "untrusted" if entry.untrusted else "trusted"
    arguments = orjson.dumps(entry.arguments, option=orjson.OPT_SORT_KEYS).decode()
    # The arguments are the model's: JSON escapes control characters but not bidi
    # overrides, which could make a path read as another one. Each line is escaped on
    # its own: a newline in the tool name or the grant's note cannot start a line.
    return "\n".join(
        printable(line)
        for line in [
            f"{entry.approval}  {entry.tool}  ({_time_left(entry.expires_at, now)})",
            f"  arguments  {arguments}",
            f"  grant      {grant}",
            f"  session    {entry.session}: taint {entry.taint}, {trust}",
            f"  call       {entry.call}, asked {format_utc(entry.requested_at)}",
            f"  approve:   bxctl approve {entry.approval}",
            f'  refuse:    bxctl refuse {entry.approval} --reason "…"',
        ]
    )


def _show_approvals(common: Common, answer: ApprovalsAnswer) -> None:
    if common.json:
        print_json(converter.unstructure(answer.entries, list[ApprovalView]))
        return
    if not answer.entries:
        print("no pending approvals")
        return
    now = utc_now()
    print("\n\n".join(approval_block(entry, now) for entry in answer.entries))


async def approvals(*, watch: bool = False, common: Common = DEFAULT) -> Exit:
    """Show every pending approval: the tool, the call's arguments, the grant, the
    session's taint, the time left.

    Parameters
    ----------
    watch
        Keep watching. On a terminal: the list kept fresh, ↑/↓ or k/j choose an
        approval, y approves it, n refuses it with a reason, q quits. Elsewhere: print the
        list again whenever it changes (Ctrl-C stops).
    """
    if watch and not common.json and is_interactive():
        from boxmaker.cli.watch import watch_approvals  # it shows approval_block: a cycle

        return await watch_approvals(common.resolve())
    try:
        answer = await _request(common, ApprovalsRequest(), ApprovalsAnswer)
        _show_approvals(common, answer)
        shown = [entry.approval for entry in answer.entries]
        while watch:
            await trio.sleep(WATCH_INTERVAL)
            answer = await _request(common, ApprovalsRequest(), ApprovalsAnswer)
            current = [entry.approval for entry in answer.entries]
            if current != shown:
                print("\n---")
                _show_approvals(common, answer)
                shown = current
    except _Failed as exc:
        return fail(str(exc), exc.code)
    return Exit.DONE


def describe_approved(answer: Approved) -> str:
    """What approving did, as the owner reads it (escaped)."""
    suffix = f" ({answer.reason})" if answer.reason else ""
    return printable(f"{answer.call}: {answer.outcome}{suffix}")


async def approve(approval: str, /, *, note: str | None = None, common: Common = DEFAULT) -> Exit:
    """Approve a pending call. brokerd decides again on the current grants and state
    first, so the outcome may still be a denial (docs/protocol.md).

    Parameters
    ----------
    approval
        The approval id (a-…), as `bxctl approvals` shows it.
    note
        Why you approved (kept with the approval).
    """
    try:
        request = Approve(approval=_approval_id(approval), note=note)
        answer = await _request(common, request, Approved)
    except _Failed as exc:
        return fail(str(exc), exc.code)
    if common.json:
        print_json(converter.unstructure(answer, Approved))
    else:
        print(describe_approved(answer))
    # Approving something that is then denied or withdrawn did not do what was asked.
    return Exit.DONE if answer.outcome in {"ask", "allowed"} else Exit.FAILED


async def refuse(approval: str, /, *, reason: str, common: Common = DEFAULT) -> Exit:
    """Refuse a pending call; the reason is recorded and passed to the model.

    Parameters
    ----------
    approval
        The approval id (a-…), as `bxctl approvals` shows it.
    reason
        Why (1 to 500 characters). The model is told.
    """
    try:
        request = Refuse(approval=_approval_id(approval), reason=reason)
    except _Failed as exc:
        return fail(str(exc), exc.code)
    except ValueError as exc:
        return fail(str(exc), Exit.USAGE)
    try:
        answer = await _request(common, request, Refused)
    except _Failed as exc:
        return fail(str(exc), exc.code)
    if common.json:
        print_json(converter.unstructure(answer, Refused))
    else:
        print(printable(f"{answer.call}: refused"))
    return Exit.DONE


async def status(*, common: Common = DEFAULT) -> Exit:
    """Which daemons run (the model, brokerd, inferproxy, loopd), and brokerd's state:
    version, boot, ledger head and usability, grants, pending calls. Exit 3 when brokerd
    is down, 1 when it cannot record or decide."""
    running = daemon_states(common.resolve())
    try:
        answer = await _request(common, StatusRequest(), StatusAnswer)
    except _Failed as exc:
        if not common.json:
            print(_daemons_line(running))
        return fail(str(exc), exc.code)
    data: dict[str, Any] = attrs.asdict(answer)
    if common.json:
        print_json({**data, "daemons": running})
    else:
        print(_daemons_line(running))
        data["uptime_s"] = round(answer.uptime_s, 1)
        for key, value in data.items():
            print(printable(f"{key:14} {value}"))
    # A broker that cannot record or decide is up but failing: say so in the exit code.
    return Exit.DONE if answer.ledger_usable and answer.grants_valid else Exit.FAILED


def _daemons_line(running: dict[str, bool]) -> str:
    states = ", ".join(f"{name} {'up' if up else 'down'}" for name, up in running.items())
    return f"{'daemons':14} {states}"


async def sessions(*, common: Common = DEFAULT) -> Exit:
    """The sessions brokerd has seen: taint, trust, calls."""
    try:
        answer = await _request(common, SessionsRequest(), SessionsAnswer)
    except _Failed as exc:
        return fail(str(exc), exc.code)
    if common.json:
        print_json(converter.unstructure(answer.sessions, list[Any]))
    elif not answer.sessions:
        print("no sessions")
    else:
        for view in answer.sessions:
            trust = "untrusted" if view.untrusted else "trusted"
            print(printable(f"{view.session}  taint {view.taint}, {trust}, {view.calls} call(s)"))
    return Exit.DONE
