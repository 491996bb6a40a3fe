"""The tlog-tiles layout: paths byte for byte as the C2SP text and Go's tile tests name
them; the file store reads back what an in-memory store holds whatever the batches,
recovers its size when opened again, survives a write that fails at any step, and says
which tile is missing, short or unreadable."""

from __future__ import annotations

import functools
import os
import random
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from boxmaker.home.file_ops import OsFileOps
from boxmaker.ledger.merkle import (
    Frontier,
    Hash,
    ListHashes,
    leaf_hash,
    prove_record,
    stored_hash_count,
    stored_hash_index,
    tree_hash,
)
from boxmaker.ledger.tiles import (
    TILE_BYTES,
    Tile,
    TileProblem,
    TileStore,
    hash_from_tile,
    tile_for_index,
    tile_path,
    tiles_for_size,
)


@functools.cache
def _stored(size: int) -> tuple[list[Hash], list[Frontier]]:
    """Every stored hash of leaves 0..size-1 (lines ``line i``), and each leaf's share."""
    frontier = Frontier()
    per_leaf = [frontier.append(leaf_hash(b"line %d" % n)) for n in range(size)]
    return [h for hashes in per_leaf for h in hashes], [frontier]


def _leaf_hashes(start: int, stop: int) -> list[Hash]:
    storage, _ = _stored(70_000)
    return storage[stored_hash_index(0, start) : stored_hash_count(stop)]


def _tree_files(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*") if path.is_file())


# --- paths ---------------------------------------------------------------------------


def test_paths_are_the_specifications() -> None:
    # tlog-tiles: "index 1234067 will be encoded as x001/x234/067".
    assert tile_path(0, 1234067, 256) == "tile/0/x001/x234/067"
    assert tile_path(3, 1234067, 1) == "tile/3/x001/x234/067.p/1"
    # Go's TestTilePath, less the height element tlog-tiles fixes at 8.
    assert tile_path(0, 1, 256) == "tile/0/001"
    assert tile_path(0, 1, 5) == "tile/0/001.p/5"
    assert tile_path(5, 123456078, 256) == "tile/5/x123/x456/078"
    assert tile_path(5, 123456078, 2) == "tile/5/x123/x456/078.p/2"
    assert tile_path(1, 3057500, 256) == "tile/1/x003/x057/500"
    assert tile_path(63, 0, 255) == "tile/63/000.p/255"
    assert tile_path(0, 999, 256) == "tile/0/999"
    assert tile_path(0, 1000, 256) == "tile/0/x001/000"
    assert tile_path(0, 1_000_000, 256) == "tile/0/x001/x000/000"
    assert Tile(2, 7, 9).path == "tile/2/007.p/9"


@pytest.mark.parametrize(
    ("level", "index", "width"),
    [(-1, 0, 256), (64, 0, 256), (0, -1, 256), (0, 0, 0), (0, 0, 257)],
)
def test_no_path_for_what_is_not_a_tile(level: int, index: int, width: int) -> None:
    with pytest.raises(ValueError, match=f"^no tile at level {level}, index {index}, width"):
        tile_path(level, index, width)


def test_the_tiles_of_a_size_are_the_specifications_examples() -> None:
    # "a tree of size 70,000 will be represented by 273 full level 0 tiles, one partial
    # level 0 tile of width 112, one full level 1 tile, one partial level 1 tile of
    # width 17, and one partial level 2 tile of width 1."
    tiles = tiles_for_size(70_000)
    assert tiles == [
        *(Tile(0, n, 256) for n in range(273)),
        Tile(0, 273, 112),
        Tile(1, 0, 256),
        Tile(1, 1, 17),
        Tile(2, 0, 1),
    ]
    # "a tree of size 256 will be represented by a full level 0 tile and a partial level
    # 1 tile of width 1."
    assert tiles_for_size(256) == [Tile(0, 0, 256), Tile(1, 0, 1)]
    assert tiles_for_size(0) == []
    # Growing: what changed, a tile that filled up given full.
    assert tiles_for_size(70_000, 69_990) == [Tile(0, 273, 112)]
    assert tiles_for_size(512, 250) == [Tile(0, 0, 256), Tile(0, 1, 256), Tile(1, 0, 2)]
    assert tiles_for_size(5, 5) == []
    with pytest.raises(ValueError, match=r"^no tiles from size 6 to size 5$"):
        tiles_for_size(5, 6)


def test_every_stored_hash_is_in_its_tile() -> None:
    """Go's TestTree, for tiles: each stored hash of a tree of 70,000 leaves, from the
    tile tile_for_index names (built from the stored hashes), and from a wider one."""
    storage, _ = _stored(70_000)
    tile_data: dict[tuple[int, int], bytes] = {}
    for tile in tiles_for_size(70_000):
        start = tile.index << 8
        level_hashes = [
            storage[stored_hash_index(8 * tile.level, start + i)] for i in range(tile.width)
        ]
        tile_data[tile.level, tile.index] = b"".join(level_hashes)
    for index in range(0, len(storage), 7):
        tile, start, end = tile_for_index(index)
        data = tile_data[tile.level, tile.index]
        assert 0 <= start < end <= len(data)
        assert hash_from_tile(tile, data[: tile.width * 32], index) == storage[index]
        wider = Tile(tile.level, tile.index, len(data) // 32)
        assert hash_from_tile(wider, data, index) == storage[index]


def test_hash_from_tile_refuses_the_wrong_tile() -> None:
    storage, _ = _stored(70_000)
    index = stored_hash_index(3, 40)  # leaves 320..327: tile 0/001, hashes 64..72
    tile, start, end = tile_for_index(index)
    assert (tile, start, end) == (Tile(0, 1, 72), 64 * 32, 72 * 32)
    data = b"".join(storage[stored_hash_index(0, 256 + i)] for i in range(256))
    assert hash_from_tile(tile, data, index) == storage[index]
    with pytest.raises(
        ValueError, match=r"^stored hash \d+ is in tile/0/001.p/72, not tile/0/001.p/71$"
    ):
        hash_from_tile(Tile(0, 1, 71), data, index)
    with pytest.raises(ValueError, match="not tile/0/002"):
        hash_from_tile(Tile(0, 2, 256), data, index)
    with pytest.raises(ValueError, match=r"^tile/0/001: 8160 bytes, too short for its width$"):
        hash_from_tile(Tile(0, 1, 256), data[:-32], index)


# --- the store -----------------------------------------------------------------------


def _fill(store: TileStore, sizes: list[int]) -> None:
    for batch in sizes:
        store.append(_leaf_hashes(store.size, store.size + batch))


def _check_reads(store: TileStore) -> None:
    storage, _ = _stored(70_000)
    count = stored_hash_count(store.size)
    indexes = list(range(0, count, 5)) + list(range(max(0, count - 600), count))
    assert store.read_hashes(indexes) == [storage[i] for i in indexes]


@given(sizes=st.lists(st.integers(0, 700), max_size=8))
@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_batches_read_back_as_stored(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int]
) -> None:
    root = tmp_path_factory.mktemp("tree") / "tree"
    store = TileStore(root)
    _fill(store, sizes)
    assert store.size == sum(sizes)
    _check_reads(store)
    reopened = TileStore(root)
    assert reopened.size == store.size
    _check_reads(reopened)
    assert _tree_files(root) == sorted(t.path for t in tiles_for_size(store.size))


def test_a_big_tree_in_many_batches(tmp_path: Path) -> None:
    """Past 65,536 leaves (a third tiling level), in batches of random sizes; each state
    reopened has the size, the frontier and the root built by appending."""
    rng = random.Random(19)
    store = TileStore(tmp_path / "tree")
    storage, _ = _stored(70_000)
    frontier = Frontier()
    while store.size < 70_000:
        batch = min(rng.choice([1, 2, 7, 255, 256, 257, 1000, 4000]), 70_000 - store.size)
        hashes = [
            h for _ in range(batch) for h in frontier.append(leaf_hash(b"line %d" % frontier.size))
        ]
        store.append(hashes)
        if rng.random() < 0.2 or store.size == 70_000:
            reopened = TileStore(tmp_path / "tree")
            assert reopened.size == frontier.size
            assert Frontier.at(reopened.size, reopened) == frontier
            assert tree_hash(reopened.size, reopened) == frontier.root()
    _check_reads(TileStore(tmp_path / "tree"))
    assert _tree_files(tmp_path / "tree") == sorted(t.path for t in tiles_for_size(70_000))
    # A proof from the files is the proof from memory.
    for index in (0, 255, 256, 65_535, 65_536, 69_999):
        assert prove_record(70_000, index, store) == prove_record(
            70_000, index, ListHashes(storage)
        )


class Recording(OsFileOps):
    """The real calls, with each rename's target kept (and a failure at one of them)."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.renamed: list[str] = []
        self.fail_at = fail_at

    def replace(self, source: Path, target: Path) -> None:
        if len(self.renamed) == self.fail_at:
            raise OSError(28, "No space left on device")
        self.renamed.append(str(target))
        super().replace(source, target)


def test_one_append_writes_each_touched_tile_once(tmp_path: Path) -> None:
    files = Recording()
    store = TileStore(tmp_path / "tree", files=files)
    _fill(store, [200])
    files.renamed.clear()
    _fill(store, [65_400])
    written = [str(Path(p).relative_to(tmp_path / "tree")) for p in files.renamed]
    expected = tiles_for_size(65_600, 200)
    assert sorted(written) == sorted(t.path for t in expected)
    assert len(written) == len(expected) == 256 + 2 + 1  # 0/000..255, 0/256.p, 1/000, 2/000.p
    # Higher levels first, level 0 last, its full tiles before its partial one.
    assert written[:2] == ["tile/2/000.p/1", "tile/1/000"]
    assert written[-2:] == ["tile/0/255", "tile/0/256.p/64"]
    # An append that changes no tile but level 0's partial writes only that.
    files.renamed.clear()
    _fill(store, [1])
    assert [str(Path(p).relative_to(tmp_path / "tree")) for p in files.renamed] == [
        "tile/0/256.p/65"
    ]


def test_narrower_partials_go_and_a_full_tile_takes_their_place(tmp_path: Path) -> None:
    store = TileStore(tmp_path / "tree")
    _fill(store, [3])
    assert _tree_files(tmp_path / "tree") == ["tile/0/000.p/3"]
    _fill(store, [4])
    assert _tree_files(tmp_path / "tree") == ["tile/0/000.p/7"]
    _fill(store, [249])
    assert _tree_files(tmp_path / "tree") == ["tile/0/000", "tile/1/000.p/1"]
    assert not (tmp_path / "tree/tile/0/000.p").exists()
    assert os.stat(tmp_path / "tree/tile/0/000").st_mode & 0o777 == 0o600
    assert os.stat(tmp_path / "tree/tile/0").st_mode & 0o777 == 0o700


@pytest.mark.parametrize("fail_at", range(6))
def test_a_write_that_fails_at_any_step_leaves_a_store_that_reopens(
    tmp_path: Path, fail_at: int
) -> None:
    """A batch from 300 to 600 leaves writes 0/001 then 0/002.p/88 after level 1: a
    failure (or a crash) at each step leaves a store whose reopened size is a size the
    batch passed through, whose hashes are right, and that the batch completes again."""
    root = tmp_path / "tree"
    _fill(TileStore(root), [300])
    store = TileStore(root, files=Recording(fail_at=fail_at))
    batch = _leaf_hashes(300, 600)
    if fail_at < 3:
        with pytest.raises(OSError, match="No space left"):
            store.append(batch)
        assert store.size == 300  # the failed batch is not taken
    else:
        store.append(batch)
    reopened = TileStore(root)
    assert reopened.size == {0: 300, 1: 300, 2: 512}.get(fail_at, 600)
    _check_reads(reopened)
    reopened.append(_leaf_hashes(reopened.size, 600))
    _check_reads(reopened)
    assert TileStore(root).size == 600
    assert _tree_files(root) == sorted(t.path for t in tiles_for_size(600))


def test_a_higher_level_ahead_of_level_0_is_cut_back(tmp_path: Path) -> None:
    """A crash after level 1 got its full tile and before level 0 did: level 1 is read
    from that full tile, only as far as level 0 goes."""
    root = tmp_path / "tree"
    _fill(TileStore(root), [255 * 256 + 10])
    assert (root / "tile/1/000.p/255").is_file()
    store = TileStore(root, files=Recording(fail_at=2))  # 2/000.p/1, 1/000, then 0/255
    with pytest.raises(OSError, match="No space left"):
        _fill(store, [246 + 256])
    assert (root / "tile/1/000").is_file()
    assert not (root / "tile/1/000.p").exists()
    reopened = TileStore(root)
    assert reopened.size == 255 * 256 + 10
    _check_reads(reopened)
    _fill(reopened, [246 + 256])
    _check_reads(TileStore(root))


def test_bad_appends_change_nothing(tmp_path: Path) -> None:
    store = TileStore(tmp_path / "tree")
    _fill(store, [3])
    hashes = _leaf_hashes(3, 5)  # leaf 3 stores 3 hashes, leaf 4 one
    with pytest.raises(ValueError, match=r"^2 hashes are not whole leaves from leaf 3$"):
        store.append(hashes[:2])
    with pytest.raises(ValueError, match=r"^a hash of 31 bytes, not 32$"):
        store.append([hashes[0], hashes[1][:31], hashes[2]])
    assert store.size == 3
    assert _tree_files(tmp_path / "tree") == ["tile/0/000.p/3"]
    store.append([])
    assert store.size == 3
    with pytest.raises(ValueError, match=r"^stored hash 4 is not in a tree of size 3$"):
        store.read_hashes([4])


def _problem(root: Path, reason: str, path: str, indexes: list[int] | None = None) -> str:
    """The problem opening the store at ``root`` (or, given ``indexes``, reading them)."""
    if indexes is None:
        with pytest.raises(TileProblem) as caught:
            TileStore(root)
    else:
        store = TileStore(root)
        with pytest.raises(TileProblem) as caught:
            store.read_hashes(indexes)
    assert (caught.value.reason, caught.value.path) == (reason, path)
    return str(caught.value)


def test_a_missing_short_or_unreadable_tile_is_named(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    _fill(TileStore(root), [70_000])
    in_tile_5 = [stored_hash_index(0, 5 * 256 + 3)]

    (root / "tile/0/005").rename(tmp_path / "kept")
    assert _problem(root, "missing", "tile/0/005", in_tile_5) == (
        "tree tile tile/0/005 missing: no such file"
    )
    (tmp_path / "kept").rename(root / "tile/0/005")

    data = (root / "tile/0/005").read_bytes()
    (root / "tile/0/005").write_bytes(data[:-1])
    assert _problem(root, "short", "tile/0/005", in_tile_5) == (
        "tree tile tile/0/005 short: 8191 bytes, a full tile has 8192"
    )
    (root / "tile/0/005").write_bytes(data + b"\x00")
    _problem(root, "short", "tile/0/005", in_tile_5)

    (root / "tile/0/005").unlink()
    (root / "tile/0/005").symlink_to(tmp_path / "kept")
    (tmp_path / "kept").write_bytes(data)
    assert _problem(root, "unreadable", "tile/0/005", in_tile_5).startswith(
        "tree tile tile/0/005 unreadable: "
    )
    (root / "tile/0/005").unlink()
    (root / "tile/0/005").mkdir()
    _problem(root, "unreadable", "tile/0/005", in_tile_5)
    (root / "tile/0/005").rmdir()
    (root / "tile/0/005").write_bytes(data)
    TileStore(root).read_hashes(in_tile_5)

    # The right edge, read when the store opens: level 1's partial tile.
    level_1 = root / "tile/1/001.p/17"
    level_1.rename(tmp_path / "edge")
    assert _problem(root, "missing", "tile/1/001.p") == (
        "tree tile tile/1/001.p missing: no partial tile of 17 hashes or more"
    )
    (root / "tile/1/001.p/16").write_bytes((tmp_path / "edge").read_bytes()[:-32])
    _problem(root, "missing", "tile/1/001.p")
    (root / "tile/1/001.p/16").unlink()
    level_1.write_bytes((tmp_path / "edge").read_bytes()[:-1])
    assert _problem(root, "short", "tile/1/001.p/17") == (
        "tree tile tile/1/001.p/17 short: 543 bytes, the tree needs 17 hashes"
    )
    (tmp_path / "edge").rename(level_1)
    assert TileStore(root).size == 70_000


def test_a_new_store_and_its_size(tmp_path: Path) -> None:
    store = TileStore(tmp_path / "tree")
    assert store.size == 0
    assert store.root == tmp_path / "tree"
    assert os.stat(tmp_path / "tree").st_mode & 0o777 == 0o700
    assert Frontier.at(0, store) == Frontier()
    # A name in a partial tile's directory that is not a width is passed over.
    _fill(store, [5])
    (tmp_path / "tree/tile/0/000.p/05").write_bytes(b"")
    (tmp_path / "tree/tile/0/000.p/junk").write_bytes(b"")
    assert TileStore(tmp_path / "tree").size == 5
    assert TILE_BYTES == 8192
