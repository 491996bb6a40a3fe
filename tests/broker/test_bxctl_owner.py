"""bxctl's owner commands against the real brokerd in process (docs/protocol.md):
approvals, approve, refuse, status, sessions, and exit 3 when brokerd is down."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import orjson
import pytest
import trio
import trio.testing
from tests.harness.broker import SESSION, Brokerd, Client, tool_request
from tests.harness.cli import bxctl_in_process
from tests.harness.homes import grant, write_grants
from tests.harness.screen import bxctl_argv, terminal

from boxmaker.cli.watch import LOST, NONE_PENDING, REGAINED
from boxmaker.home.paths import Home

pytestmark = pytest.mark.usefixtures("inline_threads")

Clock = trio.testing.MockClock


async def pending_call(home: Home) -> tuple[Client, dict[str, Any]]:
    """A read_file call waiting for the owner; its client connection stays open."""
    client = await Client.open(home.broker_sock)
    frame = await client.ask(tool_request("read_file", {"path": "notes.txt"}))
    assert frame["kind"] == "pending", frame
    return client, frame


@pytest.fixture
async def asking_home(home: Home, brokerd: Brokerd) -> Home:
    """brokerd running on a home where reading notes.txt asks the owner."""
    (home.default_workspace / "notes.txt").write_text("hello\n")
    write_grants(home, grant("read-notes", "read_file", "ask", note="the owner's notes"))
    await brokerd.start()
    return home


async def test_approvals_shows_the_block_and_approve_runs_the_call(
    asking_home: Home, autojump_clock: Clock, capsys: pytest.CaptureFixture[str]
) -> None:
    home = asking_home
    assert await bxctl_in_process(home, "approvals") == 0
    assert capsys.readouterr().out.strip() == "no pending approvals"

    client, pending = await pending_call(home)
    assert await bxctl_in_process(home, "approvals") == 0
    block = capsys.readouterr().out
    approval = pending["approval"]
    assert block.startswith(f"{approval}  read_file  expires ")
    # The local time, and how long is left (the test home's pending_timeout is 30 s).
    assert re.fullmatch(
        rf"{approval}  read_file  expires \d\d:\d\d:\d\d \(in (29s|30s)\)",
        block.splitlines()[0],
    )
    assert re.search(r"asked \d\d:\d\d:\d\d \((now|1s ago)\)", block)
    assert '"path":"notes.txt"' in block
    assert "read-notes (mode ask): the owner's notes" in block
    assert f"{SESSION}: taint public, trusted" in block
    assert f"bxctl approve {approval}" in block

    assert await bxctl_in_process(home, "approvals", "--json") == 0
    [entry] = orjson.loads(capsys.readouterr().out)
    assert (entry["approval"], entry["call"]) == (approval, pending["call"])
    assert entry["grant"] == {
        "id": "read-notes",
        "mode": "ask",
        "note": "the owner's notes",
    }

    # The id as printed, or without its prefix.
    assert await bxctl_in_process(home, "approve", approval.removeprefix("a-")) == 0
    assert capsys.readouterr().out.strip() == f"approved {pending['call']}: read_file ran (ok)"
    answer = await client.final()
    assert (answer["outcome"], answer["content"]) == ("ok", "hello\n")
    await client.aclose()


async def test_why_of_a_waiting_call_says_how_to_answer_it(
    asking_home: Home, autojump_clock: Clock, capsys: pytest.CaptureFixture[str]
) -> None:
    home = asking_home
    client, pending = await pending_call(home)
    assert await bxctl_in_process(home, "why", pending["call"]) == 0
    lines = capsys.readouterr().out.splitlines()
    approval = pending["approval"]
    kept = hashlib.sha256(home.grants_toml.read_bytes()).hexdigest()
    assert lines[2:] == [
        '  grant read-notes (in grants.toml now: mode ask, note "the owner\'s notes")',
        # Its text as the grants in force had it (genesis, start, then their policy).
        f"    grant read-notes as it was then (grants.toml {kept[:12]}…, policy seq 2):",
        "      [[grant]]",
        '      id = "read-notes"',
        '      tool = "read_file"',
        '      mode = "ask"',
        '      note = "the owner\'s notes"',
        "  the session was taint public, trusted",
        lines[10],
    ]
    assert re.fullmatch(
        rf"waits for you now: approval {approval}, expires \d\d:\d\d:\d\d \(in (29s|30s)\); "
        rf"bxctl approve {approval}",
        lines[10],
    )
    await client.aclose()


async def test_why_of_a_waiting_calls_approval_id_tells_the_call(
    asking_home: Home, autojump_clock: Clock, capsys: pytest.CaptureFixture[str]
) -> None:
    home = asking_home
    client, pending = await pending_call(home)
    assert await bxctl_in_process(home, "why", pending["approval"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"call {pending['call']}: read_file ")
    assert lines[-1].startswith(f"waits for you now: approval {pending['approval']}, expires ")
    await client.aclose()


async def test_refuse_passes_the_reason_to_the_requester(
    asking_home: Home, autojump_clock: Clock, capsys: pytest.CaptureFixture[str]
) -> None:
    home = asking_home
    client, pending = await pending_call(home)
    code = await bxctl_in_process(home, "refuse", pending["approval"], "--reason", "not today")
    assert code == 0
    assert capsys.readouterr().out.strip() == (
        f"refused {pending['call']}: the model is told: not today"
    )
    answer = await client.final()
    assert (answer["outcome"], answer["reason"], answer["detail"]) == (
        "denied",
        "refused",
        "not today",
    )
    await client.aclose()


async def test_approve_of_an_unknown_id_fails_with_the_code(
    asking_home: Home, autojump_clock: Clock, capsys: pytest.CaptureFixture[str]
) -> None:
    home = asking_home
    assert await bxctl_in_process(home, "approve", "a-00000000") == 1
    assert "no_such_approval" in capsys.readouterr().err
    assert await bxctl_in_process(home, "approve", "a-123") == 2
    assert await bxctl_in_process(home, "refuse", "a-00000000", "--reason", "") == 2


def approval_records(home: Home) -> list[dict[str, Any]]:
    lines = home.audit_log.read_bytes().splitlines()
    return [record for record in map(orjson.loads, lines) if record["kind"] == "approval"]


async def test_approve_notes_are_kept_in_the_approval_record_and_why_shows_them(
    asking_home: Home, autojump_clock: Clock, capsys: pytest.CaptureFixture[str]
) -> None:
    home = asking_home
    client, pending = await pending_call(home)
    assert (
        await bxctl_in_process(home, "approve", pending["approval"], "--note", "for the demo") == 0
    )
    await client.final()
    await client.aclose()
    [record] = approval_records(home)
    assert (record["approval"], record["note"]) == (pending["approval"], "for the demo")
    capsys.readouterr()
    assert await bxctl_in_process(home, "why", pending["call"]) == 0
    assert '  the owner\'s note: "for the demo"' in capsys.readouterr().out.splitlines()
    # Without a note (or an empty one) the record keeps the line it had before notes.
    for note in ((), ("--note", "")):
        client, pending = await pending_call(home)
        assert await bxctl_in_process(home, "approve", pending["approval"], *note) == 0
        await client.final()
        await client.aclose()
        assert "note" not in approval_records(home)[-1]


async def test_approve_after_the_grant_was_removed_is_a_denial_and_exit_1(
    asking_home: Home, autojump_clock: Clock, capsys: pytest.CaptureFixture[str]
) -> None:
    home = asking_home
    client, pending = await pending_call(home)
    write_grants(home, "")
    assert await bxctl_in_process(home, "approve", pending["approval"]) == 1
    assert capsys.readouterr().out.strip() == (
        f"approved {pending['call']}, but brokerd decided again and denied it: "
        "no_grant — no grant allows read_file on notes.txt"
    )
    await client.expect_denied("no_grant")


async def test_status_and_sessions(
    asking_home: Home, brokerd: Brokerd, autojump_clock: Clock, capsys: pytest.CaptureFixture[str]
) -> None:
    home, broker = asking_home, brokerd.broker
    assert broker is not None
    client, _ = await pending_call(home)
    # Exit 1: loopd, inferproxy and the model are down (brokerd runs alone here).
    assert await bxctl_in_process(home, "status", "--json") == 1
    status = orjson.loads(capsys.readouterr().out)
    assert status["down"] == ["model", "inferproxy", "loopd"]
    assert status["problem"] is None
    assert (status["boot"], status["pending"], status["sessions"]) == (broker.boot, 1, 1)
    # What bounds the shell's sandbox (docs/runbook.md#sandbox-limits).
    bounds = broker.sandboxes.bounds.describe()
    assert status["sandbox_bounds"] == bounds
    assert status["daemons"] == {
        "model": False,
        "brokerd": True,
        "inferproxy": False,
        "loopd": False,
    }
    assert await bxctl_in_process(home, "sessions") == 0
    assert capsys.readouterr().out.strip() == (
        f"{SESSION}  no conversation kept; taint public, trusted, 1 call(s)"
    )
    write_grants(home, "[[grant]]\nid = 'x'\n")
    assert await bxctl_in_process(home, "status") == 1
    out = capsys.readouterr().out
    assert "grants_valid   no" in out
    assert "grants.toml, grant 'x', key 'tool': required key missing" in out
    assert "True" not in out
    assert "None" not in out
    assert "ledger_usable  yes" in out
    assert f"sandbox_bounds {bounds}" in out.splitlines()
    assert out.splitlines()[0] == (
        "daemons        model down, brokerd up, inferproxy down, loopd down"
    )
    await client.aclose()


async def test_a_daemon_that_is_down_exits_3_with_the_command_that_starts_it(
    home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    for command in (["approvals"], ["status"], ["sessions"], ["approve", "a-00000000"]):
        assert await bxctl_in_process(home, *command) == 3
        out, err = capsys.readouterr()
        if command == ["status"]:
            assert (
                out.strip()
                == "daemons        model down, brokerd down, inferproxy down, loopd down"
            )
        assert "brokerd is unreachable" in err
        assert f"start the daemons with `bxctl up --home {home.root}`" in err


async def test_status_json_is_an_object_even_when_brokerd_is_down(
    home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await bxctl_in_process(home, "status", "--json") == 3
    out, err = capsys.readouterr()
    status = orjson.loads(out)
    assert status["daemons"] == {
        "model": False,
        "brokerd": False,
        "inferproxy": False,
        "loopd": False,
    }
    assert status["down"] == ["model", "brokerd", "inferproxy", "loopd"]
    assert (status["version"], status["head"], status["pending"]) == (None, None, None)
    assert status["problem"].startswith(f"brokerd is unreachable at {home.admin_sock}")
    assert err == ""


async def test_watch_waits_for_a_restarted_brokerd_and_says_so(
    asking_home: Home,
    brokerd: Brokerd,
    autojump_clock: Clock,
    capsys: pytest.CaptureFixture[str],
) -> None:
    home = asking_home
    async with trio.open_nursery() as nursery:
        nursery.start_soon(bxctl_in_process, home, "approvals", "--watch")
        await trio.sleep(1.5)
        assert capsys.readouterr().out.strip() == "no pending approvals"
        await brokerd.stop()
        await trio.sleep(3.5)  # three refreshes: said once
        out, err = capsys.readouterr()
        assert out == ""
        assert err.startswith(f"bxctl: lost brokerd: brokerd is unreachable at {home.admin_sock}")
        assert err.endswith("; asking again every 1 s\n")
        assert err.count("\n") == 1
        await brokerd.start()
        client, pending = await pending_call(home)
        await trio.sleep(1.5)
        out, err = capsys.readouterr()
        assert err == "bxctl: brokerd answers again\n"
        assert out.startswith("\n---\n")
        assert pending["approval"] in out
        nursery.cancel_scope.cancel()
        await client.aclose()


async def test_the_watch_screen_waits_for_a_restarted_brokerd(
    asking_home: Home, brokerd: Brokerd
) -> None:
    home = asking_home
    argv = bxctl_argv("approvals", "--watch", "--home", str(home.root))
    async with terminal(argv) as screen:
        await screen.wait_for(NONE_PENDING)
        await brokerd.stop()
        lost = await screen.wait_for(LOST)
        await brokerd.start()
        client, pending = await pending_call(home)
        back = await screen.wait_for(
            lambda text: REGAINED in text and f"▶ {pending['approval']}" in text
        )
        await screen.send("y")
        approved = await screen.wait_for(f"approved {pending['call']}: read_file ran (ok)")
        await screen.send("q")
        assert await screen.exit_code() == 0
        await client.aclose()
    assert f"{LOST}: brokerd is unreachable at {home.admin_sock}" in lost
    assert "pending approvals (1)" in back
    assert NONE_PENDING in approved


async def test_watch_prints_the_list_again_when_it_changes(
    asking_home: Home, autojump_clock: Clock, capsys: pytest.CaptureFixture[str]
) -> None:
    home = asking_home
    async with trio.open_nursery() as nursery:
        nursery.start_soon(bxctl_in_process, home, "approvals", "--watch")
        await trio.sleep(2.5)
        assert capsys.readouterr().out.strip() == "no pending approvals"
        client, pending = await pending_call(home)
        await trio.sleep(1.5)
        shown = capsys.readouterr().out
        assert shown.startswith("\n---\n")
        assert pending["approval"] in shown
        await trio.sleep(3)
        assert capsys.readouterr().out == ""  # unchanged: nothing printed again
        nursery.cancel_scope.cancel()
        await client.aclose()
