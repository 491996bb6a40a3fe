"""The call's vocabulary: the values that the core, the wire and the ledger all carry,
each defined once, here (docs/architecture.md).

In the manner of h11's events, which are both its state machine's vocabulary and its
users': a ``tool_request`` is one :class:`ToolRequest` whether loopd sends it, brokerd
decides it or ``bxctl grants test`` makes one up; the call's machine (:mod:`boxmaker.core.call`)
answers with the :class:`Answer`, :class:`Pending` and :class:`ErrorFrame` that go on
broker.sock as they are, and writes the :class:`Decision`, :class:`Approval` and
:class:`Result` that go in the ledger as they are. The bytes are the wire's
(:func:`boxmaker.wire.encode_frame`) and the ledger's
(:func:`boxmaker.ledger.records.encode_line`); each way a value is made from another is
a named constructor here (:meth:`Pending.of`, :meth:`Answer.denied`,
:meth:`Decision.of`, :meth:`Result.of_run`, ...). Pure: no I/O, no clock.

>>> Answer.denied("c-0000000000000001", Reason.NO_GRANT, "no grant allows it").outcome
<AnswerOutcome.DENIED: 'denied'>
"""

from __future__ import annotations

import datetime as dt
import enum
import hashlib
import re
from collections.abc import Callable
from typing import (
    TYPE_CHECKING,
    Any,
    ClassVar,
    Final,
    Generic,
    Literal,
    TypeAlias,
    TypeGuard,
    TypeVar,
)

import attrs

from boxmaker.core.grants import APPROVERS, OWNER
from boxmaker.core.labels import FRESH, Label, Taint
from boxmaker.core.reasons import Reason
from boxmaker.formats.convert import APPROVAL_ID, CALL_ID, SESSION_ID, InvalidField

if TYPE_CHECKING:
    from boxmaker.core.approvals import PendingEntry
    from boxmaker.core.decide import Ruling

# ---------------------------------------------------------------------------------------
# Fields: the validators and converters the values below (and the wire's frames) share

FieldValidator: TypeAlias = "Callable[[Any, attrs.Attribute[Any], Any], None]"
"""An attrs validator: raises :class:`~boxmaker.formats.convert.InvalidField` naming the field."""


def _check_id(pattern: re.Pattern[str], words: str, name: str, value: Any) -> None:
    """The value fully matches ``pattern`` (the ids of docs/protocol.md), else
    :class:`~boxmaker.formats.convert.InvalidField` naming the field and the form expected."""
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise InvalidField(name, f"expected {words}")


def valid_call_id(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    """An attrs validator: a call id."""
    _check_id(CALL_ID, "c- and 16 hex digits", attribute.name, value)


def valid_session_id(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    """An attrs validator: a session id."""
    _check_id(SESSION_ID, "s- and 12 hex digits", attribute.name, value)


def valid_approval_id(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    """An attrs validator: an approval id."""
    _check_id(APPROVAL_ID, "a- and 8 hex digits", attribute.name, value)


def to_ms(moment: dt.datetime) -> dt.datetime:
    """An aware time in UTC, cut to the millisecond: what a record or frame can carry.

    Frames hold times at the precision they are written with, so a frame equals
    itself after a round trip.

    >>> to_ms(dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC))
    datetime.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=datetime.timezone.utc)
    """
    if moment.tzinfo is None:
        raise ValueError("a time without a zone")
    moment = moment.astimezone(dt.UTC)
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)


# ---------------------------------------------------------------------------------------
# Outcomes


class VerdictCode(enum.StrEnum):
    """What a decision says: the one verdict enum of decisions, records and displays."""

    RUN = "run"
    ASK = "ask"
    DENY = "deny"


class ApprovalOutcome(enum.StrEnum):
    """How an approval ended (the ``approval`` record's outcome; an approve's re-decision
    and the ``approved`` admin answer say one of the first four)."""

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
    MCP_CLIENT = "mcp-client"
    """An answer from the MCP client's own prompt (elicitation), where the asking grant
    lets it count (``approvers``): the client software's answer, not the owner's; the
    record's ``approver`` names the client."""


class AnswerOutcome(enum.StrEnum):
    OK = "ok"
    DENIED = "denied"
    FAILED = "failed"


class ResultStatus(enum.StrEnum):
    OK = "ok"
    FAILED = "failed"


class ErrorCode(enum.StrEnum):
    """Codes of an ``error`` frame (docs/protocol.md lists them)."""

    BAD_FRAME = "bad_frame"
    FORBIDDEN_KIND = "forbidden_kind"
    PEER_REFUSED = "peer_refused"
    NO_SUCH_APPROVAL = "no_such_approval"
    EXPIRED = "expired"
    INTERNAL = "internal"
    BUSY = "busy"
    """broker.sock: refused at connect, before any frame was read: brokerd is at
    ``[broker] max_connections`` or short of file descriptors."""
    GRANT_NOT_WRITTEN = "grant_not_written"
    """admin.sock: approve with ``always`` could not write its grant; the call still
    waits (docs/runbook.md#grants-edit)."""
    MODEL_UNREACHABLE = "model_unreachable"
    """loop.sock: inferproxy or the model behind it did not answer."""
    MODEL_ERROR = "model_error"
    """loop.sock: the model answered with an error, or with nothing loopd can use."""
    MAX_STEPS = "max_steps"
    """loop.sock: the turn reached ``[loop] max_steps`` model calls without a reply."""
    STOPPING = "stopping"
    """loop.sock: loopd is stopping (``bxctl down``, SIGTERM) and cut the turn short."""


class Kind(enum.StrEnum):
    """The kinds of ledger records."""

    GENESIS = "genesis"
    START = "start"
    STOP = "stop"
    REPAIR = "repair"
    DECISION = "decision"
    APPROVAL = "approval"
    RESULT = "result"
    POLICY = "policy"
    MCP_TOOLS = "mcp_tools"
    CONNECTION = "connection"
    CHECKPOINT = "checkpoint"


# ---------------------------------------------------------------------------------------
# Frames of a call (broker.sock)


@attrs.frozen(kw_only=True)
class ToolRequest:
    """``tool_request``: the only frame that asks for anything. ``arguments`` as the model
    sent them; :func:`boxmaker.core.decide.evaluate` decides it."""

    KIND: ClassVar[str] = "tool_request"
    v: Literal[1] = 1
    call: str = attrs.field(validator=valid_call_id)
    session: str = attrs.field(validator=valid_session_id)
    tool: str
    arguments: dict[str, Any]


@attrs.frozen(kw_only=True)
class GrantRef:
    """The grant an ask matched, as the owner is shown it (a pending entry's, and the
    ``approvals`` answer's)."""

    id: str
    mode: Literal["auto", "ask", "deny"]
    note: str | None = None


def _known_approvers(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not value or any(approver not in APPROVERS for approver in value):
        raise InvalidField(attribute.name, f"expected some of {', '.join(APPROVERS)}")


@attrs.frozen(kw_only=True)
class Pending:
    """``pending``: the only non-final frame, sent for an ask."""

    KIND: ClassVar[str] = "pending"
    final: Literal[False] = False
    call: str = attrs.field(validator=valid_call_id)
    approval: str = attrs.field(validator=valid_approval_id)
    grant: str
    expires_at: dt.datetime = attrs.field(converter=to_ms)
    approvers: tuple[str, ...] = attrs.field(default=(OWNER,), validator=_known_approvers)
    """Who may answer: the asking grant's ``approvers``; left out of the line when only
    the owner may (so a reader that predates it reads the frame the same)."""

    @classmethod
    def of(cls, entry: PendingEntry) -> Pending:
        """The frame that tells the requester its call waits as ``entry``."""
        return cls(
            call=entry.call,
            approval=entry.approval,
            grant=entry.grant.id,
            expires_at=entry.expires_at_wall,
            approvers=entry.approvers,
        )


def _answer_consistent(answer: Answer, _: attrs.Attribute[Any], reason: Reason | None) -> None:
    # ok carries no reason; denied and failed always say why.
    if (answer.outcome is AnswerOutcome.OK) != (reason is None):
        words = "must be absent when ok" if answer.outcome is AnswerOutcome.OK else "required"
        raise InvalidField("reason", words)


@attrs.frozen(kw_only=True)
class Answer:
    """``answer``: the final frame of a tool request; exactly one per call."""

    KIND: ClassVar[str] = "answer"
    final: Literal[True] = True
    call: str = attrs.field(validator=valid_call_id)
    outcome: AnswerOutcome
    content: str | None = None
    label: Label | None = None
    reason: Reason | None = attrs.field(default=None, validator=_answer_consistent)
    detail: str | None = None

    @classmethod
    def ok(cls, call: str, content: str, label: Label) -> Answer:
        return cls(call=call, outcome=AnswerOutcome.OK, content=content, label=label)

    @classmethod
    def denied(cls, call: str, reason: Reason, detail: str | None = None) -> Answer:
        return cls(call=call, outcome=AnswerOutcome.DENIED, reason=reason, detail=detail)

    @classmethod
    def failed(cls, call: str, reason: Reason, detail: str | None = None) -> Answer:
        return cls(call=call, outcome=AnswerOutcome.FAILED, reason=reason, detail=detail)


@attrs.frozen(kw_only=True)
class RunEnd:
    """How an approved call's run ended, as its answer to the model said: ``ok``, or
    ``failed`` with the reason and detail. The call's task reports it to the admin
    (core/call_events.py's ``ApprovedReply``) and the admin sends it on, as it is, in
    the ``approved`` frame."""

    outcome: Literal["ok", "failed"]
    reason: Reason | None = None
    detail: str | None = None

    @classmethod
    def of(cls, answer: Answer) -> RunEnd:
        """What ``answer``, the run's answer to the model, says of the run.

        >>> RunEnd.of(Answer.failed("c-0123456789abcdef", Reason.NOT_FOUND, "gone"))
        RunEnd(outcome='failed', reason=<Reason.NOT_FOUND: 'not_found'>, detail='gone')
        """
        outcome: Literal["ok", "failed"] = "ok" if answer.outcome is AnswerOutcome.OK else "failed"
        return cls(outcome=outcome, reason=answer.reason, detail=answer.detail)


@attrs.frozen(kw_only=True)
class ErrorFrame:
    """``error``, on any socket; the connection closes after it on broker.sock."""

    KIND: ClassVar[str] = "error"
    code: ErrorCode
    detail: str


# ---------------------------------------------------------------------------------------
# Records of a call (the ledger)

BodyT = TypeVar("BodyT", covariant=True)


def record_time(at: str) -> dt.datetime:
    """A record's ``at`` read back, aware (UTC for every record brokerd writes).
    ValueError for text that is not ISO 8601 with an offset.

    ``fromisoformat`` itself, not :func:`boxmaker.formats.clock.parse_utc`: the conversion to
    UTC costs more than the parse (what-if reads one a decision), and an aware time
    compares and orders alike in any zone.

    >>> record_time("2026-01-02T03:04:05.678Z").isoformat()
    '2026-01-02T03:04:05.678000+00:00'
    >>> record_time("2026-01-02T03:04:05")
    Traceback (most recent call last):
    ...
    ValueError: a time without a zone: '2026-01-02T03:04:05'
    """
    moment = dt.datetime.fromisoformat(at)
    if moment.tzinfo is None:
        raise ValueError(f"a time without a zone: {at!r}")
    return moment


@attrs.frozen
class Record(Generic[BodyT]):
    """A ledger line read back: its common fields and its body (a :class:`Decision`,
    :class:`Approval`, :class:`Result`, or a record of brokerd's own life,
    :data:`boxmaker.ledger.records.Body`). ``at`` is the time as the line has it (UTC,
    ISO 8601: :func:`boxmaker.formats.clock.format_utc`), ``prev`` the SHA-256 of the line
    before. The ledger's readers make these (:mod:`boxmaker.ledger.reader`); the core
    takes them as they are (what-if's replay, a grant's usage)."""

    seq: int
    at: str
    prev: str
    body: BodyT


_B = TypeVar("_B")


def holds(record: Record[object], body_type: type[_B]) -> TypeGuard[Record[_B]]:
    """Whether ``record``'s body is a ``body_type``: a record narrowed by its body.

    >>> holds(Record(1, "2026-01-01T00:00:00.000Z", "ab", "a body"), str)
    True
    """
    return isinstance(record.body, body_type)


@attrs.frozen
class Decision:
    """The ``decision`` record: every tool request whose tool and arguments were checked,
    before anything runs (docs/protocol.md, the write order)."""

    kind: ClassVar[Kind] = Kind.DECISION
    call: str
    session: str
    tool: str
    arguments: dict[str, Any]
    verdict: VerdictCode
    reason: Reason | None
    grant: str | None
    taint: Taint
    untrusted: bool
    boot: str
    definition: str | None = None
    """An ``mcp.*`` tool's definition hash as decided on; left out of the line when
    there is none, so a line written before it existed reads the same."""

    @classmethod
    def of(cls, ruling: Ruling, boot: str) -> Decision:
        """The record of ``ruling``, made in brokerd's boot ``boot``: its words (detail,
        mode, note) are the answer's and the log's, not the ledger's."""
        return cls(
            call=ruling.call,
            session=ruling.session,
            tool=ruling.tool,
            arguments=dict(ruling.arguments),
            verdict=ruling.verdict,
            reason=ruling.reason,
            grant=ruling.grant,
            taint=ruling.state.taint,
            untrusted=ruling.state.untrusted,
            boot=boot,
            definition=ruling.definition,
        )


@attrs.frozen
class Approval:
    """The ``approval`` record, the one end of an ask. ``reason`` is a reason code, or the
    owner's text for ``refused``; the state (``taint``, ``untrusted``) is the one it was
    decided on: the re-decision's for an approve, else the ask's."""

    kind: ClassVar[Kind] = Kind.APPROVAL
    call: str
    approval: str
    outcome: ApprovalOutcome
    reason: str | None
    by: ApprovalBy
    taint: Taint
    untrusted: bool
    grant_written: str | None = None
    """The grant ``bxctl approve --always`` wrote to grants.toml for this call; left
    out of the line when there is none."""
    note: str | None = None
    """The owner's note with an approve (``bxctl approve --note``); left out of the
    line when there is none, so a line written before it existed reads the same."""
    definition: str | None = None
    """An ``mcp.*`` tool's definition hash the ending was decided on (an approve's
    re-decision's); left out of the line when there is none."""
    approver: str | None = None
    """Who answered when not the owner at bxctl: ``mcp-client:<name>`` for an answer
    from the MCP client's own prompt (a grant's ``approvers``); left out when None."""

    @classmethod
    def of(
        cls,
        entry: PendingEntry,
        outcome: ApprovalOutcome,
        reason: str | None,
        by: ApprovalBy,
        state: Label,
        grant_written: str | None = None,
        note: str | None = None,
        definition: str | None = None,
        approver: str | None = None,
    ) -> Approval:
        """How ``entry``'s ask ended, decided on ``state``; ``approver`` names the MCP
        client whose answer ended it (then ``by`` is ``mcp-client``)."""
        return cls(
            call=entry.call,
            approval=entry.approval,
            outcome=outcome,
            reason=reason,
            by=by,
            taint=state.taint,
            untrusted=state.untrusted,
            grant_written=grant_written,
            note=note,
            definition=definition,
            approver=approver,
        )


@attrs.frozen
class Result:
    """The ``result`` record: after a run, once the session state was raised
    (docs/protocol.md, the write order)."""

    kind: ClassVar[Kind] = Kind.RESULT
    call: str
    status: ResultStatus
    reason: Reason | None
    label: Label
    taint_after: Taint
    untrusted_after: bool
    output_sha256: str | None
    output_bytes: int
    stopped: bool = False
    """``requester_gone`` only: the run had begun and was stopped (a shell's sandbox
    killed) when its requester left; absent when it never began."""
    definition: str | None = None
    """An ``mcp.*`` tool's definition hash it ran with; left out of the line when none."""

    @classmethod
    def of_run(
        cls,
        call: str,
        *,
        ok: bool,
        reason: Reason | None,
        label: Label,
        content: str,
        after: Label,
        definition: str | None = None,
    ) -> Result:
        """A run's result: what its output hashes to, and the session's state ``after``
        the raise by its ``label``."""
        output = content.encode("utf-8")
        return cls(
            call=call,
            status=ResultStatus.OK if ok else ResultStatus.FAILED,
            reason=reason,
            label=label,
            taint_after=after.taint,
            untrusted_after=after.untrusted,
            output_sha256=hashlib.sha256(output).hexdigest(),
            output_bytes=len(output),
            definition=definition,
        )

    @classmethod
    def requester_gone(
        cls, call: str, state: Label, *, stopped: bool, definition: str | None = None
    ) -> Result:
        """The requester left before the run (the last look), or during it (``stopped``):
        ``failed`` ``requester_gone`` on the state the run was decided on; no output, no
        label (nobody saw anything)."""
        return cls(
            call=call,
            status=ResultStatus.FAILED,
            reason=Reason.REQUESTER_GONE,
            label=FRESH,
            taint_after=state.taint,
            untrusted_after=state.untrusted,
            output_sha256=None,
            output_bytes=0,
            stopped=stopped,
            definition=definition,
        )
