"""What a call's machine (:mod:`boxmaker.core.call`) and its driver
(:mod:`boxmaker.core.drive`) say to each other, in the manner of h11's ``_events.py``:
the *events* a :class:`~boxmaker.core.call.Call` takes (what happened), the *effects* it
gives (what to do next), and what the owner's admin connection hears of an approve or
refuse. Pure values; the frames and records the effects carry are the call's vocabulary
(:mod:`boxmaker.core.vocabulary`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

import attrs

from boxmaker.core.decide import Ask, Run, Verdict
from boxmaker.core.labels import Label
from boxmaker.core.reasons import Reason
from boxmaker.core.vocabulary import (
    Answer,
    Approval,
    ApprovalOutcome,
    Decision,
    ErrorFrame,
    Pending,
    Result,
    RunEnd,
)

if TYPE_CHECKING:
    from boxmaker.core.approvals import PendingEntry

# ---------------------------------------------------------------------------------------
# What the machine hands out besides the vocabulary's frames and records


CallFrame: TypeAlias = Pending | Answer | ErrorFrame
"""The frames a call sends its requester (broker.sock)."""
CallRecord: TypeAlias = Decision | Approval | Result
"""The records a call writes (the ledger)."""


@attrs.frozen
class ApprovedReply:
    """The ``approved`` admin answer: the approval's outcome and, when the re-decision
    denied, its reason and detail; for an approval that ran, how the run ended."""

    outcome: ApprovalOutcome
    reason: Reason | None
    detail: str | None = None
    ran: RunEnd | None = None


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
    state; ``grant_written`` the grant an approve-always wrote first; ``note`` the
    owner's, kept in the approval record. ``approver``: the MCP client whose answer
    this is (``mcp-client:<name>``, :mod:`boxmaker.core.client_answer`), where the
    asking grant lets it count; None for the owner's own."""

    verdict: Verdict
    grant_written: str | None = None
    note: str | None = None
    approver: str | None = None


@attrs.frozen
class OwnerRefused:
    """The owner refused (``reason``: the text the model is told); ``approver`` as for
    :class:`OwnerApproved`."""

    reason: str
    approver: str | None = None


@attrs.frozen
class Expired:
    """The pending deadline came (see :func:`boxmaker.core.approvals.due`)."""


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
EndWithoutRun: TypeAlias = Expired | Stopping | RequesterGone | OwnerRefused
"""How a waiting call can end without a run."""


# ---------------------------------------------------------------------------------------
# Effects


@attrs.frozen
class AppendRecord:
    """Append this record to the ledger; answer with :class:`Recorded` or
    :class:`RecordFailed`."""

    body: CallRecord


@attrs.frozen
class Send:
    frame: CallFrame


@attrs.frozen
class Enqueue:
    """Make the pending entry of ``ask`` (an approval id, both clocks) and put it in
    the table."""

    ask: Ask


@attrs.frozen
class AwaitOwner:
    """Wait for the owner's answer to ``entry`` until its deadline, or until the
    requester goes."""

    entry: PendingEntry

    @property
    def deadline(self) -> float:
        """Monotonic seconds (``trio.current_time()``)."""
        return self.entry.deadline


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
    AppendRecord
    | Send
    | Enqueue
    | AwaitOwner
    | LastLook
    | RunVerdict
    | RaiseState
    | ReplyAdmin
    | Close
)
