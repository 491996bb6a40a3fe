"""The ``mcp_tools`` record: an MCP server's tool list and definition hashes, as brokerd
found them at a start (ledger/records.py): its line, its reading back, its verification,
and how ``bxctl audit show`` prints it."""

from __future__ import annotations

import orjson
import pytest

from boxmaker.ledger.reader import LedgerReader
from boxmaker.ledger.records import (
    GENESIS_PREV,
    BadRecord,
    Genesis,
    Kind,
    McpTools,
    decode_line,
    encode_line,
    line_hash,
)
from boxmaker.ledger.verify import Problem, verify_lines

AT = "2026-01-02T03:04:05.678Z"
HASH = "ab" * 32
RECORD = McpTools(boot="b-1", server="git", tools={"git_status": HASH, "git_log": "cd" * 32})


def _chain(*bodies: object) -> list[bytes]:
    lines, prev = [], GENESIS_PREV
    for seq, body in enumerate([Genesis(ledger="l-1"), *bodies]):
        line = encode_line(seq, AT, prev, body)  # type: ignore[arg-type]
        prev = line_hash(line)
        lines.append(line + b"\n")
    return lines


def test_its_line_is_canonical_and_reads_back() -> None:
    line = encode_line(3, AT, "00" * 32, RECORD)
    assert orjson.loads(line) == {
        "seq": 3,
        "at": AT,
        "kind": "mcp_tools",
        "prev": "00" * 32,
        "boot": "b-1",
        "server": "git",
        "tools": {"git_status": HASH, "git_log": "cd" * 32},
    }
    assert decode_line(line).body == RECORD
    assert RECORD.kind is Kind.MCP_TOOLS


def test_a_line_with_a_wrong_field_is_not_a_record() -> None:
    fields = orjson.loads(encode_line(3, AT, "00" * 32, RECORD))
    fields["tools"] = ["git_status"]
    with pytest.raises(BadRecord, match="bad mcp_tools record"):
        decode_line(orjson.dumps(fields))


def test_the_reader_yields_it() -> None:
    read = [record for _, record in LedgerReader(_chain(RECORD)).records()]
    assert read[1].body == RECORD  # type: ignore[union-attr]


def test_verify_accepts_it_and_names_a_bad_hash() -> None:
    assert verify_lines(_chain(RECORD)).problems == ()
    bad = McpTools(boot="b-1", server="git", tools={"git_status": "md5ish"})
    assert verify_lines(_chain(bad)).problems == (
        Problem(1, "mcp_tools record with a definition hash that is not a sha256"),
    )
    fields = orjson.loads(encode_line(1, AT, line_hash(_chain()[0][:-1]), RECORD))
    fields["server"] = 7
    lines = [_chain()[0], orjson.dumps(fields, option=orjson.OPT_SORT_KEYS) + b"\n"]
    assert Problem(1, "mcp_tools record with a field of the wrong type") in (
        verify_lines(lines).problems
    )
