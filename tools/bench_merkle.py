"""Time the ledger's tree (docs/performance.md): the append cost per record, and proofs
and a restart's frontier at 10,000,000 leaves.

- append: per record, the leaf hash of a ~300-byte line, :meth:`Frontier.append`, and
  the tile store's :meth:`TileStore.append` (durable: temp, fsync, rename, directory
  fsync) amortized over one call per batch, for batches of 1, 16 and 256 records (the
  ledger writer's group commit calls it once per commit);
- at 10,000,000 leaves (built in a loop of leaf hashes, the store's fsyncs left out for
  the build only: they are the append figures' business): the store's open (its size
  recovered from the files), an inclusion proof for a random leaf read from the tiles
  (median and p99 of 200), its check, a consistency proof, and :meth:`Frontier.at`
  (the frontier a restart needs, read from the tiles).

Run: ``python tools/bench_merkle.py [LEAVES]``. The target: an inclusion proof in at
most 10 ms at 10,000,000 leaves (the median).
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from boxmaker.home.file_ops import OsFileOps
from boxmaker.ledger.merkle import (
    Frontier,
    check_record,
    check_tree,
    leaf_hash,
    prove_record,
    prove_tree,
    tree_hash,
)
from boxmaker.ledger.tiles import TileStore

LEAVES = 10_000_000
BUILD_BATCH = 65_536
APPEND_RECORDS = {1: 1_000, 16: 8_000, 256: 51_200}
PROOFS = 200
TARGET_PROOF_MS = 10.0


class NoSync(OsFileOps):
    """The real calls but fsync: for building the big tree only."""

    def fsync(self, fd: int) -> None:
        pass


def _line(n: int) -> bytes:
    """A line of a ledger's size (~300 bytes), different for each n."""
    return (
        b'{"arguments":{"path":"notes/day-%d.md"},"at":"2026-03-04T05:06:07.890Z",'
        b'"boot":"b-0123456789abcdef","call":"c-%016x","grant":"read-notes",'
        b'"kind":"decision","labels":[],"prev":"%064x","reason":"grant_auto",'
        b'"seq":%d,"session":"s-0123456789ab","tool":"read_file","verdict":"run"}'
    ) % (n % 1000, n, n, n)


def append_cost(root: Path, batch: int, records: int) -> float:
    """µs per record: leaf hash + frontier + one durable store append per batch."""
    store = TileStore(root)
    frontier = Frontier()
    lines = [_line(n) for n in range(records)]
    started = time.perf_counter()
    for first in range(0, records, batch):
        hashes = []
        for line in lines[first : first + batch]:
            hashes += frontier.append(leaf_hash(line))
        store.append(hashes)
    elapsed = time.perf_counter() - started
    assert store.size == records
    return elapsed / records * 1e6


def build(root: Path, leaves: int) -> Frontier:
    store = TileStore(root, files=NoSync())
    frontier = Frontier()
    append = frontier.append
    for first in range(0, leaves, BUILD_BATCH):
        hashes = []
        for n in range(first, min(first + BUILD_BATCH, leaves)):
            hashes += append(leaf_hash(_line(n)))
        store.append(hashes)
    return frontier


def timed(function: Callable[[], object]) -> float:
    started = time.perf_counter()
    function()
    return (time.perf_counter() - started) * 1000


def main() -> int:
    leaves = int(sys.argv[1]) if len(sys.argv) > 1 else LEAVES
    with tempfile.TemporaryDirectory() as tmp:
        for batch, records in APPEND_RECORDS.items():
            cost = append_cost(Path(tmp) / f"append-{batch}", batch, records)
            print(f"append, batches of {batch:>3}: {cost:8.1f} µs a record ({records} records)")

        root = Path(tmp) / "tree"
        started = time.perf_counter()
        frontier = build(root, leaves)
        print(f"built {leaves:,} leaves in {time.perf_counter() - started:.0f} s (no fsync)")
        files = sum(len(names) for _, _, names in os.walk(root))
        print(f"tile files: {files:,}")

        opened: list[TileStore] = []
        open_ms = timed(lambda: opened.append(TileStore(root)))
        store = opened[0]
        assert store.size == leaves
        print(f"open (size recovered): {open_ms:.2f} ms")

        root_hash = frontier.root()
        assert tree_hash(leaves, store) == root_hash
        at_ms = sorted(timed(lambda: Frontier.at(leaves, store)) for _ in range(20))
        assert Frontier.at(leaves, store) == frontier
        print(f"Frontier.at: median {statistics.median(at_ms):.2f} ms")

        rng = random.Random(19)
        prove_ms, check_ms = [], []
        for _ in range(PROOFS):
            index = rng.randrange(leaves)
            started = time.perf_counter()
            proof = prove_record(leaves, index, store)
            prove_ms.append((time.perf_counter() - started) * 1000)
            leaf = leaf_hash(_line(index))
            started = time.perf_counter()
            check_record(proof, leaves, root_hash, index, leaf)
            check_ms.append((time.perf_counter() - started) * 1000)
        prove_ms.sort()
        median = statistics.median(prove_ms)
        p99 = prove_ms[int(len(prove_ms) * 0.99) - 1]
        print(f"inclusion proof: median {median:.2f} ms, p99 {p99:.2f} ms ({PROOFS} leaves)")
        print(f"its check: median {statistics.median(check_ms):.3f} ms")

        old = leaves * 2 // 3
        old_root = tree_hash(old, store)
        consistency: list[list[bytes]] = []
        tree_ms = timed(lambda: consistency.append(prove_tree(leaves, old, store)))
        check_tree(consistency[0], leaves, root_hash, old, old_root)
        print(f"consistency proof from {old:,}: {tree_ms:.2f} ms")

    ok = median <= TARGET_PROOF_MS
    print(f"target: inclusion proof <= {TARGET_PROOF_MS:.0f} ms: {'ok' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
