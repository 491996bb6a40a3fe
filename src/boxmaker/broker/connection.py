"""One call per broker.sock connection (spec §3, §5.3, §6.1, §6.5).

The handler reads one frame (within 5 s), decides it with the pure
:func:`boxmaker.core.decide.evaluate`, records, waits for the owner when asked, runs,
records again and sends exactly one final frame; then the connection closes. Every
policy rule lives in the core; this module only orders the steps and the records:

- ``error bad_frame`` / ``error forbidden_kind``: nothing recorded (spec §3 step 1).
- A call id already used in this boot is refused with ``error bad_frame`` "call id
  already used", nothing recorded. A second decision under one call id would make the
  ledger unverifiable (spec §5.6: one decision per open call), and a compromised loopd
  must not be able to do that. The ids are remembered for the boot (~100 bytes each).
- ``audit_unavailable`` (ledger stopped) is answered and not recorded (spec §3 step 2);
  every other denial and verdict is recorded before anything else happens.
- An ask while ``[broker] max_pending`` asks already wait, or whose request would take
  the waiting requests past ``max_pending_bytes`` (limits.py), is denied
  ``too_many_pending``, recorded like any denial: the table, the memory of its
  arguments and the descriptors its connections hold stay bounded, and the owner sees
  in the ledger what was turned away.
- Ask: the entry waits for its ending; the pending deadline and the one-second look
  (§6.5) are two broker-wide tasks (:meth:`Broker.run_expiry`, :meth:`Broker.look_all`)
  rather than two cancel scopes per call; how
  approve/refuse/expiry/stop reach it is described in :mod:`boxmaker.broker.state`.
- Run: the last look, the run, the state raise, the result record, then the answer with
  the content (§5.3 steps 3-6); a failure at any step answers as the spec says and
  writes nothing more.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import socket
from typing import Final

import attrs
import trio

from boxmaker.broker.listeners import check_peer
from boxmaker.broker.runner import RunSpec, execute
from boxmaker.broker.state import (
    AdminReply,
    ApproveCommand,
    ApprovedReply,
    Broker,
    Command,
    ExpireCommand,
    NotRecorded,
    RefuseCommand,
    RefusedReply,
    RequesterGone,
    StopCommand,
    Waiter,
    grant_named,
)
from boxmaker.clock import utc_now
from boxmaker.core.approvals import PendingEntry
from boxmaker.core.catalogue import catalogue_tools
from boxmaker.core.decide import Ask, Decision, Deny, Run, ToolRequest, approval_outcome, evaluate
from boxmaker.core.grants import GrantSet, GrantsProblem
from boxmaker.core.labels import FRESH, UNKNOWN, Label
from boxmaker.core.reasons import AUDIT_UNAVAILABLE_DETAIL, Reason
from boxmaker.core.state import RUNBOOK_STATE, StateUnreadable
from boxmaker.ledger import records
from boxmaker.ndjson import BufferBudget, FrameError, FrameReader, receive_frame_within
from boxmaker.state_files import raise_state
from boxmaker.wire import (
    Answer,
    ApprovedOutcome,
    BadFrame,
    CatalogueAnswer,
    CatalogueRequest,
    ErrorCode,
    ErrorFrame,
    ForbiddenKind,
    Frame,
    GrantRef,
    Pending,
    decode_broker_request,
    encode_frame,
)
from boxmaker.wire import ToolRequest as ToolRequestFrame

log = logging.getLogger("boxmaker.brokerd")

FIRST_FRAME_S: Final = 5.0
"""Spec §6.1: the first frame within 5 s of the connection, else it closes."""
LOOK_INTERVAL_S: Final = 1.0
"""Spec §6.5: the one-second look."""
SEND_S: Final = 10.0
"""A requester that does not read its answer must not hold the call's task for ever."""

CALL_ID_USED: Final = "call id already used"
RESULT_UNRECORDED_DETAIL: Final = f"the result could not be recorded; see {RUNBOOK_STATE}"
APPROVAL_UNRECORDED: Final = (
    "the approval could not be recorded; the call is denied; see docs/runbook.md#audit-unavailable"
)
REFUSAL_UNRECORDED: Final = (
    "the refusal could not be recorded; the call is denied; see docs/runbook.md#audit-unavailable"
)
STOPPING_DETAIL: Final = "brokerd is stopping"

DISCONNECTS: Final = (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError)
"""A peer that left or stalled: a normal end of a connection, not a crash (STYLE)."""


class Requester:
    """The loopd end of one call: its stream, its frame reader, and the last look.

    The look needs a non-blocking ``recv(MSG_PEEK | MSG_DONTWAIT)``, which trio's
    sockets only offer as an awaitable that blocks; so each look wraps the connection's
    descriptor in a plain socket object for that one peek and detaches it again (no
    second descriptor is kept: a pending call holds one fd). A peek sees exactly what
    the stream would read.
    """

    def __init__(self, stream: trio.SocketStream, budget: BufferBudget | None = None) -> None:
        self.stream = stream
        self.reader = FrameReader(stream, budget=budget)
        self.request_bytes = 0
        """The request frame's size: what its arguments cost while the call waits."""

    def gone(self) -> bool:
        """The last look / the one-second look (spec §5.3 step 2, §6.5): has the
        requester closed its end? Bytes it sent after its request do not mean gone."""
        fd = self.stream.socket.fileno()
        if fd < 0:
            return True
        try:
            peek = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, fileno=fd)
        except OSError:
            return True
        try:
            data = peek.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True
        finally:
            peek.detach()
        return data == b""

    async def send(self, frame: Frame) -> None:
        # A bare CancelScope rather than trio.fail_after: cheaper, once a call.
        with trio.CancelScope(deadline=trio.current_time() + SEND_S):
            await self.stream.send_all(encode_frame(frame))
            return
        raise trio.TooSlowError

    async def final(self, answer: Answer | ErrorFrame | CatalogueAnswer) -> None:
        """The one final frame of the connection (spec §6.1)."""
        await self.send(answer)


async def handle_broker_connection(broker: Broker, stream: trio.SocketStream) -> None:
    """trio.serve_listeners' handler for broker.sock: one call, then close.

    Catches every Exception, so one bad client never takes brokerd down; Cancelled
    (shutdown) goes through.
    """
    try:
        # loopd runs as the owner (docs/runbook.md#loopd-uid): no one else may ask.
        if not await check_peer(stream, allowed=broker.owner_uid, name="broker.sock"):
            return
        requester = Requester(stream, broker.capacity.budget)
        # The request is read in its own frame, so what reading it took (the raw line,
        # the decoder's leftovers) is gone while the call waits (spec §6.5); the reader
        # is closed at once, so its bytes go back to the budget shared by all.
        try:
            frame = await _read_request(requester)
        finally:
            requester.reader.close()
        if frame is not None:
            await _tool_request(broker, requester, frame)
    except DISCONNECTS as exc:
        log.debug("broker.sock: the requester left (%s)", type(exc).__name__)
    except Exception:
        log.exception("broker.sock: a connection failed")


async def _read_request(requester: Requester) -> ToolRequestFrame | None:
    """The first frame: a tool request, or None once anything else was answered."""
    try:
        line = await receive_frame_within(requester.reader, FIRST_FRAME_S)
    except trio.TooSlowError:
        log.info("broker.sock: no frame within %g s; closing", FIRST_FRAME_S)
        return None
    except FrameError as exc:
        await requester.final(ErrorFrame(code=ErrorCode.BAD_FRAME, detail=str(exc)))
        return None
    if line is None:
        return None
    requester.request_bytes = len(line)
    try:
        frame = decode_broker_request(line)
    except ForbiddenKind as exc:
        log.warning("broker.sock: forbidden kind %r", exc.kind[:40])
        await requester.final(ErrorFrame(code=ErrorCode.FORBIDDEN_KIND, detail=exc.detail))
        return None
    except BadFrame as exc:
        log.info("broker.sock: bad frame: %s", exc.detail)
        await requester.final(ErrorFrame(code=ErrorCode.BAD_FRAME, detail=exc.detail))
        return None
    if isinstance(frame, CatalogueRequest):
        await requester.final(CatalogueAnswer(tools=catalogue_tools()))
        return None
    return frame


async def _read_state(broker: Broker, session: str) -> Label | StateUnreadable:
    """The session's state: cached, checked against the file's stat on every call."""
    return await broker.states.read(session)


async def _raise_state(broker: Broker, session: str, label: Label) -> Label | StateUnreadable:
    """Spec §5.3 step 4: read the state, raise it by the label, write it only when that
    raises it (spec §4.3). Most results do not, and then no thread is needed: the state
    read is the cached one, checked against the file's stat."""
    async with broker.states.raising(session):
        current = await _read_state(broker, session)
        if isinstance(current, Label) and current.join(label) == current:
            return current
        try:
            return await trio.to_thread.run_sync(raise_state, broker.sessions_dir, session, label)
        finally:
            broker.states.forget(session)


async def _evaluate(
    broker: Broker, request: ToolRequest
) -> tuple[Run | Ask | Deny, GrantSet | GrantsProblem]:
    """Spec §3 steps 2-6 with the grants and state as they are now (also approve's
    re-decision, spec §6.3). Grants are read before the state, as the order demands."""
    grants = await broker.grants.current()
    state = await _read_state(broker, request.session)
    verdict = evaluate(
        request,
        ledger_usable=broker.writer.usable,
        grants=grants,
        state=state,
        now=utc_now(),
        workspace=str(broker.workspace),
    )
    return verdict, grants


def _decision_record(decision: Decision, boot: str) -> records.Decision:
    return records.Decision(
        call=decision.call,
        session=decision.session,
        tool=decision.tool,
        arguments=dict(decision.arguments),
        verdict=records.VerdictCode(decision.verdict),
        reason=decision.reason,
        grant=decision.grant,
        taint=decision.state.taint,
        untrusted=decision.state.untrusted,
        boot=boot,
    )


def _denied(decision: Decision) -> Answer:
    return Answer.denied(decision.call, decision.reason or Reason.NO_GRANT, decision.detail)


def _audit_denied(call: str) -> Answer:
    return Answer.denied(call, Reason.AUDIT_UNAVAILABLE, AUDIT_UNAVAILABLE_DETAIL)


async def _tool_request(broker: Broker, requester: Requester, frame: ToolRequestFrame) -> None:
    call = frame.call
    if not broker.claim_call(call, frame.session):
        log.warning("broker.sock: call id %s was already used in this boot; refused", call)
        await requester.final(ErrorFrame(code=ErrorCode.BAD_FRAME, detail=CALL_ID_USED))
        return
    if broker.stopping:
        # Nothing was decided: like a connection refused a moment later, so no record.
        await requester.final(Answer.denied(call, Reason.BROKER_STOPPING, STOPPING_DETAIL))
        return
    request = ToolRequest(call, frame.session, frame.tool, frame.arguments)
    verdict, grants = await _evaluate(broker, request)
    # An ask holds a pending slot and its request's bytes from its decision (before its
    # record is awaited) to the end of its call.
    slot: int | None = None
    if isinstance(verdict, Ask):
        full = broker.capacity.reserve_pending(requester.request_bytes)
        if full is None:
            slot = requester.request_bytes
        else:
            verdict = _too_many_pending(verdict, full)
    decision = verdict.decision
    if isinstance(verdict, Ask):
        _log_decision(decision)  # now: the owner may be watching the log for it
    try:
        if not decision.recordable:
            await requester.final(_denied(decision))
            return
        if not await broker.record(_decision_record(decision, broker.boot)):
            await requester.final(_audit_denied(call))
            return
        if isinstance(verdict, Deny):
            await requester.final(_denied(decision))
        elif isinstance(verdict, Run):
            await _run(broker, requester, decision, grants, approved=False, look=True)
        else:
            await _ask(broker, requester, request, decision, grants)
    finally:
        if slot is not None:
            broker.capacity.release_pending(slot)
        # After the answer: a log line costs as much as a tenth of a call's latency.
        if not isinstance(verdict, Ask):
            _log_decision(decision)


def _too_many_pending(ask: Ask, detail: str) -> Deny:
    """The ask that would go past ``[broker] max_pending`` or ``max_pending_bytes``:
    denied, on the grant it matched and the state it was decided on."""
    return Deny(
        attrs.evolve(ask.decision, verdict="deny", reason=Reason.TOO_MANY_PENDING, detail=detail)
    )


def _log_decision(decision: Decision) -> None:
    # The ledger, not the log, is the record of every call: a call that runs on an auto
    # grant is logged at debug level (docs/decisions.md), denials and asks at info.
    log.log(
        logging.DEBUG if decision.verdict == "run" else logging.INFO,
        "decision call=%s session=%s tool=%s verdict=%s reason=%s grant=%s",
        decision.call,
        decision.session,
        decision.tool[:40],
        decision.verdict,
        decision.reason,
        decision.grant,
    )


# ---------------------------------------------------------------------------------------
# Running (spec §5.3 steps 3-6)


async def _run(
    broker: Broker,
    requester: Requester,
    decision: Decision,
    grants: GrantSet | GrantsProblem,
    *,
    approved: bool,
    look: bool,
) -> None:
    call = decision.call
    if look and requester.gone():
        log.info("call %s: the requester left before the run; nothing runs", call)
        gone = records.Result(
            call=call,
            status=records.ResultStatus.FAILED,
            reason=Reason.REQUESTER_GONE,
            label=FRESH,
            taint_after=decision.state.taint,
            untrusted_after=decision.state.untrusted,
            output_sha256=None,
            output_bytes=0,
        )
        await broker.record(gone)
        return
    spec = RunSpec.for_call(
        decision,
        grant=grant_named(grants, decision.grant),
        workspace=broker.workspace,
        runner=broker.config.runner,
        labels=broker.config.labels,
        approved=approved,
    )
    result = await execute(spec, broker.sandboxes)
    raised = await _raise_state(broker, decision.session, result.label)
    if isinstance(raised, StateUnreadable):
        log.error("call %s: the session state could not be raised: %s", call, raised.detail)
        await requester.final(
            Answer.failed(call, Reason.RESULT_UNRECORDED, RESULT_UNRECORDED_DETAIL)
        )
        return
    output = result.content.encode("utf-8")
    reason = None if result.ok else (result.reason or Reason.TOOL_ERROR)
    body = records.Result(
        call=call,
        status=records.ResultStatus.OK if result.ok else records.ResultStatus.FAILED,
        reason=reason,
        label=result.label,
        taint_after=raised.taint,
        untrusted_after=raised.untrusted,
        output_sha256=hashlib.sha256(output).hexdigest(),
        output_bytes=len(output),
    )
    if not await broker.record(body):
        # Spec §5.3 step 5: an unrecorded result's content is never passed on.
        await requester.final(
            Answer.failed(call, Reason.AUDIT_UNAVAILABLE, AUDIT_UNAVAILABLE_DETAIL)
        )
        return
    log.debug("result call=%s status=%s reason=%s bytes=%d", call, body.status, reason, len(output))
    if reason is None:
        await requester.final(Answer.ok(call, result.content, result.label))
    else:
        await requester.final(Answer.failed(call, reason, result.detail))


# ---------------------------------------------------------------------------------------
# Asking (spec §6.3-6.5)


async def _ask(
    broker: Broker,
    requester: Requester,
    request: ToolRequest,
    decision: Decision,
    grants: GrantSet | GrantsProblem,
) -> None:
    grant = grant_named(grants, decision.grant)
    ref = GrantRef(
        id=decision.grant or "",
        mode=grant.mode.value if grant is not None else "ask",
        note=decision.note,
    )
    # The decision's arguments are a fresh dict of the checked ones (nobody mutates
    # it): shared with the entry instead of copied, as thousands may wait.
    arguments = decision.arguments
    entry = PendingEntry.create(
        approval=broker.new_approval_id(),
        call=decision.call,
        session=decision.session,
        tool=decision.tool,
        arguments=arguments if isinstance(arguments, dict) else dict(arguments),
        grant=ref,
        taint=decision.state.taint,
        untrusted=decision.state.untrusted,
        requested_at=utc_now(),
        now=trio.current_time(),
        timeout=broker.config.broker.pending_timeout,
    )
    waiter = broker.add_pending(entry)
    if waiter is None:
        await _end(broker, requester, request, entry, StopCommand())
        return
    log.debug("call %s: waiting for the owner (approval %s)", entry.call, entry.approval)
    try:
        command = await _wait_for_owner(broker, requester, entry, waiter)
        await _end(broker, requester, request, entry, command)
    finally:
        broker.forget_pending(entry.approval)


def _pending_frame(entry: PendingEntry) -> Pending:
    return Pending(
        call=entry.call,
        approval=entry.approval,
        grant=entry.grant.id,
        expires_at=entry.expires_at_wall,
    )


async def _wait_for_owner(
    broker: Broker, requester: Requester, entry: PendingEntry, waiter: Waiter
) -> Command:
    """Send the pending frame, then wait until the entry ends: approve/refuse (admin),
    expiry (:meth:`Broker.run_expiry`), the requester gone (:meth:`Broker.look_all`) or
    stop. Whoever takes the entry delivers its ending in the same step, so when the
    task's own take finds it gone, the command is already there."""
    try:
        await requester.send(_pending_frame(entry))
    except DISCONNECTS:
        return RequesterGone() if broker.take_own(entry.approval) else await waiter.wait()
    # The one-second look and the pending deadline are broker-wide tasks
    # (Broker.look_all, Broker.run_expiry): each delivers this waiter its ending.
    broker.watch(entry.approval, requester.gone)
    return await waiter.wait()


def _approval(
    entry: PendingEntry,
    outcome: records.ApprovalOutcome,
    reason: str | None,
    by: records.ApprovalBy,
    state: Label | None = None,
) -> records.Approval:
    seen = state or Label(entry.taint, entry.untrusted)
    return records.Approval(
        call=entry.call,
        approval=entry.approval,
        outcome=outcome,
        reason=reason,
        by=by,
        taint=seen.taint,
        untrusted=seen.untrusted,
    )


def _report(reply: trio.MemorySendChannel[AdminReply], value: AdminReply) -> None:
    """Tell the admin handler how the approval ended. It may be gone (its client left, or
    shutdown cancelled it): the call goes on regardless, since its record is written."""
    with reply, contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        reply.send_nowait(value)


async def _end(
    broker: Broker,
    requester: Requester,
    request: ToolRequest,
    entry: PendingEntry,
    command: Command,
) -> None:
    """Record how the ask ended (the one approval record, spec §5.2) and answer."""
    call = entry.call
    outcome = records.ApprovalOutcome
    by = records.ApprovalBy
    if isinstance(command, ApproveCommand):
        await _approved(broker, requester, request, entry, command)
    elif isinstance(command, RefuseCommand):
        body = _approval(entry, outcome.REFUSED, command.reason, by.OWNER)
        recorded = await broker.record(body)
        _report(command.reply, RefusedReply() if recorded else NotRecorded(REFUSAL_UNRECORDED))
        log.info("call %s: refused by the owner (recorded: %s)", call, recorded)
        if recorded:
            await requester.final(Answer.denied(call, Reason.REFUSED, command.reason))
        else:
            await requester.final(_audit_denied(call))
    elif isinstance(command, ExpireCommand):
        timeout = broker.config.broker.pending_timeout
        recorded = await broker.record(_approval(entry, outcome.EXPIRED, "expired", by.EXPIRY))
        log.info("call %s: expired waiting for the owner", call)
        if recorded:
            detail = f"no approval within {timeout:g} s"
            await requester.final(Answer.denied(call, Reason.EXPIRED, detail))
        else:
            await requester.final(_audit_denied(call))
    elif isinstance(command, StopCommand):
        body = _approval(entry, outcome.WITHDRAWN, Reason.BROKER_STOPPING.value, by.BROKER)
        recorded = await broker.record(body)
        log.info("call %s: withdrawn, brokerd is stopping", call)
        if recorded:
            await requester.final(Answer.denied(call, Reason.BROKER_STOPPING, STOPPING_DETAIL))
        else:
            await requester.final(_audit_denied(call))
    else:
        body = _approval(entry, outcome.WITHDRAWN, Reason.REQUESTER_GONE.value, by.BROKER)
        await broker.record(body)
        log.info("call %s: withdrawn, the requester left", call)


async def _approved(
    broker: Broker,
    requester: Requester,
    request: ToolRequest,
    entry: PendingEntry,
    command: ApproveCommand,
) -> None:
    """Approve (spec §6.3): re-decide the original request against the current grants and
    state, take the last look, record the one approval, tell the owner, then run."""
    call = entry.call
    with command.reply:
        verdict, grants = await _evaluate(broker, request)
        decision = verdict.decision
        state = decision.state if decision.recordable else UNKNOWN
        result = approval_outcome(verdict)
        reason: Reason | None = decision.reason if result == "denied" else None
        answer = ApprovedOutcome(result)
        if answer is not ApprovedOutcome.DENIED and requester.gone():
            answer, reason = ApprovedOutcome.WITHDRAWN, Reason.REQUESTER_GONE
        body = _approval(
            entry,
            records.ApprovalOutcome(answer.value),
            reason.value if reason is not None else None,
            records.ApprovalBy.OWNER,
            state,
        )
        recorded = await broker.record(body)
        _report(
            command.reply,
            ApprovedReply(answer, reason) if recorded else NotRecorded(APPROVAL_UNRECORDED),
        )
    log.info(
        "call %s: approved by the owner: outcome=%s reason=%s note=%r (recorded: %s)",
        call,
        answer,
        reason,
        command.note,
        recorded,
    )
    if not recorded:
        await requester.final(_audit_denied(call))
    elif answer is ApprovedOutcome.DENIED:
        await requester.final(_denied(decision))
    elif answer is not ApprovedOutcome.WITHDRAWN:
        # The last look was taken just before the approval record (spec §5.3 step 2).
        await _run(
            broker,
            requester,
            decision,
            grants,
            approved=answer is ApprovedOutcome.ASK,
            look=False,
        )
