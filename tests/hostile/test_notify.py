"""``[notify] command`` (broker/notify.py): run with the pending approval's JSON on stdin
when a call starts waiting. The command is the owner's, but it must never cost a call
anything (a failing, slow, hanging or flooding command never blocks or denies one), it
never runs as root, and it gets a clean environment, not brokerd's.

brokerd runs in process here as root (as CI does; its home is root's), on a workspace
owned by uid 65534: the command runs as that uid, in /. Real time: real processes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from tests.harness.broker import Brokerd, Client, tool_request
from tests.harness.cli import bxctl_in_process
from tests.harness.homes import grant, write_config, write_grants

from boxmaker.broker.notify import MAX_RUNNING, RunAs, clean_env, run_as
from boxmaker.home.paths import Home

NOBODY = 65534
WAIT_S = 10.0

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="brokerd as root is the case here")


@pytest.fixture
def out() -> Iterator[Path]:
    """Where the command writes what it saw: a folder uid 65534 may write to."""
    folder = Path(tempfile.mkdtemp(prefix="bx-notify-"))
    folder.chmod(0o777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def notify_with(home: Home, out: Path, command: list[str], timeout: float = 5.0) -> None:
    """A workspace owned by uid 65534 (outside the home, which is brokerd's own): brokerd,
    root, runs the command as them."""
    workspace = out / "workspace"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("hello\n")
    os.chown(workspace, NOBODY, NOBODY)
    os.chown(workspace / "notes.txt", NOBODY, NOBODY)
    write_config(
        home,
        f'workspace = "{workspace}"\n[broker]\npending_timeout = 30\n'
        f"[notify]\ncommand = {orjson.dumps(command).decode()}\ntimeout = {timeout}\n",
    )
    write_grants(home, grant("read-notes", "read_file", "ask"))


def _complete(path: Path) -> bytes | None:
    """The file once a whole line is in it."""
    with contextlib.suppress(FileNotFoundError):
        data = path.read_bytes()
        return data if data.endswith(b"\n") else None
    return None


async def wait_for(path: Path) -> bytes:
    with trio.fail_after(WAIT_S):
        while (data := _complete(path)) is None:  # noqa: ASYNC110
            await trio.sleep(0.02)
    return data


def _gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists()


async def pending(home: Home) -> tuple[Client, dict[str, Any]]:
    client = await Client.open(home.broker_sock)
    started = time.monotonic()
    frame = await client.ask(tool_request("read_file", {"path": "notes.txt"}))
    assert frame["kind"] == "pending", frame
    assert time.monotonic() - started < 2.0  # never held up by the command
    return client, frame


@needs_root
async def test_the_command_gets_exactly_the_approvals_json_as_the_workspaces_owner(
    out: Path,
    home: Home,
    brokerd: Brokerd,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    script = f"cat > {out}/notified.json; echo >> {out}/notified.json; id -u; id -g; pwd; env"
    notify_with(
        home, out, ["sh", "-c", f"({script}) > {out}/ran.txt 2>&1; mv {out}/ran.* {out}/done"]
    )
    monkeypatch.setenv("DISPLAY", ":7")
    monkeypatch.setenv("BROKERD_SECRET", "not for the command")
    await brokerd.start()
    client, frame = await pending(home)
    received = await wait_for(out / "notified.json")
    assert await bxctl_in_process(home, "approvals", "--json") == 0
    [listed] = orjson.loads(capsys.readouterr().out)
    assert orjson.loads(received) == listed
    assert listed["approval"] == frame["approval"]
    with trio.fail_after(WAIT_S):
        while not (out / "done").exists():  # noqa: ASYNC110
            await trio.sleep(0.02)
    uid, gid, cwd, *env = (out / "done").read_text().splitlines()
    assert (uid, gid, cwd) == (str(NOBODY), str(NOBODY), "/")
    assert "DISPLAY=:7" in env
    assert f"BOXMAKER_HOME={home.root}" in env
    assert not [line for line in env if "BROKERD_SECRET" in line]
    await client.aclose()


@needs_root
async def test_a_failing_or_hanging_command_never_blocks_or_denies_a_call(
    out: Path, home: Home, brokerd: Brokerd, capsys: pytest.CaptureFixture[str]
) -> None:
    # It starts a child that would outlive it, then hangs: both are killed at the limit.
    notify_with(home, out, ["sh", "-c", f"sleep 300 & echo $! > {out}/child.pid; sleep 300"], 1.0)
    await brokerd.start()
    client, frame = await pending(home)
    child = int((await wait_for(out / "child.pid")).decode())
    assert await bxctl_in_process(home, "approve", frame["approval"]) == 0
    assert capsys.readouterr().out.strip() == f"approved {frame['call']}: read_file ran (ok)"
    assert (await client.final())["outcome"] == "ok"
    await client.aclose()
    with trio.fail_after(WAIT_S):
        while not _gone(child):  # noqa: ASYNC110
            await trio.sleep(0.05)


@needs_root
async def test_a_command_that_fails_or_does_not_exist_costs_nothing(
    out: Path,
    home: Home,
    brokerd: Brokerd,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    notify_with(home, out, ["/nonexistent/notify-send", "boxmaker"])
    await brokerd.start()
    client, frame = await pending(home)
    assert await bxctl_in_process(home, "refuse", frame["approval"], "--reason", "no") == 0
    assert (await client.final())["reason"] == "refused"
    await client.aclose()
    await trio.sleep(0.2)
    assert "notify: the command could not be run" in caplog.text


@needs_root
async def test_a_flood_of_waiting_calls_runs_at_most_four_commands_at_once(
    out: Path, home: Home, brokerd: Brokerd
) -> None:
    notify_with(home, out, ["sh", "-c", f"echo $$ >> {out}/started.txt; sleep 300"], 3.0)
    await brokerd.start()
    clients = [(await pending(home))[0] for _ in range(3 * MAX_RUNNING)]
    await trio.sleep(1.0)
    assert len((out / "started.txt").read_text().splitlines()) == MAX_RUNNING
    for client in clients:
        await client.aclose()


@needs_root
def test_never_as_root(tmp_path: Path) -> None:
    os.chown(tmp_path, 0, 0)
    assert run_as(tmp_path, tmp_path) is None
    os.chown(tmp_path, NOBODY, NOBODY)
    assert run_as(tmp_path, tmp_path) == RunAs(NOBODY, NOBODY, Path("/"))


def test_the_environment_is_clean() -> None:
    env = clean_env(NOBODY, {"LD_PRELOAD": "/tmp/x.so", "PATH": "/tmp/evil", "DISPLAY": ":0"})
    assert env["PATH"] == "/usr/local/bin:/usr/bin:/bin"
    assert "LD_PRELOAD" not in env
    assert env["DISPLAY"] == ":0"
