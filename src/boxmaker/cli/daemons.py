"""``bxctl up`` and ``bxctl down``: the three daemons in the background (spec §11).

``up`` starts brokerd, inferproxy and loopd, in that order, each as its own process in
its own session (so a closed terminal does not stop it), its output in
``logs/<program>.log`` and its pid in ``run/<program>.pid``, and waits until each
socket answers before starting the next. A daemon whose socket already answers is left
as it is. One that exits while starting stops ``up`` with the end of its log.

``down`` stops them in the other order with SIGTERM (each stops cleanly: brokerd
withdraws pending calls and appends ``stop``), waits for each to exit, and removes the
pid files. It signals only a process whose command line names its program and this
home, so a stale pid file never kills a stranger.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final

import attrs

from boxmaker.cli.common import DEFAULT, Common, Exit, fail, print_json
from boxmaker.home import ConfigError, Home, HomeError, load_config

START_S: Final = 30.0
STOP_S: Final = 15.0
POLL_S: Final = 0.05
LOG_TAIL: Final = 2000


@attrs.frozen
class Daemon:
    name: str
    module: str
    socket: Callable[[Home], Path]

    def argv(self, home: Home) -> list[str]:
        return [sys.executable, "-m", self.module, "serve", "--home", str(home.root)]


DAEMONS: Final = (
    Daemon("brokerd", "boxmaker.broker.serve", lambda home: home.admin_sock),
    Daemon("inferproxy", "boxmaker.proxy.serve", lambda home: home.infer_sock),
    Daemon("loopd", "boxmaker.loop.serve", lambda home: home.loop_sock),
)


def answers(path: Path) -> bool:
    """Does a process listen on the Unix socket ``path``?"""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def _log_tail(path: Path) -> str:
    with contextlib.suppress(OSError):
        return path.read_bytes()[-LOG_TAIL:].decode("utf-8", errors="replace").strip()
    return ""


class StartFailed(Exception):
    pass


def _start(daemon: Daemon, home: Home) -> int:
    """Start ``daemon``, wait until its socket answers; its pid. Raises StartFailed."""
    log_path = home.log_file(daemon.name)
    with log_path.open("ab") as log:
        log_path.chmod(0o600)
        process = subprocess.Popen(
            daemon.argv(home),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    home.pid_file(daemon.name).write_text(f"{process.pid}\n")
    deadline = time.monotonic() + START_S
    while not answers(daemon.socket(home)):
        if process.poll() is not None:
            home.pid_file(daemon.name).unlink(missing_ok=True)
            raise StartFailed(
                f"{daemon.name} exited with {process.returncode} while starting; "
                f"the end of {log_path}:\n{_log_tail(log_path)}"
            )
        if time.monotonic() > deadline:
            raise StartFailed(f"{daemon.name} did not answer within {START_S:g} s; see {log_path}")
        time.sleep(POLL_S)
    return process.pid


def up(*, common: Common = DEFAULT) -> Exit:
    """Start brokerd, inferproxy and loopd in the background (logs in logs/, pids in
    run/), each once its socket answers; those already running are left as they are."""
    home = common.resolve()
    try:
        config = load_config(home)
        home.create()
    except ConfigError as exc:
        return fail(f"{exc}; see docs/runbook.md#config", Exit.USAGE)
    except HomeError as exc:
        return fail(str(exc))
    if config.model.url is None:
        return fail(
            "no [model] url in config.toml: set it to your llama-server's URL, e.g. "
            '`[model]` `url = "http://127.0.0.1:8080"` (the built-in model is not there yet)',
            Exit.USAGE,
        )
    report: list[dict[str, object]] = []
    for daemon in DAEMONS:
        if answers(daemon.socket(home)):
            report.append({"daemon": daemon.name, "state": "already running"})
            continue
        try:
            pid = _start(daemon, home)
        except StartFailed as exc:
            _show(report, as_json=common.json)
            return fail(str(exc))
        report.append({"daemon": daemon.name, "state": "started", "pid": pid})
    _show(report, as_json=common.json)
    return Exit.DONE


def _ours(pid: int, daemon: Daemon, home: Home) -> bool:
    """Is ``pid`` this home's ``daemon`` (its command line says so)?"""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return daemon.module.encode() in argv and str(home.root).encode() in argv


def _stop(daemon: Daemon, home: Home) -> str:
    pid_file = home.pid_file(daemon.name)
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return "not running" if not answers(daemon.socket(home)) else "running, but not by up"
    if not _ours(pid, daemon, home):
        pid_file.unlink(missing_ok=True)
        return "not running (a stale pid file removed)"
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_S
    while _ours(pid, daemon, home):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            pid_file.unlink(missing_ok=True)
            return f"killed (no clean stop within {STOP_S:g} s)"
        time.sleep(POLL_S)
    pid_file.unlink(missing_ok=True)
    return "stopped"


def down(*, common: Common = DEFAULT) -> Exit:
    """Stop the daemons `bxctl up` started (SIGTERM; each stops cleanly), last first."""
    home = common.resolve()
    report = [{"daemon": daemon.name, "state": _stop(daemon, home)} for daemon in reversed(DAEMONS)]
    _show(report, as_json=common.json)
    return Exit.DONE


def _show(report: Sequence[Mapping[str, object]], *, as_json: bool) -> None:
    if as_json:
        print_json(list(report))
        return
    for entry in report:
        pid = f" (pid {entry['pid']})" if "pid" in entry else ""
        print(f"{entry['daemon']}: {entry['state']}{pid}")
