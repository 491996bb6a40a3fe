"""The call's transition table: its drawing and its data (:data:`TRANSITIONS`). Pure.

Every rule of a call's life is in the table below and nowhere else: the write order
(the decision before anything else; the approval record before the run; the result
record before the answer), the two last looks (before an auto run, and before the
record of an approval that would run), what an unrecorded decision, refusal, approval
or result answers, and what a pending call ends with. Beside it, what an approve that
comes too late hears (:func:`boxmaker.core.owner_answer.late_owner_answer`) and where
the deadline falls (:func:`boxmaker.core.approvals.due`).

The machine that follows it is :class:`boxmaker.core.call.Call`, each row one of its
methods; what the call knows in each phase is :data:`boxmaker.core.call_phases.State`.
tools/check_docs.py checks the drawing below, and docs/protocol.md's copy, against
:data:`TRANSITIONS`, and :meth:`Call.handle <boxmaker.core.call.Call.handle>` checks
every transition against it.

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

from collections.abc import Mapping
from typing import Final

from boxmaker.core.call_events import (
    Decided,
    Enqueued,
    Event,
    Expired,
    Looked,
    OwnerApproved,
    OwnerRefused,
    Ran,
    Recorded,
    RecordFailed,
    RequesterGone,
    Reused,
    StateRaised,
    StateUnrecordable,
    Stopping,
)
from boxmaker.core.call_phases import Phase

_P = Phase
TRANSITIONS: Final[Mapping[tuple[Phase, type[Event]], frozenset[Phase]]] = {
    (_P.IDLE, Reused): frozenset({_P.DONE}),
    (_P.IDLE, Stopping): frozenset({_P.DONE}),
    (_P.IDLE, Decided): frozenset({_P.DONE, _P.DECISION}),
    (_P.DECISION, Recorded): frozenset({_P.DONE, _P.LOOK_RUN, _P.ENQUEUE}),
    (_P.DECISION, RecordFailed): frozenset({_P.DONE}),
    (_P.ENQUEUE, Enqueued): frozenset({_P.WAITING, _P.ENDING}),
    (_P.WAITING, Expired): frozenset({_P.ENDING}),
    (_P.WAITING, Stopping): frozenset({_P.ENDING}),
    (_P.WAITING, RequesterGone): frozenset({_P.ENDING}),
    (_P.WAITING, OwnerRefused): frozenset({_P.ENDING}),
    (_P.WAITING, OwnerApproved): frozenset({_P.APPROVAL, _P.LOOK_APPROVAL}),
    (_P.LOOK_APPROVAL, Looked): frozenset({_P.APPROVAL}),
    (_P.ENDING, Recorded): frozenset({_P.DONE}),
    (_P.ENDING, RecordFailed): frozenset({_P.DONE}),
    (_P.APPROVAL, Recorded): frozenset({_P.DONE, _P.RUNNING}),
    (_P.APPROVAL, RecordFailed): frozenset({_P.DONE}),
    (_P.LOOK_RUN, Looked): frozenset({_P.RUNNING, _P.GONE}),
    (_P.GONE, Recorded): frozenset({_P.DONE}),
    (_P.GONE, RecordFailed): frozenset({_P.DONE}),
    (_P.RUNNING, Ran): frozenset({_P.RAISING}),
    (_P.RUNNING, RequesterGone): frozenset({_P.GONE}),
    (_P.RAISING, StateRaised): frozenset({_P.RESULT}),
    (_P.RAISING, StateUnrecordable): frozenset({_P.DONE}),
    (_P.RESULT, Recorded): frozenset({_P.DONE}),
    (_P.RESULT, RecordFailed): frozenset({_P.DONE}),
}
"""The table as data: every row, (phase, event type) → the phases it may go to. The
drawing above and docs/protocol.md's copy are checked against it (tools/check_docs.py),
and :meth:`Call.handle <boxmaker.core.call.Call.handle>` checks every transition
against it."""
