"""The frames of broker.sock (docs/protocol.md): loopd asks, brokerd answers."""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar, Literal, TypeAlias

import attrs

from boxmaker.convert import InvalidField
from boxmaker.core import labels
from boxmaker.core.call import AnswerOutcome
from boxmaker.core.reasons import Reason
from boxmaker.wire.common import (
    ErrorFrame,
    to_ms,
    valid_approval_id,
    valid_call_id,
    valid_session_id,
)


@attrs.frozen(kw_only=True)
class ToolRequest:
    """``tool_request``: the only frame that asks for anything."""

    KIND: ClassVar[str] = "tool_request"
    v: Literal[1] = 1
    call: str = attrs.field(validator=valid_call_id)
    session: str = attrs.field(validator=valid_session_id)
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
    call: str = attrs.field(validator=valid_call_id)
    approval: str = attrs.field(validator=valid_approval_id)
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
    call: str = attrs.field(validator=valid_call_id)
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


BrokerRequest: TypeAlias = ToolRequest | CatalogueRequest
"""What a broker.sock client may send."""
BrokerAnswer: TypeAlias = Pending | Answer | CatalogueAnswer | ErrorFrame
"""What brokerd sends back on broker.sock."""
