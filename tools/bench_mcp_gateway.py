"""What an MCP call through brokerd costs (docs/performance.md, "MCP servers through
brokerd").

One home in /tmp with the fake MCP server of the tests (tests/fakes/mcp_server.py, the
SDK's low-level server) as ``[mcp_servers.fake]`` (label ``internal``, so the session
stays trusted and ``auto`` runs), its ``echo`` tool pinned and granted ``auto``, and
``read_file`` granted ``auto``; brokerd as a separate process
(``python -m boxmaker.broker.serve serve``), spoken to on broker.sock from this process,
one connection per call, as loopd does.

- Time to first result: the first ``mcp.fake.echo`` call, which starts the server in its
  sandbox on demand (reported; then the warm server is reused: the ledger holds one
  ``mcp_tools`` record).
- In one run, interleaved call by call: an ``mcp.fake.echo`` through brokerd, a direct
  ``ClientSession`` ``tools/call`` to the same server in the same sandbox (started by
  this process, mcp/gateway_server.py), and brokerd's ``read_file`` of a 100-byte file.
  Target: the MCP call's p50 at most the direct call's p50 + 1.5 x read_file's p50.

Run: ``python tools/bench_mcp_gateway.py [--calls N]``. Exits 1 when the target is missed
or a check fails.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final

import orjson
import trio

from boxmaker.broker.cgroups import UNBOUNDED
from boxmaker.formats.convert import new_call_id, new_session_id
from boxmaker.home.config import RunnerConfig, workspace_problem
from boxmaker.home.paths import Home
from boxmaker.ledger.records import McpTools, decode_line
from boxmaker.ledger.verify_files import verify_file
from boxmaker.mcp.gateway_launch import server_launch
from boxmaker.mcp.gateway_server import run_server
from boxmaker.mcp.pins import Pin, write_pins
from boxmaker.runtime.ndjson import FrameReader

TARGET_READS: Final = 1.5
START_S: Final = 30.0
FAKE_SERVER: Final = Path(__file__).resolve().parent.parent / "tests" / "fakes" / "mcp_server.py"
NOTES: Final = "Buy milk. Call the plumber about the kitchen tap. Renew the library card.\n"
ECHO: Final = {
    "name": "echo",
    "description": "Echo the text back.",
    "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
}


class BenchFailure(Exception):
    pass


def _python() -> tuple[str, list[str]]:
    system = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    if system.exists():
        return str(system), []
    return os.path.realpath(sys.executable), [sys.base_prefix]


def make_home(scratch: Path) -> Home:
    """A home whose workspace the sandbox can use (as root: an ordinary uid's)."""
    scratch.chmod(0o711)
    workspace = scratch / "ws"
    workspace.mkdir()
    (workspace / "notes.txt").write_text(NOTES)
    if os.geteuid() == 0:
        shutil.chown(workspace, 65534, 65534)
    home = Home(scratch / "home")
    home.create()
    site_packages = next(p for p in site.getsitepackages() if p.startswith(sys.prefix))
    python, extra = _python()
    paths = [site_packages, str(FAKE_SERVER.parent), *extra]
    home.config_toml.write_text(
        f"workspace = {orjson.dumps(str(workspace)).decode()}\n"
        "[mcp_servers.fake]\n"
        f"command = {orjson.dumps(python).decode()}\n"
        f"args = {orjson.dumps([str(FAKE_SERVER)]).decode()}\n"
        f"env = {{ PYTHONPATH = {orjson.dumps(site_packages).decode()} }}\n"
        f"read_only_paths = {orjson.dumps(paths).decode()}\n"
        'label = "internal"\n'
    )
    home.grants_toml.write_text(
        '[[grant]]\nid = "read"\ntool = "read_file"\nmode = "auto"\n\n'
        '[[grant]]\nid = "echo"\ntool = "mcp.fake.echo"\nmode = "auto"\n'
    )
    write_pins(home.mcp_pins, {"fake": {"echo": Pin.of(ECHO)}})
    return home


async def broker_call(home: Home, session: str, tool: str, arguments: dict[str, Any]) -> str:
    call = new_call_id()
    frame = {"kind": "tool_request", "v": 1, "call": call, "session": session, "tool": tool}
    frame["arguments"] = arguments
    stream = await trio.open_unix_socket(str(home.broker_sock))
    async with stream:
        await stream.send_all(orjson.dumps(frame) + b"\n")
        line = await FrameReader(stream).receive_line()
    answer = orjson.loads(line or b"{}")
    if answer.get("outcome") != "ok":
        raise BenchFailure(f"{tool}: not ok: {(line or b'')[:300]!r}")
    return str(answer.get("content"))


async def timed(work: Callable[[], Awaitable[object]]) -> float:
    start = time.perf_counter()
    await work()
    return time.perf_counter() - start


def p50(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.5 * len(ordered)) - 1)]


async def wait_ready(home: Home, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise BenchFailure(f"brokerd exited {process.returncode}")
        if home.broker_sock.exists():
            with contextlib.suppress(OSError):
                (await trio.open_unix_socket(str(home.broker_sock))).socket.close()
                return
        await trio.sleep(0.05)
    raise BenchFailure("brokerd did not start")


def start_brokerd(home: Home) -> subprocess.Popen[bytes]:
    with (home.logs_dir / "bench-brokerd.log").open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "boxmaker.broker.serve", "serve", "--home", str(home.root)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )


async def bench(calls: int) -> bool:
    scratch = Path(tempfile.mkdtemp(prefix="bxmcp-", dir="/tmp"))
    process: subprocess.Popen[bytes] | None = None
    try:
        home = make_home(scratch)
        process = start_brokerd(home)
        await wait_ready(home, process)
        session = new_session_id()
        text = {"text": "ping"}
        first = await timed(lambda: broker_call(home, session, "mcp.fake.echo", text))
        print(f"time to first result (the server started on demand): {first * 1000:.0f} ms")
        from boxmaker.home.config import load_config

        config = load_config(home)
        launch = server_launch(
            "fake",
            config.mcp_servers["fake"],
            workspace=config.workspace,
            runner=RunnerConfig(),
            home_problem=lambda path: workspace_problem(home, path),
            bounded=False,
            environ=os.environ,
        )
        if isinstance(launch, str):
            raise BenchFailure(launch)
        via, direct, reads = [], [], []
        async with trio.open_nursery() as nursery:
            connection = await nursery.start(
                lambda task_status: run_server(
                    "fake",
                    launch,
                    log_path=scratch / "direct.log",
                    bounds=UNBOUNDED,
                    startup_timeout=30,
                    task_status=task_status,
                )
            )
            session_direct = connection.session
            for _ in range(calls):
                via.append(await timed(lambda: broker_call(home, session, "mcp.fake.echo", text)))
                direct.append(await timed(lambda: session_direct.call_tool("echo", text)))
                reads.append(
                    await timed(
                        lambda: broker_call(home, session, "read_file", {"path": "notes.txt"})
                    )
                )
            connection.stop()
        target = p50(direct) + TARGET_READS * p50(reads)
        print(
            f"{calls} calls each, interleaved: MCP echo through brokerd p50 "
            f"{p50(via) * 1000:.2f} ms; "
            f"direct ClientSession p50 {p50(direct) * 1000:.2f} ms; brokerd read_file p50 "
            f"{p50(reads) * 1000:.2f} ms; target {target * 1000:.2f} ms "
            f"({'ok' if p50(via) <= target else 'over target'})"
        )
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
        starts = sum(
            1
            for line in home.audit_log.read_bytes().splitlines()
            if b'"mcp_tools"' in line and isinstance(decode_line(line).body, McpTools)
        )
        print(f"mcp_tools records: {starts} (the warm server was reused)")
        report = verify_file(home.audit_log)
        if not report.sound or starts != 1:
            raise BenchFailure(f"ledger: sound {report.sound}, {starts} starts recorded")
        return p50(via) <= target
    finally:
        if process is not None and process.poll() is None:
            process.kill()
        shutil.rmtree(scratch, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    options = parser.parse_args()
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    try:
        return 0 if trio.run(bench, options.calls) else 1
    except BenchFailure as exc:
        print(f"FAILED: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
