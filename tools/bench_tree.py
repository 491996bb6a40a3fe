"""What the ledger's Merkle tree and its checkpoints cost (docs/performance.md).

- (m) the append cost per record, in this process: ``LedgerTree.add`` of 100,000 lines of
  a decision record's size (a leaf hash and the frontier's node hashes: what the writer
  does per commit), and a flush of their hashes to the tiles (what a checkpoint adds,
  per record it covers). Reported only.
- (p) brokerd's p50 per call with the tree and its checkpoints (as it runs) against
  brokerd without them (the same code, its tree and key turned off in the process), in
  the same run: two brokerd processes on two fresh homes, one client, ``read_file`` on
  an auto grant, calls interleaved one by one, alternating which goes first (as
  tools/bench_broker.py's part a). Both ledgers must verify; the one with the tree
  must end with a checkpoint. Target: the p50 ratio at most 1.10 (no change beyond
  the noise of a shared machine).

Run: ``python tools/bench_tree.py [--calls N]``. Exits 1 when a target is missed or a
check fails.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import orjson
import trio
from bench_broker import (
    BenchFailure,
    Daemon,
    broker_call,
    check_ledger,
    daemon_on,
    machine_line,
    make_home,
    percentile,
    timed,
    verdict,
)

from boxmaker.formats.convert import new_session_id
from boxmaker.home.paths import Home
from boxmaker.ledger.tree import LedgerTree

RATIO_TARGET: Final = 1.10
APPEND_LINES: Final = 100_000
WITHOUT_TREE: Final = (
    "import boxmaker.broker.serve as serve\n"
    "serve._signed = lambda home, tail: None  # no key, no tree: no checkpoints\n"
    "serve.main()\n"
)


class DaemonWithoutTree(Daemon):
    """brokerd as :class:`Daemon` runs it, its ledger writer given no tree."""

    def __init__(self, home: Home) -> None:
        self.home = home
        self.log_path = home.logs_dir / "bench-brokerd.log"
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-c", WITHOUT_TREE, "serve", "--home", str(home.root)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )


def decision_line(seq: int) -> bytes:
    """A line the size of a read_file decision record."""
    return orjson.dumps(
        {
            "arguments": {"path": "notes.txt"},
            "at": "2026-03-04T05:06:07.890Z",
            "boot": "b-0123456789abcdef",
            "call": f"c-{seq:016x}",
            "grant": "read-notes",
            "kind": "decision",
            "prev": "ab" * 32,
            "reason": None,
            "seq": seq,
            "session": "s-0123456789ab",
            "taint": "public",
            "tool": "read_file",
            "untrusted": False,
            "verdict": "run",
        }
    )


def part_m(scratch: Path) -> None:
    print(f"(m) the tree's cost per record ({APPEND_LINES:,} lines of a decision's size)")
    lines = [decision_line(seq) for seq in range(APPEND_LINES)]
    tree = LedgerTree.open(scratch / "tree")
    start = time.perf_counter()
    for at in range(0, APPEND_LINES, 2):  # the writer's batches are a record or two
        tree.add(lines[at : at + 2])
    added = time.perf_counter() - start
    start = time.perf_counter()
    tree.flush()
    flushed = time.perf_counter() - start
    print(f"  add (leaf hash, frontier): {added / APPEND_LINES * 1e6:.2f} µs a record")
    print(f"  flush to tiles (at a checkpoint): {flushed / APPEND_LINES * 1e6:.2f} µs a record")


async def part_p(calls: int) -> bool:
    print("(p) brokerd with the tree and checkpoints vs without, read_file, one client")
    with_tree, without = make_home("t", "auto"), make_home("n", "auto")
    try:
        with daemon_on(with_tree) as on, daemon_without_tree(without) as off:
            await on.wait_ready()
            await off.wait_ready()
            paths = (str(with_tree.broker_sock), str(without.broker_sock))
            session = new_session_id()
            times: tuple[list[float], list[float]] = ([], [])
            for _ in range(20):  # warm both
                for path in paths:
                    await broker_call(path, session)
            for i in range(calls):
                order = (0, 1) if i % 2 else (1, 0)
                for which in order:
                    call = functools.partial(broker_call, paths[which], session)
                    times[which].append(await timed(call))
            for daemon in (on, off):
                if (code := await daemon.stop()) != 0:
                    raise BenchFailure(f"brokerd exited {code} after SIGTERM")
        check_ledger(with_tree)
        check_ledger(without)
        last = orjson.loads(with_tree.audit_log.read_bytes().splitlines()[-1])
        if last["kind"] != "checkpoint":
            raise BenchFailure(f"the ledger with the tree ends with a {last['kind']} record")
        checkpoints = with_tree.audit_log.read_bytes().count(b'"kind":"checkpoint"')
    finally:
        shutil.rmtree(with_tree.root, ignore_errors=True)
        shutil.rmtree(without.root, ignore_errors=True)
    on50, on99 = percentile(times[0], 0.5), percentile(times[0], 0.99)
    off50, off99 = percentile(times[1], 0.5), percentile(times[1], 0.99)
    print(f"  without the tree:              p50 {off50 * 1e3:.3f} ms  p99 {off99 * 1e3:.3f} ms")
    print(f"  with the tree and checkpoints: p50 {on50 * 1e3:.3f} ms  p99 {on99 * 1e3:.3f} ms")
    print(f"  ({calls} calls each; {checkpoints} checkpoints in the ledger with the tree)")
    ratio = on50 / off50
    ok = ratio <= RATIO_TARGET
    print(f"  p50 ratio {ratio:.3f}x (target <= {RATIO_TARGET:g}x): {verdict(ok)}")
    return ok


@contextlib.contextmanager
def daemon_without_tree(home: Home) -> Iterator[Daemon]:
    daemon = DaemonWithoutTree(home)
    try:
        yield daemon
    finally:
        daemon.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000, help="(p): calls to each brokerd")
    options = parser.parse_args()
    print(machine_line())
    try:
        with tempfile.TemporaryDirectory(prefix="bxt-", dir="/tmp") as scratch:
            part_m(Path(scratch))
        print(machine_line())
        ok = trio.run(part_p, options.calls)
        print(machine_line())
    except BenchFailure as exc:
        print(f"FAILED: {exc}")
        return 1
    print("all targets met" if ok else "a target was missed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
