"""brokerd as a real process: signals, kill -9 and restart, run/ modes, peer uids, a torn
ledger. Real time, every wait bounded."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from tests.harness.broker import records, records_of, tool_request
from tests.harness.homes import grant, write_config, write_grants
from tests.harness.process import Daemon, connect, read_frame, send, start, wait_for
from tests.harness.sandbox import sandbox_workspace

from boxmaker.broker.sandbox_plan import LAUNCHER
from boxmaker.home.paths import Home
from boxmaker.ledger.verify_files import verify_file

pytestmark = pytest.mark.slow


def test_sigterm_withdraws_the_pending_call_records_stop_and_exits_0(
    home: Home, daemons: list[Daemon]
) -> None:
    write_grants(home, grant("notes", "read_file", "ask"))
    daemon = start(daemons, home)
    frame = tool_request("read_file", {"path": "notes.txt"})
    with connect(home.broker_sock) as sock:
        send(sock, frame)
        assert read_frame(sock)["kind"] == "pending"
        daemon.process.send_signal(signal.SIGTERM)
        answer = read_frame(sock)
    assert (answer["outcome"], answer["reason"]) == ("denied", "broker_stopping")
    assert daemon.wait() == 0
    approval = records_of(home, frame["call"])[-1]
    assert (approval["outcome"], approval["reason"], approval["by"]) == (
        "withdrawn",
        "broker_stopping",
        "broker",
    )
    assert [r["kind"] for r in records(home)[-2:]] == ["stop", "checkpoint"]
    assert verify_file(home.audit_log).sound
    assert not home.broker_sock.exists()


def test_sighup_rereads_grants_and_keeps_serving(home: Home, daemons: list[Daemon]) -> None:
    daemon = start(daemons, home)
    daemon.process.send_signal(signal.SIGHUP)
    with connect(home.broker_sock) as sock:
        send(sock, {"kind": "catalogue", "v": 1})
        assert read_frame(sock)["kind"] == "catalogue"
    wait_for(lambda: "SIGHUP" in daemon.stderr(), "the SIGHUP log line")
    daemon.process.send_signal(signal.SIGINT)
    assert daemon.wait() == 0


def test_kill_9_mid_pending_leaves_the_call_unfinished_after_restart(
    home: Home, daemons: list[Daemon]
) -> None:
    write_grants(home, grant("notes", "read_file", "ask"))
    daemon = start(daemons, home)
    frame = tool_request("read_file", {"path": "notes.txt"})
    with connect(home.broker_sock) as sock:
        send(sock, frame)
        assert read_frame(sock)["kind"] == "pending"
        daemon.kill()
    second = start(daemons, home)  # the stale sockets are replaced
    report = verify_file(home.audit_log)
    assert report.sound
    assert report.calls.unfinished == 1
    assert report.calls.pending == 0
    assert report.open_calls == {frame["call"]}
    # The unfinished call's id, sent again after the restart, gets no second decision.
    with connect(home.broker_sock) as sock:
        send(sock, frame)
        assert read_frame(sock) == {
            "kind": "error",
            "code": "bad_frame",
            "detail": "call id already used",
        }
    assert len(records_of(home, frame["call"])) == 1
    second.process.send_signal(signal.SIGTERM)
    assert second.wait() == 0
    assert verify_file(home.audit_log).calls.unfinished == 1


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_kill_9_after_a_run_decision_leaves_the_call_unfinished(
    home: Home, daemons: list[Daemon]
) -> None:
    with sandbox_workspace() as workspace:
        use_workspace(home, workspace)
        kill_9_while_running(home, daemons)


def use_workspace(home: Home, workspace: Path) -> None:
    """Point config.toml at ``workspace`` (from sandbox_workspace): as root, the shell
    refuses the home's own workspace, which belongs to root."""
    config = home.config_toml.read_text()
    write_config(home, f"workspace = {str(workspace)!r}\n{config}")


def kill_9_while_running(home: Home, daemons: list[Daemon]) -> None:
    write_grants(home, grant("sleepy", "shell", "auto"))
    daemon = start(daemons, home)
    frame = tool_request("shell", {"command": "sleep 60"})
    with connect(home.broker_sock) as sock:
        send(sock, frame)
        wait_for(lambda: len(records_of(home, frame["call"])) == 1, "the run decision")
        daemon.kill()
    assert records_of(home, frame["call"])[0]["verdict"] == "run"
    start(daemons, home)
    report = verify_file(home.audit_log)
    assert report.sound
    assert (report.calls.running, report.calls.unfinished) == (0, 1)


def test_a_loose_run_dir_is_tightened(home: Home, daemons: list[Daemon]) -> None:
    home.run_dir.chmod(0o755)
    daemon = start(daemons, home)
    assert stat.S_IMODE(os.stat(home.run_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.lstat(home.broker_sock).st_mode) == 0o600
    daemon.process.send_signal(signal.SIGTERM)
    assert daemon.wait() == 0


def test_a_torn_ledger_refuses_to_start_and_repair_starts(
    home: Home, daemons: list[Daemon]
) -> None:
    home.ledger_dir.mkdir(exist_ok=True)
    first = start(daemons, home)
    first.process.send_signal(signal.SIGTERM)
    assert first.wait() == 0
    with home.audit_log.open("ab") as file:
        file.write(b'{"seq":3,"at"')
    refused = start(daemons, home, ready=False)
    assert refused.wait() == 1
    assert "docs/runbook.md#ledger-torn" in refused.stderr()
    repaired = start(daemons, home, "--repair")
    repaired.process.send_signal(signal.SIGTERM)
    assert repaired.wait() == 0
    kinds = [r["kind"] for r in records(home)]
    assert kinds[-5:] == ["start", "repair", "policy", "stop", "checkpoint"]
    assert verify_file(home.audit_log).sound


def test_a_bad_config_exits_2(home: Home, daemons: list[Daemon]) -> None:
    write_config(home, "[broker]\npending_timeout = -1\n")
    daemon = start(daemons, home, ready=False)
    assert daemon.wait() == 2
    assert "see docs/runbook.md#config" in daemon.stderr()


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root")
def test_another_uid_cannot_reach_either_socket(home: Home, daemons: list[Daemon]) -> None:
    # The first wall: run/ is 0700 and the sockets 0600, so another user's connect fails
    # before brokerd sees it (SO_PEERCRED, tested above, is the second wall).
    daemon = start(daemons, home)
    probe = (
        "import socket, sys\n"
        "for path in sys.argv[1:]:\n"
        "    s = socket.socket(socket.AF_UNIX)\n"
        "    try:\n"
        "        s.connect(path)\n"
        "    except PermissionError:\n"
        "        print('refused', path)\n"
        "    else:\n"
        "        print('CONNECTED', path)\n"
    )
    done = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            sys.executable,
            "-c",
            probe,
            str(home.broker_sock),
            str(home.admin_sock),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.stdout.split("\n")[:2] == [
        f"refused {home.broker_sock}",
        f"refused {home.admin_sock}",
    ], done.stderr
    daemon.process.send_signal(signal.SIGTERM)
    assert daemon.wait() == 0


def sandboxes_of(brokerd: int) -> list[int]:
    """Pids of the bwrap processes ``brokerd`` started that run the launcher. (Their
    command lines name neither the workspace nor any other host path: the options go
    through --args.)"""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if parent == brokerd and argv[-2:] and argv[-2].endswith(LAUNCHER.encode()):
                found.append(int(entry.name))
    return found


def running_pids(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (not gone, not a zombie)."""
    alive = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            alive.append(pid)
    return alive


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
@pytest.mark.parametrize("how", ["SIGTERM", "kill -9"])
def test_the_sandbox_set_up_ahead_ends_with_brokerd(
    home: Home, daemons: list[Daemon], how: str
) -> None:
    with sandbox_workspace() as workspace:
        use_workspace(home, workspace)
        write_grants(home, grant("sh", "shell", "auto"))
        daemon = start(daemons, home)
        with connect(home.broker_sock) as sock:
            send(sock, tool_request("shell", {"command": "echo hi"}))
            answer = read_frame(sock)
        assert (answer["outcome"], answer["content"]) == ("ok", "hi\n")
        wait_for(
            lambda: sandboxes_of(daemon.process.pid), "a sandbox set up ahead of the next call"
        )
        sandboxes = sandboxes_of(daemon.process.pid)
        if how == "SIGTERM":
            daemon.process.send_signal(signal.SIGTERM)
            assert daemon.wait() == 0
        else:
            daemon.kill()
        wait_for(lambda: not running_pids(sandboxes), "the sandbox gone with brokerd")
