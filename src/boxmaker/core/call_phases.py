"""A call's phases, and what the call knows in each (:data:`State`). Pure values.

The machine (:mod:`boxmaker.core.call`) holds one of these states at a time; the
table (:mod:`boxmaker.core.call_table`) says which events each phase takes and which
phases each row may go to.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, ClassVar, TypeAlias

import attrs

from boxmaker.core.call_events import ApprovedReply, EndWithoutRun, RunOutcome
from boxmaker.core.decide import Ask, Run, Verdict

if TYPE_CHECKING:
    from boxmaker.core.approvals import PendingEntry


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
    note: str | None = None
    approver: str | None = None


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
