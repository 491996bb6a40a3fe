"""The ledger's Merkle tree as the writer keeps it (docs/decisions.md, "Checkpoints in
the ledger"): the frontier in memory, the stored hashes not yet in tiles, and the
:class:`~boxmaker.ledger.tiles.TileStore` under ``ledger/tree/``.

Leaf ``i`` is ledger line ``i``'s exact bytes (its seq, without the newline).
:meth:`LedgerTree.add` is pure CPU (a leaf hash and two node hashes a line, on
average); :meth:`LedgerTree.flush` writes the hashes kept since the last flush to the
tiles and makes them durable. The writer flushes only at a checkpoint: the tiles are
derived from the lines, so a crash loses nothing the next start cannot add again from
the lines after the tiles' size.

The tiles may hold more leaves than the tree (a flush done, then a crash before the
checkpoint record that was to follow it): the tree then starts at the smaller size, and
its first flush checks that the leaves it re-adds are the ones stored before writing
past them (:class:`TreeMismatch` when they are not: the tiles are rebuilt).

>>> import tempfile
>>> from boxmaker.ledger.merkle import ListHashes, stored_hashes, tree_hash
>>> lines = [b'{"seq":0}', b'{"seq":1}', b'{"seq":2}']
>>> with tempfile.TemporaryDirectory() as scratch:
...     tree = LedgerTree.open(Path(scratch) / "tree")
...     tree.add(lines)
...     tree.flush()
...     (tree.size, tree.store.size, tree.root() == tree_hash(3, tree.store))
(3, 3, True)
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Final

from boxmaker.home.file_ops import fsync_dir
from boxmaker.home.paths import Home
from boxmaker.ledger.merkle import Frontier, Hash, leaf_hash, stored_hash_index
from boxmaker.ledger.segments import ledger_files, ledger_lines
from boxmaker.ledger.tiles import TileProblem, TileStore

__all__ = [
    "CHECKPOINT_FILE",
    "CHECKPOINT_POS_FILE",
    "REBUILD_FLUSH_LEAVES",
    "TREE_DIR",
    "LedgerTree",
    "TreeMismatch",
    "open_tree",
    "rebuild_tree",
    "tree_dir",
]

TREE_DIR: Final = "tree"
"""``ledger/tree/``: the tiles (``tile/...``), the newest signed checkpoint and its
position (tlog-tiles' layout, less the entry bundles: the lines are the entries)."""
CHECKPOINT_FILE: Final = "checkpoint"
CHECKPOINT_POS_FILE: Final = "checkpoint.pos"
REBUILD_FLUSH_LEAVES: Final = 1 << 16
"""A rebuild flushes every 65,536 lines, so its memory stays bounded at any size."""
_TILE_DIR: Final = "tile"


def tree_dir(home: Home) -> Path:
    """``<home>/ledger/tree``."""
    return home.ledger_dir / TREE_DIR


class TreeMismatch(Exception):
    """The tiles hold a leaf that is not the line the tree was given at that seq: they
    were not made from this ledger's lines (rebuild them: :meth:`LedgerTree.rebuild`)."""

    def __init__(self, seq: int) -> None:
        super().__init__(f"the tree's tiles hold another leaf than ledger line {seq}")
        self.seq = seq


class LedgerTree:
    """The tree over the ledger's lines, of :attr:`size` leaves (not thread-safe: the
    one writer adds and flushes; a flush runs in a worker thread while nothing else
    touches the tree)."""

    def __init__(self, store: TileStore, frontier: Frontier) -> None:
        _check_within(frontier.size, store)
        self._store = store
        self._frontier = frontier
        # The stored hashes of leaves [_first_pending, size), in stored-index order.
        self._pending: list[Hash] = []
        self._first_pending = frontier.size

    @classmethod
    def open(cls, directory: Path) -> LedgerTree:
        """The tree of every leaf the tiles under ``directory`` hold (created when
        missing). Blocking."""
        store = TileStore(directory)
        return cls.resume(store, store.size)

    @classmethod
    def resume(cls, store: TileStore, size: int) -> LedgerTree:
        """The tree of the first ``size`` leaves of ``store`` (at most its size): log2
        reads. Raises :class:`~boxmaker.ledger.tiles.TileProblem` for a missing tile."""
        _check_within(size, store)
        return cls(store, Frontier.at(size, store))

    @classmethod
    def rebuild(cls, directory: Path, lines: Iterable[bytes]) -> LedgerTree:
        """Fresh tiles under ``directory`` from the ledger's ``lines`` (each with or
        without its newline), flushed as it goes. Blocking. The old tiles are removed
        first; a crash part-way leaves fewer leaves than lines, which a start rebuilds."""
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        shutil.rmtree(directory / _TILE_DIR, ignore_errors=True)
        fsync_dir(directory)
        tree = cls.open(directory)
        tree.add_flushing(lines)
        return tree

    @property
    def size(self) -> int:
        """The leaves added: the seq of the next line."""
        return self._frontier.size

    @property
    def store(self) -> TileStore:
        """The tiles (for readers: they hold :attr:`flushed` leaves, perhaps more)."""
        return self._store

    @property
    def flushed(self) -> int:
        """The leaves whose hashes are in the tiles."""
        return self._first_pending

    def root(self) -> Hash:
        """The root of the tree of :attr:`size` leaves."""
        return self._frontier.root()

    def add(self, lines: Sequence[bytes]) -> None:
        """Append ledger lines (exact bytes, no newline) as the next leaves. No I/O."""
        pending = self._pending
        append = self._frontier.append
        for line in lines:
            pending.extend(append(leaf_hash(line)))

    def add_flushing(self, lines: Iterable[bytes]) -> None:
        """Add ``lines`` (each with or without its newline), flushed every
        :data:`REBUILD_FLUSH_LEAVES` and at the end, so memory stays bounded. Blocking."""
        for line in lines:
            self.add((line.removesuffix(b"\n"),))
            if self.size - self._first_pending >= REBUILD_FLUSH_LEAVES:
                self.flush()
        self.flush()

    def flush(self) -> None:
        """Write the hashes added since the last flush to the tiles, durably. Blocking.
        On an error (OSError, TileProblem, :class:`TreeMismatch`) nothing is lost: the
        next flush writes them again."""
        if not self._pending:
            return
        store = self._store
        start = self._first_pending
        pending = self._pending
        if store.size > start:
            # The tiles are ahead (a flush before a crash): the leaves both have must
            # agree, and only the rest is written.
            overlap = min(store.size, self.size)
            cut = stored_hash_index(0, overlap) - stored_hash_index(0, start)
            self._check_stored(start, pending[:cut])
            pending = pending[cut:]
            start = overlap
        store.append(pending)
        self._first_pending = self.size
        self._pending = []

    def _check_stored(self, start: int, hashes: list[Hash]) -> None:
        base = stored_hash_index(0, start)
        stored = self._store.read_hashes(range(base, base + len(hashes)))
        for offset, (ours, theirs) in enumerate(zip(hashes, stored, strict=True)):
            if ours != theirs:
                raise TreeMismatch(_leaf_of(base + offset))


def _check_within(size: int, store: TileStore) -> None:
    if size > store.size:
        raise ValueError(
            f"a tree of {size} leaves over tiles of {store.size}: "
            "only the tiles' leaves can be resumed from"
        )


def _leaf_of(index: int) -> int:
    """The leaf whose append stored hash ``index``."""
    low, high = 0, index + 1
    while high - low > 1:
        middle = (low + high) // 2
        if stored_hash_index(0, middle) <= index:
            low = middle
        else:
            high = middle
    return low


def open_tree(home: Home, next_seq: int) -> LedgerTree:
    """The writer's tree at a start, for a ledger whose next seq is ``next_seq``
    (blocking): resumed from the tiles when they hold exactly the ledger's lines,
    otherwise rebuilt from the lines (read once: :func:`rebuild_tree`)."""
    directory = tree_dir(home)
    # A tile that cannot be read is rebuilt like any other mismatch: tiles are derived.
    with contextlib.suppress(TileProblem, OSError):
        store = TileStore(directory)
        if store.size == next_seq:
            return LedgerTree.resume(store, next_seq)
    return rebuild_tree(home)


def rebuild_tree(home: Home) -> LedgerTree:
    """The tree rebuilt from every line of every file of the ledger (blocking). With the
    oldest segments archived away (docs/runbook.md#ledger-segments) their lines cannot
    be read again: the tree is resumed from the tiles at the first line present and
    the lines from there added; the tiles must then be whole up to there
    (:class:`~boxmaker.ledger.tiles.TileProblem`, or :class:`TreeMismatch` for tiles
    made from other lines: nothing can rebuild them)."""
    directory = tree_dir(home)
    files = ledger_files(home.ledger_dir)
    if not files.archived:
        return LedgerTree.rebuild(directory, ledger_lines(files))
    tree = LedgerTree.resume(TileStore(directory), files.archived)
    tree.add_flushing(ledger_lines(files))
    return tree
