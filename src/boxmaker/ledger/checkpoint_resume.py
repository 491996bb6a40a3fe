"""What lets a verification start at a ``checkpoint`` record rather than at the genesis
(docs/protocol.md, "Verifying"): the record's signed note, its root against the tiles'
root at its size, and the calls it says were open, checked once and shared by the fast
start (:mod:`boxmaker.ledger.fast_start`, from the newest checkpoint) and by the
verification of a ledger whose oldest segments were archived
(:mod:`boxmaker.ledger.verify_segments`, from the checkpoint the oldest file present
begins with). Anything that does not hold is a :class:`Refusal` with its reason.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Callable
from typing import Literal

import attrs

from boxmaker.ledger.checkpoint import CheckpointError, parse_checkpoint
from boxmaker.ledger.merkle import Frontier, leaf_hash
from boxmaker.ledger.records import BadRecord, CheckpointRecord, decode_line, line_fields
from boxmaker.ledger.signed_note import NoteError, NoteVerifier, open_note
from boxmaker.ledger.tiles import TileProblem, TileStore
from boxmaker.ledger.verify_report import ResumePoint

__all__ = ["Archived", "Refusal", "RefusalReason", "resume_at_checkpoint"]


class RefusalReason(enum.StrEnum):
    """Why a verification could not start from a checkpoint."""

    NO_KEY = "no_key"
    NO_POSITION = "no_position"
    BAD_POSITION = "bad_position"
    WRONG_LINE = "wrong_line"
    NOT_A_CHECKPOINT = "not_a_checkpoint"
    BAD_NOTE = "bad_note"
    CHAIN_BROKEN = "chain_broken"
    TILES = "tiles"


class Archived(enum.Enum):
    """What :func:`resume_at_checkpoint` takes for the line before a checkpoint that
    begins the oldest file present, the files before it moved away."""

    BEFORE = "before"


@attrs.frozen
class Refusal:
    """The checkpoint was not used: ``reason`` in one word, ``detail`` in a sentence."""

    reason: RefusalReason
    detail: str

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}"


def resume_at_checkpoint(
    line: bytes,
    seq: int,
    where: str,
    *,
    before: bytes | Literal[Archived.BEFORE] | None,
    origin: Callable[[], str] | None,
    verifier: NoteVerifier,
    tiles: Callable[[], TileStore],
) -> ResumePoint | Refusal:
    """The resume point after checkpoint record ``line`` (without its newline), which
    must be seq ``seq`` (found at ``where``, in words), or why it cannot be used: the
    line before it must be ``before`` (by the record's ``prev``; None: there is none),
    or :attr:`Archived.BEFORE` (moved away with the segments before it: the signed root
    alone vouches for it); the note must be signed by ``verifier``'s key and say this
    ledger (``origin``, read only when needed; None: the note's own origin is taken),
    the record's size and root; the tiles (``tiles``, opened only when needed) must
    give that root at that size (:meth:`~boxmaker.ledger.merkle.Frontier.at`). The
    checks of the fast start and of a verification with the oldest segments archived
    (:mod:`boxmaker.ledger.verify_files`)."""
    digest = hashlib.sha256(line).hexdigest()
    try:
        record = decode_line(line)
    except BadRecord as exc:
        return Refusal(RefusalReason.NOT_A_CHECKPOINT, str(exc))
    body = record.body
    if not isinstance(body, CheckpointRecord) or record.seq != seq or body.size != record.seq:
        return Refusal(
            RefusalReason.NOT_A_CHECKPOINT, f"the line at {where} is not checkpoint seq {seq}"
        )
    if before is not Archived.BEFORE and (
        before is None or hashlib.sha256(before).hexdigest() != record.prev
    ):
        return Refusal(
            RefusalReason.CHAIN_BROKEN,
            f"the line before checkpoint seq {record.seq} is not the one its prev names",
        )
    said = None if origin is None else origin()
    try:
        checkpoint = parse_checkpoint(open_note(body.note.encode(), [verifier]).text)
    except (NoteError, CheckpointError) as exc:
        return Refusal(RefusalReason.BAD_NOTE, f"checkpoint seq {record.seq}: {exc}")
    if said is None:
        said = checkpoint.origin
    if (checkpoint.origin, checkpoint.size, checkpoint.root.hex()) != (
        said,
        body.size,
        body.root,
    ):
        return Refusal(
            RefusalReason.BAD_NOTE,
            f"checkpoint seq {record.seq}: its note does not say this ledger, size and root",
        )
    try:
        store = tiles()
        if store.size < body.size:
            return Refusal(
                RefusalReason.TILES,
                f"the tiles hold {store.size} leaves, checkpoint seq {record.seq} "
                f"needs {body.size}",
            )
        tree = Frontier.at(body.size, store)
    except (TileProblem, OSError) as exc:
        return Refusal(RefusalReason.TILES, str(exc))
    if tree.root() != checkpoint.root:
        return Refusal(
            RefusalReason.TILES,
            f"the tiles do not give checkpoint seq {record.seq}'s signed root",
        )
    tree.append(leaf_hash(line))
    # A boot that stopped before its checkpoint has no calls of its own open in it, so
    # with the line before archived, taking it as running changes no call's state.
    stopped = False
    if before is not Archived.BEFORE and before is not None:
        before_fields = line_fields(before)  # decoded: its hash is in the chain
        stopped = before_fields.get("kind") == "stop" and before_fields.get("boot") == body.boot
    return ResumePoint(
        next_seq=record.seq + 1,
        prev_hash=digest,
        tree=tree,
        open_calls=dict(body.open_calls),
        unfinished=frozenset(body.unfinished),
        newest_boot=body.boot,
        boot_stopped=stopped,
        origin=said,
    )
