"""broker.sock's driver: one call per connection.

The handler reads one frame (within 5 s), decides it with the pure
:func:`boxmaker.core.decide.evaluate`, and then drives the call's life, the pure
machine :class:`boxmaker.core.call.Call`, with the pure loop
:func:`boxmaker.core.drive.drive`, giving it this module's ports (:class:`_Ports`:
write a record, send a frame, put the ask in the approvals table, take the last look,
run, raise the state, reply to the admin). Every rule of what follows the decision, in
what order and what each failure answers, is in that machine's table, and how its
effects are carried out is in that loop (docs/decisions.md, "brokerd"); this module
holds the I/O.

Before the machine, only the frame itself: ``error bad_frame`` / ``error
forbidden_kind`` / the catalogue are answered and nothing is recorded. The resources
are the driver's too: an ask holds a pending slot and its request's bytes
(:mod:`boxmaker.broker.limits`) from its decision to the end of its call, and when the
caps are full the machine is told so (it denies ``too_many_pending``).

A waiting call waits in its own connection's task, in the handler's own frame (the
loop returns at the wait, and :func:`~boxmaker.core.drive.resume` carries on), under a
cancel scope whose deadline is the entry's, for its socket to become readable (then
:meth:`Requester.sent` looks: the requester's end closed, or what it sent, which may be
the MCP client's answer, :mod:`boxmaker.broker.client_answers`) or for its ending to be
delivered
(:mod:`boxmaker.broker.pending`): no timer, no wake-up a second.

A running call belongs to its connection too (:mod:`boxmaker.broker.tool_run`): a tool
that can run for long (a shell command, an HTTP fetch:
:data:`~boxmaker.broker.runner.STOPPABLE_TOOLS`) runs in a nursery of the connection
beside a hang-up watcher (:meth:`Requester.while_here`, the shape of hypercorn's
per-connection task group). When the requester leaves, the run is cancelled — the
sandbox's processes are killed on the way out — and the machine records the result
``failed`` ``requester_gone``. An ``mcp.*`` call's run is the gateway's
(:mod:`boxmaker.broker.mcp_port`), awaited the same way, so a hang-up cancels it; a
``claude.*`` call runs nothing here (the client runs its own tool once allowed): its
answer is ``ok`` ``"allowed"``, its result recorded like any other.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final, TypeAlias, assert_never

import attrs
import trio

from boxmaker.broker.client_answers import AfterRequest, heard
from boxmaker.broker.decide_now import BrokerSources, decide_now
from boxmaker.broker.mcp_port import McpGateway
from boxmaker.broker.pending import ApproveCommand, ClientAnswered, RefuseCommand, report
from boxmaker.broker.requester import Requester
from boxmaker.broker.state import Broker
from boxmaker.broker.tool_run import run_tool
from boxmaker.core.approvals import PendingEntry
from boxmaker.core.call import (
    APPROVAL_UNRECORDED,
    CALL_ID_USED,
    REFUSAL_UNRECORDED,
    RESULT_UNRECORDED_DETAIL,
    STOPPING_DETAIL,
    Call,
)
from boxmaker.core.call_events import (
    AdminReply,
    CallFrame,
    CallRecord,
    Decided,
    Enqueued,
    Event,
    Expired,
    OwnerApproved,
    OwnerRefused,
    Ran,
    RequesterGone,
    Reused,
    StateRaised,
    StateUnrecordable,
    Stopping,
)
from boxmaker.core.call_phases import Running
from boxmaker.core.catalogue import (
    catalogue_tools,
    external_catalogue_tools,
)
from boxmaker.core.client_answer import client_approver, client_refusal
from boxmaker.core.decide import Ask, Ruling, Run, Verdict
from boxmaker.core.drive import drive, resume
from boxmaker.core.grant_parse import GrantsProblem
from boxmaker.core.grants import GrantSet
from boxmaker.core.labels import Label
from boxmaker.core.state import StateUnreadable
from boxmaker.core.vocabulary import (
    Answer,
    Approval,
    Decision,
    ErrorCode,
    ErrorFrame,
    Pending,
    Result,
    RunEnd,
    ToolRequest,
)
from boxmaker.formats.clock import utc_now
from boxmaker.formats.convert import converter
from boxmaker.runtime.ndjson import BufferBudget, FrameError, FrameReader, receive_frame_within
from boxmaker.runtime.unix_sockets import DISCONNECTS, check_peer
from boxmaker.wire import (
    ApprovalView,
    BadFrame,
    CatalogueAnswer,
    CatalogueRequest,
    ClientAnswer,
    ForbiddenKind,
    decode_broker_request,
)

__all__ = [
    "APPROVAL_UNRECORDED",
    "CALL_ID_USED",
    "REFUSAL_UNRECORDED",
    "RESULT_UNRECORDED_DETAIL",
    "STOPPING_DETAIL",
    "CallOpening",
    "CallRun",
    "OpenedCall",
    "Requester",
    "handle_broker_connection",
    "open_broker_call",
]

log = logging.getLogger("boxmaker.brokerd")

FIRST_FRAME_S: Final = 5.0
"""The first frame within 5 s of the connection, else it closes."""
UNDER_WAY: Final = "it runs: the tunnel is open; its end is recorded in the ledger"
"""What an owner who approved a tunnel hears once it opened."""


@attrs.frozen
class OpenedCall:
    """A connection's call, read and ready to drive: its requester, its request, and
    for an internal call (egress's ``connect``), how it runs and that it may name an
    internal tool."""

    requester: Requester
    request: ToolRequest
    run: CallRun | None = None
    """The call's own run (a tunnel), instead of the runner's; None: the runner's."""
    internal: bool = False
    """Decided with ``internal=True`` (:func:`boxmaker.core.decide.evaluate`): only
    brokerd's own openings set it, never anything a requester sends."""


CallRun: TypeAlias = Callable[[Run | Ask, Callable[[], None]], Awaitable[Ran | RequesterGone]]
"""An internal call's run: given its verdict, and what to call once it is under way (a
tunnel open: an owner whose approve let it run hears so then, not at its end), what it
ran to."""
CallOpening: TypeAlias = Callable[[Broker, trio.SocketStream], Awaitable[OpenedCall | None]]
"""How a connection's call is read: the peer checked, the request read (None once
anything else was answered)."""


async def open_broker_call(broker: Broker, stream: trio.SocketStream) -> OpenedCall | None:
    """broker.sock's opening: the owner's uid only, then one frame (a tool request)."""
    # loopd runs as the owner (docs/runbook.md#loopd-uid): no one else may ask.
    if not await check_peer(stream, allowed=broker.owner_uid, name="broker.sock"):
        return None
    requester = Requester(stream)
    request = await _read_request(requester, broker.capacity.budget, broker.gateway)
    return None if request is None else OpenedCall(requester, request)


async def handle_broker_connection(
    broker: Broker, stream: trio.SocketStream, opening: CallOpening = open_broker_call
) -> None:
    """trio.serve_listeners' handler for broker.sock: one call, then close; with its
    own ``opening``, the egress proxy's handler for a CONNECT (:mod:`boxmaker.broker.egress`):
    everything after the request is read (the drive, the wait for the owner, the resume,
    the close) is this one function's, so a tunnel is decided, asked and recorded exactly
    as a tool call. (One function and not a helper it calls: a waiting call's stack is
    this frame alone, docs/decisions.md, "brokerd's hot path and memory".)

    Catches every Exception, so one bad client never takes brokerd down; Cancelled
    (shutdown) goes through.
    """
    try:
        opened = await opening(broker, stream)
        if opened is None:
            return
        requester = opened.requester
        ports = _Ports(broker, requester, opened.request, opened.run, internal=opened.internal)
        del opened
        try:
            waiting = await drive(ports.call, await ports.first_event(), ports)
            if waiting is None:
                return
            # Wait for the owner, here, in this frame: thousands of calls wait at once,
            # and each coroutine frame on a waiting stack costs about 250 bytes (the loop
            # returned at the wait). Until the entry's ending is delivered (an owner's
            # answer, a stop: PendingCalls.end cancels this scope), the requester leaves
            # (its socket becomes readable and the look finds its end closed), or the
            # deadline (this scope's; the table's boundary then takes the expiry). No
            # timer, no wake-up while nothing happens.
            entry = waiting.entry
            del waiting
            log.debug("call %s: waiting for the owner (approval %s)", entry.call, entry.approval)
            after: AfterRequest | None = None
            while broker.pending.ending(entry.approval) is None:
                with broker.pending.deadline(entry):
                    # Requester.hang_up's loop, inline: one frame less a waiting call;
                    # what it sends meanwhile may be the MCP client's answer.
                    await trio.lowlevel.wait_readable(stream.socket)
                    while (sent := requester.sent()) is not None:
                        if sent:
                            if not requester.HEARS_CLIENT_ANSWERS:
                                break  # a tunnel's bytes before its answer: it left
                            after = after or AfterRequest()
                            asked = ports.call.decision
                            await heard(broker, ports.request, asked, entry, after, sent)
                        await trio.lowlevel.wait_readable(stream.socket)
                    broker.pending.end(entry.approval, RequesterGone())
                broker.pending.woke(entry, trio.current_time())
            await resume(ports.call, entry, ports)
        finally:
            ports.close()
    except DISCONNECTS as exc:
        log.debug("%s: the requester left (%s)", requester_name(stream), type(exc).__name__)
    except Exception:
        log.exception("%s: a connection failed", requester_name(stream))


def requester_name(stream: trio.SocketStream) -> str:
    """The socket a connection came in on, for the log."""
    try:
        name = stream.socket.getsockname()
    except OSError:
        return "a socket"
    return Path(name).name if isinstance(name, str) and name else "a socket"


async def _read_request(
    requester: Requester, budget: BufferBudget, gateway: McpGateway
) -> ToolRequest | None:
    """The first frame: a tool request, or None once anything else was answered.

    The request is read in its own frame, so what reading it took (the reader, the raw
    line, the decoder's leftovers) is gone while the call waits; the reader is closed at
    once, so its bytes go back to the budget shared by all."""
    reader = FrameReader(requester.stream, budget=budget)
    try:
        return await _read_first(requester, reader, gateway)
    finally:
        reader.close()


async def _read_first(
    requester: Requester, reader: FrameReader, gateway: McpGateway
) -> ToolRequest | None:
    try:
        line = await receive_frame_within(reader, FIRST_FRAME_S)
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
    match frame:
        case CatalogueRequest():
            tools = catalogue_tools() + external_catalogue_tools(gateway.catalogue())
            await requester.final(CatalogueAnswer(tools=tools))
            return None
        case ToolRequest():
            return frame
        case ClientAnswer():
            detail = "client_answer is only read after a pending frame on the same connection"
            await requester.final(ErrorFrame(code=ErrorCode.BAD_FRAME, detail=detail))
            return None
        case _:
            assert_never(frame)


async def _raise_state(broker: Broker, session: str, label: Label) -> Label | StateUnreadable:
    """Read the state, raise it by the label, write it only when that raises it (a
    state only rises). Most results do not, and then no thread is needed: the state
    read is the cached one, checked against the file's stat."""
    async with broker.states.raising(session):
        current = await broker.states.read(session)
        if isinstance(current, Label) and current.join(label) == current:
            return current
        try:
            return await broker.to_thread(broker.raise_state, broker.sessions_dir, session, label)
        finally:
            broker.states.forget(session)


async def _evaluate(
    broker: Broker,
    request: ToolRequest,
    grants: GrantSet | GrantsProblem | None = None,
    *,
    look_before_asking: bool = False,
    asked: Ruling | None = None,
    internal: bool = False,
) -> Verdict:
    """The decision with the grants and state as they are now (also approve's
    re-decision): :func:`decide_now`, as ``bxctl grants test`` decides. Grants are read
    before the state, as the order demands; a decision to be recorded passes the grants
    it took (``broker.grants.take()``)."""
    if grants is None:
        grants = await broker.grants.current()
    return await decide_now(
        request,
        grants,
        BrokerSources(broker),
        look_before_asking=look_before_asking,
        asked=asked,
        internal=internal,
    )


def _log_decision(decision: Ruling) -> None:
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


class _Ports:
    """brokerd's ports for :func:`~boxmaker.core.drive.drive` (the ledger, the
    requester's socket, the runner, the state files, the approvals table), and the
    call's resources: its pending slot, its entry, the admin's reply channel while an
    approve or refuse is being recorded. (Slots, and few frames: thousands of these
    wait at once.)"""

    __slots__ = (
        "approval",
        "broker",
        "call",
        "closed",
        "holds_grants",
        "internal",
        "own_run",
        "reply_to",
        "request",
        "requester",
        "slot",
    )

    def __init__(
        self,
        broker: Broker,
        requester: Requester,
        request: ToolRequest,
        own_run: CallRun | None = None,
        *,
        internal: bool = False,
    ) -> None:
        self.broker = broker
        self.requester = requester
        self.request = request
        self.own_run = own_run
        self.internal = internal
        self.call = Call(
            request.call,
            request.session,
            boot=broker.boot,
            pending_timeout=broker.config.broker.pending_timeout,
        )
        self.slot: int | None = None
        self.approval: str | None = None
        """The pending entry's id, once one was made (it is forgotten at the close)."""
        self.reply_to: trio.MemorySendChannel[AdminReply] | None = None
        self.holds_grants = False
        self.closed = False

    async def first_event(self) -> Event:
        """What starts the call: its decision (or a reused id, or a stop)."""
        broker, request = self.broker, self.request
        if not broker.claim_call(request.call, request.session):
            log.warning("broker.sock: call id %s was already used in this boot", request.call)
            return Reused()
        if broker.stopping:
            return Stopping()
        # Held until the decision's record is written: a change of grants noticed
        # meanwhile is recorded after it (GrantsWatcher.take).
        grants = await broker.grants.take()
        self.holds_grants = True
        verdict = await _evaluate(
            broker, request, grants, look_before_asking=True, internal=self.internal
        )
        full: str | None = None
        if isinstance(verdict, Ask):
            # The ask holds a pending slot and its request's bytes from here (before
            # its record is awaited) to the end of its call.
            size = self.requester.request_bytes
            full = broker.capacity.reserve_pending(size)
            if full is None:
                self.slot = size
                _log_decision(verdict.decision)  # now: the owner may be watching the log
        return Decided(verdict, pending_full=full)

    def _give_back_grants(self) -> None:
        if self.holds_grants:
            self.holds_grants = False
            self.broker.grants.give_back()

    # -- the ports ---------------------------------------------------------------------

    async def record(self, body: CallRecord) -> bool:
        call = self.call.call
        match body:
            case Decision():
                pass  # logged at the close (an ask when it is asked)
            case Approval():
                log.info(
                    "call %s: approval %s %s (%s) by %s",
                    call,
                    body.approval,
                    body.outcome,
                    body.reason,
                    body.by,
                )
            case Result():
                log.debug("result call=%s ok=%s reason=%s", call, body.status, body.reason)
            case _:
                assert_never(body)
        recorded = await self.broker.record(body)
        self._give_back_grants()  # the decision's record is the first
        return recorded

    async def send(self, frame: CallFrame) -> bool:
        match frame:
            case Pending():
                try:
                    await self.requester.send(frame)
                except DISCONNECTS:
                    return False
                return True
            case Answer() | ErrorFrame():
                await self.requester.final(frame)
                return True
            case _:
                assert_never(frame)

    def look(self) -> bool:
        return self.requester.gone()

    async def run(self, verdict: Run | Ask, *, approved: bool) -> Ran | RequesterGone:
        if self.own_run is not None:
            # An internal call's run is its connection's own (a tunnel reads and writes
            # the requester's stream itself, so no hang-up watcher may read it).
            return await self.own_run(verdict, self._under_way)
        return await run_tool(self.broker, self.requester, self.call, verdict, approved=approved)

    def _under_way(self) -> None:
        """An internal run is under way (a tunnel opened, which may stay open for long):
        the owner whose approve let it run hears now that it runs, rather than at its
        end; the reply at the end then finds no one waiting."""
        state = self.call.state
        if isinstance(state, Running) and state.told is not None:
            self.reply(attrs.evolve(state.told, ran=RunEnd(outcome="ok", detail=UNDER_WAY)))

    async def raise_state(self, session: str, label: Label) -> StateRaised | StateUnrecordable:
        raised = await _raise_state(self.broker, session, label)
        if isinstance(raised, StateUnreadable):
            log.error(
                "call %s: the session state could not be raised: %s", self.call.call, raised.detail
            )
            return StateUnrecordable(raised.detail)
        return StateRaised(raised)

    def enqueue(self, ask: Ask) -> Enqueued:
        broker = self.broker
        entry = PendingEntry.for_ask(
            ask,
            approval=broker.pending.new_approval_id(),
            requested_at=utc_now(),
            now=trio.current_time(),
            timeout=broker.config.broker.pending_timeout,
        )
        added = broker.pending.add(entry)
        if added:
            self.approval = entry.approval
            if broker.notifier.enabled:
                broker.notifier.notify(converter.unstructure(ApprovalView.of(entry), ApprovalView))
        return Enqueued(entry, closed=not added)

    async def ending(self, entry: PendingEntry) -> Event | None:
        command = self.broker.pending.ending(entry.approval)
        call = self.call.call
        match command:
            case None:
                return None
            case ApproveCommand():
                self.reply_to = command.reply
                verdict = await _evaluate(
                    self.broker, self.request, asked=self.call.decision, internal=self.internal
                )
                log.info("call %s: approved by the owner (note %r)", call, command.note)
                # An empty note is no note: the record keeps its line without one.
                return OwnerApproved(verdict, command.grant_written, command.note or None)
            case RefuseCommand():
                self.reply_to = command.reply
                log.info("call %s: refused by the owner", call)
                return OwnerRefused(command.reason)
            case ClientAnswered(approve=approve, client=client, verdict=verdict):
                approver = client_approver(client)
                if approve:
                    return OwnerApproved(verdict, approver=approver)
                return OwnerRefused(client_refusal(client), approver=approver)
            case Expired() | Stopping() | RequesterGone():
                log.info("call %s: the wait ended: %s", call, type(command).__name__)
                return command
            case _:
                assert_never(command)

    def withdraw(self, approval: str) -> None:
        # The requester is gone already: the entry ends so, unless someone else took it
        # first (then their ending is waiting).
        self.broker.pending.end(approval, RequesterGone())

    def reply(self, reply: AdminReply) -> None:
        if self.reply_to is not None:
            report(self.reply_to, reply)
            self.reply_to = None

    def close(self) -> None:
        """The call is over, however it ended: every resource it held goes back (the
        handler's ``finally`` calls this too; the second time does nothing)."""
        if self.closed:
            return
        self.closed = True
        self._give_back_grants()
        if self.slot is not None:
            self.broker.capacity.release_pending(self.slot)
        if self.approval is not None:
            self.broker.pending.forget(self.approval)
        if self.reply_to is not None:
            self.reply_to.close()
        decision = self.call.decision
        if decision is not None and decision.verdict != "ask":
            # After the answer: a log line costs as much as a tenth of a call's latency.
            _log_decision(decision)
