"""The one ledger reader (ledger/reader.py): its two paths give one answer.

The typed path (:meth:`LedgerReader.records`) decodes every line by the one converter;
the fast path (:meth:`LedgerReader.decisions`) parses only the lines that spell a
decision and checks a decision's fields by hand. On generated ledgers, damaged lines
among them, the fast path yields exactly the decision records the typed path yields, and
each counts as malformed what its docstring says. Also here, moved from the tests of the
readers this one replaced: what-if's filters (since, session), a model's text that
spells a decision, and ``bxctl grants list``'s tally over the fast path.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from boxmaker.core.grant_usage import GrantUsage, tally_decisions
from boxmaker.core.labels import Taint
from boxmaker.core.reasons import Reason
from boxmaker.core.vocabulary import (
    Approval,
    ApprovalBy,
    ApprovalOutcome,
    Decision,
    Record,
    VerdictCode,
)
from boxmaker.ledger.reader import LedgerReader, NotARecord, iter_lines
from boxmaker.ledger.records import Body, Policy, Start, Stop, encode_line

AT = "2026-01-02T03:04:05.678Z"
PREV = "ab" * 32
BOOT = "b-0123456789abcdef"


def decision(
    call: str = "c-1",
    *,
    grant: str | None = "g",
    verdict: VerdictCode = VerdictCode.RUN,
    session: str = "s-1",
    arguments: dict[str, Any] | None = None,
    reason: Reason | None = None,
    tool: str = "read_file",
    definition: str | None = None,
) -> Decision:
    return Decision(
        call,
        session,
        tool,
        {"path": "a"} if arguments is None else arguments,
        verdict,
        reason,
        grant,
        Taint.PUBLIC,
        False,
        BOOT,
        definition,
    )


def line(seq: int, body: Body, at: str = AT) -> bytes:
    return encode_line(seq, at, PREV, body) + b"\n"


def fields_line(fields: dict[str, Any]) -> bytes:
    return orjson.dumps(fields, option=orjson.OPT_SORT_KEYS) + b"\n"


def typed_decisions(lines: list[bytes]) -> tuple[list[Record[Decision]], LedgerReader]:
    reader = LedgerReader(lines)
    found = [
        record  # type: ignore[misc] # narrowed by its body just below
        for _, record in reader.records()
        if isinstance(record, Record) and isinstance(record.body, Decision)
    ]
    return found, reader


# --- examples -----------------------------------------------------------------------------


def test_both_paths_read_a_decision_back_as_it_was_written() -> None:
    body = decision(arguments={"path": "notes.txt", "kind": "decision"})
    lines = [line(1, Start(BOOT, "1.0")), line(2, body), line(3, Stop(BOOT))]
    reader = LedgerReader(lines)
    assert list(reader.decisions()) == [Record(2, AT, PREV, body)]
    assert (reader.read, reader.malformed) == (3, 0)
    typed, typed_reader = typed_decisions(lines)
    assert typed == [Record(2, AT, PREV, body)]
    assert (typed_reader.read, typed_reader.malformed) == (3, 0)


def test_the_typed_path_says_why_a_line_is_not_a_record() -> None:
    good = line(1, Stop(BOOT))
    reader = LedgerReader([good, b"not json\n", b"[1]\n", b'{"at":"x"}'])
    read = list(reader.records())
    assert read[0] == (good[:-1], Record(1, AT, PREV, Stop(BOOT)))
    assert [problem for _, problem in read[1:]] == [
        NotARecord(problem=read[1][1].problem),  # type: ignore[union-attr]
        NotARecord("not a JSON object"),
        NotARecord("missing common field 'seq'"),
    ]
    assert read[1][1].problem.startswith("not JSON: ")  # type: ignore[union-attr]
    assert (reader.read, reader.malformed) == (4, 3)


def test_mentioning_decodes_only_the_lines_that_hold_a_mark() -> None:
    policy = Policy(BOOT, "cd" * 32, 1, None)
    lines = [
        line(1, policy),
        line(2, decision("c-1")),
        line(3, decision("c-2")),
        b"not json c-2\n",
    ]
    reader = LedgerReader(lines)
    read = [record for _, record in reader.records(mentioning=(b"c-2", b"policy"))]
    assert read[:2] == [Record(1, AT, PREV, policy), Record(3, AT, PREV, decision("c-2"))]
    assert isinstance(read[2], NotARecord)
    assert (reader.read, reader.malformed) == (4, 1)


def test_since_and_session_keep_their_decisions_only_in_ledger_order() -> None:
    lines = [
        line(1, decision("c-1", session="s-1"), "2026-01-02T03:04:05.000Z"),
        line(2, decision("c-2", session="s-2"), "2026-01-02T03:04:06.000Z"),
        line(3, decision("c-3", session="s-1"), "2026-01-02T03:04:06.000Z"),
        line(4, decision("c-4", session="s-1"), "2026-01-02T03:04:07.000Z"),
    ]
    since = dt.datetime(2026, 1, 2, 3, 4, 6, tzinfo=dt.UTC)  # inclusive
    reader = LedgerReader(lines)
    kept = reader.decisions(since=since, session="s-1")
    assert [record.body.call for record in kept] == ["c-3", "c-4"]
    assert (reader.read, reader.malformed) == (4, 0)
    # A time in another zone is the same moment.
    east = since.astimezone(dt.timezone(dt.timedelta(hours=5)))
    assert [r.seq for r in LedgerReader(lines).decisions(since=east)] == [2, 3, 4]


@pytest.mark.parametrize(
    ("damaged", "why"),
    [
        (b'{"kind":"decision","grant":"g", trunc\n', "torn"),
        (b'[{"kind":"decision"}]\n', "not an object"),
        (b'"\\"kind\\":\\"decision\\""\n', "a string"),
    ],
)
def test_a_broken_line_that_spells_a_decision_is_counted_and_passed_over(
    damaged: bytes, why: str
) -> None:
    reader = LedgerReader([damaged, line(2, decision())])
    assert [record.seq for record in reader.decisions()] == [2], why
    assert (reader.read, reader.malformed) == (2, 1)


def test_another_record_whose_text_spells_a_decision_is_not_malformed() -> None:
    approval = Approval(
        "c-1",
        "a-1",
        ApprovalOutcome.REFUSED,
        '"kind":"decision" said the model',
        ApprovalBy.OWNER,
        Taint.PUBLIC,
        False,
    )
    reader = LedgerReader([line(1, approval)])
    assert list(reader.decisions()) == []
    assert (reader.read, reader.malformed) == (1, 0)


def test_a_decision_at_a_time_without_a_zone_is_malformed_on_both_paths() -> None:
    lines = [line(1, decision(), at="2026-01-02T03:04:05")]
    reader = LedgerReader(lines)
    assert (list(reader.decisions()), reader.malformed) == ([], 1)
    assert typed_decisions(lines)[1].malformed == 1


def test_the_typed_path_gives_each_line_as_it_is_less_its_newline() -> None:
    lines = [b"not json X\n", b"{} \r\n", b"no newline"]
    assert [line for line, _ in LedgerReader(lines).records()] == [
        b"not json X",
        b"{} \r",
        b"no newline",
    ]


def test_the_counts_add_up_over_a_pass_stopped_and_taken_up_again() -> None:
    lines = iter(
        [
            b"[1] decision\n",
            line(1, decision("c-1")),
            b'"decision"\n',
            b'["decision"]\n',
            line(4, decision("c-2")),
            b"tail",
        ]
    )
    reader = LedgerReader(lines)
    first = reader.decisions()
    assert next(first).body.call == "c-1"
    first.close()  # what-if stopped, as by an error: the counts so far are kept
    assert (reader.read, reader.malformed) == (2, 1)
    assert [record.body.call for record in reader.decisions()] == ["c-2"]
    assert (reader.read, reader.malformed) == (6, 3)


def test_iter_lines_streams_a_file_with_its_newlines(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_bytes(b"one\ntwo\nthree")
    assert list(iter_lines(path)) == [b"one\n", b"two\n", b"three"]


# --- the grant usage tally, over the fast path (moved from tests/core/test_grant_usage.py)


def test_the_tally_reads_decisions_only_and_counts_every_line_read() -> None:
    lines = [
        line(0, Start(BOOT, "1.0")),
        line(1, decision("c-1", verdict=VerdictCode.ASK)),
        b"not json\n",
        # A model's raw arguments that spell a decision are still not one.
        fields_line({"arguments": {"kind": "decision", "grant": "g"}, "kind": "result"}),
        line(3, decision("c-2", verdict=VerdictCode.DENY), "2026-01-02T03:04:06.000Z"),
        line(4, decision("c-3", grant=None, verdict=VerdictCode.DENY)),
        line(5, decision("c-4", grant=None)).replace(b'"grant":null', b'"grant":7'),
    ]
    reader = LedgerReader(lines)
    usage = tally_decisions(reader.decisions())
    assert reader.read == 7
    assert reader.malformed == 1  # the grant of the wrong type
    assert usage == {
        "g": GrantUsage(2, {"ask": 1, "deny": 1}, "2026-01-02T03:04:06.000Z", "c-2"),
    }


# --- the two paths, on generated ledgers ----------------------------------------------------

TEXT = st.sampled_from(["a", "decision", '"kind":"decision"', "c-1", "é", "\\", ""])


@st.composite
def bodies(draw: st.DrawFn) -> Body:
    # Decisions the most: they are what the two paths must agree on.
    kind = draw(st.sampled_from(["decision"] * 4 + ["approval", "start", "stop", "policy"]))
    if kind == "decision":
        return Decision(
            draw(st.sampled_from(["c-1", "c-2"])),
            draw(st.sampled_from(["s-1", "s-2"])),
            draw(st.sampled_from(["read_file", "shell", "mcp.git.git_log"])),
            draw(st.dictionaries(TEXT, TEXT | st.integers(-(2**63), 2**63 - 1), max_size=2)),
            draw(st.sampled_from(VerdictCode)),
            draw(st.none() | st.sampled_from(Reason)),
            draw(st.none() | TEXT),
            draw(st.sampled_from(Taint)),
            draw(st.booleans()),
            BOOT,
            draw(st.none() | TEXT),
        )
    if kind == "approval":
        return Approval(
            "c-1",
            "a-1",
            draw(st.sampled_from(ApprovalOutcome)),
            draw(st.none() | TEXT),
            draw(st.sampled_from(ApprovalBy)),
            draw(st.sampled_from(Taint)),
            draw(st.booleans()),
            draw(st.none() | TEXT),
        )
    if kind == "start":
        return Start(BOOT, draw(TEXT))
    if kind == "stop":
        return Stop(BOOT)
    return Policy(BOOT, draw(st.none() | TEXT), draw(st.none() | st.integers(0, 3)), None)


WRONG_VALUES = st.sampled_from([None, 1, 1.5, True, "x", "decision", [], {}, "2026-01-02"])


@st.composite
def damaged(draw: st.DrawFn, good: bytes) -> bytes:
    """``good`` (a record's line) as a torn write, bad JSON or a record gone wrong leave it."""
    how = draw(
        st.sampled_from(["torn", "not json", "wrong type", "unknown kind", "extra", "missing"])
    )
    if how == "torn":
        return good[: draw(st.integers(0, len(good) - 2))]
    if how == "not json":
        return draw(st.sampled_from([b"decision\n", b"{decision\n", b"\xff\n", b"\n"]))
    fields = orjson.loads(good)
    name = draw(st.sampled_from(sorted(fields)))
    if how == "wrong type":
        fields[name] = draw(WRONG_VALUES)
    elif how == "unknown kind":
        fields["kind"] = draw(st.sampled_from(["decisions", "other", "Decision"]))
    elif how == "extra":
        fields[draw(st.sampled_from(["extra", "decision", "definition"]))] = draw(WRONG_VALUES)
    else:
        del fields[name]
    return fields_line(fields)


@st.composite
def ledgers(draw: st.DrawFn) -> list[bytes]:
    lines = []
    for seq in range(draw(st.integers(0, 12))):
        good = line(seq, draw(bodies()), draw(st.sampled_from([AT, "2026-01-02T03:04:05+05:00"])))
        lines.append(draw(damaged(good)) if draw(st.booleans()) else good)
    if lines and draw(st.booleans()):
        lines[-1] = lines[-1].rstrip(b"\n")  # the last line as a file may end
    return lines


def _fast_path_malformed(raw: bytes, typed: Record[Body] | NotARecord) -> bool:
    """What :meth:`LedgerReader.decisions` says it counts: a line that holds the bytes
    ``decision`` and is not a decision record, unless it is another record (a JSON object
    whose kind is not ``decision``)."""
    if b"decision" not in raw or isinstance(typed, Record):
        return False
    try:
        fields = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return True
    return type(fields) is not dict or fields.get("kind") == "decision"


@given(ledgers())
def test_the_fast_path_yields_exactly_the_decisions_of_the_typed_path(lines: list[bytes]) -> None:
    typed_reader = LedgerReader(lines)
    read = list(typed_reader.records())
    typed = [r for _, r in read if isinstance(r, Record) and isinstance(r.body, Decision)]
    fast_reader = LedgerReader(lines)
    assert list(fast_reader.decisions()) == typed
    assert typed_reader.read == fast_reader.read == len(lines)
    assert typed_reader.malformed == sum(isinstance(r, NotARecord) for _, r in read)
    expected = sum(_fast_path_malformed(raw, r) for raw, (_, r) in zip(lines, read, strict=True))
    assert fast_reader.malformed == expected


def _every_damage_of_a_decision() -> list[bytes]:
    damaged = _every_damage_of(orjson.loads(line(1, decision())))
    # A decision of an MCP tool carries one field more, its definition hash.
    with_definition = decision(tool="mcp.git.git_log", definition="ab" * 32)
    return damaged + _every_damage_of(orjson.loads(line(1, with_definition)))


def _every_damage_of(fields: dict[str, Any]) -> list[bytes]:
    damaged = []
    for name in sorted(fields):
        missing = dict(fields)
        del missing[name]
        damaged.append(fields_line(missing))
        for wrong in [None, 1, 1.5, True, "x", [], {}, "2026-01-02"]:
            if wrong != fields[name] or type(wrong) is not type(fields[name]):
                damaged.append(fields_line(fields | {name: wrong}))
    damaged.append(fields_line(fields | {"extra": 1}))
    return damaged


@pytest.mark.parametrize("damaged", _every_damage_of_a_decision())
def test_each_field_of_a_decision_gone_wrong_is_malformed_on_both_paths(damaged: bytes) -> None:
    """Every field missing or of each other type, and one field too many: the generated
    ledgers above meet these by chance, here each is met every run."""
    typed, typed_reader = typed_decisions([damaged])
    reader = LedgerReader([damaged])
    assert list(reader.decisions()) == typed
    if typed:  # a value of the right type after all (text for text, null for a grant)
        assert reader.malformed == typed_reader.malformed == 0
    else:
        is_decision = orjson.loads(damaged).get("kind") == "decision"
        assert (reader.malformed, typed_reader.malformed) == (int(is_decision), 1)
