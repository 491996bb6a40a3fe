"""The frames of admin.sock (docs/protocol.md): the owner's requests (bxctl) and
brokerd's answers."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal, TypeAlias

import attrs

from boxmaker.core import labels
from boxmaker.core.grants import OWNER
from boxmaker.core.reasons import Reason
from boxmaker.core.vocabulary import (
    APPROVE_OUTCOMES,
    ApprovalOutcome,
    ErrorFrame,
    GrantRef,
    RunEnd,
    to_ms,
    valid_approval_id,
    valid_call_id,
    valid_session_id,
)
from boxmaker.wire.common import non_negative, text_between

if TYPE_CHECKING:
    from boxmaker.core.approvals import PendingEntry
    from boxmaker.core.call_events import ApprovedReply

MAX_REFUSE_REASON: Final = 500
"""The owner's refusal reason is 1 to 500 characters."""
MAX_NOTE: Final = 500


@attrs.frozen(kw_only=True)
class ApprovalsRequest:
    KIND: ClassVar[str] = "approvals"


MAX_ALWAYS_S: Final = 366 * 86400
"""The longest ``always.for_s``: a year and a day."""


@attrs.frozen(kw_only=True)
class Always:
    """approve's ``always``: also write a grant for this call (docs/protocol.md).
    ``scope`` ``exact`` (the path, command or host itself) or ``dir`` (the path's
    directory); ``for_s`` how long it lasts (its ``expires``), None for no end."""

    scope: Literal["exact", "dir"] = "exact"
    for_s: int | None = attrs.field(
        default=None,
        validator=attrs.validators.optional(
            [attrs.validators.ge(1), attrs.validators.le(MAX_ALWAYS_S)]
        ),
    )


@attrs.frozen(kw_only=True)
class Approve:
    KIND: ClassVar[str] = "approve"
    approval: str = attrs.field(validator=valid_approval_id)
    note: str | None = attrs.field(default=None, validator=text_between(0, MAX_NOTE))
    always: Always | None = None


@attrs.frozen(kw_only=True)
class Refuse:
    """``refuse``: the reason (1 to 500 characters, not blank) goes to the model."""

    KIND: ClassVar[str] = "refuse"
    approval: str = attrs.field(validator=valid_approval_id)
    reason: str = attrs.field(validator=text_between(1, MAX_REFUSE_REASON))


@attrs.frozen(kw_only=True)
class StatusRequest:
    KIND: ClassVar[str] = "status"


@attrs.frozen(kw_only=True)
class SessionsRequest:
    KIND: ClassVar[str] = "sessions"


@attrs.frozen(kw_only=True)
class ChangePreview:
    """What a pending ``write_file`` would change, read when the list was asked for:
    ``summary`` in words ("creates 12 bytes", "replaces 40 bytes with 52", "cannot
    show: …"), ``lines`` a unified diff against the file as it is (``+`` lines only for
    a new file), bounded, ``lines_left_out`` what the bound left out."""

    summary: str
    lines: list[str] = attrs.Factory(list)
    lines_left_out: int = attrs.field(default=0, validator=non_negative)


@attrs.frozen(kw_only=True)
class ApprovalView:
    """One pending entry in an ``approvals`` answer; ``preview`` for a write_file
    (brokerd's own look at the file, never the model's words), else None."""

    approval: str = attrs.field(validator=valid_approval_id)
    call: str = attrs.field(validator=valid_call_id)
    session: str = attrs.field(validator=valid_session_id)
    tool: str
    arguments: dict[str, Any]
    grant: GrantRef
    requested_at: dt.datetime = attrs.field(converter=to_ms)
    expires_at: dt.datetime = attrs.field(converter=to_ms)
    taint: labels.Taint
    untrusted: bool
    preview: ChangePreview | None = None
    approvers: tuple[str, ...] = (OWNER,)
    """Who may answer (the grant's ``approvers``); left out of the line when only the
    owner may."""

    @classmethod
    def of(cls, entry: PendingEntry, preview: ChangePreview | None = None) -> ApprovalView:
        """The entry as an ``approvals`` answer lists it."""
        return cls(
            approval=entry.approval,
            call=entry.call,
            session=entry.session,
            tool=entry.tool,
            arguments=entry.arguments,
            grant=entry.grant,
            requested_at=entry.requested_at,
            expires_at=entry.expires_at_wall,
            taint=entry.taint,
            untrusted=entry.untrusted,
            preview=preview,
            approvers=entry.approvers,
        )


@attrs.frozen(kw_only=True)
class ApprovalsAnswer:
    KIND: ClassVar[str] = "approvals"
    entries: list[ApprovalView]


@attrs.frozen(kw_only=True)
class Approved:
    """``approved``: the outcome of the re-decision and the last look; ``detail`` the
    re-decision's when it denied; ``tool`` the call's; ``ran`` how the run ended when
    the approval let it run (the answer comes after the run)."""

    KIND: ClassVar[str] = "approved"
    outcome: ApprovalOutcome = attrs.field(validator=attrs.validators.in_(APPROVE_OUTCOMES))
    call: str = attrs.field(validator=valid_call_id)
    reason: Reason | None
    detail: str | None = None
    tool: str | None = None
    ran: RunEnd | None = None
    grant_written: str | None = None
    """The id of the grant an approve with ``always`` wrote to grants.toml."""

    @classmethod
    def of(
        cls, reply: ApprovedReply, *, call: str, tool: str, grant_written: str | None
    ) -> Approved:
        """The frame for the call's task's report (``reply``) of an approve."""
        return cls(
            outcome=reply.outcome,
            call=call,
            reason=reply.reason,
            detail=reply.detail,
            tool=tool,
            ran=reply.ran,
            grant_written=grant_written,
        )


@attrs.frozen(kw_only=True)
class Refused:
    KIND: ClassVar[str] = "refused"
    call: str = attrs.field(validator=valid_call_id)


@attrs.frozen(kw_only=True)
class StatusAnswer:
    KIND: ClassVar[str] = "status"
    version: str
    boot: str
    head: str
    ledger_usable: bool
    grants_valid: bool
    grants_problem: str | None
    pending: int = attrs.field(validator=non_negative)
    sessions: int = attrs.field(validator=non_negative)
    uptime_s: float = attrs.field(validator=non_negative)
    sandbox_bounds: str
    """What bounds the shell's sandbox as a whole: "cgroup v1: memory+swap, pids",
    "cgroup v2: …", or "none: why" (docs/runbook.md#sandbox-limits)."""
    shell_ready: bool
    """Whether the shell's sandbox can run in the workspace now; when not, every shell
    call is denied ``sandbox_unavailable`` (an ask before the owner is asked)."""
    shell_problem: str | None
    """Why it cannot (its runbook entry named), or None (docs/runbook.md#sandbox)."""
    witness_lagging: str | None = None
    """While ``[ledger] witness_lag = "deny_risky"`` and a witness lags: why every risky
    call is denied ``witness_lagging`` (docs/runbook.md#witness); else None."""


@attrs.frozen(kw_only=True)
class SessionView:
    session: str = attrs.field(validator=valid_session_id)
    taint: labels.Taint
    untrusted: bool
    calls: int = attrs.field(validator=non_negative)


@attrs.frozen(kw_only=True)
class SessionsAnswer:
    KIND: ClassVar[str] = "sessions"
    sessions: list[SessionView]


@attrs.frozen(kw_only=True)
class ReloadGrantsRequest:
    """``reload_grants``: read grants.toml again now (``bxctl grants revoke`` sends it)."""

    KIND: ClassVar[str] = "reload_grants"


@attrs.frozen(kw_only=True)
class GrantsReloaded:
    """What brokerd decides with after ``reload_grants``: ``grants`` valid grants, or the
    ``problem`` that makes it deny every call."""

    KIND: ClassVar[str] = "grants_reloaded"
    valid: bool
    grants: int = attrs.field(validator=non_negative)
    problem: str | None


AdminRequest: TypeAlias = (
    ApprovalsRequest | Approve | Refuse | StatusRequest | SessionsRequest | ReloadGrantsRequest
)
"""What bxctl may send on admin.sock."""
AdminAnswer: TypeAlias = (
    ApprovalsAnswer
    | Approved
    | Refused
    | StatusAnswer
    | SessionsAnswer
    | GrantsReloaded
    | ErrorFrame
)
"""What brokerd sends back on admin.sock."""
