"""What the way out costs a sandboxed command (docs/egress.md, docs/performance.md).

The real programs: brokerd as a process on a fresh home, shell calls on broker.sock, each
in its bubblewrap sandbox with socat on 127.0.0.1:3128, and an HTTPS server on this
machine's loopback (tests/harness/tls_servers.py). One small client (:data:`CLIENT`, run
by the system's python3 with http.client) measures the same work two ways, in alternating
rounds so the machine's load hits both alike: inside a sandbox through brokerd
(``set_tunnel``: a CONNECT, then TLS inside it) and on the host straight to the server
(the baseline, as the sandbox's uid when run as root).

- (a) Connect latency: a new connection until it is open, p50 of each way; the added
  latency is p50(through) - p50(direct): socat, the CONNECT, the connect call's decision
  and its record, the lookup, the dial and the ``200``. Target: at most 5 ms. Printed
  beside it, not held to the target: the same with the TLS handshake and a GET of a
  16-byte file (what the tunnel adds to each byte's way, and the server-name check).
- (b) Bulk: a GET of a 100 MB file, MB/s each way (the same TLS both ways, so what
  differs is the tunnel). Target: through at least 0.5x direct.
- (c) A shell call's start: ``true`` on broker.sock, end to end, with a network grant
  covering the call (its own sandbox with the bridge) against without (today's sandbox),
  interleaved, 50 ms apart. Target: with at most 1.5x without (medians).

Run: ``python tools/bench_egress.py [--only a|b|c] [--connects N] [--rounds N]``.
Exits 1 when a target is missed, 2 when something fails.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import orjson
import trustme

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.harness.tls_servers import Served, https_server, write_ca  # noqa: E402

from boxmaker.broker.sandbox_plan import SANDBOX_ENV, WORKSPACE  # noqa: E402
from boxmaker.formats.convert import new_call_id, new_session_id  # noqa: E402
from boxmaker.home.paths import Home  # noqa: E402
from boxmaker.ledger.verify_files import verify_file  # noqa: E402

ADDED_MS_TARGET: Final = 5.0
BULK_RATIO_TARGET: Final = 0.5
START_RATIO_TARGET: Final = 1.5
BULK_BYTES: Final = 100 * 1000 * 1000
SMALL: Final = b"sixteen bytes..\n"
START_S: Final = 30.0
SPACING: Final = 0.05
SANDBOX_UID: Final = 65534
SYSTEM_PYTHON: Final = "/usr/bin/python3"
NET_TRUE: Final = "true --net"
"""The one ``true`` the network grant covers (its ``commands``); plain ``true`` gets none."""

CLIENT: Final = '''\
"""GET PATH COUNT times on new connections, straight or through $HTTPS_PROXY; print
each one's seconds to an open connection (TCP, or TCP and the CONNECT's 200), seconds in
all (with the TLS handshake and the GET) and bytes as JSON."""
import http.client, json, os, socket, ssl, sys, time, urllib.parse

way, port, path, count, ca = sys.argv[1:]
port, count = int(port), int(count)
context = ssl.create_default_context(cafile=ca)
proxy = urllib.parse.urlsplit(os.environ.get("HTTPS_PROXY", ""))
connect = f"CONNECT localhost:{port} HTTP/1.1\\r\\nHost: localhost:{port}\\r\\n\\r\\n".encode()
taken = []
for _ in range(count):
    started = time.perf_counter()
    if way == "through":
        sock = socket.create_connection((proxy.hostname, proxy.port), timeout=60)
        sock.sendall(connect)
        head = b""
        while not head.endswith(b"\\r\\n\\r\\n"):
            byte = sock.recv(1)
            if not byte:
                sys.exit(f"the proxy closed after {head!r}")
            head += byte
        if not head.startswith(b"HTTP/1.1 200"):
            sys.exit(f"the proxy answered {head!r}")
    else:
        sock = socket.create_connection(("localhost", port), timeout=60)
    opened = time.perf_counter()
    connection = http.client.HTTPSConnection("localhost", port, context=context, timeout=60)
    connection.sock = context.wrap_socket(sock, server_hostname="localhost")
    connection.request("GET", path)
    response = connection.getresponse()
    if response.status != 200:
        sys.exit(f"HTTP {response.status}")
    size = 0
    while chunk := response.read(1 << 16):
        size += len(chunk)
    taken.append([opened - started, time.perf_counter() - started, size])
    connection.close()
print(json.dumps(taken))
'''


class BenchFailure(Exception):
    pass


class Brokerd:
    """brokerd as a process on ``home``; broker.sock spoken with blocking sockets."""

    def __init__(self, home: Home) -> None:
        self.home = home
        self.log = home.logs_dir / "bench-brokerd.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "boxmaker.broker.serve", "serve", "--home", str(home.root)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        deadline = time.monotonic() + START_S
        while not home.broker_sock.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise BenchFailure(f"brokerd did not start; see {self.log}")
            time.sleep(0.05)
        self.session = new_session_id()

    def shell(self, command: str) -> tuple[float, str]:
        """A shell call: its seconds from sending to the answer, and its output."""
        frame = {
            "kind": "tool_request",
            "v": 1,
            "call": new_call_id(),
            "session": self.session,
            "tool": "shell",
            "arguments": {"command": command},
        }
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(600)
            started = time.perf_counter()
            sock.connect(str(self.home.broker_sock))
            sock.sendall(orjson.dumps(frame) + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = sock.recv(1 << 16)
                if not chunk:
                    raise BenchFailure(f"brokerd closed after {data!r}")
                data += chunk
            taken = time.perf_counter() - started
        answer = orjson.loads(data)
        if answer.get("outcome") != "ok":
            raise BenchFailure(f"{command!r}: {answer}")
        return taken, str(answer["content"])

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=START_S)


@contextlib.contextmanager
def prepared() -> Iterator[tuple[Home, Path, Served]]:
    """A home, its workspace (the CA and the client in it) and the server, with a
    16-byte file and a 100 MB one."""
    with tempfile.TemporaryDirectory(prefix="bx-bench-egress-", dir="/tmp") as scratch:
        base = Path(scratch)
        base.chmod(0o711)
        workspace, site = base / "ws", base / "site"
        workspace.mkdir()
        site.mkdir()
        if os.geteuid() == 0:
            os.chown(workspace, SANDBOX_UID, SANDBOX_UID)
        (site / "small.txt").write_bytes(SMALL)
        with (site / "bulk.bin").open("wb") as bulk:
            bulk.truncate(BULK_BYTES)
        (workspace / "client.py").write_text(CLIENT)
        ca = trustme.CA()
        write_ca(ca, workspace / "ca.pem")
        home = Home(base / "home")
        home.create()
        with https_server(site, ca) as served:
            yield home, workspace, served


def configure(home: Home, workspace: Path, port: int) -> None:
    """Both grants hold in an untrusted session too: every connection's result makes
    the session untrusted, and the bench measures the path, not that policy."""
    home.config_toml.write_text(f"workspace = {str(workspace)!r}\n[runner]\nshell_timeout = 600\n")
    hosts = orjson.dumps([f"localhost:{port}", f"127.0.0.1:{port}"]).decode()
    home.grants_toml.write_text(
        '[[grant]]\nid = "sh"\ntool = "shell"\nmode = "auto"\nif_untrusted = "auto"\n'
        '[[grant]]\nid = "local"\ntool = "connect"\nmode = "auto"\n'
        f'hosts = {hosts}\nvia = ["shell"]\nif_untrusted = "auto"\n'
        f'commands = ["{SYSTEM_PYTHON} client.py *", "{NET_TRUE}"]\n'
    )


def client_argv(way: str, port: int, path: str, count: int, workspace: str) -> list[str]:
    return [SYSTEM_PYTHON, "client.py", way, str(port), path, str(count), f"{workspace}/ca.pem"]


def measured(brokerd: Brokerd, workspace: Path, port: int, path: str, count: int) -> dict[str, Any]:
    """``count`` GETs of ``path`` each way: {way: [[seconds to open, seconds, bytes], ...]}."""
    through = " ".join(client_argv("through", port, path, count, WORKSPACE))
    _, output = brokerd.shell(through)
    user = ["setpriv", f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups"]
    direct = subprocess.run(
        [*(user if os.geteuid() == 0 else []), *client_argv("direct", port, path, count, ".")],
        env={**SANDBOX_ENV, "HOME": str(workspace)},
        cwd=workspace,
        capture_output=True,
        check=False,
        timeout=600,
    )
    if direct.returncode != 0:
        raise BenchFailure(f"the direct client failed: {direct.stderr.decode()}")
    return {"through": orjson.loads(output), "direct": orjson.loads(direct.stdout)}


def bench_connects(brokerd: Brokerd, workspace: Path, port: int, rounds: int, n: int) -> bool:
    opening: dict[str, list[float]] = {"through": [], "direct": []}
    whole: dict[str, list[float]] = {"through": [], "direct": []}
    measured(brokerd, workspace, port, "/small.txt", 5)  # warm both ways up
    for _ in range(rounds):
        for way, taken in measured(brokerd, workspace, port, "/small.txt", n).items():
            complete = [(opened, seconds) for opened, seconds, size in taken if size == len(SMALL)]
            opening[way] += [opened for opened, _ in complete]
            whole[way] += [seconds for _, seconds in complete]
    if len(whole["through"]) != rounds * n or len(whole["direct"]) != rounds * n:
        raise BenchFailure("a GET came back short")
    direct, through = (statistics.median(opening[way]) * 1000 for way in ("direct", "through"))
    added = through - direct
    print(
        f"(a) a new connection, {rounds * n} each way: direct (TCP) p50 {direct:.2f} ms, "
        f"through brokerd (TCP, CONNECT, the decision and its record, the lookup, the dial, "
        f"200) p50 {through:.2f} ms: added {added:.2f} ms (target <= {ADDED_MS_TARGET:g} ms): "
        f"{'ok' if added <= ADDED_MS_TARGET else 'over target'}"
    )
    direct_all, through_all = (
        statistics.median(whole[way]) * 1000 for way in ("direct", "through")
    )
    print(
        f"    with the TLS handshake and a GET of 16 bytes: direct p50 {direct_all:.2f} ms, "
        f"through brokerd p50 {through_all:.2f} ms: added {through_all - direct_all:.2f} ms"
    )
    return added <= ADDED_MS_TARGET


def bench_bulk(brokerd: Brokerd, workspace: Path, port: int, rounds: int) -> bool:
    rates: dict[str, list[float]] = {"through": [], "direct": []}
    for _ in range(rounds):
        for way, [[_, seconds, size]] in measured(brokerd, workspace, port, "/bulk.bin", 1).items():
            if size != BULK_BYTES:
                raise BenchFailure(f"{way}: {size} bytes of {BULK_BYTES}")
            rates[way].append(size / seconds / 1e6)
    direct, through = (statistics.median(rates[way]) for way in ("direct", "through"))
    ratio = through / direct
    print(
        f"(b) GET of 100 MB, {rounds} each way: direct {direct:.0f} MB/s, through brokerd "
        f"{through:.0f} MB/s: {ratio:.2f}x (target >= {BULK_RATIO_TARGET:g}x): "
        f"{'ok' if ratio >= BULK_RATIO_TARGET else 'under target'}"
    )
    return ratio >= BULK_RATIO_TARGET


def bench_start(brokerd: Brokerd, runs: int) -> bool:
    times: dict[str, list[float]] = {"true": [], NET_TRUE: []}
    for command in times:  # the first of each sets things going
        brokerd.shell(command)
    for _ in range(runs):
        for command, taken in times.items():
            time.sleep(SPACING)
            taken.append(brokerd.shell(command)[0])
    without, with_net = (statistics.median(times[c]) * 1000 for c in ("true", NET_TRUE))
    ratio = with_net / without
    verdict = "ok" if ratio <= START_RATIO_TARGET else "over target"
    print(
        f"(c) shell 'true' on broker.sock, {runs} each: without a network grant median "
        f"{without:.2f} ms, with one {with_net:.2f} ms: {ratio:.2f}x "
        f"(target <= {START_RATIO_TARGET:g}x): {verdict}"
    )
    return ratio <= START_RATIO_TARGET


def run(options: argparse.Namespace) -> list[bool]:
    """Each part asked for: whether it met its target."""
    met = []
    with prepared() as (home, workspace, served):
        configure(home, workspace, served.port)
        brokerd = Brokerd(home)
        try:
            if options.only in (None, "a"):
                met.append(
                    bench_connects(
                        brokerd, workspace, served.port, options.rounds, options.connects
                    )
                )
            if options.only in (None, "b"):
                met.append(bench_bulk(brokerd, workspace, served.port, options.rounds))
            if options.only in (None, "c"):
                met.append(bench_start(brokerd, options.starts))
        finally:
            brokerd.stop()
        report = verify_file(home.audit_log)
        if not report.sound:
            raise BenchFailure(f"the ledger does not verify: {report.problems}")
    return met


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("a", "b", "c"))
    parser.add_argument("--connects", type=int, default=40, help="(a) GETs per round and way")
    parser.add_argument("--rounds", type=int, default=5, help="(a) and (b) rounds")
    parser.add_argument("--starts", type=int, default=30, help="(c) calls each way")
    options = parser.parse_args()
    missing = [tool for tool in ("bwrap", "socat") if shutil.which(tool) is None]
    if missing or not Path(SYSTEM_PYTHON).exists():
        sys.exit(f"needs {', '.join(missing) or SYSTEM_PYTHON}: nothing to measure")
    try:
        met = run(options)
    except BenchFailure as failure:
        print(f"bench_egress: {failure}", file=sys.stderr)
        sys.exit(2)
    sys.exit(0 if all(met) else 1)


if __name__ == "__main__":
    main()
