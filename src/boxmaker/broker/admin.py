"""admin.sock: the owner's requests (docs/protocol.md): approvals, approve, refuse, status,
sessions.

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
"""

from __future__ import annotations

import logging
import time
from typing import Final

import trio

from boxmaker.broker.pending import ApproveCommand, RefuseCommand
from boxmaker.broker.preview import preview_write
from boxmaker.broker.state import Broker
from boxmaker.core.approvals import PendingEntry
from boxmaker.core.call import (
    AdminReply,
    ApprovedReply,
    EarlierEnd,
    NotRecorded,
    late_owner_answer,
)
from boxmaker.core.grants import GrantsProblem
from boxmaker.core.labels import UNKNOWN
from boxmaker.core.state import StateUnreadable
from boxmaker.ndjson import FrameError, FrameReader, receive_frame_within
from boxmaker.state_files import read_state
from boxmaker.unix_sockets import DISCONNECTS, check_peer
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
    GrantRef,
    Refuse,
    Refused,
    RunEnd,
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
CALL_ENDED: Final = "the call ended before its approval was recorded (is brokerd stopping?)"


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
        approval_view(
            entry,
            previews.get(entry.approval, skipped) if entry.tool == "write_file" else None,
        )
        for entry in live
    ]


def approval_view(entry: PendingEntry, preview: ChangePreview | None = None) -> ApprovalView:
    """The entry as an ``approvals`` answer lists it."""
    grant = entry.grant
    return ApprovalView(
        approval=entry.approval,
        call=entry.call,
        session=entry.session,
        tool=entry.tool,
        arguments=entry.arguments,
        grant=GrantRef(id=grant.id, mode=grant.mode, note=grant.note),
        requested_at=entry.requested_at,
        expires_at=entry.expires_at_wall,
        taint=entry.taint,
        untrusted=entry.untrusted,
        preview=preview,
    )


async def _take(broker: Broker, request: Approve | Refuse) -> AdminAnswer:
    """approve / refuse: take the entry, hand its call the command, wait for the call's
    task to report how it was recorded."""
    approval = request.approval
    send, receive = trio.open_memory_channel[AdminReply](1)
    command: ApproveCommand | RefuseCommand
    if isinstance(request, Approve):
        command = ApproveCommand(note=request.note, reply=send)
    else:
        command = RefuseCommand(reason=request.reason, reply=send)
    with receive:
        ended = broker.pending.end(approval, command, now=trio.current_time())
        if ended is None or ended.command is not command:
            # Gone, or at or after its deadline (then the call's task records the
            # expiry, once: it is the only one that writes this call's records).
            send.close()
            earlier = EarlierEnd.EXPIRED if ended is not None else None
            code, detail = late_owner_answer(
                approval, earlier or broker.pending.earlier_end(approval)
            )
            return _error(ErrorCode(code), detail)
        try:
            reply = await receive.receive()
        except trio.EndOfChannel:
            return _error(ErrorCode.INTERNAL, CALL_ENDED)
    call = ended.entry.call
    if isinstance(reply, NotRecorded):
        return _error(ErrorCode.INTERNAL, reply.detail)
    if isinstance(reply, ApprovedReply):
        ran = reply.ran
        return Approved(
            outcome=reply.outcome,
            call=call,
            reason=reply.reason,
            detail=reply.detail,
            tool=ended.entry.tool,
            ran=None
            if ran is None
            else RunEnd(outcome="ok" if ran.ok else "failed", reason=ran.reason, detail=ran.detail),
        )
    return Refused(call=call)


async def _status(broker: Broker) -> StatusAnswer:
    grants = await broker.grants.current()
    problem = grants.describe() if isinstance(grants, GrantsProblem) else None
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
