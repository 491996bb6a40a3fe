"""admin.sock (docs/protocol.md): several requests per connection, timeouts, every answer
kind and error code, against the real daemon in process."""

from __future__ import annotations

import contextlib

import pytest
import trio
import trio.testing
from tests.harness.broker import SESSION, Brokerd, Client, admin, call, records, tool_request
from tests.harness.homes import grant, write_grants, write_state
from tests.harness.sandbox import AS_ROOT

from boxmaker import __version__
from boxmaker.broker.cgroup_plan import NoCgroups
from boxmaker.broker.state import Broker
from boxmaker.core.approvals import GrantRef, PendingEntry
from boxmaker.core.labels import Taint
from boxmaker.formats.clock import utc_now
from boxmaker.formats.convert import new_call_id
from boxmaker.home.paths import Home
from boxmaker.ledger.records import format_head, line_hash
from boxmaker.runtime.ndjson import MAX_FRAME

pytestmark = pytest.mark.usefixtures("inline_threads")

Clock = trio.testing.MockClock


async def test_status_reports_the_boot_head_and_counts(
    home: Home, broker: Broker, autojump_clock: Clock
) -> None:
    await trio.sleep(3)
    status = await admin(home, {"kind": "status"})
    last = home.audit_log.read_bytes().splitlines()[-1]
    assert status == {
        "kind": "status",
        "version": __version__,
        "boot": broker.boot,
        "head": format_head(2, line_hash(last)),  # genesis, start, the boot's policy
        "ledger_usable": True,
        "grants_valid": True,
        "grants_problem": None,
        "pending": 0,
        "sessions": 0,
        "uptime_s": pytest.approx(3.0),
        "sandbox_bounds": broker.sandboxes.bounds.describe(),
        # As root, the home's own workspace is root's: the shell cannot run there
        # (tests/broker/test_shell_before_asking.py has the cases).
        "shell_ready": not AS_ROOT,
        "shell_problem": (
            f"brokerd runs as root and the workspace {home.default_workspace} belongs to "
            "root; the sandbox never runs as host root (uid 0): set [runner] sandbox_uid "
            "to an ordinary uid that owns the workspace (or run brokerd as an ordinary "
            "user); see docs/runbook.md#sandbox-as-root"
            if AS_ROOT
            else None
        ),
        "witness_lagging": None,
    }
    await call(home, tool_request("read_file", {"path": "x"}))
    assert (await admin(home, {"kind": "status"}))["sessions"] == 1


async def test_status_shows_a_grants_problem(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    write_grants(home, grant("a", "read_file", "auto") + grant("a", "read_file", "ask"))
    await brokerd.start()
    status = await admin(home, {"kind": "status"})
    await brokerd.stop()
    assert status["grants_valid"] is False
    assert "grants.toml" in status["grants_problem"]
    assert "'a'" in status["grants_problem"]


async def test_status_says_what_bounds_the_sandbox(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    # Where no cgroup can be had, the owner is told why and what still holds.
    await brokerd.start(cgroups=lambda boot: NoCgroups("no cgroup file system is mounted"))
    status = await admin(home, {"kind": "status"})
    assert status["sandbox_bounds"] == (
        "none: no cgroup file system is mounted; only the per-process limits (ulimit) "
        "hold, not a total of memory or processes; see docs/runbook.md#sandbox-limits"
    )


async def test_sessions_lists_sessions_seen_with_their_state(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    other = "s-0000000000b2"
    write_grants(home, grant("r", "read_file", "auto"))
    (home.default_workspace / "n.txt").write_text("x")
    write_state(home, other, "public", True)
    await brokerd.start()
    assert (await admin(home, {"kind": "sessions"})) == {"kind": "sessions", "sessions": []}
    await call(home, tool_request("read_file", {"path": "n.txt"}))
    await call(home, tool_request("read_file", {"path": "n.txt"}))
    await call(home, tool_request("read_file", {"path": "nope"}, session=other))
    home.session_state(other).write_bytes(b"garbage")
    sessions = await admin(home, {"kind": "sessions"})
    await brokerd.stop()
    assert sessions == {
        "kind": "sessions",
        "sessions": [
            {"session": SESSION, "taint": "internal", "untrusted": False, "calls": 2},
            # unreadable: shown as records carry it (secret, untrusted)
            {"session": other, "taint": "secret", "untrusted": True, "calls": 1},
        ],
    }


async def test_several_requests_on_one_connection_and_bad_lines_answered(
    home: Home, broker: Broker, autojump_clock: Clock
) -> None:
    client = await Client.open(home.admin_sock)
    assert (await client.ask({"kind": "approvals"})) == {"kind": "approvals", "entries": []}
    await client.send(b"this is not json\n")
    assert await client.receive() == {
        "kind": "error",
        "code": "bad_frame",
        "detail": "not valid JSON (or not UTF-8)",
    }
    # A broker.sock kind here is simply a bad frame: admin.sock has no other code.
    bad = await client.ask({"kind": "catalogue", "v": 1})
    assert (bad["kind"], bad["code"]) == ("error", "bad_frame")
    blank = await client.ask({"kind": "refuse", "approval": "a-00000000", "reason": " "})
    assert (blank["code"], blank["detail"]) == (
        "bad_frame",
        "reason: expected 1 to 500 characters",
    )
    missing = await client.ask({"kind": "approve", "approval": "a-00000000"})
    assert missing == {
        "kind": "error",
        "code": "no_such_approval",
        "detail": "no pending approval a-00000000",
    }
    refuse = await client.ask({"kind": "refuse", "approval": "a-0000000f", "reason": "x"})
    assert refuse["code"] == "no_such_approval"
    assert (await client.ask({"kind": "status"}))["kind"] == "status"
    await client.aclose()


async def test_first_request_within_5_s_later_ones_within_60_s(
    home: Home, broker: Broker, autojump_clock: Clock
) -> None:
    silent = await Client.open(home.admin_sock)
    opened = trio.current_time()
    assert await silent.at_eof()
    assert trio.current_time() - opened == pytest.approx(5.0)
    await silent.aclose()

    client = await Client.open(home.admin_sock)
    await trio.sleep(4.9)
    assert (await client.ask({"kind": "status"}))["kind"] == "status"
    await trio.sleep(59.9)
    assert (await client.ask({"kind": "status"}))["kind"] == "status"
    answered = trio.current_time()
    assert await client.at_eof()
    assert trio.current_time() - answered == pytest.approx(60.0)
    await client.aclose()


async def test_an_oversized_admin_frame_is_answered_and_closed(
    home: Home, broker: Broker, autojump_clock: Clock
) -> None:
    client = await Client.open(home.admin_sock)

    async def flood() -> None:
        with contextlib.suppress(trio.BrokenResourceError):
            await client.send(b"{" * (MAX_FRAME + 1) + b"\n")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(flood)
        answer = await client.receive()
    assert answer is not None
    assert (answer["kind"], answer["code"]) == ("error", "bad_frame")
    await client.aclose()
    assert (await admin(home, {"kind": "status"}))["kind"] == "status"


async def test_admin_refuses_a_peer_that_is_not_the_owner(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    await brokerd.start(owner_uid=4242)
    answer = await admin(home, {"kind": "status"})
    await brokerd.stop()
    assert answer["kind"] == "error"
    assert answer["code"] == "peer_refused"


@pytest.mark.parametrize("first", ["approve", "refuse"])
async def test_two_owners_answering_one_approval_at_once_one_wins(
    home: Home, brokerd: Brokerd, autojump_clock: Clock, first: str
) -> None:
    """approve and refuse of the same approval, on two admin connections, sent together:
    exactly one is taken, the other hears no_such_approval, and the call and the ledger
    follow the one taken."""
    write_grants(home, grant("notes", "read_file", "ask"))
    (home.default_workspace / "notes.txt").write_text("hello\n")
    await brokerd.start()
    frame = tool_request("read_file", {"path": "notes.txt"})
    requester = await Client.open(home.broker_sock)
    await requester.send(frame)
    pending = await requester.final()
    assert pending["kind"] == "pending", pending
    a = pending["approval"]
    frames = {
        "approve": {"kind": "approve", "approval": a},
        "refuse": {"kind": "refuse", "approval": a, "reason": "no"},
    }
    owners = {kind: await Client.open(home.admin_sock) for kind in frames}
    order = [first, *(kind for kind in frames if kind != first)]
    for kind in order:  # both are in brokerd's sockets before it reads either
        await owners[kind].send(frames[kind])
    answers = {}

    async def hear(kind: str) -> None:
        answers[kind] = await owners[kind].final()

    async with trio.open_nursery() as nursery:
        for kind in order:
            nursery.start_soon(hear, kind)
    lost = {"kind": "error", "code": "no_such_approval", "detail": f"no pending approval {a}"}
    winners = [kind for kind, answer in answers.items() if answer != lost]
    assert len(winners) == 1, answers
    [winner] = winners
    loser = "refuse" if winner == "approve" else "approve"
    assert answers[loser] == lost
    final = await requester.final()
    if winner == "approve":
        assert answers[winner] == {
            "kind": "approved",
            "outcome": "ask",
            "call": frame["call"],
            "reason": None,
            "detail": None,
            "tool": "read_file",
            "ran": {"outcome": "ok", "reason": None, "detail": None},
        }
        assert (final["outcome"], final["content"]) == ("ok", "hello\n")
    else:
        assert answers[winner] == {"kind": "refused", "call": frame["call"]}
        assert (final["outcome"], final["reason"]) == ("denied", "refused")
    for owner in owners.values():
        await owner.aclose()
    await requester.aclose()
    await brokerd.stop()
    approvals = [r for r in records(home) if r["kind"] == "approval"]
    assert [(r["call"], r["approval"]) for r in approvals] == [(frame["call"], a)]
    assert approvals[0]["outcome"] == ("ask" if winner == "approve" else "refused")


async def test_an_entry_at_its_deadline_is_neither_listed_nor_counted(
    home: Home, broker: Broker, autojump_clock: Clock
) -> None:
    """At ``now >= expires_at`` an entry has expired even while it is still in the table
    (its own task has not taken it yet): ``approvals`` never lists it as waiting and
    ``status`` never counts it. The entry a millisecond younger is the control."""

    def entry(approval: str, timeout: float) -> PendingEntry:
        return PendingEntry.create(
            approval=approval,
            call=new_call_id(),
            session=SESSION,
            tool="read_file",
            arguments={"path": "notes.txt"},
            grant=GrantRef(id="notes", mode="ask"),
            taint=Taint.PUBLIC,
            untrusted=False,
            requested_at=utc_now(),
            now=trio.current_time(),
            timeout=timeout,
        )

    due, younger = entry("a-0000000d", 5.0), entry("a-0000000e", 5.001)
    for each in (due, younger):
        # No task waits on these: only the table holds them.
        assert broker.pending.add(each)
    await trio.sleep(5.0)
    assert trio.current_time() == due.deadline
    listed = (await admin(home, {"kind": "approvals"}))["entries"]
    status = await admin(home, {"kind": "status"})
    for each in (due, younger):
        broker.pending.forget(each.approval)
    assert [shown["approval"] for shown in listed] == ["a-0000000e"]
    assert status["pending"] == 1
