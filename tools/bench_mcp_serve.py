"""What ``bxctl mcp serve`` adds to a call (docs/performance.md, "bxctl mcp serve").

The real brokerd as a process on a fresh home in /tmp (auto grant, ``read_file`` of a
~100-byte file, durable ledger, as tools/bench_broker.py part a), and ``bxctl mcp serve``
as a process started by the MCP SDK's own ``stdio_client``, with its ``ClientSession`` in
this process. Calls interleaved, alternating which goes first, so drift hits both alike:

- brokerd's own: one ``tool_request`` on broker.sock (connect, send, answer), as loopd
  makes it;
- through the serve: ``tools/call read_file`` over stdio; the serve makes the same
  request on broker.sock and answers a text result.

Each answer must be the file's content; the ledger must verify at the end.
Target: the serve's p50 at most brokerd's p50 + 2 ms.

Run: ``python tools/bench_mcp_serve.py [--calls N]``. Exits 1 when the target is missed
or a check fails.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from typing import Final

import mcp_types as types
import trio
from bench_broker import (
    NOTES,
    BenchFailure,
    broker_call,
    check_ledger,
    daemon_on,
    machine_line,
    make_home,
    percentile,
    timed,
    verdict,
)
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from boxmaker.formats.convert import new_session_id

ADDED_TARGET_S: Final = 0.002
WARM_CALLS: Final = 20


async def serve_call(client: ClientSession) -> None:
    """One ``read_file`` through the serve; it must be the file's text."""
    result = await client.call_tool("read_file", {"path": "notes.txt"})
    [content] = result.content
    if result.is_error or not isinstance(content, types.TextContent) or content.text != NOTES:
        raise BenchFailure(f"the serve's answer is not the file: {result!r:.300}")


async def run(calls: int) -> bool:
    print("one client, auto grant, read_file of notes.txt, durable ledger")
    print("    brokerd and bxctl mcp serve: separate processes; the MCP client in this one")
    home = make_home("m", "auto")
    serve = StdioServerParameters(
        command=sys.executable,
        args=["-m", "boxmaker.cli.app", "mcp", "serve", "--home", str(home.root)],
    )
    direct: list[float] = []
    through: list[float] = []
    try:
        with daemon_on(home) as daemon, tempfile.TemporaryFile("w+") as serve_log:
            await daemon.wait_ready()
            path, session = str(home.broker_sock), new_session_id()
            async with (
                stdio_client(serve, errlog=serve_log) as streams,
                ClientSession(*streams) as client,
            ):
                await client.initialize()
                for _ in range(WARM_CALLS):
                    await broker_call(path, session)
                    await serve_call(client)
                for i in range(calls):
                    if i % 2:
                        through.append(await timed(lambda: serve_call(client)))
                        direct.append(await timed(lambda: broker_call(path, session)))
                    else:
                        direct.append(await timed(lambda: broker_call(path, session)))
                        through.append(await timed(lambda: serve_call(client)))
            code = await daemon.stop()
        if code != 0:
            raise BenchFailure(f"brokerd exited {code} after SIGTERM")
        check_ledger(home)
    finally:
        shutil.rmtree(home.root, ignore_errors=True)
    direct50, direct99 = percentile(direct, 0.5), percentile(direct, 0.99)
    through50, through99 = percentile(through, 0.5), percentile(through, 0.99)
    print(f"  brokerd's own call:      p50 {direct50 * 1e3:.3f} ms  p99 {direct99 * 1e3:.3f} ms")
    print(f"  through bxctl mcp serve: p50 {through50 * 1e3:.3f} ms  p99 {through99 * 1e3:.3f} ms")
    added = through50 - direct50
    ok = added <= ADDED_TARGET_S
    print(
        f"  the serve adds {added * 1e3:.3f} ms at p50 "
        f"(target <= {ADDED_TARGET_S * 1e3:g} ms): {verdict(ok)}"
    )
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000, help="calls each way")
    options = parser.parse_args()
    print(machine_line())
    try:
        ok = trio.run(run, options.calls)
    except BenchFailure as exc:
        print(f"FAILED: {exc}")
        return 1
    print(machine_line())
    print("all targets met" if ok else "a target was missed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
