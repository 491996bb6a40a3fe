"""Proofs for outsiders (docs/protocol.md, "Proofs"): documents that show records of the
ledger, or its growth, to someone who has no copy of it. Pure: values in, values out.

- An *inclusion proof* (``boxmaker-proof/1``) holds the ledger's public key, a signed
  checkpoint (C2SP tlog-checkpoint in a signed note) and some lines of the ledger, each
  exactly as written, with its RFC 6962 audit path to the checkpoint's root.
  :func:`check_proof` checks the signature, then each line's path: a line proved is
  byte for byte the line the owner's key committed to at that seq.
- A *consistency proof* (``boxmaker-consistency/1``) holds two signed checkpoints of one
  ledger and the RFC 6962 consistency path between them: :func:`check_consistency`
  shows that the newer tree extends the older one, so nothing the older one covered was
  changed or removed.

Neither needs the ledger or anything of boxmaker but these documents: the hashes are
SHA-256 and the signature Ed25519, as docs/protocol.md writes out step by step. What a
proof does not show is in docs/threat-model.md ("Proofs for outsiders").
"""

from __future__ import annotations

import base64
import enum
from collections.abc import Sequence
from typing import Any, Final

import attrs
import cattrs
import orjson

from boxmaker.formats.convert import converter
from boxmaker.ledger.checkpoint import Checkpoint, CheckpointError, parse_checkpoint
from boxmaker.ledger.merkle import (
    HASH_SIZE,
    Hash,
    HashReader,
    ProofError,
    check_record,
    check_tree,
    leaf_hash,
    prove_record,
    prove_tree,
)
from boxmaker.ledger.records import BadRecord, line_fields
from boxmaker.ledger.signed_note import (
    NoteError,
    NoteVerifier,
    SignatureType,
    decode_base64,
    open_note,
    parse_vkey,
)

__all__ = [
    "CONSISTENCY_FORMAT",
    "MAX_DOCUMENT_BYTES",
    "PROOF_FORMAT",
    "Checked",
    "CheckedConsistency",
    "ConsistencyDocument",
    "ProofCheckError",
    "ProofDocument",
    "ProofProblem",
    "ProvedLine",
    "ProvedRecord",
    "check_consistency",
    "check_proof",
    "dump_document",
    "encode_hashes",
    "load_consistency",
    "load_proof",
    "make_consistency",
    "make_proof",
    "note_checkpoint",
]

PROOF_FORMAT: Final = "boxmaker-proof/1"
CONSISTENCY_FORMAT: Final = "boxmaker-consistency/1"
MAX_DOCUMENT_BYTES: Final = 64 << 20
"""The largest document read: a call's records, a decision's arguments included, are far
smaller."""
MAX_PATH_HASHES: Final = 64
"""An RFC 6962 path in a tree below 2**63 leaves has at most 63 hashes (a consistency
path at most 2 log2 N, bounded by the caller's size anyway): more is not a proof."""


class ProofProblem(enum.StrEnum):
    """Why a proof document was refused, one word each (docs/protocol.md, "Proofs")."""

    NOT_A_DOCUMENT = "not_a_document"
    """Not JSON, not the format named, a field missing, extra or of the wrong type."""
    BAD_VKEY = "bad_vkey"
    """The key is not a signed-note Ed25519 vkey."""
    OTHER_KEY = "other_key"
    """The document names a key other than the one pinned."""
    ORIGIN_MISMATCH = "origin_mismatch"
    """The document's origin, its key's name and its checkpoint's origin disagree."""
    NOT_SIGNED = "not_signed"
    """The checkpoint's note is malformed, bears no signature by the key, or a bad one."""
    BAD_CHECKPOINT = "bad_checkpoint"
    """The note's text is not a checkpoint."""
    NO_RECORDS = "no_records"
    """An inclusion proof of nothing."""
    BAD_LINE = "bad_line"
    """A line that is not a JSON object with an integer ``seq``, or whose ``seq`` is not
    the seq it is proved at."""
    NOT_COVERED = "not_covered"
    """A seq at or beyond the checkpoint's size: the checkpoint says nothing of it."""
    BAD_PROOF = "bad_proof"
    """An audit path that is malformed or does not lead from the line to the root."""
    SHRUNK = "shrunk"
    """The newer checkpoint covers fewer records than the older one."""
    NOT_A_PREFIX = "not_a_prefix"
    """The older tree is not a prefix of the newer one: records it covered changed."""


class ProofCheckError(ValueError):
    """A proof document refused; :attr:`reason` says why in one word, :attr:`seq` names
    the record when one is at fault."""

    def __init__(self, reason: ProofProblem, detail: str, seq: int | None = None) -> None:
        where = "" if seq is None else f"seq {seq}: "
        super().__init__(f"{reason}: {where}{detail}")
        self.reason = reason
        self.detail = detail
        self.seq = seq


@attrs.frozen
class ProvedRecord:
    """One line of the ledger, as text (its bytes are its UTF-8), at ``seq``, with its
    audit path: base64 hashes, nearest the leaf first (RFC 6962)."""

    seq: int
    line: str
    proof: list[str]


@attrs.frozen
class ProofDocument:
    """``boxmaker-proof/1``: lines of the ledger named ``origin`` proved against the
    signed ``checkpoint`` (the whole signed note), signed by ``vkey``."""

    format: str
    origin: str
    vkey: str
    checkpoint: str
    records: list[ProvedRecord]


@attrs.frozen
class ConsistencyDocument:
    """``boxmaker-consistency/1``: the signed checkpoints ``old`` and ``new`` of the
    ledger named ``origin``, and the consistency path between them (base64)."""

    format: str
    origin: str
    vkey: str
    old: str
    new: str
    proof: list[str]


@attrs.frozen
class ProvedLine:
    """A line a proof showed to be in the ledger: its seq, exact bytes and JSON fields."""

    seq: int
    line: bytes
    fields: dict[str, Any]


@attrs.frozen
class Checked:
    """What an inclusion proof showed: these lines are in the ledger ``checkpoint``
    covers, as the key ``key_name`` (``vkey``) signed. ``pinned``: the key was the one
    the checker gave, not only the document's own."""

    checkpoint: Checkpoint
    key_name: str
    vkey: str
    pinned: bool
    lines: tuple[ProvedLine, ...]


@attrs.frozen
class CheckedConsistency:
    """What a consistency proof showed: the ledger of ``new`` extends the one of ``old``,
    both signed by ``vkey``."""

    old: Checkpoint
    new: Checkpoint
    key_name: str
    vkey: str
    pinned: bool


def encode_hashes(hashes: Sequence[Hash]) -> list[str]:
    """Hashes as the documents hold them: standard padded base64."""
    return [base64.b64encode(value).decode("ascii") for value in hashes]


def dump_document(document: ProofDocument | ConsistencyDocument) -> bytes:
    """The document's JSON (indented, keys in the documented order, a final newline)."""
    data = converter.unstructure(document, type(document))
    return orjson.dumps(data, option=orjson.OPT_INDENT_2) + b"\n"


def make_proof(
    checkpoint_note: str,
    checkpoint: Checkpoint,
    vkey: str,
    lines: Sequence[tuple[int, bytes]],
    reader: HashReader,
) -> ProofDocument:
    """The inclusion proof of ``lines`` ((seq, exact bytes) each) in the tree of
    ``checkpoint`` (whose signed note is ``checkpoint_note``), its hashes read from
    ``reader`` (the tile store). Checked by nothing here: the caller checks it as an
    outsider would (:func:`check_proof`) before handing it out."""
    records = [
        ProvedRecord(
            seq, line.decode("utf-8"), encode_hashes(prove_record(checkpoint.size, seq, reader))
        )
        for seq, line in lines
    ]
    return ProofDocument(PROOF_FORMAT, checkpoint.origin, vkey, checkpoint_note, records)


def make_consistency(
    old_note: str,
    old_size: int,
    new_note: str,
    new: Checkpoint,
    vkey: str,
    reader: HashReader,
) -> ConsistencyDocument:
    """The consistency proof from the checkpoint ``old_note`` (of ``old_size`` records)
    to ``new``, its hashes read from ``reader``. No path where none can exist (an empty
    or a larger old tree): :func:`check_consistency` then says what is wrong."""
    hashes = prove_tree(new.size, old_size, reader) if 1 <= old_size <= new.size else []
    return ConsistencyDocument(
        CONSISTENCY_FORMAT, new.origin, vkey, old_note, new_note, encode_hashes(hashes)
    )


def note_checkpoint(note: str) -> Checkpoint | None:
    """The checkpoint a signed note's text says, its signatures NOT checked (to choose
    which proof to make; the proof's check then checks them), or None when it is not
    one.

    >>> note_checkpoint("o\\n1\\n" + "A" * 43 + "=\\n\\n\\u2014 o AAAA\\n").size
    1
    """
    split = note.rfind("\n\n")
    if split < 0:
        return None
    try:
        return parse_checkpoint(note[: split + 1])
    except CheckpointError:
        return None


def _load(data: bytes, kind: type[Any], expected_format: str) -> Any:
    if len(data) > MAX_DOCUMENT_BYTES:
        raise ProofCheckError(ProofProblem.NOT_A_DOCUMENT, f"more than {MAX_DOCUMENT_BYTES} bytes")
    try:
        raw = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ProofCheckError(ProofProblem.NOT_A_DOCUMENT, f"not JSON: {exc}") from None
    if type(raw) is not dict:
        raise ProofCheckError(ProofProblem.NOT_A_DOCUMENT, "not a JSON object")
    if raw.get("format") != expected_format:
        found = raw.get("format")
        shown = found[:60] if isinstance(found, str) else found
        raise ProofCheckError(
            ProofProblem.NOT_A_DOCUMENT, f"the format is {shown!r}, not {expected_format!r}"
        )
    try:
        return converter.structure(raw, kind)
    except Exception as exc:  # cattrs raises validation groups of many kinds; one answer
        detail = "; ".join(cattrs.transform_error(exc))
        raise ProofCheckError(ProofProblem.NOT_A_DOCUMENT, detail) from None


def load_proof(data: bytes) -> ProofDocument:
    """A ``boxmaker-proof/1`` document from its JSON. Raises :class:`ProofCheckError`
    (``not_a_document``); nothing in it is checked yet (:func:`check_proof`)."""
    document: ProofDocument = _load(data, ProofDocument, PROOF_FORMAT)
    return document


def load_consistency(data: bytes) -> ConsistencyDocument:
    """A ``boxmaker-consistency/1`` document from its JSON (:func:`load_proof`'s rules)."""
    document: ConsistencyDocument = _load(data, ConsistencyDocument, CONSISTENCY_FORMAT)
    return document


def _verifier(vkey: str, pinned_vkey: str | None) -> NoteVerifier:
    """The key to check with: the pinned one, which the document must name too; else
    the document's own."""
    try:
        verifier = parse_vkey(vkey)
    except NoteError as exc:
        raise ProofCheckError(ProofProblem.BAD_VKEY, f"the document's key: {exc.detail}") from None
    if pinned_vkey is not None:
        try:
            pinned = parse_vkey(pinned_vkey.strip())
        except NoteError as exc:
            raise ProofCheckError(ProofProblem.BAD_VKEY, f"the pinned key: {exc.detail}") from None
        if pinned.vkey != verifier.vkey:
            raise ProofCheckError(
                ProofProblem.OTHER_KEY,
                f"the document's key {verifier.name}+{verifier.key_id:08x} is not the pinned "
                f"key {pinned.name}+{pinned.key_id:08x}",
            )
        verifier = pinned
    if verifier.signature_type is not SignatureType.ED25519:
        raise ProofCheckError(ProofProblem.BAD_VKEY, "the key is not an Ed25519 (0x01) key")
    return verifier


def _open_checkpoint(note: str, verifier: NoteVerifier, origin: str, which: str) -> Checkpoint:
    """The checkpoint in ``note``, signed by ``verifier``, of the ledger ``origin``."""
    try:
        text, _ = open_note(note.encode(), [verifier])
    except NoteError as exc:
        raise ProofCheckError(
            ProofProblem.NOT_SIGNED,
            f"the {which} checkpoint is not signed by {verifier.name}+{verifier.key_id:08x}: "
            f"{exc.detail}",
        ) from None
    try:
        checkpoint = parse_checkpoint(text)
    except CheckpointError as exc:
        raise ProofCheckError(
            ProofProblem.BAD_CHECKPOINT, f"the {which} note is not a checkpoint: {exc}"
        ) from None
    if checkpoint.origin != origin:
        raise ProofCheckError(
            ProofProblem.ORIGIN_MISMATCH,
            f"the {which} checkpoint is of {checkpoint.origin!r}, not {origin!r}",
        )
    return checkpoint


def _check_origin(origin: str, verifier: NoteVerifier) -> None:
    # The ledger key's name is the ledger's origin (docs/decisions.md, "Signed
    # checkpoints"): a key named for another ledger does not speak for this one.
    if verifier.name != origin:
        raise ProofCheckError(
            ProofProblem.ORIGIN_MISMATCH,
            f"the key is named {verifier.name!r}, the document's origin is {origin!r}",
        )


def _decode_path(hashes: Sequence[str], seq: int | None) -> list[Hash]:
    if len(hashes) > MAX_PATH_HASHES:
        raise ProofCheckError(
            ProofProblem.BAD_PROOF, f"{len(hashes)} hashes, more than any path has", seq
        )
    decoded = []
    for number, text in enumerate(hashes):
        try:
            value = decode_base64(text)
        except ValueError:
            value = b""
        if len(value) != HASH_SIZE:
            raise ProofCheckError(
                ProofProblem.BAD_PROOF, f"hash {number} is not base64 of 32 bytes", seq
            )
        decoded.append(value)
    return decoded


def _check_line(record: ProvedRecord, checkpoint: Checkpoint) -> ProvedLine:
    seq = record.seq
    if not 0 <= seq < checkpoint.size:
        raise ProofCheckError(
            ProofProblem.NOT_COVERED,
            f"the checkpoint covers seq 0 to {checkpoint.size - 1} only",
            seq,
        )
    try:
        line = record.line.encode("utf-8")
        fields = line_fields(line)
    except UnicodeEncodeError:
        raise ProofCheckError(ProofProblem.BAD_LINE, "the line is not UTF-8 text", seq) from None
    except BadRecord as exc:
        raise ProofCheckError(ProofProblem.BAD_LINE, f"the line is {exc}", seq) from None
    if type(fields.get("seq")) is not int or fields["seq"] != seq:
        raise ProofCheckError(
            ProofProblem.BAD_LINE, f"the line's own seq is {fields.get('seq')!r}", seq
        )
    path = _decode_path(record.proof, seq)
    try:
        check_record(path, checkpoint.size, checkpoint.root, seq, leaf_hash(line))
    except ProofError as exc:
        raise ProofCheckError(
            ProofProblem.BAD_PROOF,
            f"the line is not the one the checkpoint of size {checkpoint.size} holds ({exc})",
            seq,
        ) from None
    return ProvedLine(seq, line, fields)


def check_proof(document: ProofDocument, pinned_vkey: str | None = None) -> Checked:
    """Check an inclusion proof with nothing but the document (and the key the checker
    trusts, ``pinned_vkey``: without it the document's own key is used, which proves
    only that *someone* holding that key signed). Raises :class:`ProofCheckError`.

    In order: the format; the key (the pinned one when given); the origin (the
    document's, the key's name and the checkpoint's agree); the note's signature; its
    text a checkpoint; then each record: its seq below the checkpoint's size, its line a
    JSON object whose ``seq`` is that seq, and the line's leaf hash led by its path to
    the checkpoint's root.
    """
    if document.format != PROOF_FORMAT:
        raise ProofCheckError(
            ProofProblem.NOT_A_DOCUMENT, f"the format is {document.format!r}, not {PROOF_FORMAT!r}"
        )
    verifier = _verifier(document.vkey, pinned_vkey)
    _check_origin(document.origin, verifier)
    checkpoint = _open_checkpoint(document.checkpoint, verifier, document.origin, "proof's")
    if not document.records:
        raise ProofCheckError(ProofProblem.NO_RECORDS, "the document proves no record")
    lines = tuple(_check_line(record, checkpoint) for record in document.records)
    return Checked(checkpoint, verifier.name, verifier.vkey, pinned_vkey is not None, lines)


def check_consistency(
    document: ConsistencyDocument, pinned_vkey: str | None = None
) -> CheckedConsistency:
    """Check that the ledger of ``new`` extends the ledger of ``old``: both notes signed
    by the key (the pinned one when given), of one origin, ``new`` no smaller, and the
    RFC 6962 consistency path from ``old``'s root to ``new``'s. Raises
    :class:`ProofCheckError` (``not_a_prefix``: records ``old`` covered were changed,
    or the newer ledger is another one that shares the key and origin)."""
    if document.format != CONSISTENCY_FORMAT:
        raise ProofCheckError(
            ProofProblem.NOT_A_DOCUMENT,
            f"the format is {document.format!r}, not {CONSISTENCY_FORMAT!r}",
        )
    verifier = _verifier(document.vkey, pinned_vkey)
    _check_origin(document.origin, verifier)
    old = _open_checkpoint(document.old, verifier, document.origin, "old")
    new = _open_checkpoint(document.new, verifier, document.origin, "new")
    if new.size < old.size:
        raise ProofCheckError(
            ProofProblem.SHRUNK,
            f"the new checkpoint covers {new.size} records, the old one {old.size}: "
            "records were removed",
        )
    path = _decode_path(document.proof, None)
    if old.size == 0:
        # Every tree extends the empty one; there is no path to check.
        if path:
            raise ProofCheckError(ProofProblem.BAD_PROOF, "a path from the empty tree")
    else:
        try:
            check_tree(path, new.size, new.root, old.size, old.root)
        except ProofError as exc:
            raise ProofCheckError(
                ProofProblem.NOT_A_PREFIX,
                f"the ledger of size {new.size} does not extend the one of size {old.size} ({exc})",
            ) from None
    return CheckedConsistency(old, new, verifier.name, verifier.vkey, pinned_vkey is not None)
