"""Record bodies and their canonical bytes (docs/protocol.md)."""

from __future__ import annotations

import hashlib

import attrs
import orjson
import pytest

from boxmaker.core.labels import Label, Taint
from boxmaker.core.reasons import Reason
from boxmaker.ledger.records import (
    BODY_TYPES,
    COMMON_FIELDS,
    GENESIS_PREV,
    Approval,
    ApprovalBy,
    ApprovalOutcome,
    BadRecord,
    Decision,
    Genesis,
    Kind,
    Record,
    Repair,
    Result,
    ResultStatus,
    Start,
    Stop,
    VerdictCode,
    decode_line,
    encode_line,
    format_head,
    line_hash,
    new_boot_id,
    new_ledger_id,
    parse_head,
)

AT = "2026-01-02T03:04:05.678Z"
PREV = "ab" * 32

DECISION = Decision(
    call="c-0123456789abcdef",
    session="s-0123456789ab",
    tool="read_file",
    arguments={"path": "notes.txt", "max_bytes": 10},
    verdict=VerdictCode.DENY,
    reason=Reason.NO_GRANT,
    grant=None,
    taint=Taint.INTERNAL,
    untrusted=True,
    boot="b-1",
)
APPROVAL = Approval(
    call="c-0123456789abcdef",
    approval="a-01234567",
    outcome=ApprovalOutcome.REFUSED,
    reason="not today, ünïcode",
    by=ApprovalBy.OWNER,
    taint=Taint.PUBLIC,
    untrusted=False,
)
RESULT = Result(
    call="c-0123456789abcdef",
    status=ResultStatus.OK,
    reason=None,
    label=Label(Taint.SECRET, True),
    taint_after=Taint.SECRET,
    untrusted_after=True,
    output_sha256="cd" * 32,
    output_bytes=12,
)
EVERY_BODY = [
    Genesis(ledger="l-1"),
    Start(boot="b-1", version="0.1.0"),
    Stop(boot="b-1"),
    Repair(file="torn-20260102T030405678Z.bin", sha256="ef" * 32),
    DECISION,
    APPROVAL,
    RESULT,
    attrs.evolve(
        RESULT,
        status=ResultStatus.FAILED,
        reason=Reason.REQUESTER_GONE,
        output_sha256=None,
        output_bytes=0,
        stopped=True,
    ),
    attrs.evolve(DECISION, tool="mcp.git.git_log", definition="12" * 32),
    attrs.evolve(APPROVAL, definition="12" * 32, approver="mcp-client:claude-code"),
    attrs.evolve(RESULT, definition="12" * 32),
]


def test_every_kind_has_a_body_type_and_back() -> None:
    assert set(BODY_TYPES) == set(Kind)
    for kind, body_type in BODY_TYPES.items():
        assert body_type.kind is kind


def test_no_body_field_shadows_a_common_field() -> None:
    for body_type in BODY_TYPES.values():
        assert not {field.name for field in attrs.fields(body_type)} & COMMON_FIELDS


def test_decision_line_is_canonical_exactly() -> None:
    line = encode_line(5, AT, PREV, DECISION)
    assert line == (
        b'{"arguments":{"max_bytes":10,"path":"notes.txt"},"at":"2026-01-02T03:04:05.678Z",'
        b'"boot":"b-1","call":"c-0123456789abcdef","grant":null,"kind":"decision",'
        b'"prev":"' + PREV.encode() + b'","reason":"no_grant","seq":5,'
        b'"session":"s-0123456789ab","taint":"internal","tool":"read_file","untrusted":true,'
        b'"verdict":"deny"}'
    )


def test_result_line_carries_label_as_an_object_and_nulls() -> None:
    fields = orjson.loads(encode_line(9, AT, PREV, RESULT))
    assert fields == {
        "seq": 9,
        "at": AT,
        "kind": "result",
        "prev": PREV,
        "call": "c-0123456789abcdef",
        "status": "ok",
        "reason": None,
        "label": {"taint": "secret", "untrusted": True},
        "taint_after": "secret",
        "untrusted_after": True,
        "output_sha256": "cd" * 32,
        "output_bytes": 12,
    }


def test_a_result_says_stopped_only_when_a_run_was_stopped() -> None:
    # A result written before the field existed, or of a run not stopped, keeps its line.
    assert "stopped" not in orjson.loads(encode_line(9, AT, PREV, RESULT))
    stopped = attrs.evolve(
        RESULT, status=ResultStatus.FAILED, reason=Reason.REQUESTER_GONE, stopped=True
    )
    assert orjson.loads(encode_line(9, AT, PREV, stopped))["stopped"] is True


APPROVAL_LINE = (
    b'{"approval":"a-01234567","at":"2026-01-02T03:04:05.678Z","by":"owner",'
    b'"call":"c-0123456789abcdef","kind":"approval","outcome":"refused","prev":"'
    + PREV.encode()
    + b'","reason":"not today, \xc3\xbcn\xc3\xafcode","seq":7,"taint":"public","untrusted":false}'
)
RESULT_LINE = (
    b'{"at":"2026-01-02T03:04:05.678Z","call":"c-0123456789abcdef","kind":"result",'
    b'"label":{"taint":"secret","untrusted":true},"output_bytes":12,"output_sha256":"'
    + b"cd" * 32
    + b'","prev":"'
    + PREV.encode()
    + b'","reason":null,"seq":7,"status":"ok","taint_after":"secret","untrusted_after":true}'
)


def test_records_without_a_definition_or_approver_keep_their_lines_byte_for_byte() -> None:
    """A ledger written before ``definition`` and ``approver`` existed verifies as it did:
    a record without them is the very line it always was (the decision's: above)."""
    assert encode_line(7, AT, PREV, APPROVAL) == APPROVAL_LINE
    assert encode_line(7, AT, PREV, RESULT) == RESULT_LINE
    assert decode_line(APPROVAL_LINE).body == APPROVAL
    assert decode_line(RESULT_LINE).body == RESULT


def test_a_definition_and_an_approver_are_written_where_they_are() -> None:
    digest = "12" * 32
    decision = attrs.evolve(DECISION, tool="mcp.git.git_log", definition=digest)
    assert orjson.loads(encode_line(5, AT, PREV, decision))["definition"] == digest
    approval = orjson.loads(
        encode_line(7, AT, PREV, attrs.evolve(APPROVAL, definition=digest, approver="mcp-client:x"))
    )
    assert (approval["definition"], approval["approver"]) == (digest, "mcp-client:x")
    only_approver = orjson.loads(encode_line(7, AT, PREV, attrs.evolve(APPROVAL, approver="y")))
    assert "definition" not in only_approver
    assert only_approver["approver"] == "y"
    assert (
        orjson.loads(encode_line(7, AT, PREV, attrs.evolve(RESULT, definition=digest)))[
            "definition"
        ]
        == digest
    )


def test_non_ascii_is_utf8_not_escaped() -> None:
    line = encode_line(1, AT, PREV, APPROVAL)
    assert "ünïcode".encode() in line
    assert b" " not in line.replace(b"not today, ", b"")


def test_nested_arguments_are_sorted_too() -> None:
    body = attrs.evolve(DECISION, arguments={"b": {"z": 1, "a": 2}, "a": [3]})
    assert b'"arguments":{"a":[3],"b":{"a":2,"z":1}}' in encode_line(1, AT, PREV, body)


@pytest.mark.parametrize("body", EVERY_BODY, ids=lambda body: body.kind)
def test_decode_reverses_encode(body: object) -> None:
    line = encode_line(3, AT, PREV, body)  # type: ignore[arg-type]
    assert decode_line(line) == Record(seq=3, at=AT, prev=PREV, body=body)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b"{", "not JSON"),
        (b"[1]", "not a JSON object"),
        (b'{"seq":1,"at":"x","kind":"stop"}', "missing common field 'prev'"),
        (b'{"seq":"1","at":"x","kind":"stop","prev":"p","boot":"b"}', "wrong type"),
        (b'{"seq":true,"at":"x","kind":"stop","prev":"p","boot":"b"}', "wrong type"),
        (b'{"seq":1,"at":"x","kind":"nope","prev":"p"}', "unknown kind 'nope'"),
        (b'{"seq":1,"at":"x","kind":"stop","prev":"p"}', "bad stop record"),
        (b'{"seq":1,"at":"x","kind":"stop","prev":"p","boot":"b","x":1}', "extra fields"),
    ],
)
def test_decode_rejects(line: bytes, message: str) -> None:
    with pytest.raises(BadRecord, match=message):
        decode_line(line)


def test_line_hash_is_sha256_hex_of_the_exact_bytes() -> None:
    assert line_hash(b"abc") == hashlib.sha256(b"abc").hexdigest()
    assert line_hash(b"abc") != line_hash(b"abc\n")


def test_genesis_prev_is_64_zeros() -> None:
    assert GENESIS_PREV == "0" * 64


def test_heads_round_trip() -> None:
    digest = "0f" * 32
    assert format_head(12, digest) == "12:" + digest
    assert parse_head(format_head(12, digest)) == (12, digest)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "12",
        "12:",
        "x:" + "0" * 64,
        "-1:" + "0" * 64,
        "1:" + "0" * 63,
        "1:" + "A" * 64,
        "\u0661:" + "0" * 64,  # a digit, but not an ASCII one
    ],
)
def test_bad_heads_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="a head is SEQ:SHA256"):
        parse_head(text)


def test_ids_are_fresh_and_shaped() -> None:
    assert new_ledger_id() != new_ledger_id()
    assert new_boot_id() != new_boot_id()
    assert len(new_boot_id()) == 18
    int(new_ledger_id()[2:], 16)
