"""admin.sock: the owner's requests (docs/protocol.md): approvals, approve, refuse, status,
sessions, reload_grants.

Several requests per connection: the first within 5 s of connecting, each later one
within 60 s of the previous answer. A line that is not a request is answered
``error bad_frame`` and the connection goes on (its framing is intact); a frame that
breaks the framing (too long, cut off) is answered and the connection closed, since the
stream is out of step. admin.sock has no ``forbidden_kind`` code: a broker.sock kind
sent here is a ``bad_frame``.

approve and refuse take the entry out of the table and hand its waiting call the
command in the same step (:meth:`~boxmaker.broker.pending.PendingCalls.end`); the call's
own task does the re-decision, the last look and the one approval record
(:mod:`boxmaker.core.call`), and reports the outcome back here. That side does the work
because it owns the connection the last look peeks at, and so one task writes every
record of a call, in order.

An approve with ``always`` first writes the grant (:mod:`boxmaker.core.grant_scope`
builds it, :mod:`boxmaker.home.grants_edit` writes it, in a worker thread) while the entry
still waits, and re-reads the grants, so the re-decision and every later call decide
with it. A grant that cannot be written fails the approve (``error
grant_not_written``) and the call still waits; a grant written for an entry that ended
meanwhile (it expired, someone else answered) is removed again. Each of these steps'
decision and answer is :mod:`boxmaker.core.owner_answer`'s; the table, the file and the
waiting call are this module's.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from typing import Final

import trio

from boxmaker.broker.pending import ApproveCommand, RefuseCommand
from boxmaker.broker.preview import preview_write
from boxmaker.broker.sandbox_check import sandbox_problem
from boxmaker.broker.state import Broker
from boxmaker.core.approvals import PendingEntry
from boxmaker.core.call_events import AdminReply, ApprovedReply
from boxmaker.core.grant_parse import GrantsProblem
from boxmaker.core.grant_scope import Scope
from boxmaker.core.labels import UNKNOWN
from boxmaker.core.owner_answer import (
    Found,
    OwnerError,
    after_take,
    grant_to_write,
    late,
    not_written,
    unanswered,
)
from boxmaker.core.state import StateUnreadable
from boxmaker.formats.clock import utc_now
from boxmaker.home.grants_edit import GrantsEditError, add_grant, owner_name, remove_grant
from boxmaker.home.state_files import read_state
from boxmaker.runtime.ndjson import FrameError, FrameReader, receive_frame_within
from boxmaker.runtime.unix_sockets import DISCONNECTS, check_peer
from boxmaker.wire import (
    AdminAnswer,
    AdminRequest,
    ApprovalsAnswer,
    ApprovalsRequest,
    ApprovalView,
    Approve,
    Approved,
    BadFrame,
    ChangePreview,
    ErrorCode,
    ErrorFrame,
    GrantsReloaded,
    Refuse,
    Refused,
    ReloadGrantsRequest,
    SessionsAnswer,
    SessionsRequest,
    SessionView,
    StatusAnswer,
    StatusRequest,
    decode_admin_request,
    encode_frame,
)

log = logging.getLogger("boxmaker.brokerd")

FIRST_REQUEST_S: Final = 5.0
LATER_REQUEST_S: Final = 60.0
SEND_S: Final = 10.0
MAX_PREVIEWS: Final = 32
"""write_file previews read per ``approvals`` answer (:func:`_with_previews`)."""
PREVIEWS_S: Final = 2.0
"""Seconds of previews per ``approvals`` answer; the later writes are not shown."""


def _error(code: ErrorCode, detail: str) -> ErrorFrame:
    return ErrorFrame(code=code, detail=detail)


async def handle_admin_connection(broker: Broker, stream: trio.SocketStream) -> None:
    """trio.serve_listeners' handler for admin.sock. Owner's uid only."""
    try:
        if not await check_peer(stream, allowed=broker.owner_uid, name="admin.sock"):
            return
        await _serve(broker, stream)
    except DISCONNECTS as exc:
        log.debug("admin.sock: the client left (%s)", type(exc).__name__)
    except Exception:
        log.exception("admin.sock: a connection failed")


async def _send(stream: trio.SocketStream, frame: AdminAnswer) -> None:
    with trio.fail_after(SEND_S):
        await stream.send_all(encode_frame(frame))


async def _serve(broker: Broker, stream: trio.SocketStream) -> None:
    reader = FrameReader(stream)
    within = FIRST_REQUEST_S
    while True:
        try:
            line = await receive_frame_within(reader, within)
        except trio.TooSlowError:
            return
        except FrameError as exc:
            await _send(stream, _error(ErrorCode.BAD_FRAME, str(exc)))
            return
        if line is None:
            return
        try:
            request = decode_admin_request(line)
        except BadFrame as exc:
            answer: AdminAnswer = _error(ErrorCode.BAD_FRAME, exc.detail)
        else:
            try:
                answer = await answer_request(broker, request)
            except Exception:
                log.exception("admin.sock: %s failed", type(request).__name__)
                answer = _error(ErrorCode.INTERNAL, "brokerd failed to answer; see its log")
        await _send(stream, answer)
        within = LATER_REQUEST_S


async def answer_request(broker: Broker, request: AdminRequest) -> AdminAnswer:
    """The answer to one admin request."""
    if isinstance(request, ApprovalsRequest):
        live = broker.table.live(trio.current_time())
        return ApprovalsAnswer(entries=await _with_previews(broker, live))
    if isinstance(request, Approve | Refuse):
        return await _take(broker, request)
    if isinstance(request, StatusRequest):
        return await _status(broker)
    if isinstance(request, SessionsRequest):
        return await _sessions(broker)
    if isinstance(request, ReloadGrantsRequest):
        return await reload_grants(broker)
    raise TypeError(f"unhandled admin request {type(request).__name__}")  # pragma: no cover


async def _with_previews(broker: Broker, live: list[PendingEntry]) -> list[ApprovalView]:
    """The entries as ``approvals`` lists them, each write_file with the change it would
    make to the file as it is now (preview.py), read in one worker thread. At most
    :data:`MAX_PREVIEWS` are read per answer: a model that made thousands of writes wait
    must not make each list read thousands of files."""
    writes = [entry for entry in live if entry.tool == "write_file"]
    shown = writes[:MAX_PREVIEWS]
    workspace, rules = broker.workspace, broker.config.labels

    def read_all() -> dict[str, ChangePreview]:
        # A time budget as well: each preview is bounded, 32 of them at their worst are
        # not (the owner would wait seconds for the list).
        previews: dict[str, ChangePreview] = {}
        ends = time.monotonic() + PREVIEWS_S
        for entry in shown:
            if time.monotonic() >= ends:
                break
            path, content = str(entry.arguments["path"]), str(entry.arguments["content"])
            previews[entry.approval] = preview_write(workspace, rules, path, content)
        return previews

    previews = await broker.to_thread(read_all) if shown else {}
    skipped = ChangePreview(
        summary=f"not shown: only the first writes are read (at most {MAX_PREVIEWS}, "
        f"{PREVIEWS_S:g} s); answer some of them first"
    )
    return [
        ApprovalView.of(
            entry,
            previews.get(entry.approval, skipped) if entry.tool == "write_file" else None,
        )
        for entry in live
    ]


async def _take(broker: Broker, request: Approve | Refuse) -> AdminAnswer:
    """approve / refuse: take the entry, hand its call the command, wait for the call's
    task to report how it was recorded. What each step answers is
    :mod:`boxmaker.core.owner_answer`'s."""
    approval = request.approval
    written: str | None = None
    if isinstance(request, Approve) and request.always is not None:
        wrote = await _write_always(broker, request)
        if isinstance(wrote, OwnerError):
            return _owner_error(wrote)
        written = wrote
    send, receive = trio.open_memory_channel[AdminReply](1)
    command: ApproveCommand | RefuseCommand
    if isinstance(request, Approve):
        command = ApproveCommand(note=request.note, reply=send, grant_written=written)
    else:
        command = RefuseCommand(reason=request.reason, reply=send)
    with receive:
        ended = broker.pending.end(approval, command, now=trio.current_time())
        if ended is None:
            found = Found.GONE
        else:
            # At or after its deadline the expiry was delivered instead (the call's task
            # records it, once: it is the only one that writes this call's records).
            found = Found.WAITING if ended.command is command else Found.EXPIRED
        then = after_take(
            approval, found, written=written, earlier=broker.pending.earlier_end(approval)
        )
        if then.error is not None:
            send.close()
            if then.unwrite is not None:
                await _unwrite(broker, then.unwrite)
            return _owner_error(then.error)
        assert ended is not None
        reply: AdminReply | None
        try:
            reply = await receive.receive()
        except trio.EndOfChannel:
            reply = None
    error = unanswered(reply)
    if error is not None:
        return _owner_error(error)
    call = ended.entry.call
    if isinstance(reply, ApprovedReply):
        return Approved.of(reply, call=call, tool=ended.entry.tool, grant_written=written)
    return Refused(call=call)


def _owner_error(error: OwnerError) -> ErrorFrame:
    return _error(ErrorCode(error.code), error.detail)


async def _write_always(broker: Broker, request: Approve) -> str | OwnerError:
    """Write the grant an approve-always asks for, and decide with it from now on: its
    id, or the error to answer (the entry is left waiting)."""
    always = request.always
    assert always is not None
    approval = request.approval
    entry = broker.table.get(approval)
    found = Found.of(entry, trio.current_time())
    gone = late(approval, found, broker.pending.earlier_end(approval))
    if gone is not None:
        return gone
    assert entry is not None
    planned = grant_to_write(
        entry,
        await broker.grants.current(),
        scope=Scope(always.scope),
        lasting=None if always.for_s is None else dt.timedelta(seconds=always.for_s),
        owner=owner_name(broker.owner_uid),
        now=utc_now(),
        workspace=str(broker.workspace),
        external=broker.gateway.catalogue(),
    )
    if isinstance(planned, OwnerError):
        return planned
    grant = planned.grant
    try:
        await broker.to_thread(add_grant, broker.home.grants_toml, planned.table, grant)
    except (GrantsEditError, OSError) as exc:
        log.warning("approve %s --always: %s", approval, exc)
        return not_written(str(exc))
    log.info("approve %s --always: wrote grant %s", approval, grant.id)
    await broker.grants.current(force=True)
    return grant.id


async def _unwrite(broker: Broker, grant_id: str) -> None:
    """The approve-always's entry ended before its approve took it: its grant goes again."""
    try:
        await broker.to_thread(remove_grant, broker.home.grants_toml, grant_id)
    except (GrantsEditError, OSError) as exc:
        log.warning(
            "grant %s was written for an approval that ended; removing it failed: %s", grant_id, exc
        )
    else:
        log.info("grant %s removed again: its approval ended before the approve", grant_id)
    await broker.grants.current(force=True)


async def reload_grants(broker: Broker) -> GrantsReloaded:
    """``reload_grants``: re-read grants.toml now, as SIGHUP does."""
    grants = await broker.grants.current(force=True)
    if isinstance(grants, GrantsProblem):
        return GrantsReloaded(valid=False, grants=0, problem=grants.describe())
    return GrantsReloaded(valid=True, grants=len(grants.grants), problem=None)


async def _status(broker: Broker) -> StatusAnswer:
    grants = await broker.grants.current()
    problem = grants.describe() if isinstance(grants, GrantsProblem) else None
    shell = await broker.to_thread(
        sandbox_problem, broker.workspace, broker.config.runner.sandbox_uid
    )
    return StatusAnswer(
        version=broker.version,
        boot=broker.boot,
        head=broker.writer.head,
        ledger_usable=broker.writer.usable,
        grants_valid=problem is None,
        grants_problem=problem,
        pending=len(broker.table.live(trio.current_time())),
        sessions=len(broker.sessions),
        uptime_s=max(0.0, trio.current_time() - broker.started_at),
        sandbox_bounds=broker.sandboxes.bounds.describe(),
        shell_ready=shell is None,
        shell_problem=shell,
        witness_lagging=broker.witness_lagging(),
    )


async def _sessions(broker: Broker) -> SessionsAnswer:
    views = []
    for session, calls in list(broker.sessions.items()):
        state = await broker.to_thread(read_state, broker.sessions_dir, session)
        # An unreadable state shows as the records carry it: secret, untrusted.
        label = UNKNOWN if isinstance(state, StateUnreadable) else state
        views.append(
            SessionView(session=session, taint=label.taint, untrusted=label.untrusted, calls=calls)
        )
    return SessionsAnswer(sessions=views)
