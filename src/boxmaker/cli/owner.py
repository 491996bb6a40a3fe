"""The bxctl commands that talk to brokerd's admin.sock (docs/protocol.md):
approvals, approve, refuse, status (cli/sessions.py has sessions)."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Final, TypeVar

import attrs
import orjson
import trio
from cyclopts import Parameter

from boxmaker.cli.admin_client import (
    REPLY_TIMEOUT,
    DaemonUnreachable,
    approve_timeout,
    ask_broker,
)
from boxmaker.cli.change import change_lines
from boxmaker.cli.common import DEFAULT, Common, Exit, fail, print_json
from boxmaker.cli.daemon_processes import daemon_states
from boxmaker.cli.preflight import model_problem
from boxmaker.cli.terminal import is_interactive
from boxmaker.core.grant_scope import Scope, ScopeProblem, parse_duration
from boxmaker.core.grants import MCP_CLIENT
from boxmaker.core.reasons import reason_words
from boxmaker.core.vocabulary import ApprovalOutcome
from boxmaker.formats.clock import local_time, utc_now
from boxmaker.formats.convert import APPROVAL_ID, converter
from boxmaker.formats.printable import printable
from boxmaker.home.config import ConfigError, load_config
from boxmaker.home.paths import Home, HomeError
from boxmaker.home.regular_file import read_regular_file
from boxmaker.ledger.cosignatures import RUNBOOK_WITNESS, WitnessView, witness_views
from boxmaker.ledger.signed_note import NoteError, NoteVerifier, parse_vkey
from boxmaker.ledger.tree import tree_dir
from boxmaker.wire import (
    AdminAnswer,
    AdminRequest,
    Always,
    ApprovalsAnswer,
    ApprovalsRequest,
    ApprovalView,
    Approve,
    Approved,
    ChangePreview,
    ErrorFrame,
    Refuse,
    Refused,
    StatusAnswer,
    StatusRequest,
)

WATCH_INTERVAL = 1.0
PREVIEW_FALLBACK_LINES: Final = 200
RAN: Final = frozenset({ApprovalOutcome.ASK, ApprovalOutcome.ALLOWED})
"""Approve outcomes that let the call run."""

AnswerT = TypeVar("AnswerT", bound=AdminAnswer)


class _Failed(Exception):
    def __init__(self, code: Exit, message: str) -> None:
        super().__init__(message)
        self.code = code


async def _request(
    common: Common, request: AdminRequest, expected: type[AnswerT], *, timeout: float | None = None
) -> AnswerT:
    home = common.resolve()
    try:
        answer = await ask_broker(home, request, timeout=timeout or REPLY_TIMEOUT)
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


def _always(always: bool, lasting: str | None, scope: Scope) -> Always | None:
    """approve's ``always`` field from the options (--for and --scope need --always)."""
    if not always:
        if lasting is not None or scope is not Scope.EXACT:
            raise _Failed(Exit.USAGE, "--for and --scope go with --always")
        return None
    if lasting is None:
        return Always(scope=scope.value)
    duration = parse_duration(lasting)
    if isinstance(duration, ScopeProblem):
        raise _Failed(Exit.USAGE, f"--for: {duration.message}")
    return Always(scope=scope.value, for_s=int(duration.total_seconds()))


def _arguments_shown(entry: ApprovalView) -> str:
    """The arguments as JSON; a write_file's content is left to the change below it."""
    arguments = entry.arguments
    if entry.tool == "write_file" and "content" in arguments:
        arguments = {key: value for key, value in arguments.items() if key != "content"}
    return orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS).decode()


def _change_lines(entry: ApprovalView) -> list[str]:
    """A write_file's change: brokerd's preview, or (from a brokerd without one) the
    content as added lines; every byte change visible (:mod:`boxmaker.cli.change`)."""
    if entry.tool != "write_file":
        return []
    preview = entry.preview
    if preview is None:
        content = str(entry.arguments.get("content", ""))
        lines = ["+" + line for line in content.split("\n")]
        preview = ChangePreview(
            summary=f"{len(content.encode('utf-8', 'surrogatepass'))} bytes of content",
            lines=lines[:PREVIEW_FALLBACK_LINES],
            lines_left_out=max(0, len(lines) - PREVIEW_FALLBACK_LINES),
        )
    lines = [f"  change     {preview.summary}"]
    lines += [f"    {line}" for line in change_lines(preview.lines)]
    if preview.lines_left_out:
        more = preview.lines_left_out
        lines.append(f"    … {more} more line{'s' if more != 1 else ''}")
    return lines


def _client_may_answer(entry: ApprovalView) -> list[str]:
    """Where the grant lets the MCP client's own prompt answer, the owner is told so."""
    if MCP_CLIENT not in entry.approvers:
        return []
    return ["  answers    yours, or the MCP client's own prompt (the grant's approvers)"]


def approval_block(entry: ApprovalView, now: dt.datetime) -> str:
    """What the owner sees of one pending entry: enough to decide on. Times in the
    owner's local zone (:func:`~boxmaker.formats.clock.local_time`)."""
    grant = f"{entry.grant.id} (mode {entry.grant.mode})"
    if entry.grant.note:
        grant += f": {entry.grant.note}"
    trust = "untrusted" if entry.untrusted else "trusted"
    # The arguments are the model's: JSON escapes control characters but not bidi
    # overrides, which could make a path read as another one. Each line is escaped on
    # its own: a newline in the tool name, the grant's note or the file cannot start a
    # line.
    return "\n".join(
        printable(line)
        for line in [
            f"{entry.approval}  {entry.tool}  expires {local_time(entry.expires_at, now)}",
            f"  arguments  {_arguments_shown(entry)}",
            *_change_lines(entry),
            f"  grant      {grant}",
            *_client_may_answer(entry),
            f"  session    {entry.session}: taint {entry.taint}, {trust}",
            f"  call       {entry.call}, asked {local_time(entry.requested_at, now)}",
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
        approval, y approves it, a approves it always (a grant for exactly this call,
        no expiry), n refuses it with a reason, q quits. Elsewhere: print the
        list again whenever it changes (Ctrl-C stops).
    """
    if watch and not common.json and is_interactive():
        from boxmaker.cli.watch import watch_approvals  # it shows approval_block: a cycle

        return await watch_approvals(common.resolve())
    try:
        answer = await _request(common, ApprovalsRequest(), ApprovalsAnswer)
        _show_approvals(common, answer)
        shown: list[str] | None = [entry.approval for entry in answer.entries]
        while watch:
            await trio.sleep(WATCH_INTERVAL)
            try:
                answer = await _request(common, ApprovalsRequest(), ApprovalsAnswer)
            except _Failed as exc:
                if exc.code is not Exit.UNREACHABLE:
                    raise
                # Restarted or stopped: waited for, said once each way.
                if shown is not None:
                    fail(f"lost brokerd: {exc}; asking again every {WATCH_INTERVAL:g} s")
                    shown = None
                continue
            if shown is None:
                fail("brokerd answers again")
            current = [entry.approval for entry in answer.entries]
            if current != shown:
                print("\n---")
                _show_approvals(common, answer)
                shown = current
    except _Failed as exc:
        return fail(str(exc), exc.code)
    return Exit.DONE


def describe_approved(answer: Approved) -> str:
    """What approving did, in words (escaped): it ran and how it ended, or why it did
    not run. Never a bare outcome code."""
    tool = answer.tool or "the call"
    call = answer.call
    reason = f"{answer.reason}" if answer.reason else "no reason given"
    if answer.detail:
        reason += f" — {answer.detail}"
    if answer.outcome == ApprovalOutcome.DENIED:
        text = f"approved {call}, but brokerd decided again and denied it: {reason}"
    elif answer.outcome == ApprovalOutcome.WITHDRAWN:
        words = reason_words(answer.reason)
        why = f"{words} before it could run" if words else str(answer.reason)
        text = f"withdrawn {call}: {why}; nothing ran"
    elif answer.ran is None:
        text = f"approved {call}: {tool} runs"
    elif answer.ran.outcome == "ok" and answer.ran.detail:
        # A tunnel is answered as it opens, not at its end (docs/decisions.md): its words.
        text = f"approved {call}: {tool}: {answer.ran.detail}"
    elif answer.ran.outcome == "ok":
        text = f"approved {call}: {tool} ran (ok)"
    else:
        failed = str(answer.ran.reason)
        if answer.ran.detail:
            failed += f" — {answer.ran.detail}"
        text = f"approved {call}: {tool} ran and failed: {failed}"
    if answer.grant_written is not None:
        text += (
            f"; grant {answer.grant_written} written: the same call runs without asking "
            "from now on (an untrusted session is still asked)"
        )
    elif answer.outcome == ApprovalOutcome.ALLOWED:
        text += " (a grant now lets it run without asking)"
    return printable(text)


def describe_answer(decision: Approve | Refuse, answer: AdminAnswer) -> str:
    """What the owner's answer to a waiting call did, in words (escaped): the same line on
    every screen that answers one."""
    if isinstance(answer, Approved):
        return describe_approved(answer)
    if isinstance(answer, Refused) and isinstance(decision, Refuse):
        return printable(f"refused {answer.call}: the model is told: {decision.reason}")
    if isinstance(answer, ErrorFrame):
        return printable(f"{decision.approval}: {answer.code}: {answer.detail}")
    return printable(f"{decision.approval}: brokerd answered {type(answer).__name__}")


async def approve(
    approval: str,
    /,
    *,
    note: str | None = None,
    always: bool = False,
    for_: Annotated[str | None, Parameter(name="--for")] = None,
    scope: Scope = Scope.EXACT,
    common: Common = DEFAULT,
) -> Exit:
    """Approve a pending call. brokerd decides again on the current grants and state
    first, so the outcome may still be a denial (docs/protocol.md).

    Parameters
    ----------
    approval
        The approval id (a-…), as `bxctl approvals` shows it.
    note
        Why you approved (kept with the approval).
    always
        Also write a grant to grants.toml that runs this call without asking from now
        on (docs/runbook.md#grants-edit): exactly this path, command line or host; an
        untrusted session is still asked.
    for_
        With --always: the grant expires after this long (30m, 2h, 7d).
    scope
        With --always: exact (default) or dir (a file tool's path's directory, not below).
    """
    try:
        request = Approve(
            approval=_approval_id(approval), note=note, always=_always(always, for_, scope)
        )
        timeout = approve_timeout(common.resolve())
        answer = await _request(common, request, Approved, timeout=timeout)
    except _Failed as exc:
        return fail(str(exc), exc.code)
    if common.json:
        print_json(converter.unstructure(answer, Approved))
    else:
        print(describe_approved(answer))
    # Approving something that is then denied or withdrawn did not do what was asked.
    return Exit.DONE if answer.outcome in RAN else Exit.FAILED


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
        print(describe_answer(request, answer))
    return Exit.DONE


def _external_model(home: Home) -> str | None:
    """``[model] url``, when config.toml can be read and sets one."""
    try:
        return load_config(home).model.url
    except (ConfigError, HomeError):
        return None


def _needed(home: Home, running: dict[str, bool]) -> dict[str, bool]:
    """The daemons this home runs: the built-in model only without ``[model] url``
    (an external model's state is its own check's, :func:`status`)."""
    try:
        external = load_config(home).model.url is not None
    except (ConfigError, HomeError):
        # Unknown: the daemons keep the config they started with (a broken file changes
        # nothing), so only what runs is told, and a model not running is not a fault.
        external = not running.get("model", False)
    return {name: up for name, up in running.items() if not (external and name == "model")}


def _shown(value: object) -> str:
    """A status value as a person reads it: yes/no, "none", not Python's True/None."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "none"
    return str(value)


async def status(*, common: Common = DEFAULT) -> Exit:
    """Which daemons run (the model, brokerd, inferproxy, loopd), and brokerd's state:
    version, boot, ledger head and usability, grants, pending calls. Exit 3 when brokerd
    is unreachable; 1 when another daemon is down, or brokerd cannot record or decide.
    With --json an object in every case: brokerd's fields are null when it is down."""
    home = common.resolve()
    running = daemon_states(home)
    down = [name for name, up in _needed(home, running).items() if not up]
    model_down = None
    if _external_model(home) is not None and running["inferproxy"]:
        # An external model is no daemon of ours, but no chat runs without it: asked too.
        model_down = await trio.to_thread.run_sync(model_problem, home)
        running["model"] = model_down is None
    data: dict[str, Any] = dict.fromkeys(attrs.fields_dict(StatusAnswer))
    problem: str | None = None
    try:
        answer = await _request(common, StatusRequest(), StatusAnswer)
    except _Failed as exc:
        code, problem = exc.code, str(exc)
    else:
        data = attrs.asdict(answer)
        usable = answer.ledger_usable and answer.grants_valid
        # A broker that cannot record or decide is up but failing: the exit code says so.
        code = Exit.DONE if usable and not down and model_down is None else Exit.FAILED
    witnesses = await trio.to_thread.run_sync(_witness_views, home)
    if common.json:
        problems = {"problem": problem, "model_problem": model_down}
        shown = [attrs.asdict(view) for view in witnesses]
        print_json({**data, "daemons": running, "down": down, **problems, "witnesses": shown})
        return code
    print(_daemons_line(running))
    for view in witnesses:
        print(printable(f"{'witness':14} {_witness_line(view)}"))
    if problem is not None:
        return fail(problem, code)
    data["uptime_s"] = round(data["uptime_s"], 1)
    for key, value in data.items():
        print(printable(f"{key:14} {_shown(value)}"))
    if model_down is not None:
        fail(model_down, code)
    if down:
        return fail(f"down: {', '.join(down)}; `bxctl up` starts what is missing", code)
    return code


def _witness_views(home: Home) -> list[WitnessView]:
    """Each ``[[witness]]``'s lag, from the files (brokerd need not run); none when
    config.toml cannot be read."""
    try:
        config = load_config(home)
    except (ConfigError, HomeError):
        return []
    if not config.witness:
        return []
    try:
        ledger: NoteVerifier | None = parse_vkey(
            read_regular_file(home.ledger_vkey, limit=4096).decode().strip()
        )
    except (OSError, UnicodeDecodeError, NoteError):
        ledger = None
    return witness_views(tree_dir(home), config.witness, ledger, config.ledger.witness_max_lag)


def _witness_line(view: WitnessView) -> str:
    """``w1: cosigned size 4000, 1000 records behind (lagging)`` or ``w1: never
    cosigned (lagging)``: the lag counts records up to the newest checkpoint."""
    if view.cosigned_size is None:
        text = f"{view.name}: never cosigned"
    elif view.lag is None:
        text = f"{view.name}: cosigned size {view.cosigned_size}"
    else:
        text = f"{view.name}: cosigned size {view.cosigned_size}, {view.lag} records behind"
    if view.lagging:
        text += f" (lagging; see {RUNBOOK_WITNESS})"
    return text


def _daemons_line(running: dict[str, bool]) -> str:
    states = ", ".join(f"{name} {'up' if up else 'down'}" for name, up in running.items())
    return f"{'daemons':14} {states}"
