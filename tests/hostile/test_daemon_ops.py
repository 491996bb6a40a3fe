"""Hostile: what ``bxctl up``, ``down``, ``restart``, ``reload``, ``logs`` and
``runbook`` touch. A pid file is only a hint: a forged or stale one, or one that is a
link, never gets a process signalled that is not this home's daemon (bxctl may run as
root). A log or pid path replaced by a link is neither read nor written through. A
runbook topic is never a path."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.harness.cli import alive, bxctl
from tests.harness.homes import short_home
from tests.harness.process import Daemon, start

from boxmaker.home.paths import Home

pytestmark = pytest.mark.slow

SECRET = "TOPSECRET-not-a-log-line"


@pytest.fixture
def home() -> Iterator[Home]:
    with short_home("bx-hostile-") as home:
        bxctl(home, "init")
        home.config_toml.write_text('[model]\nurl = "http://127.0.0.1:9"\n')
        try:
            yield home
        finally:
            bxctl(home, "down", check=False)


@pytest.fixture
def stranger(home: Home) -> Iterator[subprocess.Popen[bytes]]:
    """A process of ours whose command line names brokerd's module and this home, as
    the old check (those words anywhere in it) took for this home's brokerd."""
    code = "import time; time.sleep(120)"
    argv = [sys.executable, "-c", code, "-m", "boxmaker.broker.serve", "serve"]
    with subprocess.Popen([*argv, "--home", str(home.root)]) as process:
        try:
            yield process
        finally:
            process.kill()


def test_a_forged_pid_file_gets_no_stranger_signalled(
    home: Home, stranger: subprocess.Popen[bytes]
) -> None:
    for name in ("brokerd", "inferproxy", "loopd", "model"):
        home.pid_file(name).write_text(f"{stranger.pid}\n")
    # reload would SIGHUP it (which ends a sleeping python), down would SIGTERM it.
    assert bxctl(home, "reload").stdout.splitlines() == [
        f"{name}: not running (not started by bxctl up)"
        for name in ("brokerd", "inferproxy", "loopd")
    ]
    assert bxctl(home, "down").stdout.splitlines() == [
        f"{name}: not running (a stale pid file removed)"
        for name in ("loopd", "inferproxy", "brokerd", "model")
    ]
    assert alive(stranger.pid)
    home.pid_file("brokerd").write_text(f"{stranger.pid}\n")
    restart = bxctl(home, "restart", "brokerd")
    assert restart.stdout.splitlines()[0] == "brokerd: not running (a stale pid file removed)"
    assert alive(stranger.pid)


def test_another_homes_daemon_is_not_this_homes(home: Home) -> None:
    daemons: list[Daemon] = []
    with short_home("bx-other-") as other:
        try:
            theirs = start(daemons, other)
            home.pid_file("brokerd").write_text(f"{theirs.process.pid}\n")
            assert bxctl(home, "down", "brokerd").stdout == (
                "brokerd: not running (a stale pid file removed)\n"
            )
            assert theirs.process.poll() is None
        finally:
            for daemon in daemons:
                daemon.kill()


def test_a_pid_file_that_is_a_link_is_not_followed(
    home: Home, stranger: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    elsewhere = tmp_path / "pid"
    elsewhere.write_text(f"{stranger.pid}\n")
    home.pid_file("brokerd").symlink_to(elsewhere)
    assert (
        bxctl(home, "down", "brokerd").stdout == "brokerd: not running (a stale pid file removed)\n"
    )
    assert alive(stranger.pid)
    assert home.pid_file("brokerd").is_symlink()  # not ours to remove: left as it is
    # up does not write its pid through the link either: brokerd is not started.
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    home.pid_file("brokerd").unlink()
    home.pid_file("brokerd").symlink_to(victim)
    done = bxctl(home, "up", check=False)
    assert done.returncode == 1
    assert f"brokerd: {home.pid_file('brokerd')}: not a regular file" in done.stderr
    assert victim.read_text() == "keep me\n"
    assert not home.admin_sock.exists()


def test_a_log_that_is_a_link_is_neither_read_nor_written(home: Home, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text(f"{SECRET}\n")
    home.log_file("loopd").symlink_to(secret)
    home.log_file("brokerd").write_text("a line of brokerd's\n")
    for args in (("logs",), ("logs", "loopd"), ("logs", "--json")):
        done = bxctl(home, *args, check=False)
        assert SECRET not in done.stdout + done.stderr, args
    assert bxctl(home, "logs").stdout == "brokerd    | a line of brokerd's\n"
    # -f too: what is appended to the link's target is never shown.
    command = [sys.executable, "-m", "boxmaker.cli.app", "logs", "-f", "loopd"]
    with subprocess.Popen(
        [*command, "--home", str(home.root)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as follow:
        try:
            time.sleep(1.0)
            with secret.open("a") as target:
                target.write(f"{SECRET} again\n")
            time.sleep(1.0)
            follow.send_signal(signal.SIGINT)
            out, err = follow.communicate(timeout=30)
        finally:
            follow.kill()
    assert SECRET.encode() not in out + err
    # up appends a daemon's output to its log: never through a link.
    secret.write_text(f"{SECRET}\n")
    home.log_file("brokerd").unlink()
    home.log_file("brokerd").symlink_to(secret)
    done = bxctl(home, "up", check=False)
    assert done.returncode == 1
    assert f"brokerd: {home.log_file('brokerd')}: not a regular file" in done.stderr
    assert secret.read_text() == f"{SECRET}\n"
    assert not home.admin_sock.exists()


def test_a_runbook_topic_is_never_a_path(tmp_path: Path) -> None:
    for topic in ("../../etc/passwd", "/etc/passwd", "docs/runbook.md#/etc/passwd", "..", "."):
        done = bxctl(tmp_path, "runbook", topic, check=False)
        assert done.returncode == 2, topic
        assert done.stdout == ""
        assert "root:" not in done.stderr
