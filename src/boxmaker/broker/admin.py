"""admin.sock: the owner's requests (spec §7): approvals, approve, refuse, status, sessions.

Several requests per connection: the first within 5 s of connecting, each later one
within 60 s of the previous answer. A line that is not a request is answered
``error bad_frame`` and the connection goes on (its framing is intact); a frame that
breaks the framing (too long, cut off) is answered and the connection closed, since the
stream is out of step. admin.sock has no ``forbidden_kind`` code: a broker.sock kind
sent here is a ``bad_frame``.

approve and refuse take the entry out of the table and hand its waiting call the
command in the same step; the call's own task does the re-decision, the last look and
the one approval record, and reports the outcome back here (see
:mod:`boxmaker.broker.state` for why that side).
"""

from __future__ import annotations

import logging
from typing import Final

import trio

from boxmaker.broker.connection import DISCONNECTS
from boxmaker.broker.listeners import check_peer
from boxmaker.broker.state import (
    AdminReply,
    ApproveCommand,
    ApprovedReply,
    Broker,
    ExpireCommand,
    NotRecorded,
    RefuseCommand,
)
from boxmaker.core.approvals import Expired, Missing
from boxmaker.core.grants import GrantsProblem
from boxmaker.core.labels import UNKNOWN
from boxmaker.core.state import StateUnreadable
from boxmaker.ndjson import FrameError, FrameReader, receive_frame_within
from boxmaker.state_files import read_state
from boxmaker.wire import (
    AdminAnswer,
    AdminRequest,
    ApprovalsAnswer,
    ApprovalsRequest,
    Approve,
    Approved,
    BadFrame,
    ErrorCode,
    ErrorFrame,
    Refuse,
    Refused,
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
CALL_ENDED: Final = "the call ended before its approval was recorded (is brokerd stopping?)"


def _error(code: ErrorCode, detail: str) -> ErrorFrame:
    return ErrorFrame(code=code, detail=detail)


async def handle_admin_connection(broker: Broker, stream: trio.SocketStream) -> None:
    """trio.serve_listeners' handler for admin.sock (spec §7). Owner's uid only."""
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
    """The answer to one admin request (spec §7)."""
    if isinstance(request, ApprovalsRequest):
        live = broker.table.live(trio.current_time())
        return ApprovalsAnswer(entries=[entry.view() for entry in live])
    if isinstance(request, Approve | Refuse):
        return await _take(broker, request)
    if isinstance(request, StatusRequest):
        return await _status(broker)
    if isinstance(request, SessionsRequest):
        return await _sessions(broker)
    raise TypeError(f"unhandled admin request {type(request).__name__}")  # pragma: no cover


async def _take(broker: Broker, request: Approve | Refuse) -> AdminAnswer:
    """approve / refuse (spec §6.3, §6.4): take the entry, hand its call the command,
    wait for the call's task to report how it was recorded."""
    approval = request.approval
    taken = broker.table.take(approval, now=trio.current_time())
    if isinstance(taken, Missing):
        if broker.was_expired(approval):
            return _error(ErrorCode.EXPIRED, f"approval {approval} expired")
        return _error(ErrorCode.NO_SUCH_APPROVAL, f"no pending approval {approval}")
    waiter = broker.waiters.get(approval)
    if waiter is None:  # pragma: no cover - an entry's waiter lives as long as it does
        return _error(ErrorCode.INTERNAL, f"approval {approval} has no waiting call")
    if isinstance(taken, Expired):
        # Spec §6.5: at or after expires_at the same expiry happens; the call's task
        # records it (once: it is the only one that writes this call's records).
        broker.note_expired(approval)
        waiter.deliver(ExpireCommand())
        return _error(ErrorCode.EXPIRED, f"approval {approval} expired")
    call = taken.entry.call
    send, receive = trio.open_memory_channel[AdminReply](1)
    if isinstance(request, Approve):
        waiter.deliver(ApproveCommand(note=request.note, reply=send))
    else:
        waiter.deliver(RefuseCommand(reason=request.reason, reply=send))
    with receive:
        try:
            reply = await receive.receive()
        except trio.EndOfChannel:
            return _error(ErrorCode.INTERNAL, CALL_ENDED)
    if isinstance(reply, NotRecorded):
        return _error(ErrorCode.INTERNAL, reply.detail)
    if isinstance(reply, ApprovedReply):
        return Approved(outcome=reply.outcome, call=call, reason=reply.reason)
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
        state = await trio.to_thread.run_sync(read_state, broker.sessions_dir, session)
        # An unreadable state shows as the records carry it: secret, untrusted (§4.3).
        label = UNKNOWN if isinstance(state, StateUnreadable) else state
        views.append(
            SessionView(session=session, taint=label.taint, untrusted=label.untrusted, calls=calls)
        )
    return SessionsAnswer(sessions=views)
