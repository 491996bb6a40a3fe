"""The life of one tool call, from its decision to its last frame: a pure state machine.

In the manner of h11 (``_state.py`` + ``_connection.py``): a :class:`Call` takes
*events* (what happened: the decision was made, a record was written or not, the owner
answered, the deadline came, the requester left, the tool ran, the state was raised)
and returns *effects* (what to do next: record this, send this, wait for the owner until
this deadline, run this verdict, raise the state by this label, reply to the admin,
close). It does no I/O and reads no clock: brokerd's connection handler
(:mod:`boxmaker.broker.connection`) feeds it events and carries out its effects, and
holds no rule of its own. An event the table has no row for raises
:class:`IllegalEvent`, so a driver that gets the order wrong fails loudly.

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
import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, TypeAlias

import attrs

from boxmaker.core.decide import Ask, Decision, Deny, Run, Verdict, approval_outcome
from boxmaker.core.labels import FRESH, UNKNOWN, Label
from boxmaker.core.reasons import AUDIT_UNAVAILABLE_DETAIL, Reason
from boxmaker.core.state import RUNBOOK_STATE

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
# The values core hands out (the driver turns them into frames and records)


class ApprovalOutcome(enum.StrEnum):
    """How an approval ended (the ``approval`` record's outcome; ``approved``'s outcome
    is one of the first four)."""

    ASK = "ask"
    ALLOWED = "allowed"
    DENIED = "denied"
    WITHDRAWN = "withdrawn"
    REFUSED = "refused"
    EXPIRED = "expired"


APPROVE_OUTCOMES: Final = frozenset(
    {
        ApprovalOutcome.ASK,
        ApprovalOutcome.ALLOWED,
        ApprovalOutcome.DENIED,
        ApprovalOutcome.WITHDRAWN,
    }
)
"""What an owner's approve can end in (the ``approved`` admin answer says one of them):
refused and expired end a call another way."""


class ApprovalBy(enum.StrEnum):
    OWNER = "owner"
    EXPIRY = "expiry"
    BROKER = "broker"


class AnswerOutcome(enum.StrEnum):
    OK = "ok"
    DENIED = "denied"
    FAILED = "failed"


@attrs.frozen
class Answer:
    """The call's one final ``answer`` frame."""

    outcome: AnswerOutcome
    reason: Reason | None = None
    detail: str | None = None
    content: str | None = None
    label: Label | None = None


@attrs.frozen
class BadFrameError:
    """The final ``error bad_frame`` frame (a call id already used)."""

    detail: str


@attrs.frozen
class PendingNotice:
    """The ``pending`` frame: the call waits for the owner."""

    entry: PendingEntry


Frame: TypeAlias = Answer | BadFrameError | PendingNotice


@attrs.frozen
class ApprovalBody:
    """The one ``approval`` record of an asked call."""

    approval: str
    outcome: ApprovalOutcome
    reason: str | None
    by: ApprovalBy
    state: Label
    """The state it was decided on: the re-decision's for an approve, else the ask's."""
    grant_written: str | None = None
    """The grant an approve-always wrote to grants.toml before this approval."""


@attrs.frozen
class ResultBody:
    """The ``result`` record."""

    ok: bool
    reason: Reason | None
    label: Label
    state_after: Label
    output_sha256: str | None
    output_bytes: int
    stopped: bool = False
    """The run was stopped half-way because its requester left (else it never began)."""


Body: TypeAlias = Decision | ApprovalBody | ResultBody


@attrs.frozen
class RanReply:
    """How an approved call's run ended, as its answer to the model said: ``ok``, or
    ``failed`` with the reason and detail."""

    ok: bool
    reason: Reason | None = None
    detail: str | None = None


@attrs.frozen
class ApprovedReply:
    """The ``approved`` admin answer: the approval's outcome and, when the re-decision
    denied, its reason and detail; for an approval that ran, how the run ended."""

    outcome: ApprovalOutcome
    reason: Reason | None
    detail: str | None = None
    ran: RanReply | None = None


@attrs.frozen
class RefusedReply:
    """The ``refused`` admin answer."""


@attrs.frozen
class NotRecorded:
    """The approval record could not be written: the admin answers ``error internal``."""

    detail: str


AdminReply: TypeAlias = ApprovedReply | RefusedReply | NotRecorded


@attrs.frozen
class RunOutcome:
    """What the run gave (the runner's result, as core sees it)."""

    ok: bool
    reason: Reason | None
    detail: str | None
    content: str
    label: Label


# ---------------------------------------------------------------------------------------
# Events


@attrs.frozen
class Reused:
    """The call id was already used in this boot (a second decision would break the
    ledger's one decision per open call)."""


@attrs.frozen
class Stopping:
    """brokerd is stopping."""


@attrs.frozen
class Decided:
    """The request was decided. ``pending_full``: an ask found the pending caps full
    (the detail of its ``too_many_pending`` denial)."""

    verdict: Verdict
    pending_full: str | None = None


@attrs.frozen
class Recorded:
    """The record the last effect asked for was written."""


@attrs.frozen
class RecordFailed:
    """The ledger is stopped: the record was not written."""


@attrs.frozen
class Enqueued:
    """The pending entry was made; ``closed``: the table was closed (brokerd stops), so
    it was never put in it."""

    entry: PendingEntry
    closed: bool = False


@attrs.frozen
class Looked:
    """The last look: has the requester closed its end?"""

    gone: bool


@attrs.frozen
class OwnerApproved:
    """The owner approved; ``verdict`` is the re-decision with the current grants and
    state; ``grant_written`` the grant an approve-always wrote first."""

    verdict: Verdict
    grant_written: str | None = None


@attrs.frozen
class OwnerRefused:
    reason: str


@attrs.frozen
class Expired:
    """The pending deadline came (see :func:`due`)."""


@attrs.frozen
class RequesterGone:
    """The requester closed its end while the call waited, or while its tool ran (the
    driver stopped the run)."""


@attrs.frozen
class Ran:
    outcome: RunOutcome


@attrs.frozen
class StateRaised:
    """The session's state after the raise."""

    state: Label


@attrs.frozen
class StateUnrecordable:
    detail: str


Event: TypeAlias = (
    Reused
    | Stopping
    | Decided
    | Recorded
    | RecordFailed
    | Enqueued
    | Looked
    | OwnerApproved
    | OwnerRefused
    | Expired
    | RequesterGone
    | Ran
    | StateRaised
    | StateUnrecordable
)
Ending: TypeAlias = Expired | Stopping | RequesterGone | OwnerRefused
"""How a waiting call can end without a run."""


# ---------------------------------------------------------------------------------------
# Effects


@attrs.frozen
class Record:
    body: Body


@attrs.frozen
class Send:
    frame: Frame


@attrs.frozen
class Enqueue:
    """Make the pending entry of ``ask`` (an approval id, both clocks) and put it in
    the table."""

    ask: Ask


@attrs.frozen
class AwaitOwner:
    """Wait for the owner until ``deadline`` (monotonic), or until the requester goes."""

    deadline: float


@attrs.frozen
class LastLook:
    """Look whether the requester closed its end; answer with :class:`Looked`."""


@attrs.frozen
class RunVerdict:
    """Run the call as ``verdict`` says (a run, or an ask the owner approved)."""

    verdict: Run | Ask
    approved: bool


@attrs.frozen
class RaiseState:
    session: str
    label: Label


@attrs.frozen
class ReplyAdmin:
    reply: AdminReply


@attrs.frozen
class Close:
    """The call is over: close the connection."""


Effect: TypeAlias = (
    Record | Send | Enqueue | AwaitOwner | LastLook | RunVerdict | RaiseState | ReplyAdmin | Close
)


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


class IllegalEvent(RuntimeError):
    """An event the table has no row for in the call's phase: a driver bug."""

    def __init__(self, phase: Phase, event: Event) -> None:
        super().__init__(f"{type(event).__name__} is not expected in phase {phase.name}")
        self.phase = phase
        self.event = event


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


def _denied(decision: Decision) -> Answer:
    return Answer(AnswerOutcome.DENIED, decision.reason or Reason.NO_GRANT, decision.detail)


_AUDIT_DENIED: Final = Answer(
    AnswerOutcome.DENIED, Reason.AUDIT_UNAVAILABLE, AUDIT_UNAVAILABLE_DETAIL
)
_STOPPING: Final = Answer(AnswerOutcome.DENIED, Reason.BROKER_STOPPING, STOPPING_DETAIL)
_CLOSE: Final = Close()


def _approved_outcome(verdict: Verdict) -> ApprovalOutcome:
    """What approve's re-decision means (:func:`~boxmaker.core.decide.approval_outcome`)."""
    return ApprovalOutcome(approval_outcome(verdict))


class Call:
    """One call's life (see the module docstring for its table).

    ``pending_timeout`` is config's ``[broker] pending_timeout`` (seconds), named in the
    ``expired`` denial.
    """

    __slots__ = (
        "_approved",
        "_ending",
        "_grant_written",
        "_ran",
        "_verdict",
        "call",
        "decision",
        "entry",
        "pending_timeout",
        "phase",
        "session",
    )

    def __init__(self, call: str, session: str, *, pending_timeout: float) -> None:
        self.call = call
        self.session = session
        self.pending_timeout = pending_timeout
        self.phase = Phase.IDLE
        self.decision: Decision | None = None  # the first decision (the recorded one)
        self.entry: PendingEntry | None = None
        self._verdict: Verdict | None = None
        self._ending: Ending | None = None
        self._approved: ApprovedReply | None = None
        self._ran: RunOutcome | None = None
        self._grant_written: str | None = None

    def handle(self, event: Event) -> list[Effect]:
        """Feed one event; the effects to carry out, in order."""
        row = _TABLE.get((self.phase, type(event)))
        if row is None:
            raise IllegalEvent(self.phase, event)
        phase, effects = row(self, event)
        self.phase = phase
        return effects

    # -- the rows (each returns the next phase and the effects) ------------------------

    def _reused(self, event: Reused) -> _Row:
        return Phase.DONE, [Send(BadFrameError(CALL_ID_USED)), _CLOSE]

    def _stopping_before(self, event: Stopping) -> _Row:
        # Nothing was decided: like a connection refused a moment later, no record.
        return Phase.DONE, [Send(_STOPPING), _CLOSE]

    def _decided(self, event: Decided) -> _Row:
        verdict = event.verdict
        if isinstance(verdict, Ask) and event.pending_full is not None:
            verdict = verdict.too_many_pending(event.pending_full)
        self._verdict = verdict
        decision = self.decision = verdict.decision
        if not decision.recordable:
            return Phase.DONE, [Send(_denied(decision)), _CLOSE]
        return Phase.DECISION, [Record(decision)]

    def _decision_recorded(self, event: Recorded) -> _Row:
        verdict = self._verdict
        if isinstance(verdict, Run):
            return Phase.LOOK_RUN, [LastLook()]
        if isinstance(verdict, Ask):
            return Phase.ENQUEUE, [Enqueue(verdict)]
        assert verdict is not None
        return Phase.DONE, [Send(_denied(verdict.decision)), _CLOSE]

    def _audit_denied(self, event: RecordFailed) -> _Row:
        return Phase.DONE, [Send(_AUDIT_DENIED), _CLOSE]

    def _enqueued(self, event: Enqueued) -> _Row:
        self.entry = event.entry
        self._verdict = None  # an approve re-decides; the ask is not kept while it waits
        if event.closed:
            return self._end(Stopping())
        return Phase.WAITING, [Send(PendingNotice(event.entry)), AwaitOwner(event.entry.deadline)]

    def _end(self, event: Ending) -> _Row:
        entry = self.entry
        assert entry is not None
        self._ending = event
        asked = Label(entry.taint, entry.untrusted)
        outcome, reason, by = _ENDINGS[type(event)]
        if isinstance(event, OwnerRefused):
            reason = event.reason
        body = ApprovalBody(entry.approval, outcome, reason, by, asked)
        return Phase.ENDING, [Record(body)]

    def _ending_recorded(self, event: Recorded) -> _Row:
        ending = self._ending
        if isinstance(ending, OwnerRefused):
            refused = Answer(AnswerOutcome.DENIED, Reason.REFUSED, ending.reason)
            return Phase.DONE, [ReplyAdmin(RefusedReply()), Send(refused), _CLOSE]
        if isinstance(ending, Expired):
            detail = f"no approval within {self.pending_timeout:g} s"
            return Phase.DONE, [Send(Answer(AnswerOutcome.DENIED, Reason.EXPIRED, detail)), _CLOSE]
        if isinstance(ending, Stopping):
            return Phase.DONE, [Send(_STOPPING), _CLOSE]
        return Phase.DONE, [_CLOSE]

    def _ending_failed(self, event: RecordFailed) -> _Row:
        ending = self._ending
        if isinstance(ending, RequesterGone):
            return Phase.DONE, [_CLOSE]
        effects: list[Effect] = []
        if isinstance(ending, OwnerRefused):
            effects.append(ReplyAdmin(NotRecorded(REFUSAL_UNRECORDED)))
        return Phase.DONE, [*effects, Send(_AUDIT_DENIED), _CLOSE]

    def _owner_approved(self, event: OwnerApproved) -> _Row:
        self._verdict = event.verdict
        self._grant_written = event.grant_written
        outcome = _approved_outcome(event.verdict)
        if outcome is ApprovalOutcome.DENIED:
            return self._record_approval(outcome, event.verdict.decision.reason)
        return Phase.LOOK_APPROVAL, [LastLook()]

    def _looked_before_approval(self, event: Looked) -> _Row:
        if event.gone:
            return self._record_approval(ApprovalOutcome.WITHDRAWN, Reason.REQUESTER_GONE)
        assert self._verdict is not None
        return self._record_approval(_approved_outcome(self._verdict), None)

    def _record_approval(self, outcome: ApprovalOutcome, reason: Reason | None) -> _Row:
        entry, verdict = self.entry, self._verdict
        assert entry is not None
        assert verdict is not None
        decision = verdict.decision
        # The state the re-decision saw (UNKNOWN when it could not be decided on one).
        state = decision.state if decision.recordable else UNKNOWN
        detail = decision.detail if outcome is ApprovalOutcome.DENIED else None
        self._approved = ApprovedReply(outcome, reason, detail)
        reason_text = reason.value if reason is not None else None
        body = ApprovalBody(
            entry.approval, outcome, reason_text, ApprovalBy.OWNER, state, self._grant_written
        )
        return Phase.APPROVAL, [Record(body)]

    def _approval_recorded(self, event: Recorded) -> _Row:
        approved, verdict = self._approved, self._verdict
        assert approved is not None
        assert verdict is not None
        reply = ReplyAdmin(approved)
        if isinstance(verdict, Deny):
            return Phase.DONE, [reply, Send(_denied(verdict.decision)), _CLOSE]
        if approved.outcome is ApprovalOutcome.WITHDRAWN:
            return Phase.DONE, [reply, _CLOSE]
        # The last look was taken just before the approval record. The owner hears
        # after the run (:meth:`_tell_owner`), so approve can say how it ended.
        approved_ask = approved.outcome is ApprovalOutcome.ASK
        return Phase.RUNNING, [RunVerdict(verdict, approved=approved_ask)]

    def _approval_failed(self, event: RecordFailed) -> _Row:
        return Phase.DONE, [
            ReplyAdmin(NotRecorded(APPROVAL_UNRECORDED)),
            Send(_AUDIT_DENIED),
            _CLOSE,
        ]

    def _looked_before_run(self, event: Looked) -> _Row:
        verdict = self._verdict
        assert isinstance(verdict, Run)
        if not event.gone:
            return Phase.RUNNING, [RunVerdict(verdict, approved=False)]
        return self._gone(stopped=False)

    def _run_stopped(self, event: RequesterGone) -> _Row:
        return self._gone(stopped=True)

    def _gone(self, *, stopped: bool) -> _Row:
        """The requester left before the run, or during it (``stopped``): the ledger
        closes the call with a ``failed`` ``requester_gone`` result on the state the run
        was decided on; no output, no label (nobody saw anything)."""
        verdict = self._verdict
        assert verdict is not None
        state = verdict.decision.state
        gone = ResultBody(False, Reason.REQUESTER_GONE, FRESH, state, None, 0, stopped)
        return Phase.GONE, [Record(gone)]

    def _gone_recorded(self, event: Recorded | RecordFailed) -> _Row:
        # Nobody to answer; an owner whose approve let it run hears how it ended.
        stopped = Answer(AnswerOutcome.FAILED, Reason.REQUESTER_GONE, RUN_STOPPED_DETAIL)
        return Phase.DONE, [*self._tell_owner(stopped), _CLOSE]

    def _tool_ran(self, event: Ran) -> _Row:
        self._ran = event.outcome
        return Phase.RAISING, [RaiseState(self.session, event.outcome.label)]

    def _state_raised(self, event: StateRaised) -> _Row:
        ran = self._ran
        assert ran is not None
        output = ran.content.encode("utf-8")
        reason = None if ran.ok else (ran.reason or Reason.TOOL_ERROR)
        body = ResultBody(
            ran.ok,
            reason,
            ran.label,
            event.state,
            hashlib.sha256(output).hexdigest(),
            len(output),
        )
        return Phase.RESULT, [Record(body)]

    def _tell_owner(self, answer: Answer) -> list[Effect]:
        """An approved call's ``approved`` reply, once its answer is known: the owner
        hears how the run ended, the answer the model gets. Nothing for an auto run."""
        approved = self._approved
        if approved is None:
            return []
        ok = answer.outcome is AnswerOutcome.OK
        ran = RanReply(ok, None if ok else answer.reason, None if ok else answer.detail)
        return [ReplyAdmin(attrs.evolve(approved, ran=ran))]

    def _state_unrecordable(self, event: StateUnrecordable) -> _Row:
        failed = Answer(AnswerOutcome.FAILED, Reason.RESULT_UNRECORDED, RESULT_UNRECORDED_DETAIL)
        return Phase.DONE, [*self._tell_owner(failed), Send(failed), _CLOSE]

    def _result_recorded(self, event: Recorded) -> _Row:
        ran = self._ran
        assert ran is not None
        if ran.ok:
            answer = Answer(AnswerOutcome.OK, content=ran.content, label=ran.label)
        else:
            answer = Answer(AnswerOutcome.FAILED, ran.reason or Reason.TOOL_ERROR, ran.detail)
        return Phase.DONE, [*self._tell_owner(answer), Send(answer), _CLOSE]

    def _result_failed(self, event: RecordFailed) -> _Row:
        # An unrecorded result's content is never passed on.
        failed = Answer(AnswerOutcome.FAILED, Reason.AUDIT_UNAVAILABLE, AUDIT_UNAVAILABLE_DETAIL)
        return Phase.DONE, [*self._tell_owner(failed), Send(failed), _CLOSE]


_Row: TypeAlias = tuple[Phase, list[Effect]]

_ENDINGS: Final[dict[type[Ending], tuple[ApprovalOutcome, str | None, ApprovalBy]]] = {
    Expired: (ApprovalOutcome.EXPIRED, "expired", ApprovalBy.EXPIRY),
    Stopping: (ApprovalOutcome.WITHDRAWN, Reason.BROKER_STOPPING.value, ApprovalBy.BROKER),
    RequesterGone: (ApprovalOutcome.WITHDRAWN, Reason.REQUESTER_GONE.value, ApprovalBy.BROKER),
    OwnerRefused: (ApprovalOutcome.REFUSED, None, ApprovalBy.OWNER),
}

_TABLE: Final[dict[tuple[Phase, type[Event]], Callable[[Call, Any], _Row]]] = {
    (Phase.IDLE, Reused): Call._reused,
    (Phase.IDLE, Stopping): Call._stopping_before,
    (Phase.IDLE, Decided): Call._decided,
    (Phase.DECISION, Recorded): Call._decision_recorded,
    (Phase.DECISION, RecordFailed): Call._audit_denied,
    (Phase.ENQUEUE, Enqueued): Call._enqueued,
    (Phase.WAITING, Expired): Call._end,
    (Phase.WAITING, Stopping): Call._end,
    (Phase.WAITING, RequesterGone): Call._end,
    (Phase.WAITING, OwnerRefused): Call._end,
    (Phase.WAITING, OwnerApproved): Call._owner_approved,
    (Phase.LOOK_APPROVAL, Looked): Call._looked_before_approval,
    (Phase.ENDING, Recorded): Call._ending_recorded,
    (Phase.ENDING, RecordFailed): Call._ending_failed,
    (Phase.APPROVAL, Recorded): Call._approval_recorded,
    (Phase.APPROVAL, RecordFailed): Call._approval_failed,
    (Phase.LOOK_RUN, Looked): Call._looked_before_run,
    (Phase.GONE, Recorded): Call._gone_recorded,
    (Phase.GONE, RecordFailed): Call._gone_recorded,
    (Phase.RUNNING, Ran): Call._tool_ran,
    (Phase.RUNNING, RequesterGone): Call._run_stopped,
    (Phase.RAISING, StateRaised): Call._state_raised,
    (Phase.RAISING, StateUnrecordable): Call._state_unrecordable,
    (Phase.RESULT, Recorded): Call._result_recorded,
    (Phase.RESULT, RecordFailed): Call._result_failed,
}
