"""Time an inclusion proof read from the tree's tiles at 10,000,000 records
(docs/performance.md; target: p99 <= 10 ms).

Builds the tiles of a 10,000,000-leaf tree in a temporary directory quickly: synthetic
leaf hashes (random bytes, as good as any for reading), written straight into the
tlog-tiles layout without fsync, each higher level's hashes the roots of the full
tiles below it, exactly what :class:`~boxmaker.ledger.tiles.TileStore` writes. Then
opens a ``TileStore`` on them (as ``bxctl audit prove`` does) and times
:func:`~boxmaker.ledger.merkle.prove_record` for random seqs, each proof checked against
the tree's root.

Run: ``python tools/bench_proofs.py [LEAVES [PROOFS]]``.
"""

from __future__ import annotations

import hashlib
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from boxmaker.ledger.merkle import (
    HASH_SIZE,
    check_record,
    prove_record,
    stored_hash_index,
    tree_hash,
)
from boxmaker.ledger.tiles import TILE_BYTES, TileStore, tiles_for_size

LEAVES = 10_000_000
PROOFS = 2_000
TARGET_MS = 10.0


def _root(data: bytes) -> bytes:
    """The root over a full tile's 256 hashes (RFC 6962 node hashes, level by level)."""
    level = [data[at : at + HASH_SIZE] for at in range(0, len(data), HASH_SIZE)]
    sha256 = hashlib.sha256
    while len(level) > 1:
        level = [
            sha256(b"\x01" + level[i] + level[i + 1]).digest() for i in range(0, len(level), 2)
        ]
    return level[0]


def build_tiles(root: Path, leaves: int, seed: int = 1) -> None:
    """Every tile a tree of ``leaves`` leaves has, level 0 from random hashes, each level
    above from the roots of the full tiles below it."""
    rng = random.Random(seed)
    wanted = tiles_for_size(leaves)
    level = 0
    below: bytes | None = None  # the level's hashes; level 0's are made tile by tile
    while below is None or below:
        roots = []
        for tile in (t for t in wanted if t.level == level):
            if below is None:
                data = rng.randbytes(tile.width * HASH_SIZE)
            else:
                start = tile.index * TILE_BYTES
                data = below[start : start + tile.width * HASH_SIZE]
            path = root / tile.path
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            if tile.full:
                roots.append(_root(data))
        below = b"".join(roots)
        level += 1


def main() -> int:
    leaves = int(sys.argv[1]) if len(sys.argv) > 1 else LEAVES
    proofs = int(sys.argv[2]) if len(sys.argv) > 2 else PROOFS
    with tempfile.TemporaryDirectory(prefix="bench-proofs-") as temp:
        root = Path(temp) / "tree"
        began = time.perf_counter()
        build_tiles(root, leaves)
        built = time.perf_counter() - began
        began = time.perf_counter()
        store = TileStore(root)
        opened = time.perf_counter() - began
        if store.size != leaves:
            print(f"the tiles hold {store.size} leaves, not {leaves}")
            return 1
        tree_root = tree_hash(leaves, store)
        rng = random.Random(2)
        timings = []
        for _ in range(proofs):
            seq = rng.randrange(leaves)
            began = time.perf_counter()
            proof = prove_record(leaves, seq, store)
            timings.append((time.perf_counter() - began) * 1000)
            leaf = store.read_hashes([stored_hash_index(0, seq)])[0]
            check_record(proof, leaves, tree_root, seq, leaf)
        files = sum(1 for path in root.rglob("*") if path.is_file())
    timings.sort()
    p50 = statistics.median(timings)
    p99 = timings[int(len(timings) * 0.99) - 1]
    print(
        f"leaves: {leaves:,} ({files:,} tile files, built in {built:.1f} s, opened in "
        f"{opened * 1000:.1f} ms)"
    )
    print(
        f"prove_record from the tiles, {proofs} random seqs: p50 {p50:.3f} ms, "
        f"p99 {p99:.3f} ms, max {timings[-1]:.3f} ms (each proof checked)"
    )
    ok = p99 <= TARGET_MS
    print(f"target: p99 <= {TARGET_MS:.0f} ms {'ok' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
