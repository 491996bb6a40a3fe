"""What the frames of all three sockets share: the ``error`` frame and its codes, and
the validators and converters of frame fields (the ids of docs/protocol.md, bounded
text, counts, times).
"""

from __future__ import annotations

import datetime as dt
import enum
import re
from collections.abc import Callable
from typing import Any, ClassVar, TypeAlias

import attrs

from boxmaker.convert import APPROVAL_ID, CALL_ID, SESSION_ID, InvalidField

FieldValidator: TypeAlias = "Callable[[Any, attrs.Attribute[Any], Any], None]"
"""An attrs validator: raises :class:`~boxmaker.convert.InvalidField` naming the field."""


def id_of(pattern: re.Pattern[str], words: str) -> FieldValidator:
    """An attrs validator: the value fully matches ``pattern`` (the ids of docs/protocol.md)."""

    def check(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if not isinstance(value, str) or not pattern.fullmatch(value):
            raise InvalidField(attribute.name, f"expected {words}")

    return check


valid_call_id: FieldValidator = id_of(CALL_ID, "c- and 16 hex digits")
valid_session_id: FieldValidator = id_of(SESSION_ID, "s- and 12 hex digits")
valid_approval_id: FieldValidator = id_of(APPROVAL_ID, "a- and 8 hex digits")


def text_between(low: int, high: int) -> FieldValidator:
    """An attrs validator: ``low`` to ``high`` characters, not blank when ``low`` > 0;
    ``None`` passes (an optional field left out)."""

    def check(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is None:
            return
        if not (low <= len(value) <= high) or (low > 0 and not value.strip()):
            raise InvalidField(attribute.name, f"expected {low} to {high} characters")

    return check


def non_negative(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    """An attrs validator: a count or a duration, never below zero."""
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


@attrs.frozen(kw_only=True)
class ErrorFrame:
    """``error``, on any socket; the connection closes after it on broker.sock."""

    KIND: ClassVar[str] = "error"
    code: ErrorCode
    detail: str
