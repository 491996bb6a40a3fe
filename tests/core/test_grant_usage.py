"""How often each grant decided a call, and when last (core/grant_usage.py), over the
decision records the ledger's reader yields. What a damaged line does to the tally (torn,
not JSON, a decision spelled in other text, a grant of the wrong type) is the reader's:
tests/ledger/test_ledger_reader.py."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from boxmaker.core.grant_usage import GrantUsage, tally_decisions
from boxmaker.core.labels import Taint
from boxmaker.core.vocabulary import Decision, Record, VerdictCode

AT = "2026-01-01T00:00:00.000Z"


def _decision(
    grant: str | None, verdict: str = "run", at: str = AT, call: str = "c-1"
) -> Record[Decision]:
    body = Decision(
        call, "s-1", "read_file", {}, VerdictCode(verdict), None, grant, Taint.PUBLIC, False, "b-1"
    )
    return Record(1, at, "00", body)


def test_no_decisions_no_usage() -> None:
    assert tally_decisions([]) == {}


def test_each_verdict_of_each_grant_is_counted() -> None:
    decisions = [
        _decision("g", "run"),
        _decision("h", "ask"),
        _decision("g", "run"),
        _decision("g", "deny"),
        _decision("g", "run"),
    ]
    usage = tally_decisions(decisions)
    assert usage["g"].decisions == 4
    assert usage["g"].verdicts == {"run": 3, "deny": 1}
    assert usage["h"].decisions == 1
    assert usage["h"].verdicts == {"ask": 1}


def test_a_decision_that_names_no_grant_is_passed_over_not_the_end() -> None:
    usage = tally_decisions([_decision(None, "deny"), _decision("g", "run")])
    assert usage == {"g": GrantUsage(1, {"run": 1}, AT, "c-1")}


def test_the_last_decision_gives_when_and_which_call() -> None:
    usage = tally_decisions(
        [
            _decision("g", "run", "2026-01-01T00:00:01.000Z", "c-1"),
            _decision("g", "run", "2026-01-01T00:00:02.000Z", "c-2"),
            _decision("h", "run", "2026-01-01T00:00:03.000Z", "c-3"),
        ]
    )
    assert (usage["g"].last_at, usage["g"].last_call) == ("2026-01-01T00:00:02.000Z", "c-2")
    assert (usage["h"].last_at, usage["h"].last_call) == ("2026-01-01T00:00:03.000Z", "c-3")


@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from(["run", "ask", "deny"])),
        max_size=30,
    )
)
def test_the_tally_is_the_count_of_each_grant_and_verdict(decisions: list[tuple[str, str]]) -> None:
    usage = tally_decisions([_decision(grant, verdict) for grant, verdict in decisions])
    assert set(usage) == {grant for grant, _ in decisions}
    for grant, one in usage.items():
        verdicts = [verdict for named, verdict in decisions if named == grant]
        assert one.decisions == len(verdicts)
        assert one.verdicts == {verdict: verdicts.count(verdict) for verdict in set(verdicts)}
