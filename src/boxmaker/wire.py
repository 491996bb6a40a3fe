"""Frames on the sockets (docs/protocol.md), built on the one converter of
:mod:`boxmaker.convert` (which also holds the id formats; they are re-exported here).

A frame is a frozen attrs class; the unions (broker requests, broker answers, admin
requests, admin answers, loop events) are tagged on ``"kind"``.

>>> frame = decode_broker_request(b'{"kind":"catalogue","v":1}')
>>> frame
CatalogueRequest(v=1)
>>> encode_frame(frame)
b'{"kind":"catalogue","v":1}\\n'
>>> decode_broker_request(b'{"kind":"approve","approval":"a-00000000"}')
Traceback (most recent call last):
...
boxmaker.wire.ForbiddenKind: kind 'approve' is not accepted here
"""

from __future__ import annotations

import datetime as dt
import enum
import functools
import re
from collections.abc import Callable
from typing import Any, ClassVar, Final, Literal, TypeAlias, get_args

import attrs
import orjson
from cattrs.gen import make_dict_unstructure_fn, override
from cattrs.strategies import configure_tagged_union

from boxmaker.convert import (
    APPROVAL_ID,
    CALL_ID,
    SESSION_ID,
    InvalidField,
    converter,
    format_path,
    problems,
)
from boxmaker.core import labels
from boxmaker.core.call import APPROVE_OUTCOMES, AnswerOutcome, ApprovalOutcome
from boxmaker.core.reasons import Reason

MAX_REFUSE_REASON: Final = 500
"""The owner's refusal reason is 1 to 500 characters."""
MAX_NOTE: Final = 500
MAX_SAY: Final = 65536
"""Characters of one ``say``."""


# ---------------------------------------------------------------------------------------
# Validators and converters for frame fields


def id_of(pattern: re.Pattern[str], words: str) -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    """An attrs validator: the value fully matches ``pattern`` (the ids of docs/protocol.md)."""

    def check(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if not isinstance(value, str) or not pattern.fullmatch(value):
            raise InvalidField(attribute.name, f"expected {words}")

    return check


_call_id = id_of(CALL_ID, "c- and 16 hex digits")
_session_id = id_of(SESSION_ID, "s- and 12 hex digits")
_approval_id = id_of(APPROVAL_ID, "a- and 8 hex digits")


def _text(low: int, high: int) -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    def check(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is None:
            return
        if not (low <= len(value) <= high) or (low > 0 and not value.strip()):
            raise InvalidField(attribute.name, f"expected {low} to {high} characters")

    return check


def _non_negative(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value < 0:
        raise InvalidField(attribute.name, "expected a number >= 0")


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
# The frames of broker.sock (docs/protocol.md)


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
    MODEL_UNREACHABLE = "model_unreachable"
    """loop.sock: inferproxy or the model behind it did not answer."""
    MODEL_ERROR = "model_error"
    """loop.sock: the model answered with an error, or with nothing loopd can use."""
    MAX_STEPS = "max_steps"
    """loop.sock: the turn reached ``[loop] max_steps`` model calls without a reply."""


@attrs.frozen(kw_only=True)
class ToolRequest:
    """``tool_request``: the only frame that asks for anything."""

    KIND: ClassVar[str] = "tool_request"
    v: Literal[1] = 1
    call: str = attrs.field(validator=_call_id)
    session: str = attrs.field(validator=_session_id)
    tool: str
    arguments: dict[str, Any]


@attrs.frozen(kw_only=True)
class CatalogueRequest:
    KIND: ClassVar[str] = "catalogue"
    v: Literal[1] = 1


@attrs.frozen(kw_only=True)
class Pending:
    """``pending``: the only non-final frame, sent for an ask."""

    KIND: ClassVar[str] = "pending"
    final: Literal[False] = False
    call: str = attrs.field(validator=_call_id)
    approval: str = attrs.field(validator=_approval_id)
    grant: str
    expires_at: dt.datetime = attrs.field(converter=to_ms)


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
    call: str = attrs.field(validator=_call_id)
    outcome: AnswerOutcome
    content: str | None = None
    label: labels.Label | None = None
    reason: Reason | None = attrs.field(default=None, validator=_answer_consistent)
    detail: str | None = None

    @classmethod
    def ok(cls, call: str, content: str, label: labels.Label) -> Answer:
        return cls(call=call, outcome=AnswerOutcome.OK, content=content, label=label)

    @classmethod
    def denied(cls, call: str, reason: Reason, detail: str | None = None) -> Answer:
        return cls(call=call, outcome=AnswerOutcome.DENIED, reason=reason, detail=detail)

    @classmethod
    def failed(cls, call: str, reason: Reason, detail: str | None = None) -> Answer:
        return cls(call=call, outcome=AnswerOutcome.FAILED, reason=reason, detail=detail)


@attrs.frozen(kw_only=True)
class CatalogueAnswer:
    KIND: ClassVar[str] = "catalogue"
    final: Literal[True] = True
    tools: list[dict[str, Any]]


@attrs.frozen(kw_only=True)
class ErrorFrame:
    """``error``, on either socket; the connection closes after it on broker.sock."""

    KIND: ClassVar[str] = "error"
    code: ErrorCode
    detail: str


# ---------------------------------------------------------------------------------------
# The frames of admin.sock (docs/protocol.md)


@attrs.frozen(kw_only=True)
class ApprovalsRequest:
    KIND: ClassVar[str] = "approvals"


@attrs.frozen(kw_only=True)
class Approve:
    KIND: ClassVar[str] = "approve"
    approval: str = attrs.field(validator=_approval_id)
    note: str | None = attrs.field(default=None, validator=_text(0, MAX_NOTE))


@attrs.frozen(kw_only=True)
class Refuse:
    """``refuse``: the reason (1 to 500 characters, not blank) goes to the model."""

    KIND: ClassVar[str] = "refuse"
    approval: str = attrs.field(validator=_approval_id)
    reason: str = attrs.field(validator=_text(1, MAX_REFUSE_REASON))


@attrs.frozen(kw_only=True)
class StatusRequest:
    KIND: ClassVar[str] = "status"


@attrs.frozen(kw_only=True)
class SessionsRequest:
    KIND: ClassVar[str] = "sessions"


@attrs.frozen(kw_only=True)
class GrantRef:
    """The grant an ask matched, as approvals show it."""

    id: str
    mode: Literal["auto", "ask", "deny"]
    note: str | None = None


@attrs.frozen(kw_only=True)
class ApprovalView:
    """One pending entry in an ``approvals`` answer."""

    approval: str = attrs.field(validator=_approval_id)
    call: str = attrs.field(validator=_call_id)
    session: str = attrs.field(validator=_session_id)
    tool: str
    arguments: dict[str, Any]
    grant: GrantRef
    requested_at: dt.datetime = attrs.field(converter=to_ms)
    expires_at: dt.datetime = attrs.field(converter=to_ms)
    taint: labels.Taint
    untrusted: bool


@attrs.frozen(kw_only=True)
class ApprovalsAnswer:
    KIND: ClassVar[str] = "approvals"
    entries: list[ApprovalView]


@attrs.frozen(kw_only=True)
class Approved:
    """``approved``: the outcome of the re-decision and the last look."""

    KIND: ClassVar[str] = "approved"
    outcome: ApprovalOutcome = attrs.field(validator=attrs.validators.in_(APPROVE_OUTCOMES))
    call: str = attrs.field(validator=_call_id)
    reason: Reason | None


@attrs.frozen(kw_only=True)
class Refused:
    KIND: ClassVar[str] = "refused"
    call: str = attrs.field(validator=_call_id)


@attrs.frozen(kw_only=True)
class StatusAnswer:
    KIND: ClassVar[str] = "status"
    version: str
    boot: str
    head: str
    ledger_usable: bool
    grants_valid: bool
    grants_problem: str | None
    pending: int = attrs.field(validator=_non_negative)
    sessions: int = attrs.field(validator=_non_negative)
    uptime_s: float = attrs.field(validator=_non_negative)


@attrs.frozen(kw_only=True)
class SessionView:
    session: str = attrs.field(validator=_session_id)
    taint: labels.Taint
    untrusted: bool
    calls: int = attrs.field(validator=_non_negative)


@attrs.frozen(kw_only=True)
class SessionsAnswer:
    KIND: ClassVar[str] = "sessions"
    sessions: list[SessionView]


# ---------------------------------------------------------------------------------------
# loop.sock (docs/protocol.md): one ``say`` a connection; loopd streams the turn's events back
# and closes after ``reply`` or ``error``.


@attrs.frozen(kw_only=True)
class Say:
    """``say``: start a turn; without ``session`` loopd starts a new one."""

    KIND: ClassVar[str] = "say"
    session: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(_session_id)
    )
    text: str = attrs.field(validator=_text(1, MAX_SAY))


@attrs.frozen(kw_only=True)
class SessionEvent:
    """The turn's session (always the first event)."""

    KIND: ClassVar[str] = "session"
    session: str = attrs.field(validator=_session_id)


@attrs.frozen(kw_only=True)
class ModelEvent:
    """loopd is calling the model (``step`` counts from 1 within the turn)."""

    KIND: ClassVar[str] = "model"
    step: int = attrs.field(validator=_non_negative)


@attrs.frozen(kw_only=True)
class ToolCallEvent:
    KIND: ClassVar[str] = "tool_call"
    call: str = attrs.field(validator=_call_id)
    tool: str
    arguments: dict[str, Any]


@attrs.frozen(kw_only=True)
class WaitingEvent:
    """The call waits for the owner: ``bxctl approve <approval>``."""

    KIND: ClassVar[str] = "waiting"
    call: str = attrs.field(validator=_call_id)
    approval: str = attrs.field(validator=_approval_id)
    grant: str
    expires_at: dt.datetime = attrs.field(converter=to_ms)


@attrs.frozen(kw_only=True)
class ToolResultEvent:
    """How a call ended; ``reason`` is a reason code, or broker_unreachable /
    broker_timeout / invalid_arguments when loopd could not get an answer."""

    KIND: ClassVar[str] = "tool_result"
    call: str = attrs.field(validator=_call_id)
    outcome: AnswerOutcome
    reason: str | None = None


@attrs.frozen(kw_only=True)
class ReplyEvent:
    """The model's answer: the end of the turn."""

    KIND: ClassVar[str] = "reply"
    final: Literal[True] = True
    text: str


BrokerRequest: TypeAlias = ToolRequest | CatalogueRequest
BrokerAnswer: TypeAlias = Pending | Answer | CatalogueAnswer | ErrorFrame
AdminRequest: TypeAlias = ApprovalsRequest | Approve | Refuse | StatusRequest | SessionsRequest
AdminAnswer: TypeAlias = (
    ApprovalsAnswer | Approved | Refused | StatusAnswer | SessionsAnswer | ErrorFrame
)
LoopRequest: TypeAlias = Say
LoopEvent: TypeAlias = (
    SessionEvent
    | ModelEvent
    | ToolCallEvent
    | WaitingEvent
    | ToolResultEvent
    | ReplyEvent
    | ErrorFrame
)
Frame: TypeAlias = (
    BrokerRequest | BrokerAnswer | AdminRequest | AdminAnswer | LoopRequest | LoopEvent
)

_UNIONS: Final[tuple[Any, ...]] = (
    BrokerRequest,
    BrokerAnswer,
    AdminRequest,
    AdminAnswer,
    LoopEvent,
)


def _kind_of(cl: type) -> str:
    kind: str = getattr(cl, "KIND")  # noqa: B009 - a ClassVar that mypy sees on no union
    return kind


# Optional fields are left out when unset, as docs/protocol.md's examples show; a required
# field that may be null (approved.reason, status.grants_problem) is always written.
_OMIT_UNSET: Final[dict[type, tuple[str, ...]]] = {
    Answer: ("content", "label", "reason", "detail"),
    Say: ("session",),
    ToolResultEvent: ("reason",),
    Approve: ("note",),
    GrantRef: ("note",),
}


@functools.cache
def _configure() -> None:
    """Register the frame hooks and the four tagged unions, once, on first use.

    Deferred because generating hooks resolves ``labels.Label``, and core.labels may
    (through core.catalogue) import this module before it is itself complete.
    Per-class hooks go first: configure_tagged_union captures them.
    """
    for cl, names in _OMIT_UNSET.items():
        omit: dict[str, Any] = {name: override(omit_if_default=True) for name in names}
        converter.register_unstructure_hook(cl, make_dict_unstructure_fn(cl, converter, **omit))
    for union in _UNIONS:
        configure_tagged_union(union, converter, tag_generator=_kind_of, tag_name="kind")


_KINDS: Final[dict[Any, frozenset[str]]] = {
    union: frozenset(_kind_of(cl) for cl in get_args(union)) for union in _UNIONS
}
_ALL_KINDS: Final = frozenset().union(*_KINDS.values(), {Say.KIND})


# ---------------------------------------------------------------------------------------
# Decoding and encoding


class BadFrame(Exception):
    """Any malformed frame: answered ``error bad_frame``, nothing recorded.

    ``detail`` is safe to send back and to log: it names keys and expectations and echoes
    no value but a short unknown kind, quoted with ``repr`` (so no raw control bytes).
    """

    code: ClassVar[ErrorCode] = ErrorCode.BAD_FRAME

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class ForbiddenKind(BadFrame):
    """A well-formed JSON object whose kind belongs to another socket or direction.

    On broker.sock it is answered ``error forbidden_kind`` and never recorded.
    A subclass of :class:`BadFrame`, so a caller that only cares "was it usable?" catches
    one exception; the broker catches this one first.
    """

    code: ClassVar[ErrorCode] = ErrorCode.FORBIDDEN_KIND

    def __init__(self, kind: str) -> None:
        super().__init__(f"kind {kind!r} is not accepted here")
        self.kind = kind


def _load_object(line: bytes) -> tuple[str, dict[str, Any]]:
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError:
        # orjson also refuses invalid UTF-8 here.
        raise BadFrame("not valid JSON (or not UTF-8)") from None
    if not isinstance(value, dict):
        raise BadFrame("not a JSON object")
    kind = value.get("kind")
    if not isinstance(kind, str):
        raise BadFrame("kind: expected a string")
    return kind, value


def _decode(line: bytes, union: Any, *, forbid_known: bool) -> Any:
    _configure()
    kind, value = _load_object(line)
    if kind not in _KINDS[union]:
        if forbid_known and kind in _ALL_KINDS:
            raise ForbiddenKind(kind)
        raise BadFrame(f"unknown kind {kind!r}" if len(kind) <= 40 else "unknown kind")
    try:
        return converter.structure(value, union)
    except KeyError:
        # cattrs' tagged union raises a bare KeyError for an unknown tag; kinds were
        # checked above, so only a member's own missing key can land here.
        raise BadFrame("a required key is missing") from None
    except Exception as exc:
        details = "; ".join(f"{format_path(p)}: {m}" for p, m in problems(exc))
        raise BadFrame(details) from None


def decode_broker_request(line: bytes) -> BrokerRequest:
    """A frame received on broker.sock. Raises :class:`ForbiddenKind` for any other
    known kind, :class:`BadFrame` for everything else that is wrong.

    >>> decode_broker_request(b'{"kind":"tool_request","v":1,"call":"c-1","session":"s-1",'
    ...                       b'"tool":"read_file","arguments":{}}')
    Traceback (most recent call last):
    ...
    boxmaker.wire.BadFrame: call: expected c- and 16 hex digits
    """
    result: BrokerRequest = _decode(line, BrokerRequest, forbid_known=True)
    return result


def decode_admin_request(line: bytes) -> AdminRequest:
    """A frame received on admin.sock; same exceptions as for broker.sock."""
    result: AdminRequest = _decode(line, AdminRequest, forbid_known=True)
    return result


def decode_broker_answer(line: bytes) -> BrokerAnswer:
    """A frame a broker.sock client (loopd's BrokerPort) receives. Raises :class:`BadFrame`."""
    result: BrokerAnswer = _decode(line, BrokerAnswer, forbid_known=False)
    return result


def decode_admin_answer(line: bytes) -> AdminAnswer:
    """A frame an admin.sock client (bxctl) receives. Raises :class:`BadFrame`."""
    result: AdminAnswer = _decode(line, AdminAnswer, forbid_known=False)
    return result


def decode_loop_request(line: bytes) -> Say:
    """A frame received on loop.sock: a ``say``. Raises :class:`ForbiddenKind` for any
    other known kind and :class:`BadFrame` for everything else that is wrong."""
    _configure()
    kind, value = _load_object(line)
    if kind != Say.KIND:
        if kind in _ALL_KINDS:
            raise ForbiddenKind(kind)
        raise BadFrame(f"unknown kind {kind!r}" if len(kind) <= 40 else "unknown kind")
    del value["kind"]
    try:
        return converter.structure(value, Say)
    except Exception as exc:
        details = "; ".join(f"{format_path(p)}: {m}" for p, m in problems(exc))
        raise BadFrame(details) from None


def decode_loop_event(line: bytes) -> LoopEvent:
    """A frame a loop.sock client (bxctl chat) receives. Raises :class:`BadFrame`."""
    result: LoopEvent = _decode(line, LoopEvent, forbid_known=False)
    return result


def encode_frame(frame: Frame) -> bytes:
    """The canonical bytes of a frame: compact JSON, ``kind`` first, one ``\\n`` at the end.

    >>> encode_frame(ErrorFrame(code=ErrorCode.BAD_FRAME, detail="not a JSON object"))
    b'{"kind":"error","code":"bad_frame","detail":"not a JSON object"}\\n'
    """
    _configure()
    body: dict[str, Any] = converter.unstructure(frame)
    return orjson.dumps({"kind": _kind_of(type(frame)), **body}, option=orjson.OPT_APPEND_NEWLINE)
