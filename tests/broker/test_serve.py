"""brokerd serve: start and stop records, run/ and socket modes,
stale and foreign socket paths, the clean stop with pending and running calls, a torn
ledger and --repair, and the command line's exit codes."""

from __future__ import annotations

import functools
import hashlib
import os
import socket
import stat

import pytest
import trio
import trio.testing
from tests.harness.broker import (
    GUARD,
    Brokerd,
    Client,
    admin,
    call,
    inline,
    records,
    records_of,
    running,
    tool_request,
)
from tests.harness.homes import grant, write_config, write_grants

from boxmaker import __version__
from boxmaker.broker import runner
from boxmaker.broker.grants_watcher import GrantsWatcher
from boxmaker.broker.run_spec import RunResult, RunSpec
from boxmaker.broker.serve import app, serve_broker
from boxmaker.broker.state import Broker
from boxmaker.core.grant_parse import GrantsProblem
from boxmaker.core.grants import GrantSet
from boxmaker.home.config import ConfigError
from boxmaker.home.paths import Home
from boxmaker.ledger.live_file import LedgerTorn
from boxmaker.ledger.verify_files import verify_file
from boxmaker.runtime.threads import ToThread
from boxmaker.runtime.unix_sockets import ListenerError

pytestmark = pytest.mark.usefixtures("inline_threads")

Clock = trio.testing.MockClock


def mode_of(path: os.PathLike[str]) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


async def test_start_and_stop_records_modes_and_socket_cleanup(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    home.run_dir.chmod(0o755)
    broker = await brokerd.start()
    assert mode_of(home.run_dir) == 0o700
    assert mode_of(home.broker_sock) == 0o600
    assert mode_of(home.admin_sock) == 0o600
    assert stat.S_ISSOCK(os.lstat(home.broker_sock).st_mode)
    await brokerd.stop()
    kinds = [(r["kind"], r.get("boot"), r.get("version")) for r in records(home)]
    assert kinds == [
        ("genesis", None, None),
        ("start", broker.boot, __version__),
        ("policy", broker.boot, None),
        ("stop", broker.boot, None),
        ("checkpoint", broker.boot, None),
    ]
    assert not home.broker_sock.exists()
    assert not home.admin_sock.exists()


async def test_a_second_boot_continues_the_chain(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    first = await brokerd.start()
    await brokerd.stop()
    async with running(home, to_thread=inline) as second:
        pass
    assert first.boot != second.boot
    kinds = [r["kind"] for r in records(home)]
    assert kinds == [
        "genesis",
        "start",
        "policy",
        "stop",
        "checkpoint",
        "start",
        "policy",
        "stop",
        "checkpoint",
    ]


async def test_a_stale_socket_is_replaced(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(home.broker_sock))
    stale.close()  # bound, never listening: what a killed brokerd leaves
    await brokerd.start()
    assert (await call(home, {"kind": "catalogue", "v": 1}))[0]["kind"] == "catalogue"


async def test_a_path_that_is_not_a_socket_is_refused(home: Home, autojump_clock: Clock) -> None:
    home.admin_sock.write_text("not a socket")
    with trio.fail_after(GUARD):
        async with trio.open_nursery() as nursery:
            with pytest.raises(ListenerError, match="is not a socket"):
                await nursery.start(functools.partial(serve_broker, home, to_thread=inline))
    assert home.admin_sock.read_text() == "not a socket"
    assert not home.broker_sock.exists()


async def test_a_live_socket_of_another_brokerd_is_refused(
    home: Home, broker: Broker, autojump_clock: Clock
) -> None:
    async with trio.open_nursery() as nursery:
        with pytest.raises(ListenerError, match="another process"):
            await nursery.start(functools.partial(serve_broker, home, to_thread=inline))
    assert (await admin(home, {"kind": "status"}))["kind"] == "status"


async def test_a_bad_config_refuses_to_start(home: Home, autojump_clock: Clock) -> None:
    write_config(home, "[broker]\npending_timeout = 'soon'\n")
    with trio.fail_after(GUARD):
        async with trio.open_nursery() as nursery:
            with pytest.raises(ConfigError, match="pending_timeout"):
                await nursery.start(functools.partial(serve_broker, home, to_thread=inline))


async def test_a_torn_ledger_refuses_to_start_and_repair_starts(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    await brokerd.start()
    await brokerd.stop()
    torn = b'{"seq":3,"half a rec'
    with home.audit_log.open("ab") as file:
        file.write(torn)
    async with trio.open_nursery() as nursery:
        with pytest.raises(LedgerTorn, match=r"docs/runbook\.md#ledger-torn"):
            await nursery.start(functools.partial(serve_broker, home, to_thread=inline))
    async with running(home, repair_torn=True, to_thread=inline) as broker:
        pass
    kinds = [r["kind"] for r in records(home)]
    assert kinds == [
        "genesis",
        "start",
        "policy",
        "stop",
        "checkpoint",
        "start",
        "repair",
        "policy",
        "stop",
        "checkpoint",
    ]
    repaired = records(home)[6]
    assert repaired["sha256"] == hashlib.sha256(torn).hexdigest()
    assert (home.ledger_dir / repaired["file"]).read_bytes() == torn
    assert records(home)[5]["boot"] == broker.boot


async def test_stop_withdraws_pending_calls_and_records_stop(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    write_grants(home, grant("notes", "read_file", "ask"))
    broker = await brokerd.start()
    frame = tool_request("read_file", {"path": "notes.txt"})
    client = await Client.open(home.broker_sock)
    await client.send(frame)
    await client.final()
    idle_admin = await Client.open(home.admin_sock)
    assert (await idle_admin.ask({"kind": "status"}))["pending"] == 1
    stopping_at = trio.current_time()
    broker.request_stop()
    assert await client.receive() == {
        "kind": "answer",
        "final": True,
        "call": frame["call"],
        "outcome": "denied",
        "reason": "broker_stopping",
        "detail": "brokerd is stopping",
    }
    # The idle admin connection is closed at once, not after its 60 s.
    assert await idle_admin.at_eof()
    assert trio.current_time() == stopping_at
    await client.aclose()
    await idle_admin.aclose()
    await brokerd.stop()
    approval = records_of(home, frame["call"])[-1]
    assert (approval["kind"], approval["outcome"], approval["reason"], approval["by"]) == (
        "approval",
        "withdrawn",
        "broker_stopping",
        "broker",
    )
    assert [r["kind"] for r in records(home)[-2:]] == ["stop", "checkpoint"]


async def test_stop_gives_a_running_call_5_s_then_cancels_it(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    delay = {"s": 3.0}

    async def slow_execute(
        spec: RunSpec, sandboxes: object = None, *, to_thread: ToThread = inline
    ) -> RunResult:
        await trio.sleep(delay["s"])
        return await runner.execute(spec, to_thread=to_thread)

    write_grants(home, grant("r", "read_file", "auto"))
    (home.default_workspace / "n.txt").write_text("x")
    broker = await brokerd.start(execute=slow_execute)
    fast = tool_request("read_file", {"path": "n.txt"})
    slow = tool_request("read_file", {"path": "n.txt"})
    async with trio.open_nursery() as nursery:
        answers: dict[str, list[dict[str, object]]] = {}

        async def one(frame: dict[str, object], seconds: float) -> None:
            delay["s"] = seconds
            answers[str(frame["call"])] = await call(home, frame)

        nursery.start_soon(one, fast, 3.0)
        await trio.sleep(0.1)
        nursery.start_soon(one, slow, 60.0)
        await trio.sleep(0.1)
        stop_at = trio.current_time()
        broker.request_stop()
    assert trio.current_time() - stop_at == pytest.approx(5.0)
    await brokerd.stop()
    assert answers[fast["call"]][0]["outcome"] == "ok"
    assert answers[slow["call"]] == []  # cancelled: no answer, no result
    assert [r["kind"] for r in records_of(home, slow["call"])] == ["decision"]
    report = verify_file(home.audit_log)
    assert report.sound
    assert report.calls.unfinished == 1  # a stopped boot's running call


# ---------------------------------------------------------------------------------------
# The command line (in process: exit codes and messages)


def test_cli_config_error_exits_2_with_the_runbook(
    home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    write_config(home, "[broker]\nbogus = 1\n")
    code = app(["serve", "--home", str(home.root)], result_action="return_value")
    assert code == 2
    err = capsys.readouterr().err
    assert "bogus" in err
    assert "see docs/runbook.md#config" in err


def test_cli_torn_ledger_exits_1_with_the_runbook(
    home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    home.ledger_dir.mkdir(exist_ok=True)
    home.audit_log.write_bytes(b'{"seq":0')
    code = app(["serve", "--home", str(home.root)], result_action="return_value")
    assert code == 1
    assert "docs/runbook.md#ledger-torn" in capsys.readouterr().err


def test_cli_serve_runs_until_a_stop(home: Home) -> None:
    """The command wires serve_broker with signals on; stopping it returns 0."""
    seen: dict[str, object] = {}

    async def fake(where: Home, **kwargs: object) -> None:
        seen["home"] = where
        seen.update(kwargs)
        await trio.lowlevel.checkpoint()

    command, bound, _ = app.parse_args(["serve", "--home", str(home.root), "--repair"])
    code = command(*bound.args, **bound.kwargs, run_broker=fake)
    assert code == 0
    assert seen == {"home": home, "repair_torn": True, "handle_signals": True}


async def test_stop_while_an_approve_is_in_flight_still_runs_the_approved_call(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    """The admin handler is cancelled by the stop while the call re-decides; the call's
    task must still record its approval, run within the grace, and answer."""
    slow = trio.Event()

    class SlowOnceAsked(GrantsWatcher):
        """Every look at the grants takes 1 s once ``slow`` is set (the re-decision)."""

        async def current(self, *, force: bool = False) -> GrantSet | GrantsProblem:
            if slow.is_set():
                await trio.sleep(1)
            return await super().current(force=force)

    write_grants(home, grant("notes", "read_file", "ask"))
    (home.default_workspace / "notes.txt").write_text("hi")
    broker = await brokerd.start(grants_watcher=SlowOnceAsked)
    frame = tool_request("read_file", {"path": "notes.txt"})
    client = await Client.open(home.broker_sock)
    await client.send(frame)
    pending = await client.final()
    slow.set()
    owner = await Client.open(home.admin_sock)
    await owner.send({"kind": "approve", "approval": pending["approval"]})
    await trio.sleep(0.5)
    broker.request_stop()
    assert await owner.at_eof()  # cancelled: no answer
    answer = await client.final()
    assert (answer["outcome"], answer["content"]) == ("ok", "hi")
    await owner.aclose()
    await client.aclose()
    await brokerd.stop()
    kinds = [
        (r["kind"], r.get("outcome"), r.get("status")) for r in records_of(home, frame["call"])
    ]
    assert kinds == [("decision", None, None), ("approval", "ask", None), ("result", None, "ok")]
