"""Frames on the sockets (docs/protocol.md), built on the one converter of
:mod:`boxmaker.formats.convert` (which also holds the id formats; they are re-exported here).

A frame is a frozen attrs class; the unions (broker requests, broker answers, admin
requests, admin answers, loop events) are tagged on ``"kind"``. One module a concern:
:mod:`~boxmaker.wire.broker`, :mod:`~boxmaker.wire.admin` and :mod:`~boxmaker.wire.loop`
hold each socket's frames and unions, :mod:`~boxmaker.wire.common` what they share (the
field validators), :mod:`~boxmaker.wire.codec` the bytes (decoding, encoding,
:class:`BadFrame`). The frames of a call (``tool_request``, ``pending``, ``answer``,
``error``) and the grant an approval shows are the call's vocabulary, defined once in
:mod:`boxmaker.core.vocabulary` and re-exported here. Import from here: ``from
boxmaker.wire import Answer``.

>>> frame = decode_broker_request(b'{"kind":"catalogue","v":1}')
>>> frame
CatalogueRequest(v=1)
>>> encode_frame(frame)
b'{"kind":"catalogue","v":1}\\n'
>>> decode_broker_request(b'{"kind":"approve","approval":"a-00000000"}')
Traceback (most recent call last):
...
boxmaker.wire.codec.ForbiddenKind: kind 'approve' is not accepted here
"""

from boxmaker.core.vocabulary import (
    Answer,
    ErrorCode,
    ErrorFrame,
    GrantRef,
    Pending,
    RunEnd,
    ToolRequest,
    to_ms,
)
from boxmaker.formats.convert import APPROVAL_ID, CALL_ID, SESSION_ID
from boxmaker.wire.admin import (
    MAX_NOTE,
    MAX_REFUSE_REASON,
    AdminAnswer,
    AdminRequest,
    Always,
    ApprovalsAnswer,
    ApprovalsRequest,
    ApprovalView,
    Approve,
    Approved,
    ChangePreview,
    GrantsReloaded,
    Refuse,
    Refused,
    ReloadGrantsRequest,
    SessionsAnswer,
    SessionsRequest,
    SessionView,
    StatusAnswer,
    StatusRequest,
)
from boxmaker.wire.broker import (
    MAX_CLIENT,
    BrokerAnswer,
    BrokerRequest,
    CatalogueAnswer,
    CatalogueRequest,
    ClientAnswer,
    is_client_name,
)
from boxmaker.wire.codec import (
    BadFrame,
    ForbiddenKind,
    Frame,
    decode_admin_answer,
    decode_admin_request,
    decode_broker_answer,
    decode_broker_request,
    decode_loop_event,
    decode_loop_request,
    encode_frame,
)
from boxmaker.wire.loop import (
    MAX_SAY,
    LoopEvent,
    LoopRequest,
    ModelDoneEvent,
    ModelEvent,
    OutputHead,
    ProgressEvent,
    ReplyDeltaEvent,
    ReplyEvent,
    Say,
    SessionEvent,
    ToolCallEvent,
    ToolResultEvent,
    WaitingEvent,
)

__all__ = [
    "APPROVAL_ID",
    "CALL_ID",
    "MAX_CLIENT",
    "MAX_NOTE",
    "MAX_REFUSE_REASON",
    "MAX_SAY",
    "SESSION_ID",
    "AdminAnswer",
    "AdminRequest",
    "Always",
    "Answer",
    "ApprovalView",
    "ApprovalsAnswer",
    "ApprovalsRequest",
    "Approve",
    "Approved",
    "BadFrame",
    "BrokerAnswer",
    "BrokerRequest",
    "CatalogueAnswer",
    "CatalogueRequest",
    "ChangePreview",
    "ClientAnswer",
    "ErrorCode",
    "ErrorFrame",
    "ForbiddenKind",
    "Frame",
    "GrantRef",
    "GrantsReloaded",
    "LoopEvent",
    "LoopRequest",
    "ModelDoneEvent",
    "ModelEvent",
    "OutputHead",
    "Pending",
    "ProgressEvent",
    "Refuse",
    "Refused",
    "ReloadGrantsRequest",
    "ReplyDeltaEvent",
    "ReplyEvent",
    "RunEnd",
    "Say",
    "SessionEvent",
    "SessionView",
    "SessionsAnswer",
    "SessionsRequest",
    "StatusAnswer",
    "StatusRequest",
    "ToolCallEvent",
    "ToolRequest",
    "ToolResultEvent",
    "WaitingEvent",
    "decode_admin_answer",
    "decode_admin_request",
    "decode_broker_answer",
    "decode_broker_request",
    "decode_loop_event",
    "decode_loop_request",
    "encode_frame",
    "is_client_name",
    "to_ms",
]
