"""``bxctl audit prove``, ``check-proof`` and ``consistency``: proofs for outsiders
(docs/protocol.md, "Proofs"; what they show and do not: docs/threat-model.md, "Proofs
for outsiders").

``prove`` reads the call's records and the ledger's checkpoint records from the ledger,
the audit paths from the tree's tiles (``ledger/tree/``) and the key from
``keys/ledger.vkey``, and checks the document as an outsider would before handing it
out. ``check-proof`` needs no ledger at all. ``consistency`` proves that the ledger
only grew since a checkpoint the owner kept.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

import orjson

from boxmaker.cli.common import DEFAULT, Common, Exit, fail, print_json
from boxmaker.core.vocabulary import Record
from boxmaker.formats.printable import printable
from boxmaker.home.file_ops import write_atomically
from boxmaker.home.paths import Home
from boxmaker.ledger.checkpoint import Checkpoint, CheckpointError
from boxmaker.ledger.ledger_key import RUNBOOK_LEDGER_KEY
from boxmaker.ledger.merkle import ProofError
from boxmaker.ledger.proofs import (
    MAX_DOCUMENT_BYTES,
    Checked,
    ProofCheckError,
    check_consistency,
    check_proof,
    dump_document,
    load_proof,
    make_consistency,
    make_proof,
    note_checkpoint,
)
from boxmaker.ledger.reader import LedgerReader, NotARecord
from boxmaker.ledger.records import Body, CheckpointRecord, call_of
from boxmaker.ledger.segments import SegmentProblem, ledger_files, ledger_lines
from boxmaker.ledger.signed_note import NoteError
from boxmaker.ledger.tiles import TileProblem, TileStore

CHECKPOINT_WORD: Final = b'"kind":"checkpoint"'
"""Every checkpoint line holds these bytes (canonical JSON: keys sorted, no spaces)."""
MAX_VKEY_BYTES: Final = 4096
SHOWN_FIELDS: Final = ("tool", "verdict", "reason", "grant", "outcome", "status")
"""What ``check-proof`` prints of each record after its seq, time, kind and call."""
TREE_DIR: Final = "tree"


class ProveFailed(Exception):
    """Why no proof could be made, for the owner (exit 1)."""


def _read_limited(path: Path, limit: int, what: str) -> bytes:
    """A file the owner names (a symlink is followed: it is the owner's choice)."""
    with path.open("rb") as file:
        data = file.read(limit + 1)
    if len(data) > limit:
        raise ProveFailed(f"{path}: more than {limit} bytes, not {what}")
    return data


def _home_vkey(home: Home) -> str:
    try:
        data = _read_limited(home.ledger_vkey, MAX_VKEY_BYTES, "a vkey")
    except FileNotFoundError:
        raise ProveFailed(
            f"{home.ledger_vkey}: no ledger vkey (bxctl init writes it); see {RUNBOOK_LEDGER_KEY}"
        ) from None
    return data.decode("utf-8", errors="replace").strip()


def _tiles(home: Home, size: int) -> TileStore:
    """The tree's tiles, which must cover a checkpoint of ``size`` records."""
    root = home.ledger_dir / TREE_DIR
    if not root.is_dir():
        raise ProveFailed(f"{root}: no tree tiles (brokerd writes them with each checkpoint)")
    try:
        store = TileStore(root)
    except TileProblem as exc:
        raise ProveFailed(f"{root}: {exc}") from None
    if store.size < size:
        raise ProveFailed(f"the tree's tiles cover {store.size} records, the checkpoint {size}")
    return store


def _checkpoint_of(record: Record[CheckpointRecord]) -> Checkpoint:
    """The checkpoint a checkpoint record's note says (its signature is checked with the
    whole document)."""
    found = note_checkpoint(record.body.note)
    if found is None:
        raise ProveFailed(f"the checkpoint record at seq {record.seq} holds no checkpoint note")
    return found


def _scan(
    lines: Iterable[bytes], call: str | None
) -> tuple[list[tuple[bytes, Record[Body]]], Record[CheckpointRecord] | None, int]:
    """The call's records (each with its line), the newest checkpoint record and the
    lines read, in one pass that decodes only lines naming the call or a checkpoint."""
    reader = LedgerReader(lines)
    mentioning = (CHECKPOINT_WORD,) if call is None else (call.encode(), CHECKPOINT_WORD)
    found: list[tuple[bytes, Record[Body]]] = []
    newest: Record[CheckpointRecord] | None = None
    for line, record in reader.records(mentioning=mentioning):
        if isinstance(record, NotARecord):
            continue
        if isinstance(record.body, CheckpointRecord):
            newest = Record(record.seq, record.at, record.prev, record.body)
        elif call is not None and call_of(record.body) == call:
            found.append((line, record))
    return found, newest, reader.read


def _write_or_print(document: bytes, out: Path | None) -> None:
    if out is None:
        sys.stdout.write(printable(document.decode(), lines=True))
    else:
        write_atomically(out, document, mode=0o600)


def prove(call: str, /, *, out: Path | None = None, common: Common = DEFAULT) -> Exit:
    """Prove a call's records to someone without the ledger: its lines, their inclusion
    proofs and the newest signed checkpoint that covers them, as one JSON document
    (docs/protocol.md, "Proofs"). Exit 1 when the call has no records or no checkpoint
    covers them yet.

    Parameters
    ----------
    call
        The call (c-…).
    out
        Write the document to this file (mode 0600) instead of printing it.
    """
    home = common.resolve()
    path = home.audit_log
    try:
        found, newest, read = _scan(ledger_lines(ledger_files(path.parent)), call)
    except OSError as exc:
        return fail(f"{path}: {exc.strerror}", Exit.USAGE)
    except SegmentProblem as exc:
        return fail(f"{path.parent}: {exc}", Exit.USAGE)
    if not found:
        return fail(f"no records of call {call} in the ledger ({path})", Exit.FAILED)
    last_seq = found[-1][1].seq
    if newest is None or newest.body.size <= last_seq:
        covered = "no checkpoint yet" if newest is None else f"the newest covers {newest.body.size}"
        return fail(
            f"call {call} is not yet in a checkpoint: its last record is seq {last_seq}, "
            f"{covered}; brokerd writes the next within [ledger] checkpoint_every records "
            f"or checkpoint_seconds ({read} lines now), and at its stop: prove it then",
            Exit.FAILED,
        )
    try:
        vkey = _home_vkey(home)
        checkpoint = _checkpoint_of(newest)
        store = _tiles(home, checkpoint.size)
        lines = [(record.seq, line) for line, record in found]
        document = make_proof(newest.body.note, checkpoint, vkey, lines, store)
        # Checked as its reader will check it: a proof that does not hold is not handed out.
        checked = check_proof(document, pinned_vkey=vkey)
    except (ProveFailed, TileProblem, ProofError, ProofCheckError, ValueError) as exc:
        return fail(f"no proof of call {call}: {exc}", Exit.FAILED)
    data = dump_document(document)
    try:
        _write_or_print(data, out)
    except OSError as exc:
        return fail(f"{out}: {exc.strerror}", Exit.USAGE)
    if out is not None:
        summary = {
            "call": call,
            "file": str(out),
            "records": [line.seq for line in checked.lines],
            "checkpoint": checked.checkpoint.size,
            "origin": checked.checkpoint.origin,
        }
        if common.json:
            print_json(summary)
        else:
            print(
                f"proof of call {call} ({len(checked.lines)} records) by checkpoint "
                f"{checked.checkpoint.size} of {checked.checkpoint.origin} written to {out}"
            )
    return Exit.DONE


def _pinned(vkey: str | None) -> str | None:
    """``--vkey``: a file holding the key, or the key's text itself."""
    if vkey is None:
        return None
    candidate = Path(vkey)
    if candidate.is_file():
        return _read_limited(candidate, MAX_VKEY_BYTES, "a vkey").decode(errors="replace").strip()
    return vkey.strip()


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def _describe(fields: dict[str, Any]) -> str:
    parts = [f"{fields.get('seq')!s:>6}", _shown(fields.get("at")), _shown(fields.get("kind"))]
    if "call" in fields:
        parts.append(_shown(fields["call"]))
    parts += [f"{name}={_shown(fields[name])}" for name in SHOWN_FIELDS if fields.get(name)]
    return printable("  ".join(parts))


def _key_words(checked: Checked) -> str:
    if checked.pinned:
        return "pinned"
    return f"not pinned: compare the key with the owner's: {checked.vkey}"


def check_proof_command(
    file: Path, /, *, vkey: str | None = None, common: Common = DEFAULT
) -> Exit:
    """Check a proof made by ``bxctl audit prove``, with no ledger: the checkpoint's
    signature, each line's inclusion, and print what the records say. Exit 1 naming
    the problem when anything does not hold.

    Parameters
    ----------
    file
        The proof document (JSON).
    vkey
        The ledger's key as the owner gave it to you (a file, or the vkey text): the
        proof must be signed by it. Without it, the document's own key is used, which
        shows only that someone holding that key signed.
    """
    try:
        pinned = _pinned(vkey)
        checked = check_proof(
            load_proof(_read_limited(file, MAX_DOCUMENT_BYTES, "a proof")), pinned
        )
    except OSError as exc:
        return fail(f"{exc.filename or file}: {exc.strerror}", Exit.USAGE)
    except ProveFailed as exc:
        return fail(str(exc), Exit.USAGE)
    except ProofCheckError as exc:
        if common.json:
            print_json(
                {"ok": False, "reason": exc.reason.value, "seq": exc.seq, "detail": exc.detail}
            )
        return fail(f"proof refused: {exc}", Exit.FAILED)
    checkpoint = checked.checkpoint
    if common.json:
        print_json(
            {
                "ok": True,
                "origin": checkpoint.origin,
                "checkpoint": checkpoint.size,
                "key": checked.key_name,
                "vkey": checked.vkey,
                "pinned": checked.pinned,
                "records": [line.fields for line in checked.lines],
            }
        )
        return Exit.DONE
    for line in checked.lines:
        print(_describe(line.fields))
    print(
        printable(
            f"proved by checkpoint {checkpoint.size} of {checkpoint.origin}, signed by "
            f"{checked.key_name} ({_key_words(checked)})"
        )
    )
    return Exit.DONE


def consistency(old_checkpoint: Path, /, *, common: Common = DEFAULT) -> Exit:
    """Prove that the ledger only grew since a checkpoint you kept (a copy of
    ``ledger/tree/checkpoint`` or of a checkpoint record's note): the consistency proof
    from it to the newest checkpoint, checked with this home's ledger key. Exit 1 when
    the old one is not a prefix of the ledger now (records were changed or removed) or
    is signed by another key.

    Parameters
    ----------
    old_checkpoint
        The signed checkpoint note kept earlier.
    """
    home = common.resolve()
    path = home.audit_log
    try:
        old_note = _read_limited(old_checkpoint, MAX_DOCUMENT_BYTES, "a checkpoint").decode(
            "utf-8", errors="replace"
        )
        _, newest, _ = _scan(ledger_lines(ledger_files(path.parent)), None)
    except OSError as exc:
        return fail(f"{exc.filename or path}: {exc.strerror}", Exit.USAGE)
    except (ProveFailed, SegmentProblem) as exc:
        return fail(str(exc), Exit.USAGE)
    if newest is None:
        return fail(f"the ledger ({path}) has no checkpoint yet", Exit.FAILED)
    old = note_checkpoint(old_note)
    try:
        vkey = _home_vkey(home)
        new = _checkpoint_of(newest)
        store = _tiles(home, new.size)
        # An old note that is no checkpoint gets no path: the check says why it is refused.
        old_size = 0 if old is None else old.size
        document = make_consistency(old_note, old_size, newest.body.note, new, vkey, store)
        checked = check_consistency(document, pinned_vkey=vkey)
    except ProofCheckError as exc:
        old_words = "?" if old is None else str(old.size)
        if common.json:
            print_json(
                {
                    "ok": False,
                    "reason": exc.reason.value,
                    "detail": exc.detail,
                    "old_size": None if old is None else old.size,
                    "new_size": newest.body.size,
                }
            )
        return fail(
            f"not consistent (old size {old_words}, new size {newest.body.size}): {exc}",
            Exit.FAILED,
        )
    except (ProveFailed, TileProblem, ProofError, CheckpointError, NoteError) as exc:
        return fail(f"no consistency proof: {exc}", Exit.FAILED)
    if common.json:
        print_json(
            {
                "ok": True,
                "old_size": checked.old.size,
                "new_size": checked.new.size,
                "origin": checked.new.origin,
                "document": orjson.loads(dump_document(document)),
            }
        )
    else:
        print(
            printable(
                f"ok: the ledger of {checked.new.size} records (newest checkpoint) extends "
                f"the checkpoint of {checked.old.size} records, both of {checked.new.origin}, "
                f"signed by {checked.key_name}"
            )
        )
    return Exit.DONE
