"""The tree's stored hashes on disk, in the C2SP tlog-tiles layout (docs/decisions.md,
"The ledger's tree"): the ledger keeps them under ``ledger/tree/``.

A tile is up to 256 consecutive hashes of one tree level: tiling level L holds the
tree's level 8L, so level 0 holds the leaf hashes and each hash of level L >= 1 is the
root of a *full* tile of level L-1. The tree's other levels are not stored: they are
hashed again from a tile when read (:func:`hash_from_tile`). Paths:

- a full tile (256 hashes, 8,192 bytes): ``tile/<L>/<N>``;
- a partial one (1 to 255 hashes, the tree's right edge): ``tile/<L>/<N>.p/<W>``;
- ``<N>`` in 3-digit elements, all but the last starting with ``x``
  (1234067: ``x001/x234/067``).

>>> tile_path(0, 1234067, 256), tile_path(1, 5, 17)
('tile/0/x001/x234/067', 'tile/1/005.p/17')

Entry bundles (``tile/entries/...``) are not written: the ledger's lines are the
entries. The pure maths comes first; :class:`TileStore` is the file store.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Final, Literal, TypeAlias

import attrs

from boxmaker.home.file_ops import OS_FILES, FileOps, fsync_dir, write_atomically
from boxmaker.ledger.merkle import (
    HASH_SIZE,
    Hash,
    node_hash,
    split_stored_hash_index,
    stored_hash_count,
)

__all__ = [
    "TILE_BYTES",
    "TILE_HEIGHT",
    "TILE_WIDTH",
    "Tile",
    "TileProblem",
    "TileStore",
    "hash_from_tile",
    "tile_for_index",
    "tile_path",
    "tiles_for_size",
]

TILE_HEIGHT: Final = 8
TILE_WIDTH: Final = 1 << TILE_HEIGHT
TILE_BYTES: Final = TILE_WIDTH * HASH_SIZE
_PATH_BASE: Final = 1000
_MAX_LEVEL: Final = 63
_DIR_MODE: Final = 0o700
_FILE_MODE: Final = 0o600


def tile_path(level: int, index: int, width: int) -> str:
    """The tile's path under the tree's root, byte for byte as tlog-tiles names it.

    >>> tile_path(0, 0, 1), tile_path(2, 1000, 256)
    ('tile/0/000.p/1', 'tile/2/x001/000')
    """
    if not 0 <= level <= _MAX_LEVEL or index < 0 or not 1 <= width <= TILE_WIDTH:
        raise ValueError(f"no tile at level {level}, index {index}, width {width}")
    elements = [f"{index % _PATH_BASE:03d}"]
    index //= _PATH_BASE
    while index:
        elements.append(f"x{index % _PATH_BASE:03d}")
        index //= _PATH_BASE
    partial = "" if width == TILE_WIDTH else f".p/{width}"
    return f"tile/{level}/{'/'.join(reversed(elements))}{partial}"


@attrs.frozen
class Tile:
    """Tile ``index`` of tiling ``level``, ``width`` hashes wide (256: full)."""

    level: int
    index: int
    width: int

    @property
    def path(self) -> str:
        return tile_path(self.level, self.index, self.width)

    @property
    def full(self) -> bool:
        return self.width == TILE_WIDTH


def tiles_for_size(size: int, old_size: int = 0) -> list[Tile]:
    """The tiles a tree of ``size`` leaves has that the tree of ``old_size`` had not (or
    had narrower), level by level, full tiles before the partial one (Go's NewTiles).

    >>> [t.path for t in tiles_for_size(70_000)][-4:]
    ['tile/0/273.p/112', 'tile/1/000', 'tile/1/001.p/17', 'tile/2/000.p/1']
    """
    if not 0 <= old_size <= size:
        raise ValueError(f"no tiles from size {old_size} to size {size}")
    tiles: list[Tile] = []
    level = 0
    while size >> (TILE_HEIGHT * level):
        old_count = old_size >> (TILE_HEIGHT * level)
        new_count = size >> (TILE_HEIGHT * level)
        if old_count != new_count:
            full_tiles = new_count >> TILE_HEIGHT
            tiles.extend(
                Tile(level, index, TILE_WIDTH)
                for index in range(old_count >> TILE_HEIGHT, full_tiles)
            )
            if width := new_count & (TILE_WIDTH - 1):
                tiles.append(Tile(level, full_tiles, width))
        level += 1
    return tiles


def tile_for_index(index: int) -> tuple[Tile, int, int]:
    """The narrowest tile that holds stored hash ``index``, and the byte range
    [start, end) of its data that hashes to it (one hash, or a subtree of them)."""
    level, n = split_stored_hash_index(index)
    tile_level, within = divmod(level, TILE_HEIGHT)
    tile_index = (n << within) >> TILE_HEIGHT
    n -= (tile_index << TILE_HEIGHT) >> within
    tile = Tile(tile_level, tile_index, (n + 1) << within)
    return tile, (n << within) * HASH_SIZE, ((n + 1) << within) * HASH_SIZE


def hash_from_tile(tile: Tile, data: bytes, index: int) -> Hash:
    """Stored hash ``index`` from ``tile``'s data (``tile`` is the one
    :func:`tile_for_index` names, or a wider one)."""
    if len(data) < tile.width * HASH_SIZE:
        raise ValueError(f"{tile.path}: {len(data)} bytes, too short for its width")
    needed, start, end = tile_for_index(index)
    if (needed.level, needed.index) != (tile.level, tile.index) or tile.width < needed.width:
        raise ValueError(f"stored hash {index} is in {needed.path}, not {tile.path}")
    return _subtree_root(data[start:end])


def _subtree_root(data: bytes) -> Hash:
    """The root over 2**k hashes of one tile."""
    if len(data) == HASH_SIZE:
        return data
    half = len(data) // 2
    return node_hash(_subtree_root(data[:half]), _subtree_root(data[half:]))


TileReason: TypeAlias = Literal["missing", "short", "unreadable"]


class TileProblem(Exception):
    """A tile the tree needs is missing, shorter than the tree needs, or cannot be read.
    ``path`` is the file (or the partial tile's directory) under the store's root."""

    def __init__(self, reason: TileReason, path: str, detail: str) -> None:
        super().__init__(f"tree tile {path} {reason}: {detail}")
        self.reason: TileReason = reason
        self.path = path


class TileStore:
    """The tree's tiles under ``root`` (created when missing). Its size (in leaves) is
    recovered on open from the tiles present, with O(log size) file checks; the right
    edge's partial tiles are kept in memory. The one writer calls :meth:`append`; a
    reader opened beside a live writer may find a partial tile replaced under it
    (a :class:`TileProblem`: open again).

    Crash safety: each tile file is replaced atomically (temp, fsync, rename, directory
    fsync), and one :meth:`append` writes the higher levels first and level 0 last,
    level 0's last full tile before its partial one. Level 0 is the commit point: a
    higher level found wider than level 0 needs (a crash in between) is cut back to it.
    """

    def __init__(self, root: Path, files: FileOps = OS_FILES) -> None:
        self._root = root
        self._files = files
        if not root.is_dir():
            root.mkdir(mode=_DIR_MODE)
            fsync_dir(root.parent, files)
        self._size = self._recover_size()
        # Per tiling level, the hashes of its partial tile (the tree's right edge).
        self._edge = [self._load_edge(level) for level in range(_levels(self._size))]

    @property
    def root(self) -> Path:
        return self._root

    @property
    def size(self) -> int:
        """The leaves stored."""
        return self._size

    def append(self, hashes: Sequence[Hash]) -> None:
        """Store the hashes of the next leaves, in stored-index order (what
        :meth:`boxmaker.ledger.merkle.Frontier.append` returns, leaf after leaf). Each
        tile the batch touches is written once."""
        if not hashes:
            return
        size = self._size
        edge = [list(level) for level in self._edge]
        full: list[tuple[Tile, bytes]] = []
        position = 0
        while position < len(hashes):
            count = 1 + _trailing_ones(size)
            if position + count > len(hashes):
                raise ValueError(
                    f"{len(hashes)} hashes are not whole leaves from leaf {self._size}"
                )
            for value in hashes[position : position + count]:
                if len(value) != HASH_SIZE:
                    raise ValueError(f"a hash of {len(value)} bytes, not {HASH_SIZE}")
            # Only every 8th tree level is kept; the others are hashed again when read.
            for tree_level in range(0, count, TILE_HEIGHT):
                level = tree_level // TILE_HEIGHT
                if level == len(edge):
                    edge.append([])
                edge[level].append(hashes[position + tree_level])
                if len(edge[level]) == TILE_WIDTH:
                    index = (size >> tree_level) >> TILE_HEIGHT
                    full.append((Tile(level, index, TILE_WIDTH), b"".join(edge[level])))
                    edge[level] = []
            position += count
            size += 1
        self._write(full, edge, size)
        self._size = size
        self._edge = edge

    def _write(self, full: list[tuple[Tile, bytes]], edge: list[list[Hash]], size: int) -> None:
        old_widths = [len(level) for level in self._edge]
        for level in reversed(range(len(edge))):
            for tile, data in (pair for pair in full if pair[0].level == level):
                self._write_tile(tile, data)
                self._remove_partials(tile, keep=None)
            width = len(edge[level])
            old_width = old_widths[level] if level < len(old_widths) else 0
            grew = any(pair[0].level == level for pair in full) or width != old_width
            if width and grew:
                tile = Tile(level, size >> (TILE_HEIGHT * (level + 1)), width)
                self._write_tile(tile, b"".join(edge[level]))
                self._remove_partials(tile, keep=width)

    def _write_tile(self, tile: Tile, data: bytes) -> None:
        path = self._root / tile.path
        self._make_dirs(path.parent)
        write_atomically(path, data, mode=_FILE_MODE, files=self._files)

    def _make_dirs(self, directory: Path) -> None:
        if directory.is_dir():
            return
        self._make_dirs(directory.parent)
        with contextlib.suppress(FileExistsError):
            directory.mkdir(mode=_DIR_MODE)
        fsync_dir(directory.parent, self._files)

    def _remove_partials(self, tile: Tile, keep: int | None) -> None:
        """The narrower partial files of ``tile`` (all of them once it is full): a
        partial tile is read only at the right edge, where the widest one serves."""
        directory = self._root / tile_path(tile.level, tile.index, 1).rsplit("/", 1)[0]
        if keep is None:
            shutil.rmtree(directory, ignore_errors=True)
            return
        for width in _widths(directory):
            if width < keep:
                with contextlib.suppress(FileNotFoundError):
                    self._files.unlink(directory / str(width))

    def read_hashes(self, indexes: Sequence[int]) -> list[Hash]:
        """The stored hashes at ``indexes`` (a :class:`~boxmaker.ledger.merkle.HashReader`);
        each tile file read once per call."""
        limit = stored_hash_count(self._size)
        tiles: dict[tuple[int, int], bytes] = {}
        result: list[Hash] = []
        for index in indexes:
            if not 0 <= index < limit:
                raise ValueError(f"stored hash {index} is not in a tree of size {self._size}")
            tile, start, end = tile_for_index(index)
            key = (tile.level, tile.index)
            if key not in tiles:
                tiles[key] = self._tile_data(tile.level, tile.index)
            result.append(_subtree_root(tiles[key][start:end]))
        return result

    def _tile_data(self, level: int, index: int) -> bytes:
        if index == self._size >> (TILE_HEIGHT * (level + 1)):
            return b"".join(self._edge[level])
        path = tile_path(level, index, TILE_WIDTH)
        data = self._read_file(path)
        if len(data) != TILE_BYTES:
            raise TileProblem("short", path, f"{len(data)} bytes, a full tile has {TILE_BYTES}")
        return data

    def _read_file(self, path: str) -> bytes:
        try:
            fd = os.open(self._root / path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise TileProblem("missing", path, "no such file") from None
        except OSError as exc:
            raise TileProblem("unreadable", path, exc.strerror or str(exc)) from None
        try:
            with os.fdopen(fd, "rb", closefd=True) as handle:
                return handle.read(TILE_BYTES + 1)
        except OSError as exc:
            raise TileProblem("unreadable", path, exc.strerror or str(exc)) from None

    def _full_exists(self, level: int, index: int) -> bool:
        return (self._root / tile_path(level, index, TILE_WIDTH)).is_file()

    def _recover_size(self) -> int:
        """Level 0's full tiles (written in order, so a prefix: found by an exponential
        then a binary search), then the widest partial tile after them."""
        present = 0
        probe = 1
        while self._full_exists(0, probe - 1):
            present = probe
            probe *= 2
        missing = probe
        while missing - present > 1:
            middle = (present + missing) // 2
            if self._full_exists(0, middle - 1):
                present = middle
            else:
                missing = middle
        partial = self._root / tile_path(0, present, 1).rsplit("/", 1)[0]
        return present * TILE_WIDTH + max(_widths(partial), default=0)

    def _load_edge(self, level: int) -> list[Hash]:
        """Tiling level ``level``'s partial tile at this size, from its widest partial
        file or (after a crash between levels) the full tile written ahead of level 0."""
        width = (self._size >> (TILE_HEIGHT * level)) & (TILE_WIDTH - 1)
        if not width:
            return []
        index = self._size >> (TILE_HEIGHT * (level + 1))
        directory = tile_path(level, index, 1).rsplit("/", 1)[0]
        widths = [found for found in _widths(self._root / directory) if found >= width]
        if widths:
            path = tile_path(level, index, max(widths))
        elif self._full_exists(level, index):
            path = tile_path(level, index, TILE_WIDTH)
        else:
            raise TileProblem("missing", directory, f"no partial tile of {width} hashes or more")
        data = self._read_file(path)
        if len(data) < width * HASH_SIZE:
            raise TileProblem("short", path, f"{len(data)} bytes, the tree needs {width} hashes")
        return [data[at : at + HASH_SIZE] for at in range(0, width * HASH_SIZE, HASH_SIZE)]


def _levels(size: int) -> int:
    """How many tiling levels a tree of ``size`` leaves has hashes at."""
    levels = 0
    while size >> (TILE_HEIGHT * levels):
        levels += 1
    return levels


def _trailing_ones(n: int) -> int:
    return ((n + 1) & -(n + 1)).bit_length() - 1


def _widths(directory: Path) -> Iterable[int]:
    """The widths of the partial files in a ``<N>.p`` directory (none when it is not
    there); other names are not tiles and are passed over."""
    try:
        names = [entry.name for entry in directory.iterdir()]
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [int(name) for name in names if name.isdigit() and str(int(name)) == name]
