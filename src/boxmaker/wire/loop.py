"""The frames of loop.sock (docs/protocol.md): one ``say`` a connection; loopd streams
the turn's events back and closes after ``reply`` or ``error``."""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar, Final, Literal, TypeAlias

import attrs

from boxmaker.core.vocabulary import (
    AnswerOutcome,
    ErrorFrame,
    to_ms,
    valid_approval_id,
    valid_call_id,
    valid_session_id,
)
from boxmaker.formats.convert import InvalidField
from boxmaker.wire.common import non_negative, text_between

MAX_SAY: Final = 65536
"""Characters of one ``say``."""
MAX_DETAIL: Final = 1000
"""Characters of a ``tool_result``'s ``detail`` (a longer one is cut, ending in ``…``)."""
MAX_HEAD_LINES: Final = 8
"""Lines of a tool's output a ``tool_result`` carries."""
MAX_HEAD_LINE: Final = 200
"""Characters of each of those lines (a longer one is cut, ending in ``…``)."""
MAX_DELTA: Final = 4096
"""Characters of one ``reply_delta`` (a longer piece goes in several)."""


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
class ProgressEvent:
    """The model is still working on step ``step``: ``elapsed_ms`` since the step began,
    ``tokens`` generated so far (0 until the model streams). At most one each
    :data:`boxmaker.loop.turn.PROGRESS_S`."""

    KIND: ClassVar[str] = "progress"
    step: int = attrs.field(validator=non_negative)
    elapsed_ms: int = attrs.field(validator=non_negative)
    tokens: int = attrs.field(validator=non_negative)


@attrs.frozen(kw_only=True)
class ReplyDeltaEvent:
    """A piece of the model's text as it is generated, in order: the pieces of one step
    put together are its text (the ``reply``'s, when the step ends the turn)."""

    KIND: ClassVar[str] = "reply_delta"
    text: str = attrs.field(validator=text_between(0, MAX_DELTA))


StepCut: TypeAlias = Literal["repeated", "max_tokens"]
"""Why a step's text was cut: it repeated itself (loopd's repetition guard), or it
reached the step's ``max_tokens``."""
STEP_CUT_WORDS: Final[dict[StepCut, str]] = {
    "repeated": "the model was repeating itself; its text ends before the repeats",
    "max_tokens": "the model's text reached the step's limit ([loop] max_step_tokens)",
}


@attrs.frozen(kw_only=True)
class ModelDoneEvent:
    """The model answered step ``step`` after ``elapsed_ms``, with ``tokens`` generated
    (``None`` when the model did not say). ``cut`` says why its text was cut short
    (``None``: the model ended it): what streamed after a ``repeated`` cut is not kept,
    and the ``reply`` has the text up to the repeat."""

    KIND: ClassVar[str] = "model_done"
    step: int = attrs.field(validator=non_negative)
    elapsed_ms: int = attrs.field(validator=non_negative)
    tokens: int | None = None
    cut: StepCut | None = None

    def cut_words(self) -> str | None:
        """Why the text was cut, in words for the owner (None: it was not)."""
        return None if self.cut is None else STEP_CUT_WORDS[self.cut]


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


def _head_lines(_: Any, attribute: attrs.Attribute[Any], value: list[str]) -> None:
    if len(value) > MAX_HEAD_LINES or any(len(line) > MAX_HEAD_LINE for line in value):
        detail = f"expected at most {MAX_HEAD_LINES} lines of {MAX_HEAD_LINE} characters"
        raise InvalidField(attribute.name, detail)


@attrs.frozen(kw_only=True)
class OutputHead:
    """The first lines of a tool's output, for the owner to glance at."""

    lines: list[str] = attrs.field(validator=_head_lines)
    total_lines: int = attrs.field(validator=non_negative)
    """Lines in the whole output (more than ``len(lines)`` when some are left out)."""


@attrs.frozen(kw_only=True)
class ToolResultEvent:
    """How a call ended; ``reason`` is a reason code, or broker_unreachable /
    broker_timeout / invalid_arguments when loopd could not get an answer. ``detail``
    says why in words; ``output`` is the head of what the tool returned (for shell its
    stdout, ``stderr`` its stderr, ``exit_code`` its exit status); ``elapsed_ms`` runs
    from the request to the answer, the owner's wait included."""

    KIND: ClassVar[str] = "tool_result"
    call: str = attrs.field(validator=valid_call_id)
    outcome: AnswerOutcome
    reason: str | None = None
    detail: str | None = attrs.field(default=None, validator=text_between(0, MAX_DETAIL))
    output: OutputHead | None = None
    stderr: OutputHead | None = None
    exit_code: int | None = None
    elapsed_ms: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(non_negative)
    )


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
    | ProgressEvent
    | ReplyDeltaEvent
    | ModelDoneEvent
    | ToolCallEvent
    | WaitingEvent
    | ToolResultEvent
    | ReplyEvent
    | ErrorFrame
)
"""What loopd streams back on loop.sock."""
