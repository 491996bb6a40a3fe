"""The life of one tool call, from its decision to its last frame: a pure state machine.

In the manner of h11 (``_state.py`` + ``_connection.py``): a :class:`Call` takes
*events* (what happened: the decision was made, a record was written or not, the owner
answered, the deadline came, the requester left, the tool ran, the state was raised)
and returns *effects* (what to do next: append this record, send this frame, wait for
the owner's answer to this entry, run this verdict, raise the state by this label,
reply to the admin, close). The frames it sends and the records it appends are the
wire's and the ledger's own values (:mod:`boxmaker.core.vocabulary`). It does no I/O
and reads no clock: the one driver loop (:func:`boxmaker.core.drive.drive`) feeds it
events and carries out its effects through ports (brokerd's connection handler,
:mod:`boxmaker.broker.connection`, gives the real ones), and holds no rule of its own.
An event the table has no row for raises :class:`IllegalEvent`, so a driver that gets
the order wrong fails loudly.

The table, drawn and as data, is :mod:`boxmaker.core.call_table`: each of its rows is
one method here, and every transition is checked against the row's declared next
phases (:class:`IllegalTransition`). What the call knows is its phase's state
(:data:`boxmaker.core.call_phases.State`: the entry while it waits, the verdict while
its record is written, what the run gave while the state is raised), never a field
that a row must hope is set.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any, ClassVar, Final, TypeAlias, assert_never

import attrs

from boxmaker.core.call_events import (
    AppendRecord,
    ApprovedReply,
    AwaitOwner,
    Close,
    Decided,
    Effect,
    EndWithoutRun,
    Enqueue,
    Enqueued,
    Event,
    Expired,
    LastLook,
    Looked,
    NotRecorded,
    OwnerApproved,
    OwnerRefused,
    RaiseState,
    Ran,
    Recorded,
    RecordFailed,
    RefusedReply,
    ReplyAdmin,
    RequesterGone,
    Reused,
    RunVerdict,
    Send,
    StateRaised,
    StateUnrecordable,
    Stopping,
)
from boxmaker.core.call_phases import (
    Approving,
    Deciding,
    Done,
    Ending,
    Enqueueing,
    Gone,
    Idle,
    LookingBeforeApproval,
    LookingBeforeRun,
    Phase,
    Raising,
    RecordingResult,
    Running,
    State,
    Waiting,
)
from boxmaker.core.call_table import TRANSITIONS
from boxmaker.core.decide import Ask, Deny, Ruling, Run, Verdict, approval_outcome
from boxmaker.core.labels import UNKNOWN, Label
from boxmaker.core.reasons import AUDIT_UNAVAILABLE_DETAIL, Reason
from boxmaker.core.state import RUNBOOK_STATE
from boxmaker.core.vocabulary import (
    Answer,
    Approval,
    ApprovalBy,
    ApprovalOutcome,
    Decision,
    ErrorCode,
    ErrorFrame,
    Pending,
    Result,
    RunEnd,
)

if TYPE_CHECKING:
    from boxmaker.core.approvals import PendingEntry


CALL_ID_USED: Final = "call id already used"
STOPPING_DETAIL: Final = "brokerd is stopping"
RESULT_UNRECORDED_DETAIL: Final = f"the result could not be recorded; see {RUNBOOK_STATE}"
APPROVAL_UNRECORDED: Final = (
    "the approval could not be recorded; the call is denied; see docs/runbook.md#audit-unavailable"
)
REFUSAL_UNRECORDED: Final = (
    "the refusal could not be recorded; the call is denied; see docs/runbook.md#audit-unavailable"
)
RUN_STOPPED_DETAIL: Final = "its requester left while it ran: the run was stopped"


class IllegalEvent(RuntimeError):
    """An event the table has no row for in the call's phase: a driver bug."""

    def __init__(self, phase: Phase, event: Event) -> None:
        super().__init__(f"{type(event).__name__} is not expected in phase {phase.name}")
        self.phase = phase
        self.event = event


class IllegalTransition(RuntimeError):
    """A row went to a phase its declared next phases (:data:`TRANSITIONS`) do not name:
    the table and its data disagree, a bug of the machine itself."""

    def __init__(self, phase: Phase, event: Event, reached: Phase) -> None:
        super().__init__(
            f"{type(event).__name__} in phase {phase.name} went to {reached.name}, "
            "which its row does not name"
        )
        self.phase = phase
        self.event = event
        self.reached = reached


_CLOSE: Final = Close()
_DONE: Final = Done()


class Call:
    """One call's life (its table: :mod:`boxmaker.core.call_table`).

    ``boot`` is brokerd's boot id (its decision record names it); ``pending_timeout``
    is config's ``[broker] pending_timeout`` (seconds), named in the ``expired`` denial.
    """

    __slots__ = ("_state", "boot", "call", "decision", "pending_timeout", "session")

    rows: ClassVar[Mapping[tuple[Phase, type[Event]], _Row]]
    """The table: each row's method and its next phases (:data:`TRANSITIONS`); set once
    the methods are defined."""

    def __init__(self, call: str, session: str, *, boot: str, pending_timeout: float) -> None:
        self.call = call
        self.session = session
        self.boot = boot
        self.pending_timeout = pending_timeout
        self._state: State = Idle()
        self.decision: Ruling | None = None
        """The first decision, the recorded one (None until it is made)."""

    @property
    def phase(self) -> Phase:
        return self._state.phase

    @property
    def state(self) -> State:
        """What the call knows in its phase."""
        return self._state

    def handle(self, event: Event) -> list[Effect]:
        """Feed one event; the effects to carry out, in order."""
        phase = self._state.phase
        row = self.rows.get((phase, type(event)))
        if row is None:
            raise IllegalEvent(phase, event)
        state, effects = row.method(self, self._state, event)
        if state.phase not in row.next:
            raise IllegalTransition(phase, event, state.phase)
        self._state = state
        return effects

    # -- the answers -------------------------------------------------------------------

    def _denied(self, decision: Ruling) -> Send:
        return Send(Answer.denied(self.call, decision.reason or Reason.NO_GRANT, decision.detail))

    def _audit_unavailable(self) -> Send:
        return Send(Answer.denied(self.call, Reason.AUDIT_UNAVAILABLE, AUDIT_UNAVAILABLE_DETAIL))

    def _stopping(self) -> Send:
        return Send(Answer.denied(self.call, Reason.BROKER_STOPPING, STOPPING_DETAIL))

    # -- the rows (each returns the next phase's state and the effects) ----------------

    def _reused(self, at: Idle, event: Reused) -> _Step:
        return _DONE, [Send(ErrorFrame(code=ErrorCode.BAD_FRAME, detail=CALL_ID_USED)), _CLOSE]

    def _stopping_before(self, at: Idle, event: Stopping) -> _Step:
        # Nothing was decided: like a connection refused a moment later, no record.
        return _DONE, [self._stopping(), _CLOSE]

    def _decided(self, at: Idle, event: Decided) -> _Step:
        verdict = event.verdict
        if isinstance(verdict, Ask) and event.pending_full is not None:
            verdict = verdict.too_many_pending(event.pending_full)
        decision = self.decision = verdict.decision
        if not decision.recordable:
            return _DONE, [self._denied(decision), _CLOSE]
        return Deciding(verdict), [AppendRecord(Decision.of(decision, self.boot))]

    def _decision_recorded(self, at: Deciding, event: Recorded) -> _Step:
        verdict = at.verdict
        match verdict:
            case Run():
                return LookingBeforeRun(verdict), [LastLook()]
            case Ask():
                return Enqueueing(), [Enqueue(verdict)]
            case Deny():
                return _DONE, [self._denied(verdict.decision), _CLOSE]
            case _:
                assert_never(verdict)  # pragma: no mutate - unreachable, mypy checks it

    def _audit_denied(self, at: Deciding, event: RecordFailed) -> _Step:
        return _DONE, [self._audit_unavailable(), _CLOSE]

    def _enqueued(self, at: Enqueueing, event: Enqueued) -> _Step:
        waiting = Waiting(event.entry)
        if event.closed:
            return self._end(waiting, Stopping())
        return waiting, [Send(Pending.of(event.entry)), AwaitOwner(event.entry)]

    def _end(self, at: Waiting, event: EndWithoutRun) -> _Step:
        entry = at.entry
        asked = Label(entry.taint, entry.untrusted)
        outcome, reason, by = _ENDINGS[type(event)]
        if isinstance(event, OwnerRefused):
            reason = event.reason
        definition = self.decision.definition if self.decision is not None else None
        ending = Approval.of(entry, outcome, reason, by, asked, definition=definition)
        return Ending(event), [AppendRecord(ending)]

    def _ending_recorded(self, at: Ending, event: Recorded) -> _Step:
        ending = at.ending
        match ending:
            case OwnerRefused(reason=reason):
                refused = Answer.denied(self.call, Reason.REFUSED, reason)
                return _DONE, [ReplyAdmin(RefusedReply()), Send(refused), _CLOSE]
            case Expired():
                detail = f"no approval within {self.pending_timeout:g} s"
                return _DONE, [Send(Answer.denied(self.call, Reason.EXPIRED, detail)), _CLOSE]
            case Stopping():
                return _DONE, [self._stopping(), _CLOSE]
            case RequesterGone():
                return _DONE, [_CLOSE]
            case _:
                assert_never(ending)  # pragma: no mutate - unreachable, mypy checks it

    def _ending_failed(self, at: Ending, event: RecordFailed) -> _Step:
        ending = at.ending
        if isinstance(ending, RequesterGone):
            return _DONE, [_CLOSE]
        effects: list[Effect] = []
        if isinstance(ending, OwnerRefused):
            effects.append(ReplyAdmin(NotRecorded(REFUSAL_UNRECORDED)))
        return _DONE, [*effects, self._audit_unavailable(), _CLOSE]

    def _owner_approved(self, at: Waiting, event: OwnerApproved) -> _Step:
        verdict = event.verdict
        if isinstance(verdict, Deny):
            outcome = ApprovalOutcome.DENIED
            return _approval(at.entry, verdict, outcome, event.grant_written, note=event.note)
        looking = LookingBeforeApproval(at.entry, verdict, event.grant_written, event.note)
        return looking, [LastLook()]

    def _looked_before_approval(self, at: LookingBeforeApproval, event: Looked) -> _Step:
        if event.gone:
            outcome = ApprovalOutcome.WITHDRAWN
            gone = Reason.REQUESTER_GONE
            return _approval(at.entry, at.verdict, outcome, at.grant_written, gone, at.note)
        outcome = approval_outcome(at.verdict)
        return _approval(at.entry, at.verdict, outcome, at.grant_written, note=at.note)

    def _approval_recorded(self, at: Approving, event: Recorded) -> _Step:
        verdict, reply = at.verdict, at.reply
        if isinstance(verdict, Deny):
            return _DONE, [ReplyAdmin(reply), self._denied(verdict.decision), _CLOSE]
        if reply.outcome is ApprovalOutcome.WITHDRAWN:
            return _DONE, [ReplyAdmin(reply), _CLOSE]
        # The last look was taken just before the approval record. The owner hears
        # after the run (:meth:`_tell_owner`), so approve can say how it ended.
        approved_ask = reply.outcome is ApprovalOutcome.ASK
        return Running(verdict, told=reply), [RunVerdict(verdict, approved=approved_ask)]

    def _approval_failed(self, at: Approving, event: RecordFailed) -> _Step:
        return _DONE, [
            ReplyAdmin(NotRecorded(APPROVAL_UNRECORDED)),
            self._audit_unavailable(),
            _CLOSE,
        ]

    def _looked_before_run(self, at: LookingBeforeRun, event: Looked) -> _Step:
        if not event.gone:
            return Running(at.run, told=None), [RunVerdict(at.run, approved=False)]
        return self._gone(at.run, told=None, stopped=False)

    def _run_stopped(self, at: Running, event: RequesterGone) -> _Step:
        return self._gone(at.verdict, told=at.told, stopped=True)

    def _gone(self, verdict: Run | Ask, *, told: ApprovedReply | None, stopped: bool) -> _Step:
        """The requester left before the run, or during it (``stopped``): the ledger
        closes the call with a ``failed`` ``requester_gone`` result on the state the run
        was decided on."""
        gone = Result.requester_gone(
            self.call,
            verdict.decision.state,
            stopped=stopped,
            definition=verdict.decision.definition,
        )
        return Gone(told), [AppendRecord(gone)]

    def _gone_recorded(self, at: Gone, event: Recorded | RecordFailed) -> _Step:
        # Nobody to answer; an owner whose approve let it run hears how it ended.
        stopped = Answer.failed(self.call, Reason.REQUESTER_GONE, RUN_STOPPED_DETAIL)
        return _DONE, [*_tell_owner(at.told, stopped), _CLOSE]

    def _tool_ran(self, at: Running, event: Ran) -> _Step:
        ran = event.outcome
        return Raising(ran, at.told), [RaiseState(self.session, ran.label)]

    def _state_raised(self, at: Raising, event: StateRaised) -> _Step:
        ran = at.ran
        reason = None if ran.ok else (ran.reason or Reason.TOOL_ERROR)
        result = Result.of_run(
            self.call,
            ok=ran.ok,
            reason=reason,
            label=ran.label,
            content=ran.content,
            after=event.state,
            definition=self.decision.definition if self.decision is not None else None,
        )
        return RecordingResult(ran, at.told), [AppendRecord(result)]

    def _state_unrecordable(self, at: Raising, event: StateUnrecordable) -> _Step:
        failed = Answer.failed(self.call, Reason.RESULT_UNRECORDED, RESULT_UNRECORDED_DETAIL)
        return _DONE, [*_tell_owner(at.told, failed), Send(failed), _CLOSE]

    def _result_recorded(self, at: RecordingResult, event: Recorded) -> _Step:
        ran = at.ran
        if ran.ok:
            answer = Answer.ok(self.call, ran.content, ran.label)
        else:
            answer = Answer.failed(self.call, ran.reason or Reason.TOOL_ERROR, ran.detail)
        return _DONE, [*_tell_owner(at.told, answer), Send(answer), _CLOSE]

    def _result_failed(self, at: RecordingResult, event: RecordFailed) -> _Step:
        # An unrecorded result's content is never passed on.
        failed = Answer.failed(self.call, Reason.AUDIT_UNAVAILABLE, AUDIT_UNAVAILABLE_DETAIL)
        return _DONE, [*_tell_owner(at.told, failed), Send(failed), _CLOSE]


def _approval(
    entry: PendingEntry,
    verdict: Verdict,
    outcome: ApprovalOutcome,
    grant_written: str | None,
    reason: Reason | None = None,
    note: str | None = None,
) -> _Step:
    """An approve's approval record, on the state its re-decision saw (UNKNOWN when it
    could not be decided on one), and what the owner will hear of it."""
    decision = verdict.decision
    if outcome is ApprovalOutcome.DENIED:
        reason, detail = decision.reason, decision.detail
    else:
        detail = None
    state = decision.state if decision.recordable else UNKNOWN
    reason_text = reason.value if reason is not None else None
    body = Approval.of(
        entry,
        outcome,
        reason_text,
        ApprovalBy.OWNER,
        state,
        grant_written,
        note,
        definition=decision.definition,
    )
    return Approving(verdict, ApprovedReply(outcome, reason, detail)), [AppendRecord(body)]


def _tell_owner(told: ApprovedReply | None, answer: Answer) -> list[Effect]:
    """An approved call's ``approved`` reply, once its answer is known: the owner hears
    how the run ended, the answer the model gets. Nothing for an auto run."""
    if told is None:
        return []
    return [ReplyAdmin(attrs.evolve(told, ran=RunEnd.of(answer)))]


_Step: TypeAlias = tuple[State, list[Effect]]


@attrs.frozen
class _Row:
    """One row of the table: the method that makes the transition, and the phases it
    may go to (the data :func:`Call.handle` checks every transition against)."""

    method: Callable[[Call, Any, Any], _Step]
    next: AbstractSet[Phase]


_ENDINGS: Final[dict[type[EndWithoutRun], tuple[ApprovalOutcome, str | None, ApprovalBy]]] = {
    Expired: (ApprovalOutcome.EXPIRED, "expired", ApprovalBy.EXPIRY),
    Stopping: (ApprovalOutcome.WITHDRAWN, Reason.BROKER_STOPPING.value, ApprovalBy.BROKER),
    RequesterGone: (ApprovalOutcome.WITHDRAWN, Reason.REQUESTER_GONE.value, ApprovalBy.BROKER),
    OwnerRefused: (ApprovalOutcome.REFUSED, None, ApprovalBy.OWNER),
}

_P = Phase
_METHODS: Final[dict[tuple[Phase, type[Event]], Callable[[Call, Any, Any], _Step]]] = {
    (_P.IDLE, Reused): Call._reused,
    (_P.IDLE, Stopping): Call._stopping_before,
    (_P.IDLE, Decided): Call._decided,
    (_P.DECISION, Recorded): Call._decision_recorded,
    (_P.DECISION, RecordFailed): Call._audit_denied,
    (_P.ENQUEUE, Enqueued): Call._enqueued,
    (_P.WAITING, Expired): Call._end,
    (_P.WAITING, Stopping): Call._end,
    (_P.WAITING, RequesterGone): Call._end,
    (_P.WAITING, OwnerRefused): Call._end,
    (_P.WAITING, OwnerApproved): Call._owner_approved,
    (_P.LOOK_APPROVAL, Looked): Call._looked_before_approval,
    (_P.ENDING, Recorded): Call._ending_recorded,
    (_P.ENDING, RecordFailed): Call._ending_failed,
    (_P.APPROVAL, Recorded): Call._approval_recorded,
    (_P.APPROVAL, RecordFailed): Call._approval_failed,
    (_P.LOOK_RUN, Looked): Call._looked_before_run,
    (_P.GONE, Recorded): Call._gone_recorded,
    (_P.GONE, RecordFailed): Call._gone_recorded,
    (_P.RUNNING, Ran): Call._tool_ran,
    (_P.RUNNING, RequesterGone): Call._run_stopped,
    (_P.RAISING, StateRaised): Call._state_raised,
    (_P.RAISING, StateUnrecordable): Call._state_unrecordable,
    (_P.RESULT, Recorded): Call._result_recorded,
    (_P.RESULT, RecordFailed): Call._result_failed,
}
# Each row's method with its declared next phases: a method without a row in the data
# fails here, at import (tests/core/test_call.py checks that every row has a method).
Call.rows = {key: _Row(method, TRANSITIONS[key]) for key, method in _METHODS.items()}
