"""The ``connection`` record: one tunnel's end, written by brokerd before its connect
call's result (ledger/records.py): its line, reading it back, and verification of its
fields and of its place in the call's order."""

from __future__ import annotations

from typing import Any

import attrs
import orjson
import pytest

from boxmaker.core.labels import FRESH, Taint
from boxmaker.core.reasons import Reason
from boxmaker.core.vocabulary import Decision, Result, VerdictCode
from boxmaker.ledger.reader import LedgerReader
from boxmaker.ledger.records import (
    GENESIS_PREV,
    BadRecord,
    Body,
    Connection,
    ConnectionEnd,
    Genesis,
    Kind,
    decode_line,
    encode_line,
    line_hash,
)
from boxmaker.ledger.verify import Problem, verify_lines

AT = "2026-01-02T03:04:05.678Z"
SHELL = "c-00000000000000a0"
CONNECT = "c-00000000000000c1"
SESSION = "s-000000000001"

RECORD = Connection(
    call=CONNECT,
    via=SHELL,
    session=SESSION,
    host="pypi.org",
    port=443,
    address="151.101.0.223",
    server_name="pypi.org",
    bytes_up=517,
    bytes_down=40_960,
    duration_ms=812,
    ended=ConnectionEnd.CLOSED,
)


def decision(call: str, tool: str, verdict: VerdictCode = VerdictCode.RUN) -> Decision:
    arguments: dict[str, Any] = {"command": "pip install attrs"}
    if tool == "connect":
        arguments = {"host": "pypi.org", "port": 443, "via": SHELL, "via_tool": "shell"}
    return Decision(
        call=call,
        session=SESSION,
        tool=tool,
        arguments=arguments,
        verdict=verdict,
        reason=None if verdict is not VerdictCode.DENY else Reason.NO_GRANT,
        grant="pypi" if verdict is not VerdictCode.DENY else None,
        taint=Taint.PUBLIC,
        untrusted=False,
        boot="b-1",
    )


def result(call: str) -> Result:
    return Result.of_run(call, ok=True, reason=None, label=FRESH, content="", after=FRESH)


def chain(*bodies: Body) -> list[bytes]:
    lines, prev = [], GENESIS_PREV
    for seq, body in enumerate([Genesis(ledger="l-1"), *bodies]):
        line = encode_line(seq, AT, prev, body)
        prev = line_hash(line)
        lines.append(line + b"\n")
    return lines


def forged(body: Body, **changes: Any) -> list[bytes]:
    """A sound chain around ``body`` whose connection line carries ``changes``."""
    lines = chain(decision(SHELL, "shell"), decision(CONNECT, "connect"))
    fields = orjson.loads(encode_line(3, AT, line_hash(lines[-1][:-1]), body))
    fields |= changes
    for name in [name for name, value in changes.items() if value is _GONE]:
        del fields[name]
    lines.append(orjson.dumps(fields, option=orjson.OPT_SORT_KEYS) + b"\n")
    return lines


_GONE = object()


def test_its_line_is_canonical_and_reads_back() -> None:
    line = encode_line(3, AT, "00" * 32, RECORD)
    assert orjson.loads(line) == {
        "seq": 3,
        "at": AT,
        "kind": "connection",
        "prev": "00" * 32,
        "call": CONNECT,
        "via": SHELL,
        "session": SESSION,
        "host": "pypi.org",
        "port": 443,
        "address": "151.101.0.223",
        "server_name": "pypi.org",
        "bytes_up": 517,
        "bytes_down": 40_960,
        "duration_ms": 812,
        "ended": "closed",
    }
    assert decode_line(line).body == RECORD
    assert RECORD.kind is Kind.CONNECTION


def test_every_way_a_tunnel_ends_is_a_value() -> None:
    assert [end.value for end in ConnectionEnd] == [
        "closed",
        "idle",
        "byte_cap",
        "call_ended",
        "server_name_mismatch",
        "not_tls",
        "ledger_failed",
        "stopping",
        "upstream_error",
    ]


def test_an_unknown_end_is_not_a_record() -> None:
    fields = orjson.loads(encode_line(3, AT, "00" * 32, RECORD))
    fields["ended"] = "vanished"
    with pytest.raises(BadRecord, match="bad connection record"):
        decode_line(orjson.dumps(fields))


def test_the_reader_yields_it() -> None:
    read = [record for _, record in LedgerReader(chain(RECORD)).records()]
    assert read[1].body == RECORD  # type: ignore[union-attr]


def test_verify_accepts_a_connection_while_its_connect_runs() -> None:
    lines = chain(
        decision(SHELL, "shell"),
        decision(CONNECT, "connect"),
        RECORD,
        result(CONNECT),
        result(SHELL),
    )
    report = verify_lines(lines)
    assert report.problems == ()
    assert report.calls.complete == 2


def test_a_tls_less_connection_has_no_server_name() -> None:
    bare = attrs.evolve(RECORD, server_name=None, ended=ConnectionEnd.NOT_TLS)
    lines = chain(decision(SHELL, "shell"), decision(CONNECT, "connect"), bare)
    assert verify_lines(lines).problems == ()


@pytest.mark.parametrize(
    ("before", "what"),
    [
        ((), f"connection for call {CONNECT} that is not running"),
        (
            (decision(CONNECT, "connect", VerdictCode.ASK),),
            f"connection for call {CONNECT} that is not running",
        ),
        (
            (decision(CONNECT, "connect", VerdictCode.DENY),),
            f"connection for call {CONNECT} that is not running",
        ),
        (
            (decision(CONNECT, "connect"), result(CONNECT)),
            f"connection for call {CONNECT} that is not running",
        ),
    ],
)
def test_a_connection_out_of_its_call_order(before: tuple[Body, ...], what: str) -> None:
    lines = chain(*before, RECORD)
    assert verify_lines(lines).problems == (Problem(len(before) + 1, what),)


@pytest.mark.parametrize(
    ("change", "what"),
    [
        ({"call": "c-1"}, "connection record with call id 'c-1'"),
        ({"via": None}, "connection record with via id None"),
        ({"session": "s-1"}, "connection record with session id 's-1'"),
        ({"host": ""}, "connection record with host ''"),
        ({"port": 0}, "connection record with port 0"),
        ({"port": 65536}, "connection record with port 65536"),
        ({"port": "443"}, "connection record with port '443'"),
        ({"port": True}, "connection record with port True"),
        ({"bytes_up": -1}, "connection record with bytes_up -1"),
        ({"bytes_down": 1.5}, "connection record with bytes_down 1.5"),
        ({"duration_ms": None}, "connection record with duration_ms None"),
        ({"address": "pypi.org"}, "connection record with address 'pypi.org', not an IP address"),
        ({"address": 7}, "connection record with address 7, not an IP address"),
        ({"server_name": 7}, "connection record with server_name 7"),
        ({"ended": "vanished"}, "connection record with ended 'vanished'"),
        ({"ended": ["closed"]}, "connection record with a field of the wrong type"),
        ({"bytes_up": _GONE}, "connection record without 'bytes_up'"),
    ],
)
def test_verify_names_each_bad_field(change: dict[str, Any], what: str) -> None:
    assert verify_lines(forged(RECORD, **change)).problems == (Problem(3, what),)


def test_an_ipv6_address_is_an_address() -> None:
    assert verify_lines(forged(RECORD, address="2a04:4e42::223")).problems == ()
