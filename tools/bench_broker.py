"""What brokerd costs per call, under load, and in memory (docs/performance.md).

Every part runs the real brokerd as a separate process
(``python -m boxmaker.broker.serve serve --home H``, its log in ``H/logs``) on a fresh
home in /tmp, and speaks broker.sock from this process with trio, one connection per
call, as loopd does. Each answer must be ``ok`` with the file's content (or ``pending``
for the asks of part d); each ledger must verify at the end.

- (a) one client, auto grant, ``read_file`` of a ~100-byte file, durable ledger: p50 and
  p99 per call, next to a baseline measured in the same run, interleaved call by call: a
  bare trio echo server on a Unix socket in this process; per request: connect, send a
  ~200-byte line, the server appends 300 bytes and fsyncs twice (each through
  ``trio.to_thread.run_sync``, as the ledger writer does), answers a line, closes.
  Target: p50 at most 2x the baseline's p50.
- (b) 32 concurrent clients, each making sequential calls: calls/s, as a ratio to the
  same 32-client load on the bare server, run in alternating rounds. Target: at least
  1.25x (the lowest ratio of the runs before the call machine; machines here differ
  2-3x in speed, so the absolute rate, once the target, is reported only).
- (d) 10,000 calls pending on an ``ask`` grant, each an open connection: brokerd's RSS
  (``VmRSS`` of its process), next to its idle RSS before them. Target: at most 100 MB.
  Then its CPU while they wait, idle, over 10 s (utime + stime of /proc/PID/stat).
  Target: at most 2% of a core. Then SIGTERM: every call must be answered
  ``broker_stopping`` and brokerd exit 0.

Run: ``python tools/bench_broker.py [--only a|b|d] [--calls N] [--pendings N]``.
Exits 1 when a target is missed or a check fails.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import math
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, Final

import attrs
import orjson
import trio

from boxmaker.formats.convert import new_call_id, new_session_id
from boxmaker.home.paths import Home
from boxmaker.ledger.verify_files import verify_file
from boxmaker.runtime.ndjson import FrameReader

LATENCY_TARGET: Final = 2.0
THROUGHPUT_TARGET: Final = 1500.0
"""calls/s, reported only (the target is the ratio below)."""
THROUGHPUT_RATIO_TARGET: Final = 1.25
IDLE_CPU_TARGET: Final = 0.02
"""Of one core, with every pending call waiting and nothing happening."""
IDLE_CPU_S: Final = 10.0
RSS_TARGET_MB: Final = 100.0
CLIENTS: Final = 32
NOTES: Final = (
    "Buy milk. Call the plumber about the kitchen tap. Renew the library card by Friday.\n"
)
BASELINE_RECORD: Final = b"x" * 299 + b"\n"
BASELINE_ANSWER: Final = b'{"kind":"answer","final":true,"outcome":"ok"}\n'
START_S: Final = 30.0
STOP_S: Final = 60.0
SETUP_PARALLEL: Final = 64
"""Part d opens its connections this many at a time (brokerd listens with backlog 128)."""
OPEN_S: Final = 75.0
"""Part d stops opening pending calls after this long (the run must stay bounded)."""
FD_MARGIN: Final = 64


class Held:
    """A pending call's open connection (part d)."""

    def __init__(self, stream: trio.SocketStream, reader: FrameReader, call: str) -> None:
        self.stream = stream
        self.reader = reader
        self.call = call
        self.pending = False


class BenchFailure(Exception):
    """Something that must hold did not: the run is void, exit 1."""


# ---------------------------------------------------------------------------------------
# Homes, brokerd as a process


def make_home(tag: str, mode: str) -> Home:
    """A fresh home with a short path (AF_UNIX paths are capped at 107 bytes)."""
    home = Home(Path(tempfile.mkdtemp(prefix=f"bxb{tag}-", dir="/tmp")))
    home.create()
    home.config_toml.write_text("[broker]\npending_timeout = 600.0\n", encoding="utf-8")
    home.grants_toml.write_text(
        f'[[grant]]\nid = "read-notes"\ntool = "read_file"\nmode = "{mode}"\n', encoding="utf-8"
    )
    (home.default_workspace / "notes.txt").write_text(NOTES, encoding="utf-8")
    return home


def tool_request(call: str, session: str) -> bytes:
    frame = {
        "kind": "tool_request",
        "v": 1,
        "call": call,
        "session": session,
        "tool": "read_file",
        "arguments": {"path": "notes.txt"},
    }
    return orjson.dumps(frame) + b"\n"


class Daemon:
    """brokerd in its own process, so its CPU and memory are its own."""

    def __init__(self, home: Home) -> None:
        self.home = home
        self.log_path = home.logs_dir / "bench-brokerd.log"
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "boxmaker.broker.serve", "serve", "--home", str(home.root)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self, lines: int = 5) -> str:
        text = self.log_path.read_text(encoding="utf-8", errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    async def wait_ready(self) -> None:
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BenchFailure(f"brokerd exited {self.process.returncode}: {self.log_tail()}")
            with contextlib.suppress(OSError, trio.BrokenResourceError):
                if (await admin(self.home, {"kind": "status"})).get("kind") == "status":
                    return
            await trio.sleep(0.05)
        raise BenchFailure(f"brokerd did not become ready within {START_S:g} s")

    def status_kb(self, field: str) -> int:
        """A ``/proc/PID/status`` figure in kB (VmRSS, VmHWM)."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise BenchFailure(f"no {field} in /proc/{self.pid}/status")

    def threads(self) -> int:
        return self.status_kb("Threads")

    def open_fds(self) -> int:
        return sum(1 for _ in Path(f"/proc/{self.pid}/fd").iterdir())

    def cpu_s(self) -> float:
        """User + system CPU seconds of brokerd, all its threads."""
        return proc_cpu_s(self.pid)

    def main_thread_cpu_s(self) -> float:
        """The same for its main thread alone: the trio loop (the rest is worker threads)."""
        return proc_cpu_s(self.pid, f"task/{self.pid}/")

    async def stop(self) -> int:
        """SIGTERM, then its exit status (the clean stop, docs/runbook.md)."""
        self.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_S
        while self.process.poll() is None:
            if time.monotonic() > deadline:
                self.process.kill()
                raise BenchFailure(f"brokerd did not stop within {STOP_S:g} s of SIGTERM")
            await trio.sleep(0.05)
        return self.process.returncode

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def proc_cpu_s(pid: int, task: str = "") -> float:
    data = Path(f"/proc/{pid}/{task}stat").read_text()
    fields = data[data.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@contextlib.contextmanager
def daemon_on(home: Home) -> Iterator[Daemon]:
    daemon = Daemon(home)
    try:
        yield daemon
    finally:
        daemon.kill()


async def admin(home: Home, frame: dict[str, Any]) -> dict[str, Any]:
    stream = await trio.open_unix_socket(str(home.admin_sock))
    async with stream:
        await stream.send_all(orjson.dumps(frame) + b"\n")
        line = await FrameReader(stream).receive_line()
    if line is None:
        raise BenchFailure("admin.sock closed without an answer")
    answer: dict[str, Any] = orjson.loads(line)
    return answer


def check_ledger(home: Home) -> None:
    report = verify_file(home.audit_log)
    if not report.sound:
        raise BenchFailure(f"{home.audit_log}: the ledger does not verify: {report.problems[0]}")
    counts = ", ".join(f"{k} {v}" for k, v in attrs.asdict(report.calls).items() if v)
    print(f"  ledger {home.audit_log}: sound, {report.records} records ({counts})")


# ---------------------------------------------------------------------------------------
# One call each way


async def broker_call(path: str, session: str) -> None:
    """One tool request on broker.sock; its answer must be ok with the file's content."""
    call = new_call_id()
    stream = await trio.open_unix_socket(path)
    async with stream:
        await stream.send_all(tool_request(call, session))
        line = await FrameReader(stream).receive_line()
    if line is None:
        raise BenchFailure(f"call {call}: brokerd closed without an answer")
    answer = orjson.loads(line)
    if answer.get("outcome") != "ok" or answer.get("call") != call:
        raise BenchFailure(f"call {call}: not ok: {line[:300]!r}")
    if answer.get("content") != NOTES:
        raise BenchFailure(f"call {call}: wrong content: {answer.get('content')!r:.100}")


class Baseline:
    """A bare trio Unix-socket server: read a line, append 300 bytes and fsync, twice
    (each in a worker thread, as the ledger writer does), answer a line, close."""

    def __init__(self, scratch: Path) -> None:
        directory = Path(tempfile.mkdtemp(prefix="bare-", dir=scratch))
        self.path = str(directory / "bare.sock")
        self.fd = os.open(
            directory / "bare.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600
        )
        # About the size of a tool request frame.
        self.request = orjson.dumps({"kind": "echo", "pad": "p" * 170}) + b"\n"

    def close(self) -> None:
        os.close(self.fd)

    def _append(self) -> None:
        os.write(self.fd, BASELINE_RECORD)
        os.fsync(self.fd)

    async def _handle(self, stream: trio.SocketStream) -> None:
        async with stream:
            line = await FrameReader(stream).receive_line()
            if line is None:
                return
            await trio.to_thread.run_sync(self._append)
            await trio.to_thread.run_sync(self._append)
            await stream.send_all(BASELINE_ANSWER)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await sock.bind(self.path)
        sock.listen(128)
        listener = trio.SocketListener(sock)
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, self._handle, [listener])
            task_status.started()

    async def call(self) -> None:
        stream = await trio.open_unix_socket(self.path)
        async with stream:
            await stream.send_all(self.request)
            line = await FrameReader(stream).receive_line()
        if line != BASELINE_ANSWER[:-1]:
            raise BenchFailure(f"bare server: unexpected answer {line!r}")


async def timed(work: Callable[[], Awaitable[None]]) -> float:
    start = time.perf_counter()
    await work()
    return time.perf_counter() - start


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def verdict(ok: bool) -> str:
    return "ok" if ok else "over target"


def machine_line() -> str:
    one, five, _ = os.getloadavg()
    return f"machine: {os.cpu_count()} CPUs, load average {one:.2f} (1 min) {five:.2f} (5 min)"


# ---------------------------------------------------------------------------------------
# (a) latency


async def part_a(calls: int, scratch: Path) -> bool:
    print("(a) one client, auto grant, read_file of notes.txt, durable ledger")
    print("    brokerd: a separate process; baseline: bare trio server in this process")
    home = make_home("a", "auto")
    baseline = Baseline(scratch)
    try:
        with daemon_on(home) as daemon:
            await daemon.wait_ready()
            path, session = str(home.broker_sock), new_session_id()
            bare: list[float] = []
            broker: list[float] = []
            async with trio.open_nursery() as nursery:
                await nursery.start(baseline.serve)
                for _ in range(20):  # warm both: imports, the session's state file
                    await broker_call(path, session)
                    await baseline.call()
                cpu0, main0, mine0 = daemon.cpu_s(), daemon.main_thread_cpu_s(), self_cpu_s()
                for i in range(calls):
                    # Interleaved, alternating which goes first, so drift hits both alike.
                    if i % 2:
                        bare.append(await timed(baseline.call))
                        broker.append(await timed(lambda: broker_call(path, session)))
                    else:
                        broker.append(await timed(lambda: broker_call(path, session)))
                        bare.append(await timed(baseline.call))
                cpu = daemon.cpu_s() - cpu0
                main = daemon.main_thread_cpu_s() - main0
                mine = self_cpu_s() - mine0
                nursery.cancel_scope.cancel()
            code = await daemon.stop()
        if code != 0:
            raise BenchFailure(f"brokerd exited {code} after SIGTERM")
        check_ledger(home)
    finally:
        baseline.close()
        shutil.rmtree(home.root, ignore_errors=True)
    bare50, bare99 = percentile(bare, 0.5), percentile(bare, 0.99)
    call50, call99 = percentile(broker, 0.5), percentile(broker, 0.99)
    ratio = call50 / bare50
    print(f"  bare round trip + 2 fsyncs: p50 {bare50 * 1e3:.3f} ms  p99 {bare99 * 1e3:.3f} ms")
    print(f"  brokerd read_file call:     p50 {call50 * 1e3:.3f} ms  p99 {call99 * 1e3:.3f} ms")
    print(f"  ({calls} each; brokerd CPU {cpu / calls * 1e3:.3f} ms a call,", end=" ")
    print(f"{main / calls * 1e3:.3f} ms of it in its trio thread;", end=" ")
    print(f"this process {mine / calls / 2 * 1e3:.3f} ms a request)")
    ok = ratio <= LATENCY_TARGET
    print(f"  p50 ratio {ratio:.2f}x (target <= {LATENCY_TARGET:g}x): {verdict(ok)}")
    return ok


# ---------------------------------------------------------------------------------------
# (b) throughput


async def clients_round(
    work: Callable[[int], Awaitable[None]], clients: int, per_client: int
) -> float:
    """``clients`` tasks, each doing ``per_client`` sequential calls; the elapsed time."""

    async def one(index: int) -> None:
        for _ in range(per_client):
            await work(index)

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for index in range(clients):
            nursery.start_soon(one, index)
    return time.perf_counter() - start


async def part_b(calls: int, scratch: Path) -> bool:
    rounds, per_round = 4, max(1, calls // 4 // CLIENTS)
    total = rounds * per_round * CLIENTS
    print(f"(b) {CLIENTS} concurrent clients, sequential calls each, a new connection per call")
    print("    brokerd: a separate process; bare server rounds alternate with brokerd's")
    home = make_home("b", "auto")
    baseline = Baseline(scratch)
    broker_s = bare_s = cpu = main = mine = 0.0
    per_round_rates: list[str] = []
    try:
        with daemon_on(home) as daemon:
            await daemon.wait_ready()
            path = str(home.broker_sock)
            sessions = [new_session_id() for _ in range(CLIENTS)]

            async def broker_work(index: int) -> None:
                await broker_call(path, sessions[index])

            async def bare_work(_: int) -> None:
                await baseline.call()

            async with trio.open_nursery() as nursery:
                await nursery.start(baseline.serve)
                await clients_round(broker_work, CLIENTS, 3)  # warm, state files written
                await clients_round(bare_work, CLIENTS, 3)
                for _ in range(rounds):
                    cpu0, main0 = daemon.cpu_s(), daemon.main_thread_cpu_s()
                    mine0 = self_cpu_s()
                    elapsed = await clients_round(broker_work, CLIENTS, per_round)
                    cpu += daemon.cpu_s() - cpu0
                    main += daemon.main_thread_cpu_s() - main0
                    mine += self_cpu_s() - mine0
                    broker_s += elapsed
                    per_round_rates.append(f"{per_round * CLIENTS / elapsed:,.0f}")
                    bare_s += await clients_round(bare_work, CLIENTS, per_round)
                nursery.cancel_scope.cancel()
            code = await daemon.stop()
        if code != 0:
            raise BenchFailure(f"brokerd exited {code} after SIGTERM")
        check_ledger(home)
    finally:
        baseline.close()
        shutil.rmtree(home.root, ignore_errors=True)
    rate, bare_rate = total / broker_s, total / bare_s
    print(f"  bare round trip + 2 fsyncs: {bare_rate:,.0f} requests/s")
    print(f"  brokerd read_file calls:    {rate:,.0f} calls/s ({total} calls;", end=" ")
    print(f"rounds {', '.join(per_round_rates)}/s)")
    print(f"  CPU a call: brokerd {cpu / total * 1e3:.3f} ms,", end=" ")
    print(f"{main / total * 1e3:.3f} ms of it in its one trio thread", end=" ")
    print(f"(that thread caps it near {total / main:,.0f} calls/s);", end=" ")
    print(f"clients {mine / total * 1e3:.3f} ms")
    ratio = rate / bare_rate
    ok = ratio >= THROUGHPUT_RATIO_TARGET
    print(
        f"  {rate:,.0f} calls/s (>= {THROUGHPUT_TARGET:,.0f}/s on the reference machine:", end=" "
    )
    print(f"{'met' if rate >= THROUGHPUT_TARGET else 'not met'}, reported)")
    print(f"  ratio to the bare server {ratio:.2f}x", end=" ")
    print(f"(target >= {THROUGHPUT_RATIO_TARGET:g}x): {verdict(ok)}")
    return ok


# ---------------------------------------------------------------------------------------
# (d) memory with pending approvals


def raise_fd_limit(want: int) -> int:
    """The soft RLIMIT_NOFILE up to the hard one, or to ``want`` where we may raise the
    hard limit too (CAP_SYS_RESOURCE); brokerd inherits it. The soft limit in force."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < want:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))
            return want
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return want if hard == resource.RLIM_INFINITY else hard


async def open_pending(
    path: str, session: str, index: int, limiter: trio.CapacityLimiter, held: list[Held]
) -> None:
    """One ask call, left waiting for the owner: connect, request, read ``pending``."""
    call = new_call_id()
    async with limiter:
        stream = await trio.open_unix_socket(path)
        entry = Held(stream, FrameReader(stream), call)
        held.append(entry)
        await stream.send_all(tool_request(call, session))
        line = await entry.reader.receive_line()
    if line is None:
        raise BenchFailure(f"call {call} (#{index}): brokerd closed without a pending frame")
    frame = orjson.loads(line)
    if frame.get("kind") != "pending" or frame.get("call") != call:
        raise BenchFailure(f"call {call}: expected pending, got {line[:300]!r}")
    entry.pending = True


async def final_answer(entry: Held, outcomes: collections.Counter[str]) -> None:
    """After SIGTERM: the one final frame of a pending call."""
    async with entry.stream:
        try:
            line = await entry.reader.receive_line()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            line = None
    if line is None:
        outcomes["closed without an answer"] += 1
        return
    answer = orjson.loads(line)
    outcomes[f"{answer.get('outcome')} {answer.get('reason')}"] += 1


async def part_d(count: int) -> bool:
    print(f"(d) brokerd RSS with {count:,} pending approvals (ask grant, one connection each)")
    # brokerd holds one descriptor per pending call (its connection; the look peeks on
    # that same descriptor), plus a few of its own; this process one per call.
    hard_before = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    limit = raise_fd_limit(count + FD_MARGIN)
    fit = min(count, limit - FD_MARGIN)
    print(
        f"    RLIMIT_NOFILE hard limit {hard_before}, now {limit} (brokerd inherits it);", end=" "
    )
    print(f"brokerd needs 1 a pending call, ~{count + FD_MARGIN:,} in all")
    if fit < count:
        print(f"    NOTE: {count:,} pending calls do not fit in {limit} descriptors;", end=" ")
        print(f"measuring {fit:,} and scaling the growth linearly to {count:,}")
    home = make_home("d", "ask")
    held: list[Held] = []
    try:
        with daemon_on(home) as daemon:
            await daemon.wait_ready()
            await trio.sleep(1.0)
            idle_kb = daemon.status_kb("VmRSS")
            path = str(home.broker_sock)
            sessions = [new_session_id() for _ in range(max(1, fit // 100))]
            limiter = trio.CapacityLimiter(SETUP_PARALLEL)
            start = time.perf_counter()
            with trio.move_on_after(OPEN_S):
                async with trio.open_nursery() as nursery:
                    for index in range(fit):
                        session = sessions[index % len(sessions)]
                        nursery.start_soon(open_pending, path, session, index, limiter, held)
            opened_s = time.perf_counter() - start
            opened = sum(1 for entry in held if entry.pending)
            status = await admin(home, {"kind": "status"})
            if opened == fit and status.get("pending") != opened:
                raise BenchFailure(f"brokerd reports {status.get('pending')} pending, not {opened}")
            await trio.sleep(2.0)
            cpu0 = daemon.cpu_s()
            await trio.sleep(IDLE_CPU_S)
            idle_cpu = (daemon.cpu_s() - cpu0) / IDLE_CPU_S
            rss_kb, hwm_kb = daemon.status_kb("VmRSS"), daemon.status_kb("VmHWM")
            fds, threads = daemon.open_fds(), daemon.threads()

            # Stop: every pending call must be answered broker_stopping, then exit 0.
            outcomes: collections.Counter[str] = collections.Counter()
            codes: list[int] = []

            async def stop() -> None:
                codes.append(await daemon.stop())

            stop_start = time.perf_counter()
            with trio.fail_after(STOP_S + 10):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(stop)
                    for entry in held:
                        nursery.start_soon(final_answer, entry, outcomes)
            connected = len(held)
            held.clear()
            stop_s = time.perf_counter() - stop_start
        if codes != [0]:
            raise BenchFailure(f"brokerd exited {codes} after SIGTERM: {daemon.log_tail()}")
        check_ledger(home)
    finally:
        for entry in held:
            entry.stream.socket.close()
        shutil.rmtree(home.root, ignore_errors=True)
    mib = 1024.0
    per_call_kb = (rss_kb - idle_kb) / max(1, opened)
    at_count_kb = idle_kb + per_call_kb * count
    print(f"  idle brokerd RSS:          {idle_kb / mib:7.1f} MB")
    print(f"  with {opened:,} pending: {rss_kb / mib:7.1f} MB", end=" ")
    print(f"(peak {hwm_kb / mib:.1f} MB; {per_call_kb:.1f} KiB a pending call;", end=" ")
    print(f"{fds:,} fds, {threads} threads)")
    print(f"  opened in {opened_s:.1f} s ({opened / opened_s:,.0f}/s);", end=" ")
    print(f"brokerd CPU while they wait ({IDLE_CPU_S:g} s idle):", end=" ")
    print(f"{idle_cpu * 100:.2f}% of a core (target <= {IDLE_CPU_TARGET * 100:g}%):", end=" ")
    cpu_ok = idle_cpu <= IDLE_CPU_TARGET
    print(verdict(cpu_ok))
    answered = ", ".join(f"{n} {what}" for what, n in sorted(outcomes.items()))
    print(f"  SIGTERM: brokerd exited 0 in {stop_s:.1f} s; the calls: {answered}")
    if outcomes.get("denied broker_stopping", 0) != connected and opened == fit:
        raise BenchFailure(f"not every pending call was answered broker_stopping: {answered}")
    held_ok = opened == count
    if not held_ok:
        why = "the fd limit" if opened == fit else f"not opened within {OPEN_S:g} s"
        print(f"  held {opened:,} of {count:,} pending calls ({why}): over target")
    figure = "" if held_ok else f" scaled to {count:,}"
    rss_ok = at_count_kb / mib <= RSS_TARGET_MB
    print(f"  RSS{figure} {at_count_kb / mib:.1f} MB", end=" ")
    print(f"(target <= {RSS_TARGET_MB:g} MB): {verdict(rss_ok)}")
    return held_ok and rss_ok and cpu_ok


# ---------------------------------------------------------------------------------------


async def run(parts: str, calls: int, pendings: int) -> bool:
    results: list[bool] = []
    with tempfile.TemporaryDirectory(prefix="bxb-", dir="/tmp") as scratch:
        if "a" in parts:
            results.append(await part_a(calls, Path(scratch)))
            print(machine_line())
        if "b" in parts:
            results.append(await part_b(calls * 8, Path(scratch)))
            print(machine_line())
        if "d" in parts:
            results.append(await part_d(pendings))
            print(machine_line())
    return all(results)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["a", "b", "d"], help="run one part")
    parser.add_argument(
        "--calls", type=int, default=1000, help="(a): calls each way; (b): 8x this in all"
    )
    parser.add_argument("--pendings", type=int, default=10_000, help="(d): pending calls")
    options = parser.parse_args()
    print(machine_line())
    try:
        ok = trio.run(run, options.only or "abd", options.calls, options.pendings)
    except BenchFailure as exc:
        print(f"FAILED: {exc}")
        return 1
    print("all targets met" if ok else "a target was missed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
