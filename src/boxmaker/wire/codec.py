"""Frames to bytes and back: the tagged unions (on ``"kind"``), the hooks registered on
the one converter of :mod:`boxmaker.formats.convert`, and the decoders of each socket and
direction, which tell a kind of another socket (:class:`ForbiddenKind`) from anything
else that is wrong (:class:`BadFrame`).
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar, Final, TypeAlias, get_args

import orjson
from cattrs.gen import make_dict_unstructure_fn, override
from cattrs.strategies import configure_tagged_union

from boxmaker.core.vocabulary import Answer, ErrorCode, GrantRef, Pending
from boxmaker.formats.convert import converter, format_path, problems
from boxmaker.wire.admin import AdminAnswer, AdminRequest, ApprovalView, Approve, Approved
from boxmaker.wire.broker import BrokerAnswer, BrokerRequest
from boxmaker.wire.loop import LoopEvent, LoopRequest, ModelDoneEvent, Say, ToolResultEvent

Frame: TypeAlias = (
    BrokerRequest | BrokerAnswer | AdminRequest | AdminAnswer | LoopRequest | LoopEvent
)
"""Any frame of any socket: what :func:`encode_frame` takes."""

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
    ToolResultEvent: ("reason", "detail", "output", "stderr", "exit_code", "elapsed_ms"),
    ModelDoneEvent: ("tokens", "cut"),
    Approve: ("note", "always"),
    Approved: ("grant_written",),
    GrantRef: ("note",),
    Pending: ("approvers",),
    ApprovalView: ("approvers",),
}


@functools.cache
def _configure() -> None:
    """Register the frame hooks and the tagged unions, once, on first use.

    Deferred because generating hooks resolves the frames' annotations (``labels.Label``
    among them) in the modules that define them: on first use core.labels and every
    module of this package are complete, whatever order they were imported in.
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
    boxmaker.wire.codec.BadFrame: call: expected c- and 16 hex digits
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

    >>> from boxmaker.core.vocabulary import ErrorFrame
    >>> encode_frame(ErrorFrame(code=ErrorCode.BAD_FRAME, detail="not a JSON object"))
    b'{"kind":"error","code":"bad_frame","detail":"not a JSON object"}\\n'
    """
    _configure()
    body: dict[str, Any] = converter.unstructure(frame)
    return orjson.dumps({"kind": _kind_of(type(frame)), **body}, option=orjson.OPT_APPEND_NEWLINE)
