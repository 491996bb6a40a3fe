"""The daemons as processes: which ones there are, whether each answers, which process is
this home's, and starting and stopping one (``bxctl up``, ``down``; docs/runbook.md#up).

Each daemon runs as its own process in its own session (so a closed terminal does not
stop it), its output in ``logs/<program>.log`` and its pid in ``run/<program>.pid``. A
pid file is only a hint: a process is signalled only when it is this home's daemon
(:func:`find_daemon`), through a pidfd, so neither a stale pid file nor a reused pid
ever gets a stranger signalled.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final, Literal

import attrs

from boxmaker.cli.log_tail import read_tail
from boxmaker.home.paths import Home
from boxmaker.home.regular_file import open_regular_file

START_S: Final = 30.0
STOP_S: Final = 15.0
POLL_S: Final = 0.05
LOG_TAIL_LINES: Final = 20

DaemonName = Literal["model", "brokerd", "inferproxy", "loopd"]


@attrs.frozen
class Daemon:
    name: str
    module: str
    ready: Callable[[Home], bool]
    """Is it serving? (its socket answers, or the model wrote its URL)"""

    def argv(self, home: Home, *extra: str) -> list[str]:
        return [sys.executable, *self.identity(home), *extra]

    def identity(self, home: Home) -> list[str]:
        """What follows the interpreter on the command line of this home's daemon."""
        return ["-m", self.module, "serve", "--home", str(home.root)]


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
BY_NAME: Final = {daemon.name: daemon for daemon in DAEMONS}


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


# ---------------------------------------------------------------------------------------
# Which process is this home's daemon


def find_daemon(daemon: Daemon, home: Home) -> int | None:
    """A pidfd of this home's ``daemon``, from its pid file, or None.

    The pid file is only a hint: it is read without following a link, and the process
    it names counts only when it runs as us with exactly the daemon's command line for
    this home (``-m <module> serve --home <home>``). The pidfd is opened before that
    check, so the pid cannot be reused by a stranger between the check and a signal."""
    try:
        fd = open_regular_file(home.pid_file(daemon.name))
        try:
            pid = int(os.read(fd, 32).decode("ascii").strip())
        finally:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
    except (OSError, ValueError):
        return None
    if _is_ours(pid, daemon, home):
        return pidfd
    os.close(pidfd)
    return None


def _is_ours(pid: int, daemon: Daemon, home: Home) -> bool:
    try:
        owner = Path(f"/proc/{pid}").stat().st_uid
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    expected = [part.encode() for part in daemon.identity(home)]
    return owner == os.getuid() and argv[1 : 1 + len(expected)] == expected


def _exited(pidfd: int, within: float) -> bool:
    """Wait up to ``within`` seconds for the process of ``pidfd`` to end."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(int(within * 1000)))


# ---------------------------------------------------------------------------------------
# Starting and stopping one


class StartFailed(Exception):
    pass


def _open_log(home: Home, daemon: Daemon) -> int:
    """``logs/<daemon>.log`` for appending, never through a link. Raises StartFailed."""
    path = home.log_file(daemon.name)
    try:
        fd = open_regular_file(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    except OSError as exc:
        raise StartFailed(f"{daemon.name}: {path}: {exc.strerror}") from exc
    os.fchmod(fd, 0o600)
    return fd


def _write_pid(home: Home, daemon: Daemon, pid: int) -> None:
    fd = open_regular_file(home.pid_file(daemon.name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        os.write(fd, f"{pid}\n".encode())
    finally:
        os.close(fd)


def start(daemon: Daemon, home: Home, *extra: str) -> int:
    """Start ``daemon``, wait until it is ready; its pid. Raises StartFailed."""
    log = _open_log(home, daemon)
    try:
        process = subprocess.Popen(
            daemon.argv(home, *extra),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    finally:
        os.close(log)
    try:
        _write_pid(home, daemon, process.pid)
    except OSError as exc:
        process.terminate()
        process.wait(STOP_S)
        raise StartFailed(f"{daemon.name}: {home.pid_file(daemon.name)}: {exc.strerror}") from exc
    deadline = time.monotonic() + START_S
    log_path = home.log_file(daemon.name)
    while not daemon.ready(home):
        if process.poll() is not None:
            home.pid_file(daemon.name).unlink(missing_ok=True)
            tail = "\n".join(read_tail(log_path, LOG_TAIL_LINES))
            raise StartFailed(
                f"{daemon.name} exited with {process.returncode} while starting; "
                f"the end of {log_path}:\n{tail}"
            )
        if time.monotonic() > deadline:
            raise StartFailed(f"{daemon.name} did not answer within {START_S:g} s; see {log_path}")
        time.sleep(POLL_S)
    return process.pid


def stop(daemon: Daemon, home: Home) -> str:
    """Stop this home's ``daemon`` (SIGTERM, then SIGKILL after STOP_S); what happened."""
    pid_file = home.pid_file(daemon.name)
    pidfd = find_daemon(daemon, home)
    if pidfd is None:
        stale = os.path.lexists(pid_file)
        with contextlib.suppress(OSError):
            # Only a regular file is ours to remove; anything else there is left as it is.
            if pid_file.is_file() and not pid_file.is_symlink():
                pid_file.unlink()
        if daemon.ready(home):
            return "running, but not started by up"
        return "not running (a stale pid file removed)" if stale else "not running"
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGTERM)
        if _exited(pidfd, STOP_S):
            state = "stopped"
        else:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            _exited(pidfd, STOP_S)
            state = f"killed (no clean stop within {STOP_S:g} s)"
    except ProcessLookupError:
        state = "stopped"
    finally:
        os.close(pidfd)
    pid_file.unlink(missing_ok=True)
    return state
