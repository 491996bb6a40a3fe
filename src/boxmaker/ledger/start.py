"""brokerd's start on the ledger (docs/protocol.md, "Verifying"): the calls earlier
boots left open and the writer's tree, from the newest checkpoint when it holds, else
from a full verification.

The fast path: :func:`~boxmaker.ledger.fast_start.verify_since_checkpoint`, then the
tree resumed from the tiles at the checkpoint's size and the lines from the
checkpoint's own on added (read once more, from the file that holds it through the live
file: they are the few since the checkpoint).
The fallback: the full verification (every line, every checkpoint, every tile), then
the tree resumed from the tiles when that verification found them whole and of the
ledger's size, else rebuilt from the lines of every file. Blocking.
"""

from __future__ import annotations

import attrs

from boxmaker.home.paths import Home
from boxmaker.ledger.fast_start import (
    Refusal,
    RefusalReason,
    SinceCheckpoint,
    verify_since_checkpoint,
)
from boxmaker.ledger.segments import ledger_lines_from
from boxmaker.ledger.signed_note import NoteVerifier
from boxmaker.ledger.tiles import TileProblem, TileStore
from boxmaker.ledger.tree import LedgerTree, rebuild_tree, tree_dir
from boxmaker.ledger.verify import Report
from boxmaker.ledger.verify_files import verify_file

__all__ = ["LedgerStart", "start_ledger"]


@attrs.frozen
class LedgerStart:
    """The ledger as a start finds it: the verification's report (of the lines after
    the checkpoint on the fast path, else of all), the tree at the ledger's next seq,
    and why the fast path was not taken (None: it was)."""

    report: Report
    tree: LedgerTree
    fallback: Refusal | None
    checkpoint_seq: int | None = None


def start_ledger(home: Home, verifier: NoteVerifier | None, next_seq: int) -> LedgerStart:
    """Verify the ledger at ``home`` (whose next seq is ``next_seq``) and open its tree:
    see the module docstring. I/O errors on the ledger propagate."""
    found = verify_since_checkpoint(home.audit_log, verifier)
    if isinstance(found, SinceCheckpoint):
        tree_or_refusal = _resumed_tree(home, found, next_seq)
        if isinstance(tree_or_refusal, LedgerTree):
            return LedgerStart(found.report, tree_or_refusal, None, found.checkpoint_seq)
        found = tree_or_refusal
    report = verify_file(home.audit_log, verifier=verifier)
    directory = tree_dir(home)
    if report.tiles_sound:
        try:
            store = TileStore(directory)
            if store.size == next_seq:
                return LedgerStart(report, LedgerTree.resume(store, next_seq), found)
        except (TileProblem, OSError):
            pass
    return LedgerStart(report, rebuild_tree(home), found)


def _resumed_tree(home: Home, found: SinceCheckpoint, next_seq: int) -> LedgerTree | Refusal:
    try:
        tree = LedgerTree.resume(TileStore(tree_dir(home)), found.checkpoint_seq)
        lines = ledger_lines_from(found.files, found.checkpoint_seq, found.offset)
        tree.add([line.removesuffix(b"\n") for line in lines])
    except (TileProblem, OSError, ValueError) as exc:
        return Refusal(RefusalReason.TILES, str(exc))
    if tree.size != next_seq:
        return Refusal(
            RefusalReason.TILES, f"the tree has {tree.size} leaves, the ledger {next_seq} lines"
        )
    return tree
