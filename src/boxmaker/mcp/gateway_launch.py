"""How an MCP server's sandbox starts (docs/mcp.md, "MCP servers through brokerd";
docs/runbook.md#mcp-servers).

The shell's sandbox (broker/sandbox_plan.py) with the server's own paths in place of the
workspace: the same uid (never root), no capabilities, the same seccomp filter, no
network (unless its grants give it a way out: broker/server_egress.py), the same process
and file-size limits, and, where brokerd has cgroups, memory bounded by the cgroup rather
than by address space (Node-based servers reserve ranges far above any sensible
RLIMIT_AS). Without a cgroup the address-space limit stays.

Each path is resolved at each start and bound by its real path, at the path the owner
wrote: a writable path whose real path has left the workspace (the model writes the
workspace, links included), or any path whose real path reaches the home, is refused.
bwrap 0.8 resolves a bind's source by its name again (even ``--bind-fd``'s), so a link
swapped in between this check and bwrap's mount is not seen: a limit written down in
docs/threat-model.md.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

from boxmaker.broker.run_spec import sandbox_limits
from boxmaker.broker.sandbox_check import find_sandbox
from boxmaker.broker.sandbox_plan import SANDBOX_PATH, SYSTEM_DIRS, Egress, Launch, server_argv
from boxmaker.home.config import RunnerConfig
from boxmaker.home.mcp_config import RUNBOOK_MCP_SERVERS, McpServerConfig


def server_environment(server: McpServerConfig, environ: Mapping[str, str]) -> dict[str, str]:
    """``env_pass``'s names that ``environ`` has, then ``env`` over them.

    >>> config = McpServerConfig(command="x", env={"A": "1"}, env_pass=("TOKEN", "GONE"))
    >>> server_environment(config, {"TOKEN": "t", "OTHER": "o"})
    {'TOKEN': 't', 'A': '1'}
    """
    passed = {name: environ[name] for name in server.env_pass if name in environ}
    return {**passed, **server.env}


def server_mounts(
    server: McpServerConfig,
    *,
    workspace: Path,
    home_problem: Callable[[Path], str | None],
) -> tuple[str, ...] | str:
    """bwrap's options binding the server's paths (parents before children, so a path
    bound inside another stays visible), or why one may not be bound. Blocking."""
    paths = [(path, False) for path in server.read_only_paths]
    paths += [(path, True) for path in server.writable_paths]
    paths.sort(key=lambda item: len(Path(item[0]).parts))
    mounts: list[str] = []
    for path, writable in paths:
        real = Path(os.path.realpath(path))
        if not real.exists():
            return f"{path}: no such file or directory"
        problem = home_problem(real)
        if problem is None and writable and not real.is_relative_to(workspace):
            problem = f"by its real path {real}, outside the workspace {workspace}"
        if problem is not None:
            return f"{path}: {problem}"
        mounts += ["--bind" if writable else "--ro-bind", str(real), path]
    return tuple(mounts)


SHEBANG_BYTES: Final = 256
"""How much of a script brokerd reads to find its interpreter (the kernel reads 256)."""


def _shown(path: Path, server: McpServerConfig) -> bool:
    roots = ("/usr", *(f"/{name}" for name in SYSTEM_DIRS))
    roots += (*server.read_only_paths, *server.writable_paths)
    return any(path.is_relative_to(root) for root in roots)


def _interpreter(program: Path) -> Path | None:
    try:
        with program.open("rb") as script:
            head = script.read(SHEBANG_BYTES)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].split()
    return Path(os.fsdecode(words[0])) if words else None


def command_problem(server: McpServerConfig, owner_path: str | None) -> str | None:
    """Why the server's ``command`` cannot start in its sandbox, or None: a bare name
    not on the sandbox's PATH, or a program (or a script's interpreter) the sandbox does
    not show. Without this the server only exits 127, its log empty. ``owner_path`` is
    the PATH the owner's shell would search (to say where the program is). Blocking.

    >>> print(command_problem(McpServerConfig(command="no-such-server-x"), ""))
    command 'no-such-server-x' is not on the sandbox's PATH (/usr/local/bin:/usr/bin:/bin)
    >>> command_problem(McpServerConfig(command="sh"), "") is None
    True
    """
    command = server.command
    if "/" in command:
        program = Path(command)
    else:
        found = shutil.which(command, path=SANDBOX_PATH)
        if found is None:
            elsewhere = shutil.which(command, path=owner_path)
            hint = (
                f": it is {elsewhere} on your PATH; give that as command, and the directory "
                "it is installed in as read_only_paths"
                if elsewhere
                else ""
            )
            return f"command {command!r} is not on the sandbox's PATH ({SANDBOX_PATH}){hint}"
        program = Path(found)
    if not program.is_file():
        return f"command {command}: no such program"
    if not _shown(program, server):
        return (
            f"command {command}: the sandbox does not show it; add the directory it is "
            "installed in to read_only_paths"
        )
    interpreter = _interpreter(program)
    if interpreter is None:
        return None
    real = Path(os.path.realpath(interpreter))
    for shown in (interpreter, real):
        if not _shown(shown, server):
            named = f"{interpreter} ({real})" if real != interpreter else f"{interpreter}"
            return (
                f"command {command} is a script run by {named}, which the sandbox does "
                f"not show; add {shown.parent.parent} (the interpreter's installation) to "
                "read_only_paths, or run a system interpreter (docs/mcp.md)"
            )
    return None


def server_launch(
    name: str,
    server: McpServerConfig,
    *,
    workspace: Path,
    runner: RunnerConfig,
    home_problem: Callable[[Path], str | None],
    bounded: bool,
    environ: Mapping[str, str],
    egress: Egress | None = None,
) -> Launch | str:
    """The launch of server ``name``, or why it cannot start (the failure's detail).
    ``workspace``: its real path (brokerd's, resolved at start); ``bounded``: whether
    the sandbox will have a cgroup; ``egress``: its way out, when it has one
    (broker/server_egress.py). Blocking (stats)."""
    found = find_sandbox(workspace, runner.sandbox_uid)
    if isinstance(found, str):
        return found
    mounts = server_mounts(server, workspace=workspace, home_problem=home_problem)
    if isinstance(mounts, str):
        return f"[mcp_servers.{name}] {mounts}; see {RUNBOOK_MCP_SERVERS}"
    problem = command_problem(server, environ.get("PATH"))
    if problem is not None:
        return f"[mcp_servers.{name}] {problem}; see {RUNBOOK_MCP_SERVERS}"
    limits = sandbox_limits(runner)
    argv = server_argv(
        found.bwrap,
        env=server_environment(server, environ),
        mounts=mounts,
        limits=limits,
        argv=(server.command, *server.args),
        address_space=not bounded,
        egress=egress,
    )
    return Launch(argv, found.user, limits)
