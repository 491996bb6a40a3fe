"""What-if against the broker's own decisions: hypothesis generates calls, the real
brokerd decides them in process (autojump clock, the real ledger), and ``bxctl grants
what-if`` replays that ledger:

- with the grants.toml brokerd used, no verdict changes (replay equals brokerd deciding
  each request afresh);
- with one grant's mode changed from auto to ask, exactly the calls that grant let run
  flip, each run → ask under the same grant;
- a candidate grant that matches none of the calls is named as never matching.

The tools do not really run (a stand-in executor answers ok with the label the real one
would give), so the sessions' taint and trust still rise as they would: a read of a
secret file, a fetch, raise them, and later calls are decided on that.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from typing import Any, Final

import orjson
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tests.harness.broker import PENDING_TIMEOUT, call, inline, records, running, tool_request
from tests.harness.homes import grant, short_home, write_config, write_grants, write_state

from boxmaker.broker.run_spec import RunResult, RunSpec
from boxmaker.cli.common import Common
from boxmaker.cli.what_if import what_if
from boxmaker.home.paths import Home
from boxmaker.runtime.threads import ToThread

pytestmark = pytest.mark.slow

SESSIONS: Final = ("s-00000000000a", "s-00000000000b", "s-00000000000c")
STATES: Final = [("public", False), ("internal", False), ("secret", False), ("public", True)]
REQUESTS: Final[list[tuple[str, dict[str, Any]]]] = [
    ("read_file", {"path": "notes/a.txt"}),
    ("read_file", {"path": "notes/b.txt"}),
    ("read_file", {"path": "notes/.env"}),  # the deny grant, before read-notes
    ("read_file", {"path": "docs/x.md"}),  # ask, up to taint internal
    ("read_file", {"path": ".env"}),  # no grant
    ("read_file", {"path": "../outside"}),  # bad_arguments: not the grants' doing
    ("list_dir", {"path": "notes"}),
    ("write_file", {"path": "out/a.txt", "content": "x"}),  # ask
    ("write_file", {"path": "out/none/a.txt", "content": "x"}),  # ask, then not_found
    ("shell", {"command": "git status"}),  # auto, denied when untrusted
    ("shell", {"command": "git status; rm -rf x"}),
    ("shell", {"command": "ls"}),
    ("http_get", {"url": "https://a.org/"}),  # auto: the session becomes untrusted
    ("http_get", {"url": "https://b.org/"}),
]
NOTES_AUTO: Final = grant("read-notes", "read_file", "auto", paths=["notes/**"])
OTHERS: Final = (
    grant("no-env", "read_file", "deny", paths=["**/.env"])
    + grant("read-docs", "read_file", "ask", paths=["docs/**"], max_taint="internal")
    + grant("list", "list_dir", "auto")
    + grant("write-out", "write_file", "ask", paths=["out/**"])
    + grant("git", "shell", "auto", commands=["git status*"], if_untrusted="deny")
    + grant("web", "http_get", "auto", hosts=["a.org"])
)
GRANTS: Final = NOTES_AUTO + OTHERS
NOTES_ASK: Final = grant("read-notes", "read_file", "ask", paths=["notes/**"])
NEVER: Final = grant("never", "read_file", "auto", paths=["never/**"])


async def stand_in_execute(
    spec: RunSpec, sandboxes: object = None, *, to_thread: ToThread = inline
) -> RunResult:
    """Ran, ok, with the label the real run gives (the session's state rises by it)."""
    return RunResult(ok=True, reason=None, detail=None, content="ok", label=spec.label)


@contextlib.contextmanager
def broker_home(states: list[tuple[str, bool]]) -> Iterator[Home]:
    with short_home("bx-whatif-") as home:
        write_config(home, f"[broker]\npending_timeout = {PENDING_TIMEOUT}\n")
        write_grants(home, GRANTS)
        (home.default_workspace / "out").mkdir()
        for session, (taint, untrusted) in zip(SESSIONS, states, strict=True):
            write_state(home, session, taint, untrusted)
        yield home


async def decide_all(home: Home, calls: list[tuple[int, int]]) -> None:
    """Each call through broker.sock, one after the other, to its end (an ask waits for
    the owner until it expires: virtual time)."""
    async with running(home, to_thread=inline, execute=stand_in_execute):
        for session, request in calls:
            tool, arguments = REQUESTS[request]
            await call(home, tool_request(tool, arguments, session=SESSIONS[session]))


def replay(home: Home, candidate_text: str) -> dict[str, Any]:
    candidate = home.root / "candidate.toml"
    candidate.write_text(candidate_text)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = what_if(candidate, limit=0, common=Common(home=str(home.root), json=True))
    assert code == 0, out.getvalue()
    return dict(orjson.loads(out.getvalue()))


def flipped(answer: dict[str, Any]) -> list[tuple[str | None, str | None, str, str, str]]:
    return sorted(
        (group["then"], group["now"], c["call"], c["then"]["verdict"], c["now"]["verdict"])
        for group in answer["groups"]
        for c in group["calls"]
    )


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    states=st.lists(st.sampled_from(STATES), min_size=3, max_size=3),
    calls=st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=len(SESSIONS) - 1),
            st.integers(min_value=0, max_value=len(REQUESTS) - 1),
        ),
        min_size=1,
        max_size=12,
    ),
)
@example(
    # Every kind of decision at least once: runs on read-notes trusted and asks on it
    # untrusted (after a fetch), taint_exceeded (a secret session on read-docs), an
    # untrusted denial (git after the fetch), a deny grant, no grant, bad_arguments, and
    # a write_file ask denied not_found.
    states=[("public", False), ("secret", False), ("public", True)],
    calls=[
        (0, 0),
        (0, 12),
        (0, 1),
        (0, 9),
        (1, 3),
        (1, 0),
        (2, 0),
        (2, 2),
        (2, 4),
        (0, 5),
        (1, 8),
        (1, 7),
    ],
)
def test_what_if_on_the_brokers_own_ledger(
    states: list[tuple[str, bool]], calls: list[tuple[int, int]]
) -> None:
    with broker_home(states) as home:
        trio.run(decide_all, home, calls, clock=trio.testing.MockClock(autojump_threshold=0))
        decisions = [r for r in records(home) if r["kind"] == "decision"]
        assert len(decisions) == len(calls)
        by_grants = [
            d
            for d in decisions
            if d["reason"] in (None, "no_grant", "denied_by_grant", "taint_exceeded", "untrusted")
        ]

        same = replay(home, GRANTS)
        assert (same["replayed"], same["changed"], same["groups"]) == (len(by_grants), 0, [])
        skipped = sum(same["skipped"]["not_by_grants"].values())
        assert skipped == len(decisions) - len(by_grants)

        ask = replay(home, NOTES_ASK + OTHERS + NEVER)
        ran_on_notes = [
            ("read-notes", "read-notes", d["call"], "run", "ask")
            for d in by_grants
            if d["grant"] == "read-notes" and d["verdict"] == "run"
        ]
        assert flipped(ask) == sorted(ran_on_notes)
        assert {"id": "never", "tool": "read_file", "mode": "auto"} in ask["never_matched"]
        never = {g["id"] for g in ask["never_matched"]}
        for recorded in by_grants:
            assert recorded["grant"] not in never  # it covered that call, then and now
