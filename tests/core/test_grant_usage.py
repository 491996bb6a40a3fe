"""How often each grant decided a call, and when last (core/grant_usage.py)."""

from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from boxmaker.core.grant_usage import GrantUsage, tally_decisions


def _decision(grant: object, verdict: str = "run", at: object = None, call: object = None) -> bytes:
    record = {"at": at, "call": call, "grant": grant, "kind": "decision", "verdict": verdict}
    return orjson.dumps(record, option=orjson.OPT_SORT_KEYS) + b"\n"


def test_an_empty_ledger_has_no_usage_and_no_lines_read() -> None:
    tally = tally_decisions([])
    assert tally.usage == {}
    assert tally.records == 0


def test_lines_that_are_not_decisions_are_counted_as_read_but_tally_nothing() -> None:
    tally = tally_decisions([b'{"kind":"genesis","seq":0}\n', b"not json\n"])
    assert (tally.usage, tally.records) == ({}, 2)


def test_each_verdict_of_each_grant_is_counted() -> None:
    lines = [
        _decision("g", "run"),
        _decision("h", "ask"),
        _decision("g", "run"),
        _decision("g", "deny"),
        _decision("g", "run"),
    ]
    tally = tally_decisions(lines)
    assert tally.records == 5
    assert tally.usage["g"].decisions == 4
    assert tally.usage["g"].verdicts == {"run": 3, "deny": 1}
    assert tally.usage["h"].decisions == 1
    assert tally.usage["h"].verdicts == {"ask": 1}


def test_a_broken_line_that_spells_a_decision_is_passed_over_not_the_end() -> None:
    lines = [
        b'{"kind":"decision","grant":"g", trunc\n',
        _decision("g", "ask", "2026-01-01T00:00:01.000Z", "c-1"),
    ]
    tally = tally_decisions(lines)
    assert tally.records == 2
    assert tally.usage == {"g": GrantUsage(1, {"ask": 1}, "2026-01-01T00:00:01.000Z", "c-1")}


def test_a_record_that_only_holds_the_decision_mark_is_no_decision() -> None:
    lines = [
        # Not a JSON object, though the line holds the mark.
        b'[{"kind":"decision","grant":"g","verdict":"run"}]\n',
        b'"\\"kind\\":\\"decision\\""\n',
        # An object of another kind that names a grant, with the mark in its arguments.
        b'{"arguments":{"kind":"decision"},"grant":"g","kind":"result","verdict":"run"}\n',
        _decision("g", "deny"),
    ]
    tally = tally_decisions(lines)
    assert tally.records == 4
    assert tally.usage["g"].verdicts == {"deny": 1}


def test_a_decision_that_names_no_grant_is_passed_over_not_the_end() -> None:
    lines = [_decision(None, "deny"), _decision(7, "deny"), _decision("g", "run")]
    tally = tally_decisions(lines)
    assert list(tally.usage) == ["g"]
    assert tally.usage["g"].verdicts == {"run": 1}


def test_the_last_decision_gives_when_and_which_call_and_only_text_counts() -> None:
    tally = tally_decisions(
        [
            _decision("g", "run", "2026-01-01T00:00:01.000Z", "c-1"),
            _decision("g", "run", "2026-01-01T00:00:02.000Z", "c-2"),
            _decision("h", "run", "2026-01-01T00:00:03.000Z", "c-3"),
            _decision("h", "ask", 1767225604, 4),
        ]
    )
    assert (tally.usage["g"].last_at, tally.usage["g"].last_call) == (
        "2026-01-01T00:00:02.000Z",
        "c-2",
    )
    assert (tally.usage["h"].last_at, tally.usage["h"].last_call) == (None, None)


@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from(["run", "ask", "deny"])),
        max_size=30,
    )
)
def test_the_tally_is_the_count_of_each_grant_and_verdict(decisions: list[tuple[str, str]]) -> None:
    tally = tally_decisions([_decision(grant, verdict) for grant, verdict in decisions])
    assert tally.records == len(decisions)
    assert set(tally.usage) == {grant for grant, _ in decisions}
    for grant, usage in tally.usage.items():
        verdicts = [verdict for named, verdict in decisions if named == grant]
        assert usage.decisions == len(verdicts)
        assert usage.verdicts == {verdict: verdicts.count(verdict) for verdict in set(verdicts)}
