"""The writer's tree (boxmaker.ledger.tree): whatever the batches, its root is RFC 6962's
computed from scratch over the lines; only a flush puts hashes in the tiles; a tree
resumed from the tiles or rebuilt from the lines is the same tree; tiles ahead of the
tree are checked, not trusted; a failed flush loses nothing."""

from __future__ import annotations

import hashlib
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from boxmaker.home.file_ops import OsFileOps
from boxmaker.home.paths import Home
from boxmaker.ledger import tree as tree_module
from boxmaker.ledger.merkle import Frontier, Hash, tree_hash
from boxmaker.ledger.tiles import TileStore
from boxmaker.ledger.tree import LedgerTree, TreeMismatch, open_tree, tree_dir


def _mth(lines: list[bytes]) -> Hash:
    """RFC 6962's MTH, written out: the reference every root is held to."""
    if not lines:
        return hashlib.sha256(b"").digest()
    if len(lines) == 1:
        return hashlib.sha256(b"\x00" + lines[0]).digest()
    k = 1
    while k * 2 < len(lines):
        k *= 2
    return hashlib.sha256(b"\x01" + _mth(lines[:k]) + _mth(lines[k:])).digest()


def _lines(count: int, start: int = 0, tag: bytes = b"") -> list[bytes]:
    return [b'{"seq":%d%s}' % (seq, tag) for seq in range(start, start + count)]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batches=st.lists(st.integers(min_value=0, max_value=40), max_size=12))
def test_any_batches_give_the_reference_root(
    tmp_path_factory: pytest.TempPathFactory, batches: list[int]
) -> None:
    directory = tmp_path_factory.mktemp("tree") / "tree"
    tree = LedgerTree.open(directory)
    added: list[bytes] = []
    for count in batches:
        batch = _lines(count, len(added))
        tree.add(batch)
        added += batch
        assert tree.size == len(added)
        assert tree.root() == _mth(added)
    tree.flush()
    reopened = TileStore(directory)
    assert reopened.size == len(added)
    assert tree_hash(reopened.size, reopened) == _mth(added)


def test_only_a_flush_puts_the_hashes_in_the_tiles(tmp_path: Path) -> None:
    directory = tmp_path / "tree"
    tree = LedgerTree.open(directory)
    tree.add(_lines(300))
    assert (tree.size, tree.flushed, TileStore(directory).size) == (300, 0, 0)
    tree.flush()
    assert (tree.flushed, TileStore(directory).size) == (300, 300)
    tree.add(_lines(5, 300))
    assert TileStore(directory).size == 300
    tree.flush()
    assert TileStore(directory).size == 305
    assert tree_hash(305, TileStore(directory)) == _mth(_lines(305))


@pytest.mark.parametrize("size", [0, 1, 255, 256, 257, 1000])
def test_a_tree_resumed_from_the_tiles_goes_on_as_the_reference(tmp_path: Path, size: int) -> None:
    directory = tmp_path / "tree"
    first = LedgerTree.open(directory)
    first.add(_lines(size))
    first.flush()
    resumed = LedgerTree.open(directory)
    assert (resumed.size, resumed.root()) == (size, _mth(_lines(size)))
    resumed.add(_lines(300, size))
    resumed.flush()
    assert resumed.root() == _mth(_lines(size + 300))
    assert tree_hash(size + 300, TileStore(directory)) == _mth(_lines(size + 300))


def test_a_tree_cannot_resume_past_its_tiles(tmp_path: Path) -> None:
    tree = LedgerTree.open(tmp_path / "tree")
    tree.add(_lines(3))
    tree.flush()
    with pytest.raises(ValueError, match="a tree of 4 leaves over tiles of 3"):
        LedgerTree.resume(tree.store, 4)


def test_tiles_ahead_of_the_tree_are_checked_then_written_past(tmp_path: Path) -> None:
    directory = tmp_path / "tree"
    ahead = LedgerTree.open(directory)
    ahead.add(_lines(600))
    ahead.flush()
    tree = LedgerTree.resume(TileStore(directory), 500)
    tree.add(_lines(50, 500))
    tree.flush()  # all 50 already stored: nothing to write
    assert (tree.flushed, tree.store.size) == (550, 600)
    tree.add(_lines(100, 550))
    tree.flush()
    assert tree.store.size == 650
    assert tree_hash(650, TileStore(directory)) == _mth(_lines(650))


def test_tiles_of_other_lines_are_refused_and_nothing_is_written(tmp_path: Path) -> None:
    directory = tmp_path / "tree"
    ahead = LedgerTree.open(directory)
    ahead.add(_lines(600))
    ahead.flush()
    tree = LedgerTree.resume(TileStore(directory), 500)
    tree.add(_lines(3, 500) + _lines(200, 503, tag=b',"edited":1'))
    with pytest.raises(TreeMismatch, match=r"ledger line 503$") as raised:
        tree.flush()
    assert raised.value.seq == 503
    assert (tree.flushed, TileStore(directory).size) == (500, 600)


class FailingFsync(OsFileOps):
    def __init__(self) -> None:
        self.failing = True

    def fsync(self, fd: int) -> None:
        if self.failing:
            raise OSError(5, "Input/output error")
        super().fsync(fd)


def test_a_failed_flush_loses_nothing(tmp_path: Path) -> None:
    directory = tmp_path / "tree"
    files = FailingFsync()
    files.failing = False
    tree = LedgerTree(store := TileStore(directory, files), Frontier())
    tree.add(_lines(10))
    tree.flush()
    files.failing = True
    tree.add(_lines(300, 10))
    with pytest.raises(OSError, match="Input/output error"):
        tree.flush()
    assert (tree.flushed, store.size) == (10, 10)
    files.failing = False
    tree.flush()
    assert tree_hash(310, TileStore(directory)) == _mth(_lines(310))


def test_a_rebuild_replaces_the_tiles_and_flushes_as_it_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "tree"
    stale = LedgerTree.open(directory)
    stale.add(_lines(700, tag=b',"old":1'))
    stale.flush()
    (directory / "checkpoint").write_bytes(b"kept\n")
    flushed_at: list[int] = []
    monkeypatch.setattr(tree_module, "REBUILD_FLUSH_LEAVES", 100)
    real_flush = LedgerTree.flush

    def counting_flush(self: LedgerTree) -> None:
        flushed_at.append(self.size)
        real_flush(self)

    monkeypatch.setattr(LedgerTree, "flush", counting_flush)
    rebuilt = LedgerTree.rebuild(directory, [line + b"\n" for line in _lines(250)])
    assert flushed_at == [100, 200, 250]
    assert (rebuilt.size, rebuilt.root()) == (250, _mth(_lines(250)))
    store = TileStore(directory)
    assert store.size == 250
    assert tree_hash(250, store) == _mth(_lines(250))
    assert (directory / "checkpoint").read_bytes() == b"kept\n"


def _ledger(home: Home, count: int) -> list[bytes]:
    lines = _lines(count)
    home.ledger_dir.mkdir(parents=True)
    home.audit_log.write_bytes(b"".join(line + b"\n" for line in lines))
    return lines


def test_open_tree_resumes_tiles_of_the_ledgers_size(tmp_path: Path) -> None:
    home = Home(tmp_path / "home")
    lines = _ledger(home, 40)
    made = LedgerTree.open(tree_dir(home))
    made.add(lines)
    made.flush()
    home.audit_log.write_bytes(b"not read\n")  # proof that the lines are not read again
    tree = open_tree(home, 40)
    assert (tree.size, tree.root()) == (40, _mth(lines))


@pytest.mark.parametrize("tiles", [0, 39, 41])
def test_open_tree_rebuilds_tiles_of_another_size(tmp_path: Path, tiles: int) -> None:
    home = Home(tmp_path / "home")
    lines = _ledger(home, 40)
    made = LedgerTree.open(tree_dir(home))
    made.add(_lines(tiles, tag=b',"other":1'))
    made.flush()
    tree = open_tree(home, 40)
    assert (tree.size, tree.root(), TileStore(tree_dir(home)).size) == (40, _mth(lines), 40)


def test_open_tree_rebuilds_tiles_it_cannot_read(tmp_path: Path) -> None:
    home = Home(tmp_path / "home")
    lines = _ledger(home, 300)
    made = LedgerTree.open(tree_dir(home))
    made.add(lines)
    made.flush()
    (tree_dir(home) / "tile" / "1" / "000.p" / "1").unlink()
    tree = open_tree(home, 300)
    assert (tree.size, tree.root()) == (300, _mth(lines))
    assert tree_hash(300, TileStore(tree_dir(home))) == _mth(lines)
