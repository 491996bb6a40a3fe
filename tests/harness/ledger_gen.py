"""Ledgers written fast, as brokerd would have written them, with checkpoints: for the
tests of verification from a checkpoint and for tools/bench_ledger_start.py.

:func:`write_ledger` writes ``audit.jsonl`` (canonical lines, real chain hashes), a
``checkpoint`` record every ``every`` records (the tree's real root, a note signed by
the given key, the calls open then, tracked here on their own), and at the end the
tree's tiles (through :class:`~boxmaker.ledger.tiles.TileStore`, without fsync: a
generated ledger is not worth the disk's time), ``ledger/tree/checkpoint`` and
``checkpoint.pos``. Calls are left in every phase: asked, running, approved, and open
when their boot stops (unfinished).
"""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path
from typing import Any

import attrs
import orjson

from boxmaker.core.labels import Label, Taint
from boxmaker.core.reasons import Reason
from boxmaker.home.file_ops import OsFileOps
from boxmaker.ledger.checkpoint import Checkpoint, format_checkpoint, ledger_origin
from boxmaker.ledger.checkpointer import CheckpointPosition
from boxmaker.ledger.merkle import Frontier, Hash
from boxmaker.ledger.records import (
    GENESIS_PREV,
    Approval,
    ApprovalBy,
    ApprovalOutcome,
    CallPhase,
    CheckpointRecord,
    Decision,
    Genesis,
    Result,
    ResultStatus,
    Start,
    Stop,
    VerdictCode,
    body_fields,
    encode_line,
)
from boxmaker.ledger.segments import SEGMENTS_DIR, segment_name
from boxmaker.ledger.signed_note import NoteSigner, sign_note
from boxmaker.ledger.tiles import TileStore
from boxmaker.ledger.tree import CHECKPOINT_FILE, CHECKPOINT_POS_FILE, TREE_DIR

AT = "2026-03-01T00:00:00.000Z"
FLUSH_LEAVES = 1 << 16


class NoSync(OsFileOps):
    """The real file calls less fsync."""

    def fsync(self, fd: int) -> None:
        pass


def _template(body: Any) -> dict[str, Any]:
    fields = body_fields(body)
    fields["kind"] = body.kind.value
    return fields


_DECISION = _template(
    Decision(
        call="c-0000000000000000",
        session="s-000000000000",
        tool="read_file",
        arguments={"path": "notes/day-1.md"},
        verdict=VerdictCode.RUN,
        reason=None,
        grant="read-notes",
        taint=Taint.INTERNAL,
        untrusted=False,
        boot="b-0",
    )
)
_APPROVAL = _template(
    Approval(
        call="c-0000000000000000",
        approval="a-00000000",
        outcome=ApprovalOutcome.ALLOWED,
        reason=None,
        by=ApprovalBy.OWNER,
        taint=Taint.INTERNAL,
        untrusted=False,
    )
)
_RESULT = _template(
    Result(
        call="c-0000000000000000",
        status=ResultStatus.OK,
        reason=None,
        label=Label(Taint.INTERNAL, False),
        taint_after=Taint.INTERNAL,
        untrusted_after=False,
        output_sha256="00" * 32,
        output_bytes=10,
    )
)


@attrs.define
class Generated:
    """What was written: the ledger's path, its records, each checkpoint's seq, and
    the calls open at the end (the newest boot's phases, and the rest)."""

    path: Path
    records: int
    checkpoints: list[int]
    open_calls: dict[str, tuple[str, CallPhase]]


@attrs.define
class _Writer:
    file: Any
    signer: NoteSigner
    tree: Frontier = attrs.field(factory=Frontier)
    stored: list[Hash] = attrs.field(factory=list)
    store: TileStore | None = None
    seq: int = 0
    prev: str = GENESIS_PREV
    offset: int = 0
    last_checkpoint: tuple[int, int, str, bytes] | None = None
    in_file: int = 0
    """Lines in the live file."""

    def write(self, line: bytes) -> None:
        self.file.write(line + b"\n")
        self.in_file += 1
        self.stored.extend(self.tree.append(hashlib.sha256(b"\x00" + line).digest()))
        self.prev = hashlib.sha256(line).hexdigest()
        self.offset += len(line) + 1
        self.seq += 1
        if self.store is not None and len(self.stored) >= 2 * FLUSH_LEAVES:
            self.store.append(self.stored)
            self.stored = []

    def fields(self, fields: dict[str, Any]) -> None:
        fields["seq"] = self.seq
        fields["at"] = AT
        fields["prev"] = self.prev
        self.write(orjson.dumps(fields, option=orjson.OPT_SORT_KEYS))

    def checkpoint(self, boot: str, phases: dict[str, CallPhase], unfinished: list[str]) -> None:
        root = self.tree.root()
        text = format_checkpoint(Checkpoint(self.signer.name, self.seq, root))
        note = sign_note(text, [self.signer])
        body = CheckpointRecord(
            boot=boot,
            size=self.seq,
            root=root.hex(),
            note=note.decode(),
            open_calls=phases,
            unfinished=unfinished,
        )
        line = encode_line(self.seq, AT, self.prev, body)
        self.last_checkpoint = (self.seq, self.offset, hashlib.sha256(line).hexdigest(), note)
        self.write(line)

    def seal(self, live: Path) -> None:
        """The full live file becomes the segment of its lines, read-only, and a new
        live file is begun (its first line: the checkpoint the caller writes next)."""
        self.file.close()
        segments = live.parent / SEGMENTS_DIR
        segments.mkdir(mode=0o700, exist_ok=True)
        sealed = segments / segment_name(self.seq - self.in_file, self.seq - 1)
        live.rename(sealed)
        os.chmod(sealed, 0o444)
        self.file = live.open("wb", buffering=1 << 20)
        self.offset = 0
        self.in_file = 0


def write_ledger(
    ledger_dir: Path,
    records: int,
    signer: NoteSigner,
    *,
    every: int = 1000,
    seed: int = 1,
    stop_chance: float = 0.001,
    max_open: int = 12,
    max_unfinished: int = 40,
    tiles: bool = True,
    segment_records: int | None = None,
) -> Generated:
    """Write a ledger of about ``records`` records under ``ledger_dir`` (the genesis
    names the ledger ``signer`` is the key of: its name is the origin). A boot stops
    now and then: cleanly (its open calls ended first, as brokerd's stop ends them) or
    leaving them open, as a kill would, while fewer than ``max_unfinished`` are.
    ``tiles``: write the tree's tiles, the checkpoint and its position.
    ``segment_records``: seal the live file when it holds that many lines, as brokerd's
    writer does (docs/protocol.md, "Segments"): each sealed file
    ``segments/<first>-<last>.jsonl``, mode 0444, of exactly that many lines, and each
    file after the first begun with a checkpoint of size its first seq."""
    rng = random.Random(seed)
    ledger_id = signer.name.removeprefix("boxmaker.local/ledger/")
    assert ledger_origin(ledger_id) == signer.name
    ledger_dir.mkdir(parents=True, exist_ok=True)
    path = ledger_dir / "audit.jsonl"
    checkpoints: list[int] = []
    mine: dict[str, CallPhase] = {}  # the running boot's open calls
    left: dict[str, tuple[str, CallPhase]] = {}  # those stopped boots left open
    store = TileStore(ledger_dir / TREE_DIR, files=NoSync()) if tiles else None
    out = _Writer(path.open("wb", buffering=1 << 20), signer, store=store)
    boot = ""
    stopped = True

    def checkpoint() -> None:
        phases = {} if stopped else dict(mine)
        unfinished = sorted([*left, *(mine if stopped else ())])
        out.checkpoint(boot or "b-none", phases, unfinished)
        checkpoints.append(out.seq - 1)

    def full() -> bool:
        return segment_records is not None and out.in_file == segment_records

    try:
        out.write(encode_line(0, AT, GENESIS_PREV, Genesis(ledger=ledger_id)))
        number = 0
        while out.seq < records:
            if full():
                out.seal(path)
                checkpoint()
                continue
            if out.seq % every == 0:
                checkpoint()
                continue
            if stopped or rng.random() < stop_chance:
                if not stopped:
                    if (mine and rng.random() < 0.5) or len(left) + len(mine) > max_unfinished:
                        _end(out, *mine.popitem(), rng)
                        continue  # ended one by one, a record each, then the stop
                    out.fields(_template(Stop(boot=boot)))
                    left.update((call, (boot, phase)) for call, phase in mine.items())
                    mine.clear()
                    stopped = True
                    continue
                boot = f"b-{rng.randbytes(8).hex()}"
                out.fields(_template(Start(boot=boot, version="0")))
                stopped = False
                continue
            number += 1
            roll = rng.random()
            if mine and (roll < 0.45 or len(mine) >= max_open):
                call = rng.choice(list(mine))
                phase = mine[call]
                if phase is CallPhase.ASKED:
                    outcome = rng.choice(
                        (ApprovalOutcome.ALLOWED, ApprovalOutcome.ASK, ApprovalOutcome.DENIED)
                    )
                    out.fields(dict(_APPROVAL, call=call, outcome=outcome.value))
                    if outcome is ApprovalOutcome.DENIED:
                        del mine[call]
                    else:
                        mine[call] = CallPhase.APPROVED
                else:
                    out.fields(dict(_RESULT, call=call, output_bytes=rng.randint(0, 9999)))
                    del mine[call]
                continue
            call = f"c-{number:016x}"
            verdict = rng.choice((VerdictCode.RUN, VerdictCode.ASK, VerdictCode.DENY))
            fields = dict(_DECISION, call=call, boot=boot, verdict=verdict.value)
            if verdict is VerdictCode.DENY:
                fields.update(reason=Reason.NO_GRANT.value, grant=None)
            else:
                mine[call] = CallPhase.RUNNING if verdict is VerdictCode.RUN else CallPhase.ASKED
            out.fields(fields)
        if full():
            out.seal(path)
            checkpoint()
    finally:
        out.file.close()
    if store is not None:
        store.append(out.stored)
        if out.last_checkpoint is not None:
            seq, offset, sha, note = out.last_checkpoint
            tree_dir = ledger_dir / TREE_DIR
            (tree_dir / CHECKPOINT_FILE).write_bytes(note)
            position = CheckpointPosition(seq=seq, offset=offset, sha256=sha)
            (tree_dir / CHECKPOINT_POS_FILE).write_bytes(position.to_json())
    os.chmod(path, 0o600)
    open_calls = dict(left)
    open_calls.update((call, (boot, phase)) for call, phase in mine.items())
    return Generated(path, out.seq, checkpoints, open_calls)


def _end(out: _Writer, call: str, phase: CallPhase, rng: random.Random) -> None:
    """End an open call as a clean stop does: an ask withdrawn, a run's result."""
    if phase is CallPhase.ASKED:
        out.fields(dict(_APPROVAL, call=call, outcome=ApprovalOutcome.WITHDRAWN.value))
    else:
        out.fields(dict(_RESULT, call=call, output_bytes=rng.randint(0, 9999)))
