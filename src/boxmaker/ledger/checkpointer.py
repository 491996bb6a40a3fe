"""Signed checkpoints of the ledger's tree, made by the ledger writer (docs/protocol.md,
"Checkpoints"; docs/decisions.md, "Checkpoints in the ledger").

The writer hands every durable batch to :meth:`Checkpointer.written` (its lines go into
the tree, its bodies into the open calls). A checkpoint is due after ``every`` records,
or ``seconds`` after the first record not yet in one, and at the writer's clean close.
The writer task then, with nothing else appended in between:

1. :meth:`Checkpointer.prepare`: flushes the tree's tiles (a worker thread) and signs
   the C2SP checkpoint (origin, size = the next seq, root) with the ledger key: the
   :class:`~boxmaker.ledger.records.CheckpointRecord` to append;
2. appends that record through its commit path (so its seq is its size);
3. :meth:`Checkpointer.stored`: writes ``ledger/tree/checkpoint`` (the signed note) and
   ``ledger/tree/checkpoint.pos`` (where the record's line is), both atomically, then
   calls the ``on_checkpoint`` hook.

A flush or a signature that fails is logged and the checkpoint skipped, never the
ledger stopped: the tiles are derived from the lines, and the next checkpoint (after
``every`` more records or ``seconds``) tries again.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

import attrs
import orjson
import trio

from boxmaker.home.file_ops import OS_FILES, FileOps, write_atomically
from boxmaker.home.regular_file import read_regular_file
from boxmaker.ledger.checkpoint import Checkpoint, format_checkpoint
from boxmaker.ledger.open_calls import OpenCalls
from boxmaker.ledger.records import Body, CheckpointRecord, line_hash
from boxmaker.ledger.signed_note import NoteSigner, sign_note
from boxmaker.ledger.tree import CHECKPOINT_FILE, CHECKPOINT_POS_FILE, LedgerTree
from boxmaker.runtime.threads import WORKER_THREAD, ToThread

__all__ = [
    "CheckpointPosition",
    "Checkpointer",
    "read_position",
]

log = logging.getLogger("boxmaker.ledger")

FILE_MODE: Final = 0o600
MAX_POSITION_FILE: Final = 4096

CheckpointHook = Callable[[bytes, int], None]
"""``on_checkpoint(note, size)``: called once a checkpoint is stored; it must not block
(start a task, or put the note where a task takes it)."""


@attrs.frozen
class CheckpointPosition:
    """Where the newest checkpoint record is: its ``seq``, the byte ``offset`` of its line
    in ``audit.jsonl`` and the ``sha256`` of the line (hex, as ``prev`` names a line).

    >>> CheckpointPosition(12, 3456, "ab" * 32).to_json()[:30]
    b'{"offset":3456,"seq":12,"sha25'
    """

    seq: int
    offset: int
    sha256: str

    def to_json(self) -> bytes:
        fields = {"offset": self.offset, "seq": self.seq, "sha256": self.sha256}
        return orjson.dumps(fields, option=orjson.OPT_SORT_KEYS) + b"\n"


def read_position(path: Path) -> CheckpointPosition:
    """``checkpoint.pos`` read back. Raises OSError, or ValueError for anything but the
    three fields with their types."""
    try:
        fields = orjson.loads(read_regular_file(path, limit=MAX_POSITION_FILE))
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    if not isinstance(fields, dict) or sorted(fields) != ["offset", "seq", "sha256"]:
        raise ValueError(f"{path}: not a checkpoint position (offset, seq, sha256)")
    seq, offset, sha = fields["seq"], fields["offset"], fields["sha256"]
    if type(seq) is not int or type(offset) is not int or seq < 0 or offset < 0:
        raise ValueError(f"{path}: seq and offset must be integers from 0")
    if type(sha) is not str or len(sha) != 64 or sha.strip("0123456789abcdef"):
        raise ValueError(f"{path}: sha256 must be 64 lowercase hex digits")
    return CheckpointPosition(seq=seq, offset=offset, sha256=sha)


class Checkpointer:
    """Makes the ledger's checkpoints for one boot (see the module docstring)."""

    def __init__(
        self,
        tree: LedgerTree,
        signer: NoteSigner,
        *,
        boot: str,
        open_calls: OpenCalls,
        directory: Path,
        every: int = 1000,
        seconds: float = 60.0,
        on_checkpoint: CheckpointHook | None = None,
        to_thread: ToThread = WORKER_THREAD,
        files: FileOps = OS_FILES,
    ) -> None:
        if every < 1 or not seconds > 0:
            raise ValueError(f"checkpoints every {every} records or {seconds} s")
        self.tree = tree
        self._signer = signer
        self._boot = boot
        self._open_calls = open_calls
        self._directory = directory
        self._every = every
        self._seconds = seconds
        self.on_checkpoint = on_checkpoint
        self._to_thread = to_thread
        self._files = files
        self._uncovered = 0
        """Records (checkpoints not counted) written since the last checkpoint."""
        self._since_attempt = 0
        self._deadline = math.inf
        self.latest: Checkpoint | None = None
        """The newest checkpoint stored by this boot."""
        self.skipped = 0
        """Checkpoints skipped for a failed flush or signature (``bxctl status`` may
        show it)."""

    @property
    def origin(self) -> str:
        return self._signer.name

    @property
    def deadline(self) -> float:
        """The trio time at which a checkpoint is due for time (inf: none is)."""
        return self._deadline

    @property
    def uncovered(self) -> int:
        """Records written that no checkpoint covers yet."""
        return self._uncovered

    def due(self) -> bool:
        """A checkpoint is due: ``every`` records since the last try, or its deadline
        passed with records to cover."""
        return self._since_attempt >= self._every or (
            self._uncovered > 0 and trio.current_time() >= self._deadline
        )

    def written(self, bodies: Sequence[Body], lines: Sequence[bytes]) -> None:
        """A batch is durable: ``lines`` (no newlines) are the next leaves; ``bodies``
        move the open calls. No I/O."""
        self.tree.add(lines)
        counted = 0
        for body in bodies:
            self._open_calls.track(body)
            if not isinstance(body, CheckpointRecord):
                counted += 1
        if counted and not self._uncovered:
            self._deadline = trio.current_time() + self._seconds
        self._uncovered += counted
        self._since_attempt += counted

    async def prepare(self, size: int) -> CheckpointRecord | None:
        """The record of the checkpoint at ``size`` (the writer's next seq, which must be
        the tree's size), the tiles flushed first; None when the flush or the signature
        failed (logged; the next checkpoint tries again)."""
        if size != self.tree.size:
            raise ValueError(f"a checkpoint at {size} of a tree of {self.tree.size} leaves")
        self._since_attempt = 0
        self._deadline = trio.current_time() + self._seconds
        root = self.tree.root()
        # Anything a flush or a signature raises skips this checkpoint only: the tiles
        # and the note are derived from the lines, which are already safe.
        try:
            await self._to_thread(self.tree.flush)
        except Exception:
            self.skipped += 1
            log.exception("the tree's tiles could not be written; checkpoint %d skipped", size)
            return None
        try:
            text = format_checkpoint(Checkpoint(self.origin, size, root))
            note = sign_note(text, [self._signer])
        except Exception:
            self.skipped += 1
            log.exception("the ledger's checkpoint %d could not be signed; skipped", size)
            return None
        return CheckpointRecord(
            boot=self._boot,
            size=size,
            root=root.hex(),
            note=note.decode(),
            open_calls=self._open_calls.phases,
            unfinished=self._open_calls.unfinished,
        )

    async def stored(self, record: CheckpointRecord, line: bytes, offset: int) -> None:
        """The record is durable as ``line`` at byte ``offset``: keep the note and its
        position beside the tiles, then tell ``on_checkpoint``."""
        self._uncovered = 0
        self._deadline = math.inf
        self.latest = Checkpoint(self.origin, record.size, bytes.fromhex(record.root))
        note = record.note.encode()
        position = CheckpointPosition(seq=record.size, offset=offset, sha256=line_hash(line))
        try:
            await self._to_thread(self._write_files, note, position)
        except OSError:
            # The record in the ledger is what counts; a start falls back to a full
            # verify without these files.
            log.exception("ledger/tree/checkpoint not written (checkpoint %d)", record.size)
        if self.on_checkpoint is not None:
            try:
                self.on_checkpoint(note, record.size)
            except Exception:
                log.exception("a checkpoint hook failed (checkpoint %d)", record.size)

    def _write_files(self, note: bytes, position: CheckpointPosition) -> None:
        # The note first: a position never names a record newer than the note beside it.
        write_atomically(self._directory / CHECKPOINT_FILE, note, mode=FILE_MODE, files=self._files)
        write_atomically(
            self._directory / CHECKPOINT_POS_FILE,
            position.to_json(),
            mode=FILE_MODE,
            files=self._files,
        )
