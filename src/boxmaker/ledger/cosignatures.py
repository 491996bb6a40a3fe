"""The witnesses' cosignatures kept beside the ledger's tree (docs/protocol.md,
"Witnesses"): where each is, the size a kept signed note says, and what ``bxctl status``
shows of each witness. Only files: brokerd's sender (broker/witnesses.py) writes them,
and bxctl reads them without loading brokerd's machinery.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Final

import attrs

from boxmaker.home.config import WitnessConfig
from boxmaker.home.regular_file import read_regular_file
from boxmaker.ledger.checkpoint import CheckpointError, parse_checkpoint
from boxmaker.ledger.signed_note import NoteError, NoteVerifier, open_note, parse_vkey
from boxmaker.ledger.tree import CHECKPOINT_FILE

COSIGNATURES: Final = "cosignatures"
"""The directory under ``ledger/tree/`` with each witness's newest cosigned note."""
RUNBOOK_WITNESS: Final = "docs/runbook.md#witness"
MAX_COSIGNATURE_FILE: Final = 64 * 1024


def cosignature_path(tree_dir: Path, name: str) -> Path:
    return tree_dir / COSIGNATURES / name


def read_cosigned(path: Path, verifier: NoteVerifier, origin: str | None = None) -> int | None:
    """The size of the checkpoint in a signed note file signed by ``verifier`` (a kept
    cosignature, or the newest checkpoint with the ledger's key), with origin
    ``origin`` when given; else None. Blocking."""
    try:
        data = read_regular_file(path, limit=MAX_COSIGNATURE_FILE)
        text = open_note(data, [verifier]).text
        checkpoint = parse_checkpoint(text)
    except (OSError, NoteError, CheckpointError):
        return None
    if origin is not None and checkpoint.origin != origin:
        return None
    return checkpoint.size


@attrs.frozen
class WitnessView:
    """What ``bxctl status`` shows of a witness: the size it last cosigned (None:
    never) and the records the newest checkpoint holds beyond it (None: unknown)."""

    name: str
    cosigned_size: int | None
    lag: int | None
    lagging: bool


def witness_views(
    tree_dir: Path, witnesses: Sequence[WitnessConfig], ledger: NoteVerifier | None, max_lag: int
) -> list[WitnessView]:
    """Each witness's state from the files under ``tree_dir``: its kept cosignature and
    the newest checkpoint (checked with the ledger's key when one is given). Blocking."""
    newest = None
    if ledger is not None:
        newest = read_cosigned(tree_dir / CHECKPOINT_FILE, ledger, ledger.name)
    views = []
    for config in witnesses:
        verifier = parse_vkey(config.vkey)
        origin = ledger.name if ledger is not None else None
        cosigned = read_cosigned(cosignature_path(tree_dir, config.name), verifier, origin)
        lag = None if cosigned is None or newest is None else max(0, newest - cosigned)
        lagging = cosigned is None or (lag is not None and lag > max_lag)
        views.append(WitnessView(config.name, cosigned, lag, lagging))
    return views
