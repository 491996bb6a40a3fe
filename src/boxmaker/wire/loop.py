"""The frames of loop.sock (docs/protocol.md): one ``say`` a connection; loopd streams
the turn's events back and closes after ``reply`` or ``error``."""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar, Final, Literal, TypeAlias

import attrs

from boxmaker.core.call import AnswerOutcome
from boxmaker.wire.common import (
    ErrorFrame,
    non_negative,
    text_between,
    to_ms,
    valid_approval_id,
    valid_call_id,
    valid_session_id,
)

MAX_SAY: Final = 65536
"""Characters of one ``say``."""


@attrs.frozen(kw_only=True)
class Say:
    """``say``: start a turn; without ``session`` loopd starts a new one."""

    KIND: ClassVar[str] = "say"
    session: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(valid_session_id)
    )
    text: str = attrs.field(validator=text_between(1, MAX_SAY))


@attrs.frozen(kw_only=True)
class SessionEvent:
    """The turn's session (always the first event)."""

    KIND: ClassVar[str] = "session"
    session: str = attrs.field(validator=valid_session_id)


@attrs.frozen(kw_only=True)
class ModelEvent:
    """loopd is calling the model (``step`` counts from 1 within the turn)."""

    KIND: ClassVar[str] = "model"
    step: int = attrs.field(validator=non_negative)


@attrs.frozen(kw_only=True)
class ToolCallEvent:
    KIND: ClassVar[str] = "tool_call"
    call: str = attrs.field(validator=valid_call_id)
    tool: str
    arguments: dict[str, Any]


@attrs.frozen(kw_only=True)
class WaitingEvent:
    """The call waits for the owner: ``bxctl approve <approval>``."""

    KIND: ClassVar[str] = "waiting"
    call: str = attrs.field(validator=valid_call_id)
    approval: str = attrs.field(validator=valid_approval_id)
    grant: str
    expires_at: dt.datetime = attrs.field(converter=to_ms)


@attrs.frozen(kw_only=True)
class ToolResultEvent:
    """How a call ended; ``reason`` is a reason code, or broker_unreachable /
    broker_timeout / invalid_arguments when loopd could not get an answer."""

    KIND: ClassVar[str] = "tool_result"
    call: str = attrs.field(validator=valid_call_id)
    outcome: AnswerOutcome
    reason: str | None = None


@attrs.frozen(kw_only=True)
class ReplyEvent:
    """The model's answer: the end of the turn."""

    KIND: ClassVar[str] = "reply"
    final: Literal[True] = True
    text: str


LoopRequest: TypeAlias = Say
"""What a loop.sock client (bxctl chat) may send."""
LoopEvent: TypeAlias = (
    SessionEvent
    | ModelEvent
    | ToolCallEvent
    | WaitingEvent
    | ToolResultEvent
    | ReplyEvent
    | ErrorFrame
)
"""What loopd streams back on loop.sock."""
