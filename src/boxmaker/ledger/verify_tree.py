"""What verification asks of a ``checkpoint`` record and of the tree's tiles
(docs/protocol.md, "Verifying"): the parts of :func:`boxmaker.ledger.verify.verify_lines`
that run once a checkpoint (every ~1,000 records) or once a tile (every 256), kept out
of its per-line loop.

A checkpoint record at seq S must say what the ledger's lines 0..S-1 say: its root is
the tree's root at size S; its note's text is the C2SP checkpoint (this ledger's
origin, S, that root in base64), signed by the ledger's key when one is given; its
``open_calls`` and ``unfinished`` are the calls the verifier itself found open then.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from boxmaker.ledger.checkpoint import CheckpointError, parse_checkpoint
from boxmaker.ledger.merkle import HASH_SIZE, Frontier, Hash, node_hash
from boxmaker.ledger.signed_note import NoteError, NoteVerifier, open_note
from boxmaker.ledger.tiles import TILE_BYTES, TILE_HEIGHT, TILE_WIDTH, TileStore, tile_path

__all__ = ["TileCheck", "checkpoint_problems", "phases_differ"]

_SHOWN_CALLS: Final = 3
"""A differing set of open calls names this many calls, then counts the rest."""


def _note_text(note: str, verifier: NoteVerifier | None) -> str:
    """The note's checkpoint text: its signature checked when a key is given (raises
    NoteError), else cut at the blank line before the signatures."""
    if verifier is not None:
        return open_note(note.encode(), [verifier]).text
    split = note.rfind("\n\n")
    return note[: split + 1] if split >= 0 else note


def checkpoint_problems(
    rec: Mapping[str, Any],
    tree: Frontier,
    origin: str | None,
    verifier: NoteVerifier | None,
    open_now: Mapping[str, str],
    unfinished_now: frozenset[str],
) -> list[str]:
    """What is wrong with checkpoint record ``rec`` given the tree of the lines before
    it, this ledger's origin (None: not known, not checked), the key (None: the
    signature is not checked) and the calls open then (the record's boot's with their
    phases, and the others'). Raises KeyError for a missing field, TypeError for one of
    a wrong type (as the loop's other records do)."""
    found: list[str] = []
    root = tree.root()
    claimed = rec["root"]
    if claimed != root.hex():
        found.append(
            f"checkpoint root {str(claimed)[:12]}… is not the tree's root at size "
            f"{tree.size} ({root.hex()[:12]}…)"
        )
    note = rec["note"]
    if type(note) is not str:
        raise TypeError("note")
    try:
        checkpoint = parse_checkpoint(_note_text(note, verifier))
    except (NoteError, CheckpointError) as exc:
        found.append(f"checkpoint note refused: {exc}")
    else:
        if origin is not None and checkpoint.origin != origin:
            found.append(f"checkpoint note's origin {checkpoint.origin!r} is not {origin!r}")
        if checkpoint.size != rec["size"]:
            found.append(f"checkpoint note's size {checkpoint.size} is not the record's")
        if checkpoint.root.hex() != claimed:
            shown = base64.b64encode(checkpoint.root).decode()
            found.append(f"checkpoint note's root {shown} is not the record's")
    recorded = rec["open_calls"]
    if type(recorded) is not dict or type(rec["unfinished"]) is not list:
        raise TypeError("open_calls")
    differ = phases_differ(recorded, open_now)
    if differ:
        found.append(f"checkpoint open_calls differ from the calls open then: {differ}")
    unfinished = rec["unfinished"]
    if len(unfinished) != len(unfinished_now) or set(unfinished) != unfinished_now:
        differ = phases_differ(
            dict.fromkeys(unfinished, "unfinished"), dict.fromkeys(unfinished_now, "unfinished")
        )
        found.append(
            f"checkpoint unfinished differ from the calls open then: {differ or 'repeated'}"
        )
    return found


def phases_differ(recorded: Mapping[str, object], actual: Mapping[str, str]) -> str:
    """The first differences between a record's calls (call -> phase) and the open
    calls found, in words; empty when they are the same."""
    if recorded == actual:
        return ""
    words: list[str] = []
    for call in sorted(set(recorded) | set(actual)):
        said, found = recorded.get(call), actual.get(call)
        if said == found:
            continue
        if said is None:
            words.append(f"{call} {found}, not recorded")
        elif found is None:
            words.append(f"{call} recorded {said}, not open")
        else:
            words.append(f"{call} recorded {said}, is {found}")
    more = len(words) - _SHOWN_CALLS
    return "; ".join(words[:_SHOWN_CALLS]) + (f"; and {more} more" if more > 0 else "")


class TileCheck:
    """Compares the tree's tiles under a :class:`~boxmaker.ledger.tiles.TileStore`'s
    root with the leaves a verification computes, tile by tile, as the full tiles of
    level 0 complete (:meth:`add`), then the partial tiles at the store's size
    (:meth:`finish`). Memory: one tile a level. Each problem names the tile."""

    def __init__(self, store: TileStore) -> None:
        self._root = store.root
        self._size = store.size
        # Per tiling level, the hashes of its tile under construction.
        self._levels: list[list[Hash]] = [[]]
        # Per tiling level, how many of its tiles are full.
        self._full: list[int] = [0]
        self.problems: list[str] = []
        self.tiles = 0

    @property
    def size(self) -> int:
        """The leaves the tiles hold (and the check covers)."""
        return self._size

    def add(self, leaves: list[Hash]) -> None:
        """The next full tile of leaf hashes (256), in order."""
        self._levels[0] = leaves
        self._complete(0)

    def _complete(self, level: int) -> None:
        """Level ``level``'s tile is full: compare it (as far as the store holds it),
        and carry its root up one tiling level."""
        hashes = self._levels[level]
        index = self._full[level]
        self._compare_held(level, index, hashes)
        if level + 1 == len(self._levels):
            self._levels.append([])
            self._full.append(0)
        above = self._levels[level + 1]
        above.append(_subtree_root(hashes))
        self._levels[level] = []
        self._full[level] = index + 1
        if len(above) == TILE_WIDTH:
            self._complete(level + 1)

    def _compare_held(self, level: int, index: int, hashes: list[Hash]) -> None:
        """Compare tile ``index`` of ``level`` with ``hashes``, cut to the width the
        store's size gives it (nothing when the store ends before it)."""
        width = min((self._size >> (TILE_HEIGHT * level)) - index * TILE_WIDTH, TILE_WIDTH)
        if width > 0:
            self._compare(level, index, width, hashes[:width])

    def finish(self, leaves: list[Hash], total: int) -> None:
        """The leaf hashes after the last full tile (``total`` leaves in all): the
        partial tiles at the store's size are compared."""
        if total < self._size:
            self.problems.append(
                f"the tiles hold {self._size} leaves, the ledger has {total} lines"
            )
            return
        self._levels[0] = leaves
        for level, hashes in enumerate(self._levels):
            if hashes:
                self._compare_held(level, self._full[level], hashes)

    def _compare(self, level: int, index: int, width: int, hashes: list[Hash]) -> None:
        self.tiles += 1
        full = tile_path(level, index, TILE_WIDTH)
        path = full if width == TILE_WIDTH else tile_path(level, index, width)
        data = _read_tile(self._root / path)
        if data is None and width != TILE_WIDTH:
            # A crash between levels may leave a wider tile ahead; its prefix counts.
            directory = self._root / path.rsplit("/", 1)[0]
            wider = sorted(found for found in _widths(directory) if found > width)
            candidates = [full] + [tile_path(level, index, found) for found in wider]
            for candidate in candidates:
                data = _read_tile(self._root / candidate)
                if data is not None:
                    path = candidate
                    break
        want = b"".join(hashes)
        if data is None:
            self.problems.append(f"tree tile {path} is missing")
        elif data[: len(want)] != want or len(data) > TILE_BYTES:
            at = next(
                (
                    i
                    for i in range(0, len(want), HASH_SIZE)
                    if data[i : i + HASH_SIZE] != want[i : i + HASH_SIZE]
                ),
                len(want),
            )
            self.problems.append(
                f"tree tile {path} holds another hash at position {at // HASH_SIZE} "
                f"than the ledger's lines give"
            )


def _read_tile(path: Path) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        return handle.read(TILE_BYTES + 1)


def _widths(directory: Path) -> list[int]:
    try:
        names = [entry.name for entry in directory.iterdir()]
    except OSError:
        return []
    return [int(name) for name in names if name.isdigit() and str(int(name)) == name]


def _subtree_root(hashes: list[Hash]) -> Hash:
    level = hashes
    while len(level) > 1:
        level = [node_hash(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return level[0]
