"""Frames (docs/protocol.md): round trips, strict shapes, forbidden kinds, the converter."""

from __future__ import annotations

import contextlib
import datetime as dt
import pathlib
from collections.abc import Callable
from typing import Any

import attrs
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from boxmaker.core.labels import Label, Taint
from boxmaker.core.reasons import Reason
from boxmaker.core.vocabulary import APPROVE_OUTCOMES, ApprovalOutcome
from boxmaker.formats import convert
from boxmaker.formats.convert import APPROVAL_ID, CALL_ID, SESSION_ID, converter
from boxmaker.wire import (
    MAX_CLIENT,
    Answer,
    ApprovalsAnswer,
    ApprovalsRequest,
    ApprovalView,
    Approve,
    Approved,
    BadFrame,
    CatalogueAnswer,
    CatalogueRequest,
    ClientAnswer,
    ErrorCode,
    ErrorFrame,
    ForbiddenKind,
    GrantRef,
    Pending,
    Refuse,
    Refused,
    SessionsAnswer,
    SessionsRequest,
    SessionView,
    StatusAnswer,
    StatusRequest,
    ToolRequest,
    decode_admin_answer,
    decode_admin_request,
    decode_broker_answer,
    decode_broker_request,
    encode_frame,
)

CALL = "c-0123456789abcdef"
SESSION = "s-0123456789ab"
APPROVAL = "a-1f2e3d4c"

# ---------------------------------------------------------------------------------------
# strategies

text = st.text(st.characters(exclude_categories=["Cs"]), max_size=20)
call_ids = st.from_regex(CALL_ID, fullmatch=True)
session_ids = st.from_regex(SESSION_ID, fullmatch=True)
approval_ids = st.from_regex(APPROVAL_ID, fullmatch=True)
# format_utc writes four-digit years only from year 1000 on.
times = st.datetimes(
    min_value=dt.datetime(1000, 1, 1),
    max_value=dt.datetime(9999, 12, 31),
    timezones=st.just(dt.UTC),
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)
json_objects = st.dictionaries(text, json_values, max_size=4)
labels = st.builds(Label, st.sampled_from(Taint), st.booleans())
denial_reasons = st.sampled_from(Reason)
counts = st.integers(0, 2**31)


def answers() -> st.SearchStrategy[Answer]:
    ok = st.builds(Answer.ok, call_ids, text, labels)
    denied = st.builds(Answer.denied, call_ids, denial_reasons, st.none() | text)
    failed = st.builds(Answer.failed, call_ids, denial_reasons, st.none() | text)
    return ok | denied | failed


broker_requests = st.builds(
    ToolRequest, call=call_ids, session=session_ids, tool=text, arguments=json_objects
) | st.just(CatalogueRequest())
errors = st.builds(ErrorFrame, code=st.sampled_from(ErrorCode), detail=text)
broker_answers = (
    st.builds(Pending, call=call_ids, approval=approval_ids, grant=text, expires_at=times)
    | answers()
    | st.builds(CatalogueAnswer, tools=st.lists(json_objects, max_size=3))
    | errors
)
reasons_1_500 = st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=500).filter(
    str.strip
)
admin_requests = (
    st.just(ApprovalsRequest())
    | st.builds(Approve, approval=approval_ids, note=st.none() | text)
    | st.builds(Refuse, approval=approval_ids, reason=reasons_1_500)
    | st.just(StatusRequest())
    | st.just(SessionsRequest())
)
grant_refs = st.builds(
    GrantRef, id=text, mode=st.sampled_from(["auto", "ask", "deny"]), note=st.none() | text
)
views = st.builds(
    ApprovalView,
    approval=approval_ids,
    call=call_ids,
    session=session_ids,
    tool=text,
    arguments=json_objects,
    grant=grant_refs,
    requested_at=times,
    expires_at=times,
    taint=st.sampled_from(Taint),
    untrusted=st.booleans(),
)
admin_answers = (
    st.builds(ApprovalsAnswer, entries=st.lists(views, max_size=3))
    | st.builds(
        Approved,
        outcome=st.sampled_from(sorted(APPROVE_OUTCOMES)),
        call=call_ids,
        reason=st.none() | denial_reasons,
    )
    | st.builds(Refused, call=call_ids)
    | st.builds(
        StatusAnswer,
        version=text,
        boot=text,
        head=text,
        ledger_usable=st.booleans(),
        grants_valid=st.booleans(),
        grants_problem=st.none() | text,
        pending=counts,
        sessions=counts,
        uptime_s=st.floats(0, 1e9),
        sandbox_bounds=text,
        shell_ready=st.booleans(),
        shell_problem=st.none() | text,
        witness_lagging=st.none() | text,
    )
    | st.builds(
        SessionsAnswer,
        sessions=st.lists(
            st.builds(
                SessionView,
                session=session_ids,
                taint=st.sampled_from(Taint),
                untrusted=st.booleans(),
                calls=counts,
            ),
            max_size=3,
        ),
    )
    | errors
)

DECODERS: list[tuple[st.SearchStrategy[Any], Callable[[bytes], Any]]] = [
    (broker_requests, decode_broker_request),
    (broker_answers, decode_broker_answer),
    (admin_requests, decode_admin_request),
    (admin_answers, decode_admin_answer),
]
ALL_DECODERS = [decoder for _, decoder in DECODERS]


# ---------------------------------------------------------------------------------------
# round trips and the canonical form


@pytest.mark.parametrize(("frames", "decode"), DECODERS, ids=lambda v: getattr(v, "__name__", ""))
@given(data=st.data())
def test_every_frame_round_trips(
    frames: st.SearchStrategy[Any], decode: Callable[[bytes], Any], data: st.DataObject
) -> None:
    frame = data.draw(frames)
    line = encode_frame(frame)
    assert line.endswith(b"\n")
    assert line.count(b"\n") == 1
    assert decode(line) == frame
    assert encode_frame(decode(line)) == line


@given(frame=broker_requests | broker_answers | admin_requests | admin_answers)
def test_encoding_is_compact_with_kind_first(frame: Any) -> None:
    line = encode_frame(frame)
    assert line.startswith(b'{"kind":"' + type(frame).KIND.encode() + b'"')
    assert orjson.dumps(orjson.loads(line)) == line[:-1]
    assert "kind" not in attrs.fields_dict(type(frame))


def test_spec_examples_decode() -> None:
    request = decode_broker_request(
        b'{"kind":"tool_request","v":1,"call":"c-0123456789abcdef","session":"s-0123456789ab",'
        b'"tool":"read_file","arguments":{"path":"notes.txt"}}'
    )
    assert request == ToolRequest(
        call=CALL, session=SESSION, tool="read_file", arguments={"path": "notes.txt"}
    )
    assert decode_broker_request(b'{"kind":"catalogue","v":1}') == CatalogueRequest()
    assert decode_admin_request(b'{"kind":"approve","approval":"a-1f2e3d4c"}') == Approve(
        approval=APPROVAL
    )
    approved = decode_admin_answer(
        b'{"kind":"approved","outcome":"ask","call":"c-0123456789abcdef","reason":null}'
    )
    assert approved == Approved(outcome=ApprovalOutcome.ASK, call=CALL, reason=None)


@pytest.mark.parametrize("outcome", ["refused", "expired"])
def test_an_approved_answer_says_only_what_an_approve_can_end_in(outcome: str) -> None:
    # One enum for the approval outcome; the approved frame takes its approve subset.
    line = b'{"kind":"approved","outcome":"%s","call":"c-0123456789abcdef","reason":null}'
    with pytest.raises(BadFrame, match="outcome"):
        decode_admin_answer(line % outcome.encode())


def test_optional_fields_are_left_out_and_required_nulls_kept() -> None:
    ok = Answer.ok(CALL, "hi", Label(Taint.INTERNAL, False))
    assert encode_frame(ok) == (
        b'{"kind":"answer","final":true,"call":"c-0123456789abcdef","outcome":"ok",'
        b'"content":"hi","label":{"taint":"internal","untrusted":false}}\n'
    )
    denied = Answer.denied(CALL, Reason.NO_GRANT, "no grant allows read_file on notes.txt")
    assert b'"reason":"no_grant"' in encode_frame(denied)
    assert b"content" not in encode_frame(denied)
    assert (
        encode_frame(Approve(approval=APPROVAL)) == b'{"kind":"approve","approval":"a-1f2e3d4c"}\n'
    )
    approved = Approved(outcome=ApprovalOutcome.ALLOWED, call=CALL, reason=None)
    assert b'"reason":null' in encode_frame(approved)


def test_pending_times_are_utc_milliseconds() -> None:
    moment = dt.datetime(2026, 3, 4, 7, 8, 9, 123456, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    pending = Pending(call=CALL, approval=APPROVAL, grant="g", expires_at=moment)
    assert pending.expires_at == dt.datetime(2026, 3, 4, 5, 8, 9, 123000, tzinfo=dt.UTC)
    assert b'"expires_at":"2026-03-04T05:08:09.123Z"' in encode_frame(pending)
    assert b'"final":false' in encode_frame(pending)
    with pytest.raises(ValueError, match="zone"):
        Pending(call=CALL, approval=APPROVAL, grant="g", expires_at=dt.datetime(2026, 1, 1))


# ---------------------------------------------------------------------------------------
# what is refused, and how


def request(**fields: Any) -> bytes:
    base: dict[str, Any] = {
        "kind": "tool_request",
        "v": 1,
        "call": CALL,
        "session": SESSION,
        "tool": "read_file",
        "arguments": {},
    }
    base.update(fields)
    return orjson.dumps({k: v for k, v in base.items() if v is not ...})


@pytest.mark.parametrize(
    ("line", "detail"),
    [
        (b"", "not valid JSON"),
        (b"{", "not valid JSON"),
        (b'{"kind":"catalogue","v":1}\xff', "not valid JSON"),
        (b'"\xff\xfe"', "not valid JSON"),
        (b"[1,2]", "not a JSON object"),
        (b"null", "not a JSON object"),
        (b'{"v":1}', "kind: expected a string"),
        (b'{"kind":5}', "kind: expected a string"),
        (b'{"kind":"hello"}', "unknown kind 'hello'"),
        (b'{"kind":"' + b"x" * 100 + b'"}', "unknown kind"),
        (request(call="c-1"), "call: expected c- and 16 hex digits"),
        (request(call="C-0123456789ABCDEF"), "call: expected c- and 16 hex digits"),
        (request(session="s-0123456789abc"), "session: expected s- and 12 hex digits"),
        (request(session=5), "session: expected a string"),
        (request(call=...), "call: required key missing"),
        (request(arguments=...), "arguments: required key missing"),
        (request(arguments=[1]), "arguments: expected an object"),
        (request(tool=None), "tool: expected a string"),
        (request(v=2), "v: expected 1"),
        (request(v=True), "v: expected 1"),
        (request(v=1.0), "v: expected 1"),
        (request(extra=1), "extra: unknown key"),
        (request(final=True), "final: unknown key"),
        (b'{"kind":"catalogue","v":1,"tools":[]}', "tools: unknown key"),
        (b'{"kind":"catalogue"' + b',"v":1' * 2 + b',"kind":"x"}', "unknown kind 'x'"),
    ],
)
def test_bad_broker_frames(line: bytes, detail: str) -> None:
    with pytest.raises(BadFrame) as raised:
        decode_broker_request(line)
    assert type(raised.value) is BadFrame
    assert detail in raised.value.detail
    assert raised.value.code is ErrorCode.BAD_FRAME


def test_several_problems_are_all_named() -> None:
    with pytest.raises(BadFrame) as raised:
        decode_broker_request(request(call="x", session=1, extra=2))
    detail = raised.value.detail
    assert "session: expected a string" in detail
    assert "extra: unknown key" in detail


@pytest.mark.parametrize(
    "kind",
    sorted(
        {"approvals", "approve", "refuse", "status", "sessions", "pending", "answer", "error"}
        | {"approved", "refused"}
    ),
)
def test_other_known_kinds_are_forbidden_on_broker_sock(kind: str) -> None:
    with pytest.raises(ForbiddenKind) as raised:
        decode_broker_request(orjson.dumps({"kind": kind, "junk": [1]}))
    assert raised.value.kind == kind
    assert raised.value.code is ErrorCode.FORBIDDEN_KIND


@pytest.mark.parametrize("kind", ["tool_request", "catalogue", "pending", "answer", "approved"])
def test_other_known_kinds_are_forbidden_on_admin_sock(kind: str) -> None:
    with pytest.raises(ForbiddenKind):
        decode_admin_request(orjson.dumps({"kind": kind}))


def test_clients_see_foreign_kinds_as_bad_frames() -> None:
    with pytest.raises(BadFrame) as raised:
        decode_broker_answer(b'{"kind":"tool_request"}')
    assert type(raised.value) is BadFrame
    with pytest.raises(BadFrame):
        decode_admin_answer(b'{"kind":"pending"}')


@pytest.mark.parametrize(
    ("reason", "good"),
    [("", False), ("   ", False), ("x", True), ("é" * 500, True), ("x" * 501, False)],
)
def test_refuse_reason_is_1_to_500_characters(reason: str, good: bool) -> None:
    line = orjson.dumps({"kind": "refuse", "approval": APPROVAL, "reason": reason})
    if good:
        assert decode_admin_request(line) == Refuse(approval=APPROVAL, reason=reason)
    else:
        with pytest.raises(BadFrame, match="reason: expected 1 to 500 characters"):
            decode_admin_request(line)


def test_answer_outcome_and_reason_agree() -> None:
    with pytest.raises(BadFrame, match="reason: must be absent when ok"):
        decode_broker_answer(
            orjson.dumps({"kind": "answer", "call": CALL, "outcome": "ok", "reason": "no_grant"})
        )
    with pytest.raises(BadFrame, match="reason: required"):
        decode_broker_answer(orjson.dumps({"kind": "answer", "call": CALL, "outcome": "denied"}))
    with pytest.raises(BadFrame, match="final: expected true"):
        decode_broker_answer(
            orjson.dumps({"kind": "answer", "final": False, "call": CALL, "outcome": "ok"})
        )


def test_nested_problems_have_paths() -> None:
    view = {
        "approval": APPROVAL,
        "call": CALL,
        "session": SESSION,
        "tool": "t",
        "arguments": {},
        "grant": {"id": "g", "mode": "sometimes"},
        "requested_at": "2026-01-01T00:00:00.000Z",
        "expires_at": "2026-01-01",
        "taint": "public",
        "untrusted": False,
    }
    with pytest.raises(BadFrame) as raised:
        decode_admin_answer(orjson.dumps({"kind": "approvals", "entries": [view, view]}))
    detail = raised.value.detail
    assert 'entries[0].grant.mode: expected "auto" or "ask" or "deny"' in detail
    assert "entries[1].expires_at: expected a UTC time" in detail


@given(line=st.binary(max_size=200))
def test_arbitrary_bytes_only_ever_raise_bad_frame(line: bytes) -> None:
    for decode in ALL_DECODERS:
        with contextlib.suppress(BadFrame):
            decode(line)


KINDS = [
    "tool_request", "catalogue", "pending", "answer", "error", "approvals", "approve",
    "approved", "refuse", "refused", "status", "sessions", "other",
]  # fmt: skip


@given(kind=st.sampled_from(KINDS), body=st.dictionaries(st.sampled_from(
    ["v", "call", "session", "tool", "arguments", "final", "approval", "grant", "expires_at",
     "outcome", "content", "label", "reason", "detail", "tools", "code", "note", "entries",
     "version", "boot", "head", "pending", "sessions", "uptime_s", "x"]), json_values))  # fmt: skip
def test_arbitrary_objects_only_ever_raise_bad_frame(kind: str, body: dict[str, Any]) -> None:
    line = orjson.dumps({**body, "kind": kind})
    for decode in ALL_DECODERS:
        with contextlib.suppress(BadFrame):
            decode(line)


# ---------------------------------------------------------------------------------------
# the converter's strictness (shared by config.toml, grants.toml, records)


@pytest.mark.parametrize(
    ("value", "cl", "message"),
    [
        ("5", int, "expected an integer"),
        (True, int, "expected an integer"),
        (1.5, int, "expected an integer"),
        (5, str, "expected a string"),
        ("1.5", float, "expected a number"),
        (True, float, "expected a number"),
        (float("nan"), float, "expected a finite number"),
        (float("inf"), float, "expected a finite number"),
        (1, bool, "expected true or false"),
        ("true", bool, "expected true or false"),
        (1, Taint, "expected one of: public, internal, secret"),
        ("Public", Taint, "expected one of"),
        (5, str | None, "expected a string"),
        ("", pathlib.Path, "expected a non-empty string"),
        (5, pathlib.Path, "expected a non-empty string"),
        ("2026-01-01T00:00:00", dt.datetime, "expected a UTC time"),
        (dt.datetime(2026, 1, 1), dt.datetime, "with a zone"),
        (20260101, dt.datetime, "expected a UTC time"),
    ],
)
def test_converter_is_strict(value: object, cl: Any, message: str) -> None:
    with pytest.raises(convert.WrongType, match=message):
        converter.structure(value, cl)


def test_converter_accepts_the_right_things() -> None:
    assert converter.structure(3, float) == 3.0
    assert isinstance(converter.structure(3, float), float)
    assert converter.structure("secret", Taint) is Taint.SECRET
    optional_str: Any = str | None
    assert converter.structure(None, optional_str) is None
    assert converter.structure("x", pathlib.Path) == pathlib.Path("x")
    toml_time = dt.datetime(2026, 1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    assert converter.structure(toml_time, dt.datetime) == dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    assert converter.unstructure(dt.datetime(2026, 1, 1, tzinfo=dt.UTC)) == (
        "2026-01-01T00:00:00.000Z"
    )


@attrs.frozen
class Inner:
    n: int


@attrs.frozen
class Outer:
    items: list[Inner]


def test_problems_formats_paths() -> None:
    assert convert.format_path(("a", 0, "b")) == "a[0].b"
    assert convert.format_path((0,)) == "[0]"

    with pytest.raises(Exception) as raised:  # noqa: PT011 - cattrs' own group
        converter.structure({"items": [{"n": 1}, {"n": "2", "m": 0}]}, Outer)
    assert convert.problems(raised.value) == [
        (("items", 1, "n"), "expected an integer"),
        (("items", 1, "m"), "unknown key"),
    ]


def test_new_ids_match_their_patterns() -> None:
    assert CALL_ID.fullmatch(convert.new_call_id())
    assert SESSION_ID.fullmatch(convert.new_session_id())
    assert APPROVAL_ID.fullmatch(convert.new_approval_id())
    assert convert.new_call_id() != convert.new_call_id()


# ---------------------------------------------------------------------------------------
# the MCP client's answer, and who may answer a pending call


def test_pending_names_its_approvers_only_where_the_client_may_answer() -> None:
    moment = dt.datetime(2026, 3, 4, tzinfo=dt.UTC)
    owner_only = Pending(call=CALL, approval=APPROVAL, grant="g", expires_at=moment)
    assert b"approvers" not in encode_frame(owner_only)
    assert decode_broker_answer(encode_frame(owner_only)) == owner_only
    both = attrs.evolve(owner_only, approvers=("owner", "mcp-client"))
    assert b'"approvers":["owner","mcp-client"]' in encode_frame(both)
    assert decode_broker_answer(encode_frame(both)) == both
    for wrong in ((), ("owner", "root")):
        with pytest.raises(convert.InvalidField, match="approvers: expected some of owner"):
            attrs.evolve(owner_only, approvers=wrong)


def client_answer(**fields: Any) -> bytes:
    base: dict[str, Any] = {
        "kind": "client_answer",
        "v": 1,
        "approval": APPROVAL,
        "approve": True,
        "client": "Claude Code",
    }
    return orjson.dumps({**base, **fields})


def test_a_client_answer_round_trips() -> None:
    frame = decode_broker_request(client_answer())
    assert frame == ClientAnswer(approval=APPROVAL, approve=True, client="Claude Code")
    assert encode_frame(frame) == client_answer() + b"\n"


@pytest.mark.parametrize(
    ("fields", "detail"),
    [
        ({"client": ""}, "client: expected 1 to 64 printable characters"),
        ({"client": "x" * 65}, "client: expected 1 to 64 printable characters"),
        ({"client": "a\x1b[2Jb"}, "client: expected 1 to 64 printable characters"),
        ({"client": "a\u202eb"}, "client: expected 1 to 64 printable characters"),
        ({"client": "   "}, "client: expected 1 to 64 printable characters"),
        ({"approval": "a-1"}, "approval: expected a- and 8 hex digits"),
        ({"approve": "yes"}, "approve"),
        ({"always": True}, "always"),
    ],
)
def test_a_client_answer_is_checked(fields: dict[str, Any], detail: str) -> None:
    with pytest.raises(BadFrame) as raised:
        decode_broker_request(client_answer(**fields))
    assert detail in raised.value.detail


def test_a_client_name_of_64_printable_characters_passes() -> None:
    name = "é" * MAX_CLIENT
    frame = decode_broker_request(client_answer(client=name))
    assert isinstance(frame, ClientAnswer)
    assert frame.client == name
