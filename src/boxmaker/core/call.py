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

The table is data (:data:`TRANSITIONS`: every row's possible next phases), and every
transition is checked against it (:class:`IllegalTransition`); tools/check_docs.py
checks the drawing below, and docs/protocol.md's copy, against it. What the call knows
is its phase's state (:data:`State`: the entry while it waits, the verdict while its
record is written, what the run gave while the state is raised), never a field that a
row must hope is set.

Every rule of a call's life is in the table below and nowhere else: the write order
(the decision before anything else; the approval record before the run; the result
record before the answer), the two last looks (before an auto run, and before the
record of an approval that would run), what an unrecorded decision, refusal, approval
or result answers, what a pending call ends with, and (:func:`late_owner_answer`,
:func:`due`) what an approve that comes too late hears and where the deadline falls.

The transition table (phase, event → effects → next phase)::

    IDLE
      Reused                      → send error bad_frame "call id already used"; close → DONE
      Stopping                    → send denied broker_stopping; close          → DONE
      Decided(ask, pending_full)  → the ask becomes deny too_many_pending, then as below
      Decided(not recordable)     → send denied (audit_unavailable); close      → DONE
      Decided(run|ask|deny)       → record the decision                         → DECISION
    DECISION (the decision record is being written)
      RecordFailed                → send denied audit_unavailable; close        → DONE
      Recorded, deny              → send denied (its reason); close             → DONE
      Recorded, run               → last look                                   → LOOK_RUN
      Recorded, ask               → enqueue (put it in the approvals table)     → ENQUEUE
    ENQUEUE
      Enqueued(entry)             → send pending; wait for the owner until the
                                    entry's deadline                             → WAITING
      Enqueued(entry, closed)     → (brokerd is stopping) record approval
                                    withdrawn broker_stopping by broker          → ENDING
    WAITING (one of these five ends it; whoever took the entry delivered it)
      Expired                     → record approval expired by expiry           → ENDING
      Stopping                    → record approval withdrawn broker_stopping   → ENDING
      RequesterGone               → record approval withdrawn requester_gone    → ENDING
      OwnerRefused(reason)        → record approval refused (reason) by owner   → ENDING
      OwnerApproved(re-decision)  → deny: record approval denied (its reason)   → APPROVAL
                                    ask/run: last look                          → LOOK_APPROVAL
    LOOK_APPROVAL
      Looked(gone)                → record approval withdrawn requester_gone    → APPROVAL
      Looked(here)                → record approval ask/allowed by owner        → APPROVAL
    ENDING (the approval record of an ending without a run)
      Recorded                    → expired: send denied expired "no approval within T s"
                                    stopping: send denied broker_stopping
                                    requester gone: nothing to send
                                    refused: reply refused; send denied refused (reason)
                                    then close                                  → DONE
      RecordFailed                → refused: reply not recorded (REFUSAL_UNRECORDED);
                                    requester gone: nothing to send; else (and refused)
                                    send denied audit_unavailable; close        → DONE
    APPROVAL (the approval record of an approve)
      Recorded                    → denied: reply approved (outcome, reason,
                                    detail); send denied (the re-decision's
                                    reason); close                              → DONE
                                    withdrawn: reply approved; close            → DONE
                                    ask/allowed: run the re-decision (approved);
                                    the reply waits for the run's end           → RUNNING
      RecordFailed                → reply not recorded (APPROVAL_UNRECORDED);
                                    send denied audit_unavailable; close        → DONE
    LOOK_RUN
      Looked(gone)                → record result failed requester_gone         → GONE
      Looked(here)                → run the verdict                             → RUNNING
    GONE
      Recorded | RecordFailed     → (approved: reply approved, ran failed
                                    requester_gone) close (nobody to answer)    → DONE
    RUNNING
      Ran(outcome)                → raise the session's state by its label      → RAISING
      RequesterGone               → (the run was stopped) record result failed
                                    requester_gone                              → GONE
    RAISING
      StateRaised(state)          → record the result                           → RESULT
      StateUnrecordable(detail)   → (approved: reply approved, ran failed)
                                    send failed result_unrecorded; close        → DONE
    RESULT
      Recorded                    → (approved: reply approved, ran ok / failed)
                                    send ok (content) or failed (reason); close → DONE
      RecordFailed                → (approved: reply approved, ran failed)
                                    send failed audit_unavailable (the content is
                                    never passed on unrecorded); close          → DONE

An approve's last look comes before its record, so the record says what happened: a
requester gone by then makes the approval ``withdrawn`` and nothing runs. An auto run's
last look comes after its decision record; a requester gone then leaves a ``failed``
``requester_gone`` result, so the call is closed in the ledger.
A requester that leaves while its tool runs (``RequesterGone`` in RUNNING) has its run
stopped by the driver (the sandbox's processes killed); the result is ``failed``
``requester_gone`` with nothing of the output passed on or counted into the state, as
nobody saw it.
"""

from __future__ import annotations

import enum
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
    RanReply,
    Recorded,
    RecordFailed,
    RefusedReply,
    ReplyAdmin,
    RequesterGone,
    Reused,
    RunOutcome,
    RunVerdict,
    Send,
    StateRaised,
    StateUnrecordable,
    Stopping,
)
from boxmaker.core.decide import Ask, Deny, Ruling, Run, Verdict, approval_outcome
from boxmaker.core.labels import UNKNOWN, Label
from boxmaker.core.reasons import AUDIT_UNAVAILABLE_DETAIL, Reason
from boxmaker.core.state import RUNBOOK_STATE
from boxmaker.core.vocabulary import APPROVE_OUTCOMES as APPROVE_OUTCOMES
from boxmaker.core.vocabulary import (
    Answer,
    AnswerOutcome,
    Approval,
    ApprovalBy,
    ApprovalOutcome,
    Decision,
    ErrorCode,
    ErrorFrame,
    Pending,
    Result,
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


def due(deadline: float, now: float) -> bool:
    """The expiry boundary, the one place it is written: at ``now >= deadline`` a
    pending entry has expired (``>=`` everywhere: the table, the admin's take, the
    waiting call's own deadline). ``deadline`` and ``now`` are monotonic seconds."""
    return now >= deadline


# ---------------------------------------------------------------------------------------
# Phases, and what each knows


class Phase(enum.Enum):
    IDLE = "idle"
    DECISION = "decision"
    ENQUEUE = "enqueue"
    WAITING = "waiting"
    LOOK_APPROVAL = "look_approval"
    ENDING = "ending"
    APPROVAL = "approval"
    LOOK_RUN = "look_run"
    GONE = "gone"
    RUNNING = "running"
    RAISING = "raising"
    RESULT = "result"
    DONE = "done"


@attrs.frozen
class Idle:
    """A tool request was read, its call id claimed."""

    phase: ClassVar[Phase] = Phase.IDLE


@attrs.frozen
class Deciding:
    """The decision record of ``verdict`` is being written."""

    phase: ClassVar[Phase] = Phase.DECISION
    verdict: Verdict


@attrs.frozen
class Enqueueing:
    """The ask's pending entry is being made (the ask itself is not kept: the entry holds
    what the owner is shown, and an approve re-decides)."""

    phase: ClassVar[Phase] = Phase.ENQUEUE


@attrs.frozen
class Waiting:
    """``entry`` waits for the owner."""

    phase: ClassVar[Phase] = Phase.WAITING
    entry: PendingEntry


@attrs.frozen
class LookingBeforeApproval:
    """The last look after an approve whose re-decision would run."""

    phase: ClassVar[Phase] = Phase.LOOK_APPROVAL
    entry: PendingEntry
    verdict: Run | Ask
    grant_written: str | None


@attrs.frozen
class Ending:
    """The approval record of an ending without a run is being written."""

    phase: ClassVar[Phase] = Phase.ENDING
    ending: EndWithoutRun


@attrs.frozen
class Approving:
    """The approval record of an approve is being written; ``reply`` is what the owner
    hears of it."""

    phase: ClassVar[Phase] = Phase.APPROVAL
    verdict: Verdict
    reply: ApprovedReply


@attrs.frozen
class LookingBeforeRun:
    """The last look before an auto run."""

    phase: ClassVar[Phase] = Phase.LOOK_RUN
    run: Run


@attrs.frozen
class Gone:
    """The result ``failed`` ``requester_gone`` is being written. ``told``: the owner
    whose approve let the call run, waiting to hear how it ended (None for an auto run),
    here and in the phases after a run."""

    phase: ClassVar[Phase] = Phase.GONE
    told: ApprovedReply | None


@attrs.frozen
class Running:
    phase: ClassVar[Phase] = Phase.RUNNING
    verdict: Run | Ask
    told: ApprovedReply | None


@attrs.frozen
class Raising:
    """The session's state is being raised by what ``ran`` gave."""

    phase: ClassVar[Phase] = Phase.RAISING
    ran: RunOutcome
    told: ApprovedReply | None


@attrs.frozen
class RecordingResult:
    phase: ClassVar[Phase] = Phase.RESULT
    ran: RunOutcome
    told: ApprovedReply | None


@attrs.frozen
class Done:
    """The connection is closed."""

    phase: ClassVar[Phase] = Phase.DONE


State: TypeAlias = (
    Idle
    | Deciding
    | Enqueueing
    | Waiting
    | LookingBeforeApproval
    | Ending
    | Approving
    | LookingBeforeRun
    | Gone
    | Running
    | Raising
    | RecordingResult
    | Done
)
"""What the call knows in each phase, and only that: a phase's state carries exactly the
values its rows read (the entry while it waits, the verdict while its record is written,
what the run gave while the state is raised), so no row can find one missing."""


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


class EarlierEnd(enum.Enum):
    """How an entry ended before an owner's answer came, as brokerd remembers it."""

    EXPIRED = "expired"
    WITHDRAWN = "withdrawn"


def late_owner_answer(approval: str, earlier: EarlierEnd | None) -> tuple[str, str]:
    """What an approve or refuse of an entry no longer in the table hears: ``expired``
    when it expired (so one racing the expiry hears the same whichever took the entry
    first); ``no_such_approval`` otherwise, saying so when its requester left first (a
    chat ended with Ctrl-C). (error code, detail).

    >>> late_owner_answer("a-00000001", EarlierEnd.WITHDRAWN)[1]
    'approval a-00000001 was withdrawn: its requester left before anyone answered; nothing ran'
    """
    if earlier is EarlierEnd.EXPIRED:
        return "expired", f"approval {approval} expired"
    if earlier is EarlierEnd.WITHDRAWN:
        return "no_such_approval", (
            f"approval {approval} was withdrawn: its requester left before anyone answered; "
            "nothing ran"
        )
    return "no_such_approval", f"no pending approval {approval}"


_CLOSE: Final = Close()
_DONE: Final = Done()


class Call:
    """One call's life (see the module docstring for its table).

    ``boot`` is brokerd's boot id (its decision record names it); ``pending_timeout``
    is config's ``[broker] pending_timeout`` (seconds), named in the ``expired`` denial.
    """

    __slots__ = ("_state", "boot", "call", "decision", "pending_timeout", "session")

    rows: ClassVar[Mapping[tuple[Phase, type[Event]], _Row]]
    """The table (:data:`TRANSITIONS` is its data); set once the rows are defined."""

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
        return Ending(event), [AppendRecord(Approval.of(entry, outcome, reason, by, asked))]

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
            return _approval(at.entry, verdict, ApprovalOutcome.DENIED, event.grant_written)
        looking = LookingBeforeApproval(at.entry, verdict, event.grant_written)
        return looking, [LastLook()]

    def _looked_before_approval(self, at: LookingBeforeApproval, event: Looked) -> _Step:
        if event.gone:
            outcome = ApprovalOutcome.WITHDRAWN
            return _approval(at.entry, at.verdict, outcome, at.grant_written, Reason.REQUESTER_GONE)
        outcome = approval_outcome(at.verdict)
        return _approval(at.entry, at.verdict, outcome, at.grant_written)

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
        gone = Result.requester_gone(self.call, verdict.decision.state, stopped=stopped)
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
    body = Approval.of(entry, outcome, reason_text, ApprovalBy.OWNER, state, grant_written)
    return Approving(verdict, ApprovedReply(outcome, reason, detail)), [AppendRecord(body)]


def _tell_owner(told: ApprovedReply | None, answer: Answer) -> list[Effect]:
    """An approved call's ``approved`` reply, once its answer is known: the owner hears
    how the run ended, the answer the model gets. Nothing for an auto run."""
    if told is None:
        return []
    # An ok answer has no reason and no detail; a failed one says both.
    ran = RanReply(answer.outcome is AnswerOutcome.OK, answer.reason, answer.detail)
    return [ReplyAdmin(attrs.evolve(told, ran=ran))]


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
_TABLE: Final[dict[tuple[Phase, type[Event]], _Row]] = {
    (_P.IDLE, Reused): _Row(Call._reused, {_P.DONE}),
    (_P.IDLE, Stopping): _Row(Call._stopping_before, {_P.DONE}),
    (_P.IDLE, Decided): _Row(Call._decided, {_P.DONE, _P.DECISION}),
    (_P.DECISION, Recorded): _Row(Call._decision_recorded, {_P.DONE, _P.LOOK_RUN, _P.ENQUEUE}),
    (_P.DECISION, RecordFailed): _Row(Call._audit_denied, {_P.DONE}),
    (_P.ENQUEUE, Enqueued): _Row(Call._enqueued, {_P.WAITING, _P.ENDING}),
    (_P.WAITING, Expired): _Row(Call._end, {_P.ENDING}),
    (_P.WAITING, Stopping): _Row(Call._end, {_P.ENDING}),
    (_P.WAITING, RequesterGone): _Row(Call._end, {_P.ENDING}),
    (_P.WAITING, OwnerRefused): _Row(Call._end, {_P.ENDING}),
    (_P.WAITING, OwnerApproved): _Row(Call._owner_approved, {_P.APPROVAL, _P.LOOK_APPROVAL}),
    (_P.LOOK_APPROVAL, Looked): _Row(Call._looked_before_approval, {_P.APPROVAL}),
    (_P.ENDING, Recorded): _Row(Call._ending_recorded, {_P.DONE}),
    (_P.ENDING, RecordFailed): _Row(Call._ending_failed, {_P.DONE}),
    (_P.APPROVAL, Recorded): _Row(Call._approval_recorded, {_P.DONE, _P.RUNNING}),
    (_P.APPROVAL, RecordFailed): _Row(Call._approval_failed, {_P.DONE}),
    (_P.LOOK_RUN, Looked): _Row(Call._looked_before_run, {_P.RUNNING, _P.GONE}),
    (_P.GONE, Recorded): _Row(Call._gone_recorded, {_P.DONE}),
    (_P.GONE, RecordFailed): _Row(Call._gone_recorded, {_P.DONE}),
    (_P.RUNNING, Ran): _Row(Call._tool_ran, {_P.RAISING}),
    (_P.RUNNING, RequesterGone): _Row(Call._run_stopped, {_P.GONE}),
    (_P.RAISING, StateRaised): _Row(Call._state_raised, {_P.RESULT}),
    (_P.RAISING, StateUnrecordable): _Row(Call._state_unrecordable, {_P.DONE}),
    (_P.RESULT, Recorded): _Row(Call._result_recorded, {_P.DONE}),
    (_P.RESULT, RecordFailed): _Row(Call._result_failed, {_P.DONE}),
}
Call.rows = _TABLE

TRANSITIONS: Final[Mapping[tuple[Phase, type[Event]], frozenset[Phase]]] = {
    key: frozenset(row.next) for key, row in _TABLE.items()
}
"""The table as data: every row, (phase, event type) → the phases it may go to. The
drawing above and docs/protocol.md's copy are checked against it (tools/check_docs.py),
and :meth:`Call.handle` checks every transition against it."""
