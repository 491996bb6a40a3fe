"""What ``bxctl up`` (and ``restart``) checks before it starts anything
(docs/runbook.md#up): :func:`preflight` finds every problem, not only the first, each
with its runbook entry; while any is found, nothing starts.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from typing import Final

import attrs
import httpx
import trio

from boxmaker.broker.bwrap_version import bwrap_version_problem
from boxmaker.cli.admin_client import DaemonUnreachable, ask_broker
from boxmaker.cli.common import Exit
from boxmaker.cli.daemon_processes import INFERPROXY, MODEL
from boxmaker.core.grant_parse import GrantsProblem
from boxmaker.home.config import Config, ConfigError, load_config
from boxmaker.home.grants_file import read_grants
from boxmaker.home.paths import Home
from boxmaker.model.serve import ModelUnavailable, check_installed
from boxmaker.wire import StatusAnswer, StatusRequest

BWRAP_CHECK_S: Final = 10.0
MODEL_CHECK_S: Final = 8.0
"""How long inferproxy may take to answer `GET /health` for the model: its own connect
timeout to the model (5 s) and a margin."""
RUNBOOK_UP: Final = "docs/runbook.md#up"
RUNBOOK_MODEL: Final = "docs/runbook.md#model-unreachable"


@attrs.frozen
class PreflightProblem:
    text: str
    anchor: str
    code: Exit = Exit.USAGE

    def describe(self) -> str:
        return f"{self.text}; see {self.anchor}"


def _initialised(home: Home) -> bool:
    return home.root.is_dir() and any(
        os.path.lexists(path) for path in (home.config_toml, home.grants_toml)
    )


def _bwrap_problem() -> PreflightProblem | None:
    """bubblewrap is there, can make its namespaces, and is new enough for the sandbox
    (docs/runbook.md#sandbox)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return PreflightProblem(
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
            return PreflightProblem(too_old, "docs/runbook.md#sandbox", Exit.FAILED)
        said = done.stderr.decode("utf-8", "replace").strip() or f"exit {done.returncode}"
    return PreflightProblem(
        f"bubblewrap ({bwrap}) cannot create its sandbox here: {said}",
        "docs/runbook.md#sandbox",
        Exit.FAILED,
    )


def model_problem(home: Home) -> str | None:
    """Why the model does not answer, asked through inferproxy (the one process that
    connects to it: docs/egress.md) with `GET /health`: inferproxy's 502 says why. None
    when the model answers with any status (503 while it loads is an answer too), or
    when inferproxy itself is down (that is said as a daemon down)."""
    transport = httpx.HTTPTransport(uds=str(home.infer_sock))
    try:
        with httpx.Client(transport=transport, timeout=MODEL_CHECK_S, trust_env=False) as client:
            response = client.get("http://inferproxy/health")
    except httpx.TimeoutException:
        return f"inferproxy did not answer for the model within {MODEL_CHECK_S:g} s"
    except httpx.HTTPError:
        return None
    if response.status_code != 502:
        return None
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = f"inferproxy answered 502; see {RUNBOOK_MODEL}"
    return str(message)


def model_warning(home: Home, config: Config) -> str | None:
    """A warning when ``[model] url`` names a server that does not answer: the daemons
    run without it (inferproxy tries it again at each request), but no chat can."""
    if config.model.url is None:
        return None
    problem = model_problem(home)
    return None if problem is None else f"warning: {problem}"


def _broker_status(home: Home) -> StatusAnswer | None:
    """brokerd's status, or None when it does not answer."""
    # up is a plain function, never called on a trio thread (`bxctl demo` runs it in a
    # worker thread): one trio run of its own for one question.
    try:
        answer = trio.run(ask_broker, home, StatusRequest())
    except DaemonUnreachable:
        return None
    return answer if isinstance(answer, StatusAnswer) else None


def _bounds_warning(status: StatusAnswer) -> str | None:
    if status.sandbox_bounds.startswith("cgroup"):
        return None
    return (
        "warning: no cgroup bounds the shell sandbox's memory and processes as a whole: "
        f"{status.sandbox_bounds}"
    )


def _shell_warning(status: StatusAnswer) -> str | None:
    if status.shell_ready:
        return None
    return (
        "warning: the shell tool cannot run here, so brokerd denies every shell call "
        f"sandbox_unavailable before anyone is asked: {status.shell_problem}"
    )


def sandbox_bounds_warning(home: Home) -> str | None:
    """A warning when brokerd (running) says nothing bounds each shell sandbox as a
    whole: no cgroup could be had, and only the per-process limits hold
    (docs/runbook.md#sandbox-limits). Not a problem: the shell still runs."""
    status = _broker_status(home)
    return None if status is None else _bounds_warning(status)


def sandbox_warnings(home: Home) -> list[str]:
    """What ``up`` warns of once brokerd runs, as brokerd finds it (its status): a
    shell that cannot run here, and why (docs/runbook.md#sandbox; brokerd's own look,
    the one that denies a shell ask before the owner is asked), and a sandbox no cgroup
    bounds. Neither stops ``up``: the file tools and http_get work without the shell."""
    status = _broker_status(home)
    if status is None:
        return []
    found = (_shell_warning(status), _bounds_warning(status))
    return [warning for warning in found if warning is not None]


def _port_problem(port: int) -> PreflightProblem | None:
    """Can inferproxy listen on 127.0.0.1:``port``, as it binds it?"""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            return PreflightProblem(
                f"[proxy] tcp_port {port}: 127.0.0.1:{port} cannot be used ({exc.strerror})",
                RUNBOOK_UP,
                Exit.FAILED,
            )
    return None


def preflight(home: Home) -> tuple[Config | None, list[PreflightProblem]]:
    """Everything ``up`` needs, checked before it starts anything: the config (when it
    is sound) and every problem found, not only the first."""
    problems: list[PreflightProblem] = []
    bwrap = _bwrap_problem()
    if bwrap is not None:
        problems.append(bwrap)
    if not _initialised(home):
        problems.append(
            PreflightProblem(
                f"{home.root}: not a boxmaker home yet; run `bxctl init --home {home.root}`",
                RUNBOOK_UP,
            )
        )
        return None, problems
    config: Config | None = None
    try:
        config = load_config(home)
    except ConfigError as exc:
        problems += [PreflightProblem(text, "docs/runbook.md#config") for text in exc.problems]
    grants = read_grants(home.grants_toml).value
    if isinstance(grants, GrantsProblem):
        problems.append(
            PreflightProblem(
                f"grants.toml is invalid: {grants.describe()}", "docs/runbook.md#grants"
            )
        )
    if config is not None:
        if config.model.url is None and not MODEL.ready(home):
            try:
                check_installed()
            except ModelUnavailable as exc:
                problems.append(
                    PreflightProblem(f"no [model] url in config.toml, and {exc}", RUNBOOK_UP)
                )
        port = config.proxy.tcp_port
        if port and not INFERPROXY.ready(home):
            found = _port_problem(port)
            if found is not None:
                problems.append(found)
    return config, problems
