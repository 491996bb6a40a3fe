"""Policy records (docs/protocol.md, "Policy records"): the grants brokerd decides with,
recorded at each change, before any decision made with them and after every decision
made with the grants before them."""

from __future__ import annotations

import hashlib
from pathlib import Path

import orjson
import pytest
import trio
from tests.harness.broker import Brokerd, Client, call, records, tool_request
from tests.harness.homes import grant, write_grants
from trio.testing import MockClock

from boxmaker.broker.grants_watcher import GrantsWatcher
from boxmaker.broker.policy_recorder import PolicyRecorder
from boxmaker.core.grants import GrantSet
from boxmaker.home.paths import Home
from boxmaker.ledger.policies import kept_path, policies_dir
from boxmaker.ledger.records import Stop
from boxmaker.ledger.verify_files import verify_file
from boxmaker.ledger.writer import LedgerWriter

FIRST = grant("notes", "read_file", "auto", note="first")
SECOND = grant("notes", "read_file", "auto", note="second")


def replace(path: Path, text: str) -> None:
    """As an editor saves: a new inode, so the stat key moves."""
    temp = path.with_name(path.name + ".tmp")
    temp.write_text(text)
    temp.replace(path)


def policies(home: Home) -> list[dict[str, object]]:
    return [r for r in records(home) if r["kind"] == "policy"]


def kinds(home: Home) -> list[tuple[object, ...]]:
    return [(r["kind"], r.get("call"), r.get("sha256")) for r in records(home)]


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def ledger_and_first_grants(folder: Path) -> tuple[Path, Path, LedgerWriter]:
    """A new ledger and a grants.toml holding FIRST in ``folder``, and the ledger's writer
    (not yet running)."""
    ledger = folder / "audit.jsonl"
    grants_toml = folder / "grants.toml"
    grants_toml.write_text(FIRST)
    return ledger, grants_toml, LedgerWriter.open(ledger)


async def test_a_change_noticed_before_a_decision_is_recorded_before_it(
    home: Home, brokerd: Brokerd, inline_threads: object, autojump_clock: MockClock
) -> None:
    write_grants(home, FIRST)
    (home.default_workspace / "notes.txt").write_text("hi")
    broker = await brokerd.start()
    first = tool_request("read_file", {"path": "notes.txt"})
    assert (await call(home, first))[-1]["outcome"] == "ok"
    write_grants(home, SECOND)
    second = tool_request("read_file", {"path": "notes.txt"})
    assert (await call(home, second))[-1]["outcome"] == "ok"
    await brokerd.stop()
    assert [k for k in kinds(home) if k[0] in ("policy", "decision")] == [
        ("policy", None, sha(FIRST)),
        ("decision", first["call"], None),
        ("policy", None, sha(SECOND)),
        ("decision", second["call"], None),
    ]
    assert policies(home)[0] == {
        **policies(home)[0],
        "boot": broker.boot,
        "grants": 1,
        "problem": None,
    }
    for record in policies(home):
        path = kept_path(policies_dir(home.audit_log), str(record["sha256"]))
        assert hashlib.sha256(path.read_bytes()).hexdigest() == record["sha256"]


async def test_an_approval_decided_again_after_a_change_comes_after_its_policy(
    home: Home, brokerd: Brokerd, inline_threads: object, autojump_clock: MockClock
) -> None:
    """approve --always writes grants.toml, then the approve's re-decision reads it: its
    policy record must precede the approval record."""
    write_grants(home, grant("notes", "read_file", "ask"))
    (home.default_workspace / "notes.txt").write_text("hi")
    await brokerd.start()
    frame = tool_request("read_file", {"path": "notes.txt"})
    client = await Client.open(home.broker_sock)
    await client.send(frame)
    pending = await client.final()
    write_grants(home, FIRST)
    owner = await Client.open(home.admin_sock)
    await owner.send({"kind": "approve", "approval": pending["approval"]})
    assert (await owner.final())["outcome"] == "allowed"
    assert (await client.final())["outcome"] == "ok"
    await owner.aclose()
    await client.aclose()
    await brokerd.stop()
    order = [(k[0], k[2]) for k in kinds(home) if k[0] in ("policy", "approval")]
    asked = grant("notes", "read_file", "ask")
    assert order == [("policy", sha(asked)), ("policy", sha(FIRST)), ("approval", None)]


async def test_the_same_bytes_again_are_not_recorded_again(
    home: Home, brokerd: Brokerd, inline_threads: object, autojump_clock: MockClock
) -> None:
    write_grants(home, FIRST)
    broker = await brokerd.start()
    write_grants(home, FIRST)  # a new inode, the same bytes
    await broker.grants.current()
    await broker.grants.current(force=True)
    await brokerd.stop()
    assert [r["sha256"] for r in policies(home)] == [sha(FIRST)]


async def test_a_change_waits_for_the_decisions_made_with_the_grants_before_it(
    tmp_path: Path,
) -> None:
    """A decision that took the old grants is recorded before the change, and a decision
    that comes during the change waits for it and gets the new grants."""
    ledger, grants_toml, writer = ledger_and_first_grants(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        recorder = PolicyRecorder(writer, "b-1", policies_dir(ledger))
        watcher = GrantsWatcher(grants_toml, policy=recorder)
        await watcher.current()
        held = await watcher.take()
        assert isinstance(held, GrantSet)
        assert held.grants[0].note == "first"
        replace(grants_toml, SECOND)
        nursery.start_soon(watcher.current)
        later: list[GrantSet] = []
        taken_later = trio.Event()

        async def take_later() -> None:
            taken = await watcher.take()
            assert isinstance(taken, GrantSet)
            later.append(taken)
            taken_later.set()
            watcher.give_back()

        nursery.start_soon(take_later)
        await trio.sleep(0.3)
        assert later == []
        assert [line.count(b'"policy"') for line in ledger.read_bytes().splitlines()] == [0, 1]
        # The held decision's own record (any kind stands for it), then it gives back.
        await writer.append(Stop(boot="b-1"))
        watcher.give_back()
        with trio.fail_after(10):
            await taken_later.wait()
        assert later[0].grants[0].note == "second"
        await writer.aclose()
    lines = ledger.read_bytes().splitlines()
    assert [orjson.loads(line)["kind"] for line in lines] == ["genesis", "policy", "stop", "policy"]
    assert verify_file(ledger).sound


async def test_a_change_stuck_behind_a_lost_decision_goes_on_after_its_wait(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _, grants_toml, writer = ledger_and_first_grants(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        watcher = GrantsWatcher(grants_toml, policy=PolicyRecorder(writer, "b-1", tmp_path / "p"))
        watcher.SWITCH_WAIT_S = 0.2
        await watcher.take()  # never given back
        replace(grants_toml, SECOND)
        with trio.fail_after(10):
            value = await watcher.current()
        assert isinstance(value, GrantSet)
        assert value.grants[0].note == "second"
        await writer.aclose()
    assert "1 decision(s) still unrecorded after 0.2 s" in caplog.text
