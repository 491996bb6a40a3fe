"""Ledgers with a Merkle tree and signed checkpoint records, built for tests: canonical
lines (``encode_line``), the tree's hashes (a :class:`~boxmaker.ledger.merkle.Frontier`),
checkpoint records signed with a given key, in memory or written into a home (the
lines to ``ledger/audit.jsonl``, the hashes as tiles under ``ledger/tree/``), as the
ledger writer keeps them."""

from __future__ import annotations

from pathlib import Path

import attrs

from boxmaker.core.labels import Label, Taint
from boxmaker.core.reasons import Reason
from boxmaker.home.paths import Home
from boxmaker.ledger.checkpoint import Checkpoint, format_checkpoint, ledger_origin
from boxmaker.ledger.ledger_key import load_ledger_signer, read_ledger_origin
from boxmaker.ledger.merkle import Frontier, ListHashes, leaf_hash, stored_hash_count
from boxmaker.ledger.records import (
    GENESIS_PREV,
    Approval,
    ApprovalBy,
    ApprovalOutcome,
    Body,
    CheckpointRecord,
    Decision,
    Genesis,
    Result,
    ResultStatus,
    Start,
    VerdictCode,
    encode_line,
    line_hash,
)
from boxmaker.ledger.signed_note import NoteSigner, sign_note
from boxmaker.ledger.tiles import TileStore

AT = "2026-12-01T10:00:00.000Z"
BOOT = "b-" + "0" * 16
SESSION = "s-" + "1" * 12


@attrs.define
class BuiltLedger:
    """A ledger's lines and every hash its tree stores, leaf after leaf."""

    lines: list[bytes] = attrs.field(factory=list)
    frontier: Frontier = attrs.field(factory=Frontier)
    stored: list[bytes] = attrs.field(factory=list)

    @classmethod
    def new(cls, ledger_id: str = "l-" + "0" * 16) -> BuiltLedger:
        built = cls()
        built.append(Genesis(ledger=ledger_id))
        return built

    @classmethod
    def from_lines(cls, lines: list[bytes]) -> BuiltLedger:
        built = cls()
        for line in lines:
            built.add_line(line)
        return built

    @property
    def reader(self) -> ListHashes:
        return ListHashes(self.stored)

    def add_line(self, line: bytes) -> None:
        self.lines.append(line)
        self.stored.extend(self.frontier.append(leaf_hash(line)))

    def append(self, body: Body, at: str = AT) -> int:
        """Append ``body`` as the next record; its seq."""
        seq = len(self.lines)
        prev = line_hash(self.lines[-1]) if self.lines else GENESIS_PREV
        self.add_line(encode_line(seq, at, prev, body))
        return seq

    def checkpoint(self, signer: NoteSigner, boot: str = BOOT) -> tuple[str, Checkpoint]:
        """Sign the tree over every line so far and append its checkpoint record (its
        seq is the size), as the writer does; the note and the checkpoint."""
        checkpoint = Checkpoint(signer.name, len(self.lines), self.frontier.root())
        note = sign_note(format_checkpoint(checkpoint), [signer]).decode()
        record = CheckpointRecord(
            boot=boot,
            size=checkpoint.size,
            root=checkpoint.root.hex(),
            note=note,
            open_calls={},
            unfinished=[],
        )
        self.append(record)
        return note, checkpoint


def denied_call(built: BuiltLedger, call: str) -> None:
    built.append(_decision(call, VerdictCode.DENY, Reason.NO_GRANT, None))


def approved_call(built: BuiltLedger, call: str) -> None:
    """Asked, approved by the owner, ran: three records."""
    built.append(_decision(call, VerdictCode.ASK, None, "read-notes"))
    built.append(
        Approval(
            call=call,
            approval="a-12345678",
            outcome=ApprovalOutcome.ALLOWED,
            reason=None,
            by=ApprovalBy.OWNER,
            taint=Taint.PUBLIC,
            untrusted=False,
        )
    )
    built.append(
        Result(
            call=call,
            status=ResultStatus.OK,
            reason=None,
            label=Label(Taint.INTERNAL, False),
            taint_after=Taint.INTERNAL,
            untrusted_after=False,
            output_sha256="0" * 64,
            output_bytes=5,
        )
    )


def _decision(
    call: str, verdict: VerdictCode, reason: Reason | None, grant: str | None
) -> Decision:
    return Decision(
        call=call,
        session=SESSION,
        tool="read_file",
        arguments={"path": "notes.txt"},
        verdict=verdict,
        reason=reason,
        grant=grant,
        taint=Taint.PUBLIC,
        untrusted=False,
        boot=BOOT,
    )


def load_home(home: Home) -> BuiltLedger:
    """The home's ledger, its tree computed from its lines."""
    return BuiltLedger.from_lines(home.audit_log.read_bytes().splitlines())


def home_signer(home: Home) -> NoteSigner:
    return load_ledger_signer(home, read_ledger_origin(home.audit_log))


def save_home(home: Home, built: BuiltLedger) -> None:
    """Write the lines to the home's ledger and the hashes not yet in its tiles."""
    home.audit_log.write_bytes(b"".join(line + b"\n" for line in built.lines))
    store = TileStore(tree_dir(home))
    store.append(built.stored[stored_hash_count(store.size) :])


def tree_dir(home: Home) -> Path:
    return home.ledger_dir / "tree"


def start(built: BuiltLedger) -> None:
    built.append(Start(boot=BOOT, version="test"))


def origin_of(ledger_id: str) -> str:
    return ledger_origin(ledger_id)
