"""MCP servers for the gateway's tests: the fake one (tests/fakes/mcp_server.py) and the
published ``mcp-server-git``, as ``[mcp_servers]`` entries a sandbox can run, and a
:class:`~boxmaker.mcp.gateway.Gateway` on a test home.

The sandbox sees only ``/usr``, ``/bin``, ``/lib*`` and the paths an entry names. The
tests' Python packages are in this virtual environment's site-packages; the interpreter
is the system's of the same version when there is one (a pyenv interpreter under root's
0700 home is out of the sandbox uid's reach), else the base interpreter, shown read-only.
"""

from __future__ import annotations

import contextlib
import os
import site
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import orjson
import trio

from boxmaker.core.external_tools import ExternalTool
from boxmaker.home.config import Config, workspace_problem
from boxmaker.home.mcp_config import McpServerConfig
from boxmaker.home.paths import Home
from boxmaker.ledger.records import Body
from boxmaker.mcp.gateway import Gateway
from boxmaker.mcp.pins import Pin, write_pins

FAKE_SERVER = Path(__file__).resolve().parent.parent / "fakes" / "mcp_server.py"
SITE_PACKAGES = next(p for p in site.getsitepackages() if p.startswith(sys.prefix))


def _interpreter() -> tuple[str, tuple[str, ...]]:
    system = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    if system.exists():
        return str(system), ()
    real = os.path.realpath(sys.executable)
    return real, (sys.base_prefix,)


PYTHON, PYTHON_PATHS = _interpreter()


def python_server(*args: str, **overrides: Any) -> McpServerConfig:
    """An entry running this Python with ``args`` in the sandbox."""
    paths = (SITE_PACKAGES, *PYTHON_PATHS, *overrides.pop("read_only_paths", ()))
    env = {"PYTHONPATH": SITE_PACKAGES, **overrides.pop("env", {})}
    return McpServerConfig(command=PYTHON, args=args, env=env, read_only_paths=paths, **overrides)


def fake_server(definition: Path, **overrides: Any) -> McpServerConfig:
    """The fake server, its ``echo`` description read from ``definition`` (a file in a
    directory it may read)."""
    paths = (str(FAKE_SERVER.parent), str(definition.parent))
    return python_server(str(FAKE_SERVER), str(definition), read_only_paths=paths, **overrides)


@attrs.define
class Recorded:
    """The records a gateway appended (it records through brokerd's writer)."""

    bodies: list[Body] = attrs.Factory(list)
    fail: bool = False

    async def __call__(self, body: Body) -> bool:
        if self.fail:
            return False
        self.bodies.append(body)
        return True


def make_gateway(home: Home, workspace: Path, servers: dict[str, McpServerConfig]) -> Gateway:
    config = Config(workspace=workspace, mcp_servers=servers)
    return Gateway(
        home=home,
        config=config,
        workspace=workspace,
        home_problem=lambda path: workspace_problem(home, path),
        record=Recorded(),
        boot="b-test",
    )


@contextlib.asynccontextmanager
async def running(gateway: Gateway) -> AsyncIterator[Gateway]:
    async with trio.open_nursery() as nursery:
        await nursery.start(gateway.run)
        try:
            yield gateway
        finally:
            nursery.cancel_scope.cancel()


def pin_all(home: Home, server: str, tools: dict[str, dict[str, Any]]) -> None:
    """Pin these definitions (name -> definition) for ``server``."""
    write_pins(home.mcp_pins, {server: {name: Pin.of(d) for name, d in tools.items()}})


def echo_definition(description: str = "Echo the text back.") -> dict[str, Any]:
    """The fake server's ``echo`` definition as it lists it."""
    schema = {"type": "object", "properties": {"text": {"type": "string"}}}
    return {"name": "echo", "description": description, "inputSchema": schema}


def tool(gateway: Gateway, name: str) -> ExternalTool:
    return gateway.catalogue()[name]


def server_toml(name: str, server: McpServerConfig) -> str:
    """``server`` as a config.toml table ``[mcp_servers.NAME]``."""
    env = server.env.items()
    lines = [
        f"[mcp_servers.{name}]",
        f"command = {orjson.dumps(server.command).decode()}",
        f"args = {orjson.dumps(list(server.args)).decode()}",
        f"env = {{ {', '.join(f'{k} = {orjson.dumps(v).decode()}' for k, v in env)} }}",
        f"read_only_paths = {orjson.dumps(list(server.read_only_paths)).decode()}",
        f"writable_paths = {orjson.dumps(list(server.writable_paths)).decode()}",
        f"call_timeout_s = {server.call_timeout_s}",
        f'label = "{server.label}"',
    ]
    return "\n".join(lines) + "\n"


def make_repository(workspace: Path) -> Path:
    """A git repository in ``workspace`` (one commit, one change), owned as the
    workspace is (the sandbox's uid, as root)."""
    repo = workspace / "repo"
    repo.mkdir()
    run = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-C", str(repo)]
    subprocess.run([*run, "init", "-q", "-b", "main"], check=True)
    (repo / "notes.txt").write_text("first\n")
    subprocess.run([*run, "add", "notes.txt"], check=True)
    subprocess.run([*run, "commit", "-q", "-m", "the first note"], check=True)
    (repo / "notes.txt").write_text("first\nsecond\n")
    owner = workspace.stat()
    subprocess.run(["chown", "-R", f"{owner.st_uid}:{owner.st_gid}", str(repo)], check=True)
    return repo


NET_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "action": {"type": "string"},
        "host": {"type": "string"},
        "port": {"type": "integer"},
        "cafile": {"type": "string"},
        "pause": {"type": "number"},
    },
}


def net_definition(name: str = "net") -> dict[str, Any]:
    """The fake server's ``net`` (or ``net_b``) definition as it lists it."""
    return {"name": name, "description": "Through the proxy.", "inputSchema": NET_SCHEMA}
