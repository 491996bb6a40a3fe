"""What-if's replay (core/replay.py): each recorded decision decided again equals
decide() afresh on the candidate (the caches never change an answer), expiry counts at
the record's time, decisions the grants did not make are skipped and counted, and the
candidate's grants that never matched or never decided are named."""

from __future__ import annotations

import datetime as dt
from typing import Any

import attrs
from hypothesis import given
from hypothesis import strategies as st
from tests.harness.grants import checked
from tests.harness.grants import grant_set as grants
from tests.harness.homes import grant_table as g

from boxmaker.core import catalogue
from boxmaker.core.catalogue import MAX_BYTES
from boxmaker.core.decide import CheckedRequest, Ruling, decide
from boxmaker.core.grants import GrantSet
from boxmaker.core.labels import FRESH, Label, Taint
from boxmaker.core.reasons import Reason
from boxmaker.core.replay import CACHE_ENTRIES, Outcome, Replay
from boxmaker.core.vocabulary import Decision, Record, VerdictCode, record_time

RecordedDecision = Record[Decision]
"""A ``decision`` record, as replay takes it."""
PREV = "00" * 32
BOOT = "b-0123456789abcdef"

NOW = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)
SESSION = "s-0123456789ab"
INTERNAL = Label(Taint.INTERNAL, False)
SECRET = Label(Taint.SECRET, False)
UNTRUSTED = Label(Taint.PUBLIC, True)


def decided(
    seq: int,
    tool: str,
    arguments: dict[str, Any],
    then: GrantSet,
    state: Label = FRESH,
    at: dt.datetime = NOW,
    session: str = SESSION,
) -> RecordedDecision:
    """What brokerd records for this call when it decides with ``then``."""
    args = checked(tool, arguments)
    decision = decide(CheckedRequest(f"c-{seq:016x}", session, args), then, state, at).decision
    return recorded_of(seq, decision, at)


def recorded_of(seq: int, decision: Ruling, at: dt.datetime) -> RecordedDecision:
    """The record brokerd writes of ``decision``, as the ledger's reader yields it (its
    time to the microsecond, where brokerd's is to the millisecond: the boundaries below
    are a microsecond apart)."""
    return Record(seq, at.isoformat(), PREV, Decision.of(decision, BOOT))


def denied_early(seq: int, reason: Reason, arguments: dict[str, Any]) -> RecordedDecision:
    body = Decision(
        f"c-{seq:016x}",
        SESSION,
        "read_file",
        arguments,
        VerdictCode.DENY,
        reason,
        None,
        FRESH.taint,
        FRESH.untrusted,
        BOOT,
    )
    return Record(seq, NOW.isoformat(), PREV, body)


# --- examples ----------------------------------------------------------------------------

BASE = (
    g("read-notes", "read_file", "auto", paths='["notes/**"]')
    + g("read-docs", "read_file", "ask", paths='["docs/**"]')
    + g("no-env", "read_file", "deny", paths='["**/.env"]')
    + g("git", "shell", "auto", commands='["git status*"]')
)


def test_the_same_grants_change_nothing_and_a_mode_change_flips_what_that_grant_decided() -> None:
    then = grants(BASE)
    calls = [
        decided(1, "read_file", {"path": "notes/a.txt"}, then),  # run, read-notes
        decided(2, "read_file", {"path": "docs/a.md"}, then),  # ask, read-docs
        decided(3, "read_file", {"path": "a/.env"}, then),  # deny, no-env
        decided(4, "shell", {"command": "git status"}, then),  # run, git
        decided(5, "read_file", {"path": "notes/b.txt"}, then, UNTRUSTED),  # ask (untrusted)
        decided(6, "shell", {"command": "rm x"}, then),  # deny, no_grant
    ]
    same = Replay(then)
    assert list(same.run(calls)) == []
    assert (same.replayed, same.unchanged, same.flips) == (6, 6, 0)

    asks = BASE.replace(
        '"read-notes"\ntool = "read_file"\nmode = "auto"',
        '"read-notes"\ntool = "read_file"\nmode = "ask"',
    )
    assert asks != BASE
    candidate = Replay(grants(asks))
    flips = list(candidate.run(calls))
    assert [(f.recorded.seq, f.recorded.body.verdict, f.now) for f in flips] == [
        (1, VerdictCode.RUN, Outcome(VerdictCode.ASK, None, "read-notes", None))
    ]
    assert (candidate.replayed, candidate.unchanged, candidate.flips) == (6, 5, 1)


def test_a_grant_expired_now_but_valid_then_decides_as_it_did_then() -> None:
    candidate = grants(g("read", "read_file", "auto", expires="2026-06-01T12:00:00Z"))
    before = NOW - dt.timedelta(milliseconds=1)
    calls = [
        decided(1, "read_file", {"path": "a"}, candidate, at=before),  # run: valid then
        decided(2, "read_file", {"path": "a"}, candidate, at=NOW),  # no_grant: expired
    ]
    assert [c.body.verdict for c in calls] == [VerdictCode.RUN, VerdictCode.DENY]
    replay = Replay(candidate)
    assert list(replay.run(calls)) == []
    # Recorded as run at NOW (as if the grant had not expired): the cache must not carry
    # the answer of the earlier epoch over the boundary.
    ran_at_now = attrs.evolve(calls[0], seq=3, at=NOW.isoformat())
    flip = replay.replay(ran_at_now)
    assert flip is not None
    assert flip.now == Outcome(
        VerdictCode.DENY, Reason.NO_GRANT, None, "no grant allows read_file on a"
    )


def test_decisions_not_made_by_grants_are_skipped_and_counted_by_reason() -> None:
    candidate = grants(g("read", "read_file", "auto"))
    calls = [
        denied_early(1, Reason.BAD_ARGUMENTS, {"path": "../x"}),
        denied_early(2, Reason.TOO_MANY_PENDING, {"path": "a"}),
        denied_early(3, Reason.TOO_MANY_PENDING, {"path": "b"}),
        denied_early(4, Reason.GRANTS_INVALID, {"path": "a"}),
        denied_early(5, Reason.STATE_UNREADABLE, {"path": "a"}),
        denied_early(6, Reason.NOT_FOUND, {"path": "a/b"}),
        denied_early(7, Reason.NO_GRANT, {"path": "a"}),  # made by grants: replayed
    ]
    replay = Replay(candidate)
    flips = list(replay.run(calls))
    assert [f.recorded.seq for f in flips] == [7]
    assert replay.not_by_grants == {
        "bad_arguments": 1,
        "too_many_pending": 2,
        "grants_invalid": 1,
        "state_unreadable": 1,
        "not_found": 1,
    }
    assert (replay.replayed, replay.unreplayable) == (1, 0)


def test_arguments_that_no_longer_check_are_unreplayable() -> None:
    replay = Replay(grants(g("read", "read_file", "auto")))
    calls = [
        denied_early(1, Reason.NO_GRANT, {"path": "../x"}),
        denied_early(2, Reason.NO_GRANT, {"path": True}),
        denied_early(3, Reason.NO_GRANT, {"path": ["a"]}),  # unhashable: no cache key
        denied_early(4, Reason.NO_GRANT, {"path": "a", "max_bytes": True}),
        denied_early(5, Reason.NO_GRANT, {"path": "a", "max_bytes": 1}),
    ]
    assert [f.recorded.seq for f in replay.run(calls)] == [5]
    assert (replay.unreplayable, replay.replayed) == (4, 1)


def test_a_bool_never_shares_a_cache_entry_with_an_int() -> None:
    replay = Replay(grants(g("read", "read_file", "auto")))
    valid = denied_early(1, Reason.NO_GRANT, {"path": "a", "max_bytes": 1})
    forged = denied_early(2, Reason.NO_GRANT, {"path": "a", "max_bytes": True})
    assert replay.replay(valid) is not None
    assert replay.replay(forged) is None  # checked afresh: a bool is not an integer
    assert replay.unreplayable == 1


def test_write_file_content_is_keyed_only_as_fitting() -> None:
    candidate = grants(g("out", "write_file", "auto", paths='["out/**"]'))
    replay = Replay(candidate)
    small = decided(1, "write_file", {"path": "out/a", "content": "x"}, GrantSet())
    other = decided(2, "write_file", {"path": "out/a", "content": "y" * 1000}, GrantSet())
    # Past a quarter of the cap in characters, content is checked afresh: this one is
    # over the cap in UTF-8 bytes (a ledger edited by hand) and must not pass as fitting.
    huge = attrs.evolve(
        small,
        seq=3,
        body=attrs.evolve(small.body, arguments={"path": "out/a", "content": "é" * (600 * 1024)}),
    )
    flips = list(replay.run([small, other, huge]))
    assert [f.recorded.seq for f in flips] == [1, 2]
    assert (replay.replayed, replay.unreplayable) == (2, 1)


def test_never_matched_and_never_deciding_grants_in_file_order() -> None:
    candidate = grants(
        g("nothing", "shell", "auto", commands='["make *"]')
        + g("read-any", "read_file", "auto")
        + g("read-notes", "read_file", "auto", paths='["notes/**"]')  # shadowed
        + g("old", "read_file", "auto", paths='["old/**"]', expires="2026-01-01T00:00:00Z")
        + g("web", "http_get", "auto", hosts='["a.org"]')
    )
    calls = [
        decided(1, "read_file", {"path": "notes/a"}, GrantSet()),
        decided(2, "read_file", {"path": "old/a"}, GrantSet()),  # old had expired
        decided(3, "shell", {"command": "ls"}, GrantSet()),
    ]
    replay = Replay(candidate)
    list(replay.run(calls))
    assert [x.id for x in replay.never_matched()] == ["nothing", "old", "web"]
    assert [x.id for x in replay.never_deciding()] == ["read-notes"]


def test_the_caches_stay_bounded(monkeypatch: Any) -> None:
    monkeypatch.setattr("boxmaker.core.replay.CACHE_ENTRIES", 4)
    replay = Replay(grants(g("read", "read_file", "ask")))
    calls = [
        decided(n, "read_file", {"path": f"p{n % 9}"}, GrantSet(), state)
        for n in range(60)
        for state in (FRESH, SECRET)
    ]
    assert len(list(replay.run(calls))) == 120
    assert len(replay._outcomes) <= 4
    assert len(replay._calls) <= 4
    assert CACHE_ENTRIES == 65536


# --- the property: replay equals deciding afresh ------------------------------------------

NOWS = [
    NOW - dt.timedelta(days=1),
    NOW - dt.timedelta(microseconds=1),
    NOW,
    NOW + dt.timedelta(microseconds=1),
    NOW + dt.timedelta(days=1),
]
EXPIRES = [
    None,
    None,
    "2026-06-01T12:00:00Z",
    "2026-06-01T12:00:00.000001Z",
    "2026-06-02T00:00:00Z",
]
GLOBS = ['["notes/**"]', '["*.txt"]', '["**/.env"]', '["out/**", "notes/*"]']
COMMANDS = ['["git status*"]', '["ls", "make *"]', '["*"]']
HOSTS = ['["a.org"]', '["*.a.org", "b.net"]']
REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("read_file", {"path": "notes.txt"}),
    ("read_file", {"path": "notes/a.txt"}),
    ("read_file", {"path": "a/.env"}),
    ("read_file", {"path": "notes/a.txt", "max_bytes": 10}),
    ("list_dir", {"path": "notes"}),
    ("write_file", {"path": "out/x", "content": "one"}),
    ("write_file", {"path": "out/x", "content": "two"}),
    ("write_file", {"path": "notes/y", "content": "one"}),
    ("shell", {"command": "git status"}),
    ("shell", {"command": "git status; rm x"}),
    ("shell", {"command": "make test"}),
    ("http_get", {"url": "https://a.org/x"}),
    ("http_get", {"url": "https://x.a.org/"}),
    ("http_get", {"url": "http://b.net/"}),
]
STATES = [Label(taint, untrusted) for taint in Taint for untrusted in (False, True)]
SKIPPED = [Reason.BAD_ARGUMENTS, Reason.TOO_MANY_PENDING, Reason.STATE_UNREADABLE]


@st.composite
def grant_files(draw: st.DrawFn) -> GrantSet:
    tables = []
    for index in range(draw(st.integers(min_value=0, max_value=7))):
        tool = draw(st.sampled_from(["read_file", "list_dir", "write_file", "shell", "http_get"]))
        extra: dict[str, str] = {}
        if tool in ("read_file", "list_dir", "write_file") and draw(st.booleans()):
            extra["paths"] = draw(st.sampled_from(GLOBS))
        if tool == "shell" and draw(st.booleans()):
            extra["commands"] = draw(st.sampled_from(COMMANDS))
        if tool == "http_get":
            extra["hosts"] = draw(st.sampled_from(HOSTS))
        if draw(st.booleans()):
            extra["max_taint"] = f'"{draw(st.sampled_from(list(Taint)))}"'
        if draw(st.booleans()):
            extra["if_untrusted"] = f'"{draw(st.sampled_from(["auto", "ask", "deny"]))}"'
        expires = draw(st.sampled_from(EXPIRES))
        if expires is not None:
            extra["expires"] = expires
        mode = draw(st.sampled_from(["auto", "ask", "deny"]))
        tables.append(g(f"g{index}", tool, mode, **extra))
    return grants("".join(tables))


@st.composite
def ledgers(draw: st.DrawFn) -> tuple[GrantSet, list[RecordedDecision]]:
    """Decisions as brokerd records them, by grants of their own (any), with a few
    denied before the grants; arguments, states and times repeat, so the caches hit."""
    then = draw(grant_files())
    recorded = []
    for seq in range(draw(st.integers(min_value=0, max_value=40))):
        tool, arguments = draw(st.sampled_from(REQUESTS))
        state, at = draw(st.sampled_from(STATES)), draw(st.sampled_from(NOWS))
        session = draw(st.sampled_from([SESSION, "s-000000000002"]))
        one = decided(seq, tool, arguments, then, state, at, session)
        if draw(st.integers(min_value=0, max_value=9)) == 0:
            reason = draw(st.sampled_from(SKIPPED))
            body = attrs.evolve(one.body, verdict=VerdictCode.DENY, reason=reason)
            one = attrs.evolve(one, body=body)
        recorded.append(one)
    return then, recorded


@given(ledgers(), grant_files())
def test_replay_equals_deciding_each_recorded_call_afresh(
    ledger: tuple[GrantSet, list[RecordedDecision]], candidate: GrantSet
) -> None:
    _, recorded = ledger
    replay = Replay(candidate)
    flips = {f.recorded.seq: f.now for f in replay.run(recorded)}
    expected: dict[int, Outcome] = {}
    matched: set[str] = set()
    deciding: set[str] = set()
    replayed = 0
    for one in recorded:
        body, at = one.body, record_time(one.at)
        if body.reason in SKIPPED:
            continue
        replayed += 1
        args = checked(body.tool, dict(body.arguments))
        state = Label(body.taint, body.untrusted)
        fresh = decide(CheckedRequest(body.call, body.session, args), candidate, state, at)
        now = fresh.decision
        if now.grant is not None:
            deciding.add(now.grant)
        matched |= {x.id for x in candidate.grants if x.matches(body.tool, args, at)}
        if now.verdict != body.verdict:
            expected[one.seq] = Outcome(now.verdict, now.reason, now.grant, now.detail)
    assert flips == expected
    assert (replay.replayed, replay.flips, replay.unchanged) == (
        replayed,
        len(expected),
        replayed - len(expected),
    )
    assert sum(replay.not_by_grants.values()) == len(recorded) - replayed
    assert {x.id for x in replay.never_matched()} == {x.id for x in candidate.grants} - matched
    assert {x.id for x in replay.never_deciding()} == matched - deciding


@given(ledgers())
def test_replay_with_the_grants_that_decided_finds_no_flip(
    ledger: tuple[GrantSet, list[RecordedDecision]],
) -> None:
    then, recorded = ledger
    replay = Replay(then)
    assert list(replay.run(recorded)) == []
    assert replay.unchanged == replay.replayed


# --- the caches: what is reused, and what is never shared ---------------------------------


class Counted:
    """How often replay checks arguments and decides (the costs its caches save)."""

    def __init__(self, monkeypatch: Any) -> None:
        self.checks = 0
        self.decides = 0

        def check_arguments(tool: str, arguments: Any) -> Any:
            self.checks += 1
            return catalogue.check_arguments(tool, arguments)

        def counted_decide(*args: Any) -> Any:
            self.decides += 1
            return decide(*args)

        monkeypatch.setattr("boxmaker.core.replay.check_arguments", check_arguments)
        monkeypatch.setattr("boxmaker.core.replay.decide", counted_decide)


def test_a_repeated_call_in_the_same_state_and_epoch_is_neither_checked_nor_decided_again(
    monkeypatch: Any,
) -> None:
    counted = Counted(monkeypatch)
    replay = Replay(grants(BASE))
    first = decided(1, "read_file", {"path": "notes/a.txt", "max_bytes": 10}, GrantSet())
    again = attrs.evolve(
        first,
        seq=2,
        body=attrs.evolve(first.body, call="c-0000000000000002", session="s-000000000002"),
    )
    assert [f.recorded.seq for f in replay.run([first, again])] == [1, 2]
    assert (counted.checks, counted.decides) == (1, 1)
    # Another state: decided again (on the one grant that decides it), not checked again.
    untrusted = attrs.evolve(
        first,
        seq=3,
        body=attrs.evolve(first.body, taint=UNTRUSTED.taint, untrusted=UNTRUSTED.untrusted),
    )
    flip = replay.replay(untrusted)
    assert flip is not None
    assert flip.now == Outcome(
        VerdictCode.ASK,
        None,
        "read-notes",
        "the session is untrusted and grant read-notes says if_untrusted = ask",
    )
    assert (counted.checks, counted.decides) == (1, 2)


def test_write_file_content_up_to_a_quarter_of_the_cap_shares_one_cache_entry(
    monkeypatch: Any,
) -> None:
    counted = Counted(monkeypatch)
    replay = Replay(grants(g("out", "write_file", "auto", paths='["out/**"]')))
    writes = [
        decided(n, "write_file", {"path": "out/a", "content": content}, GrantSet())
        for n, content in enumerate(["x", "y" * 1000, "z" * (MAX_BYTES // 4)])
    ]
    assert [f.now.verdict for f in replay.run(writes)] == [VerdictCode.RUN] * 3
    assert (counted.checks, counted.decides) == (1, 1)


def test_longer_write_file_content_is_checked_and_decided_afresh_every_time(
    monkeypatch: Any,
) -> None:
    counted = Counted(monkeypatch)
    candidate = grants(
        g("out", "write_file", "auto", paths='["out/**"]', expires="2026-06-01T12:00:00Z")
    )
    replay = Replay(candidate)
    content = "x" * (MAX_BYTES // 4 + 1)  # fits the cap in bytes: it checks
    before = NOW - dt.timedelta(seconds=1)
    writes = [
        decided(1, "write_file", {"path": "out/a", "content": content}, GrantSet(), at=before),
        decided(2, "write_file", {"path": "notes/a", "content": content}, GrantSet(), at=before),
        decided(3, "write_file", {"path": "out/a", "content": content}, GrantSet(), at=before),
        decided(4, "write_file", {"path": "out/a", "content": content}, GrantSet(), at=NOW),
    ]
    flips = {f.recorded.seq: f.now for f in replay.run(writes)}
    assert flips == {
        1: Outcome(VerdictCode.RUN, None, "out", None),
        3: Outcome(VerdictCode.RUN, None, "out", None),
    }
    assert (replay.replayed, replay.unchanged, replay.unreplayable) == (4, 2, 0)
    assert (counted.checks, counted.decides) == (4, 4)
    assert replay.matched == {"out"}


def test_the_same_arguments_for_another_tool_never_share_a_cache_entry() -> None:
    replay = Replay(grants(g("list", "list_dir", "auto") + g("read", "read_file", "ask")))
    read = decided(1, "read_file", {"path": "notes"}, GrantSet())
    listed = decided(2, "list_dir", {"path": "notes"}, GrantSet())
    flips = {f.recorded.seq: f.now for f in replay.run([read, listed, read, listed])}
    assert flips == {
        1: Outcome(VerdictCode.ASK, None, "read", None),
        2: Outcome(VerdictCode.RUN, None, "list", None),
    }
    assert replay.flips == 4


def test_recorded_external_calls_are_replayed_against_family_grants() -> None:
    # bxctl has no gateway: a recorded mcp.* call is decided as if its tool were accepted.
    then = grants(g("all-mcp", "mcp.*", "auto") + g("bash", "claude.Bash", "ask"))
    log = Decision(
        "c-0000000000000001",
        SESSION,
        "mcp.git.git_log",
        {"repo_path": "/w"},
        VerdictCode.RUN,
        None,
        "all-mcp",
        FRESH.taint,
        FRESH.untrusted,
        BOOT,
        "ab" * 32,
    )
    calls = [
        Record(1, NOW.isoformat(), PREV, log),
        decided(2, "claude.Bash", {"command": "ls"}, then),
    ]
    assert [d.body.grant for d in calls] == ["all-mcp", "bash"]
    same = Replay(then)
    assert list(same.run(calls)) == []
    assert (same.replayed, same.unchanged) == (2, 2)
    candidate = Replay(grants(g("no-git", "mcp.git.*", "deny") + g("all-mcp", "mcp.*", "auto")))
    flips = list(candidate.run(calls))
    assert [(f.recorded.seq, f.now) for f in flips] == [
        (
            1,
            Outcome(
                VerdictCode.DENY,
                Reason.DENIED_BY_GRANT,
                "no-git",
                'grant no-git denies mcp.git.git_log on {"repo_path":"/w"}',
            ),
        ),
        (
            2,
            Outcome(
                VerdictCode.DENY,
                Reason.NO_GRANT,
                None,
                'no grant allows claude.Bash on {"command":"ls"}',
            ),
        ),
    ]
