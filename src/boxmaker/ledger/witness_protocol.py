"""The C2SP tlog-witness ``add-checkpoint`` call, both ends, byte for byte. Pure.

The request body is an old size line (``old <size>``), up to 63 consistency proof lines
(one base64 hash each), an empty line, then the signed checkpoint note. A witness keeps,
per log origin, the size and root of the newest checkpoint it cosigned, and answers
(docs/protocol.md, "Witnesses"):

- 200: one cosignature line (``cosignature/v1``, signed-note's ``— name base64``) — the
  caller persists the new head *before* it sends the line;
- 400 ``malformed``: a body that is not the format, an old size above the size;
- 403 ``not_signed``: no valid signature by a key the witness trusts for the origin, or
  a bad one by such a key;
- 404 ``unknown_log``: an origin the witness is not configured for;
- 409 ``conflict``: the old size is not the witness's size; the body is that size and a
  newline, ``Content-Type: text/x.tlog.size``;
- 422 ``bad_proof`` / ``fork`` / ``not_empty_tree``: the proof does not hold, the same
  size with another root, a size-0 checkpoint whose root is not the empty tree's.

:func:`decide_add_checkpoint` is the witness's whole decision, given its state and its
log keys; the HTTP server (``bxctl witness serve``) and brokerd's sender
(boxmaker.broker.witnesses) are shells around this module.

>>> request = AddCheckpoint(0, (), b"example.com/log\\n1\\n...\\n\\nsig\\n")
>>> format_add_checkpoint(request)[:7]
b'old 0\\n\\n'
"""

from __future__ import annotations

import base64
import enum
import re
from collections.abc import Mapping, Sequence
from typing import Final

import attrs

from boxmaker.ledger.checkpoint import (
    MAX_SIZE,
    Checkpoint,
    CheckpointError,
    parse_checkpoint,
)
from boxmaker.ledger.merkle import EMPTY_TREE_HASH, HASH_SIZE, Hash, ProofError, check_tree
from boxmaker.ledger.signed_note import (
    NoteError,
    NoteProblem,
    NoteVerifier,
    decode_base64,
    open_note,
)

__all__ = [
    "MAX_BODY",
    "MAX_PROOF_LINES",
    "SIZE_CONTENT_TYPE",
    "AddCheckpoint",
    "Cosign",
    "Refusal",
    "TreeHead",
    "WitnessProblem",
    "WitnessRequestError",
    "decide_add_checkpoint",
    "format_add_checkpoint",
    "format_conflict",
    "parse_add_checkpoint",
    "parse_conflict",
    "pick_cosignature",
]

MAX_PROOF_LINES: Final = 63
"""The spec's bound on a request's proof lines (a proof in a tree of 2**63 leaves)."""
MAX_BODY: Final = 64 * 1024
"""A request body read at most: 63 proof lines and a note of 100 signatures fit in
a fifth of it."""
SIZE_CONTENT_TYPE: Final = "text/x.tlog.size"
ADD_CHECKPOINT_PATH: Final = "/add-checkpoint"
_SIZE: Final = re.compile(rb"0|[1-9][0-9]{0,18}")


class WitnessProblem(enum.StrEnum):
    """Why a witness did not cosign; each maps to one HTTP status (:data:`STATUS`)."""

    MALFORMED = "malformed"
    NOT_SIGNED = "not_signed"
    UNKNOWN_LOG = "unknown_log"
    CONFLICT = "conflict"
    BAD_PROOF = "bad_proof"
    FORK = "fork"
    """The same size as the witness's with another root: two trees for one log."""
    NOT_EMPTY_TREE = "not_empty_tree"


STATUS: Final[Mapping[WitnessProblem, int]] = {
    WitnessProblem.MALFORMED: 400,
    WitnessProblem.NOT_SIGNED: 403,
    WitnessProblem.UNKNOWN_LOG: 404,
    WitnessProblem.CONFLICT: 409,
    WitnessProblem.BAD_PROOF: 422,
    WitnessProblem.FORK: 422,
    WitnessProblem.NOT_EMPTY_TREE: 422,
}


class WitnessRequestError(ValueError):
    """A request body or an answer that is not the protocol's format."""


def _hash(_instance: object, _attribute: object, value: tuple[bytes, ...]) -> None:
    if len(value) > MAX_PROOF_LINES or any(len(h) != HASH_SIZE for h in value):
        raise ValueError(f"a proof is at most {MAX_PROOF_LINES} hashes of {HASH_SIZE} bytes")


def _size(_instance: object, _attribute: object, value: int) -> None:
    if not 0 <= value <= MAX_SIZE:
        raise ValueError(f"a tree size is 0 to 2**63-1, not {value}")


@attrs.frozen
class AddCheckpoint:
    """One ``add-checkpoint`` request: the size the client believes the witness has,
    the consistency proof from it, and the signed checkpoint note (its exact bytes)."""

    old_size: int = attrs.field(validator=_size)
    proof: tuple[Hash, ...] = attrs.field(validator=_hash)
    note: bytes


def format_add_checkpoint(request: AddCheckpoint) -> bytes:
    """The request body: ``old <n>\\n``, one base64 hash a line, an empty line, the note."""
    lines = [f"old {request.old_size}\n".encode()]
    lines += [base64.b64encode(h) + b"\n" for h in request.proof]
    return b"".join(lines) + b"\n" + request.note


def parse_add_checkpoint(body: bytes) -> AddCheckpoint:
    """The request in ``body``, strictly: the old size in decimal without leading
    zeros, each proof line canonical base64 of 32 bytes, at most 63 of them. Raises
    :class:`WitnessRequestError`."""
    head, blank, note = body.partition(b"\n\n")
    if not blank:
        raise WitnessRequestError("no empty line before the checkpoint")
    first, *proof_lines = head.split(b"\n")
    size = first.removeprefix(b"old ")
    if size == first or not _SIZE.fullmatch(size) or int(size) > MAX_SIZE:
        raise WitnessRequestError("the first line is not 'old <size>' (decimal, no leading 0)")
    if len(proof_lines) > MAX_PROOF_LINES:
        raise WitnessRequestError(f"more than {MAX_PROOF_LINES} proof lines")
    proof: list[Hash] = []
    for number, line in enumerate(proof_lines, start=2):
        try:
            value = decode_base64(line.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            value = b""
        if len(value) != HASH_SIZE:
            raise WitnessRequestError(f"line {number} is not the base64 of a 32-byte hash")
        proof.append(value)
    return AddCheckpoint(int(size), tuple(proof), note)


@attrs.frozen
class TreeHead:
    """What a witness keeps per log: the size and root it last cosigned."""

    size: int = attrs.field(validator=_size)
    root: Hash


@attrs.frozen
class Cosign:
    """Cosign ``text`` (the checkpoint note's text): the witness first makes ``head``
    its state for ``origin`` (durably, and only if its size for the origin is still
    ``old_size``), then answers 200 with its cosignature."""

    origin: str
    text: str
    checkpoint: Checkpoint
    old_size: int

    @property
    def head(self) -> TreeHead:
        return TreeHead(self.checkpoint.size, self.checkpoint.root)


@attrs.frozen
class Refusal:
    """Not cosigned: the status, the reason code, a one-line detail, and the body to
    answer (the witness's size for a 409, else ``<reason>: <detail>``)."""

    problem: WitnessProblem
    detail: str
    origin: str | None = None
    known_size: int | None = None

    @property
    def status(self) -> int:
        return STATUS[self.problem]

    @property
    def content_type(self) -> str:
        if self.problem is WitnessProblem.CONFLICT:
            return SIZE_CONTENT_TYPE
        return "text/plain; charset=utf-8"

    @property
    def body(self) -> bytes:
        if self.problem is WitnessProblem.CONFLICT:
            return format_conflict(self.known_size or 0)
        return f"{self.problem}: {self.detail}\n".encode()


def format_conflict(size: int) -> bytes:
    """A 409's body: the witness's size, in decimal, and a newline."""
    return f"{size}\n".encode()


def parse_conflict(body: bytes) -> int:
    """The size in a 409's ``text/x.tlog.size`` body. Raises :class:`WitnessRequestError`."""
    size = body.removesuffix(b"\n")
    if size == body or not _SIZE.fullmatch(size) or int(size) > MAX_SIZE:
        raise WitnessRequestError("a 409 body that is not a size and a newline")
    return int(size)


def _origin_of(note: bytes) -> str:
    first, _, _ = note.partition(b"\n")
    return first.decode("utf-8", errors="replace")


def decide_add_checkpoint(
    body: bytes,
    logs: Mapping[str, Sequence[NoteVerifier]],
    heads: Mapping[str, TreeHead],
) -> Cosign | Refusal:
    """The witness's answer to an ``add-checkpoint`` body. ``logs`` maps each origin the
    witness serves to the keys it trusts for it; ``heads`` holds what it last cosigned
    per origin (none: never). The checks run in the spec's order: the format, the
    origin, the signature, the sizes, the proof."""
    try:
        request = parse_add_checkpoint(body)
    except WitnessRequestError as exc:
        return Refusal(WitnessProblem.MALFORMED, str(exc))
    origin = _origin_of(request.note)
    verifiers = logs.get(origin)
    if verifiers is None:
        return Refusal(WitnessProblem.UNKNOWN_LOG, f"no log {origin[:200]!r} here")
    try:
        text = open_note(request.note, verifiers).text
    except NoteError as exc:
        problem = WitnessProblem.MALFORMED
        if exc.reason is not NoteProblem.MALFORMED:
            problem = WitnessProblem.NOT_SIGNED
        return Refusal(problem, f"the checkpoint note: {exc}", origin)
    try:
        checkpoint = parse_checkpoint(text)
    except CheckpointError as exc:
        return Refusal(WitnessProblem.MALFORMED, f"the checkpoint: {exc}", origin)
    return _check_sizes(request, origin, text, checkpoint, heads.get(origin))


def _check_sizes(
    request: AddCheckpoint,
    origin: str,
    text: str,
    checkpoint: Checkpoint,
    known: TreeHead | None,
) -> Cosign | Refusal:
    old, size = request.old_size, checkpoint.size
    if old > size:
        return Refusal(WitnessProblem.MALFORMED, f"old size {old} above the size {size}", origin)
    known_size = known.size if known is not None else 0
    if old != known_size:
        return Refusal(
            WitnessProblem.CONFLICT,
            f"old size {old}, the witness has {known_size}",
            origin,
            known_size,
        )
    if size == 0 and checkpoint.root != EMPTY_TREE_HASH:
        return Refusal(
            WitnessProblem.NOT_EMPTY_TREE, "size 0 with a root not the empty tree's", origin
        )
    if old == 0 or known is None:
        if request.proof:
            return Refusal(WitnessProblem.BAD_PROOF, "a proof from size 0 must be empty", origin)
        return Cosign(origin, text, checkpoint, old)
    if old == size and checkpoint.root != known.root:
        return Refusal(
            WitnessProblem.FORK,
            f"size {size} with a root other than the one cosigned at that size",
            origin,
        )
    try:
        check_tree(request.proof, size, checkpoint.root, old, known.root)
    except ProofError as exc:
        return Refusal(
            WitnessProblem.BAD_PROOF, f"no consistency from size {old} to {size}: {exc}", origin
        )
    return Cosign(origin, text, checkpoint, old)


def pick_cosignature(body: bytes, verifier: NoteVerifier) -> str:
    """The line of a 200's body signed by ``verifier``'s name and key id (others, by
    keys the client does not know, are ignored, as the spec asks). The signature itself
    is checked by :func:`boxmaker.ledger.signed_note.verify_cosignature`. Raises
    :class:`WitnessRequestError` when there is none."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise WitnessRequestError("a 200 body that is not UTF-8") from None
    if not text.endswith("\n"):
        raise WitnessRequestError("a 200 body whose last line has no newline")
    key = verifier.key_id.to_bytes(4, "big")
    prefix = f"\u2014 {verifier.name} "
    for line in text[:-1].split("\n"):
        if not line.startswith(prefix):
            continue
        try:
            raw = decode_base64(line[len(prefix) :])
        except ValueError:
            continue
        if raw[:4] == key:
            return line + "\n"
    raise WitnessRequestError(f"no cosignature by {verifier.name}+{verifier.key_id:08x}")
