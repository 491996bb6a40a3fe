"""The single ledger writer (docs/decisions.md, "Ledger"): group commit, checkpoints,
seals, stop. The live file is opened (or created), and a torn tail repaired, before it
starts: :mod:`boxmaker.ledger.live_file`.

Two layers:

- :class:`LedgerFile` is the file layer (write + fsync); :class:`OsLedgerFile` is the
  real one (``O_APPEND``). Tests inject their own to fail a write or an fsync.
- :class:`LedgerWriter` is the trio task that owns the file: callers send
  ``(body, reply channel)``; the task takes every record waiting, writes them, fsyncs
  once, and only then answers. Any failed write or fsync stops it for good in this
  process (docs/runbook.md#audit-unavailable): :attr:`LedgerWriter.usable` turns False
  and every append raises :class:`LedgerStopped`. With a
  :class:`~boxmaker.ledger.checkpointer.Checkpointer`, each durable batch goes into the
  Merkle tree, and the task appends a signed checkpoint record when one is due and at
  its clean close (docs/protocol.md, "Checkpoints"). With a :class:`LiveSealer`, a
  batch takes at most the room left in the live file, and the checkpoint due when it is
  full seals it: that checkpoint is the first line of the next live file
  (docs/protocol.md, "Segments"; the file steps: ledger/seal.py).

A write that fails half-way may leave a partial line in the file; the writer stops, and
the next start finds the torn tail (docs/runbook.md#ledger-torn) instead of continuing a
broken chain.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import attrs
import trio

from boxmaker.core.reasons import AUDIT_UNAVAILABLE_DETAIL
from boxmaker.formats.clock import format_utc, utc_now
from boxmaker.ledger.live_file import Tail, open_ledger
from boxmaker.ledger.records import (
    Body,
    CheckpointRecord,
    encode_line,
    format_head,
    line_hash,
)
from boxmaker.runtime.oneshot import OneShot
from boxmaker.runtime.threads import WORKER_THREAD, ToThread

if TYPE_CHECKING:
    from boxmaker.ledger.checkpointer import Checkpointer

log = logging.getLogger("boxmaker.ledger")

MAX_BATCH = 1024
"""Records per group commit at most, so one write stays bounded under a burst."""


class SealSkipped(Exception):
    """A seal that left the ledger as it was (the live file still in place, still
    appended to): logged, and tried again at the next checkpoint."""


class LedgerStopped(Exception):
    """An append after the ledger stopped (docs/runbook.md#audit-unavailable), or after it
    was closed."""


@attrs.frozen
class Appended:
    """A record that is written and fsynced. ``line`` has no newline."""

    seq: int
    head: str
    line: bytes


class LedgerFile(Protocol):
    """The writer's view of the file; blocking, called from a worker thread."""

    def write(self, data: bytes) -> None: ...

    def fsync(self) -> None: ...

    def close(self) -> None: ...


@attrs.define
class OsLedgerFile:
    """The real file, opened ``O_APPEND`` so every write lands at the end."""

    fd: int

    @classmethod
    def open(cls, path: Path) -> OsLedgerFile:
        return cls(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC))

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]

    def fsync(self) -> None:
        os.fsync(self.fd)

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)


class LiveSealer(Protocol):
    """Seals the live file (ledger/seal.py's :class:`~boxmaker.ledger.seal.Sealer`)."""

    @property
    def records(self) -> int:
        """Lines the live file holds at most (``[ledger] segment_records``)."""
        ...

    def seal(self, first: int, last: int, line: bytes) -> LedgerFile:
        """Seal the live file (lines ``first`` to ``last``) with the checkpoint ``line``
        (no newline) as the first line of the next, and open that one. Blocking.
        Raises :class:`SealSkipped` when the ledger is as it was, OSError when it is
        not (the writer stops; the next start completes the seal)."""
        ...


_Reply = Appended | BaseException
_Request = tuple[Body, OneShot[_Reply]]


class LedgerWriter:
    """The one task that appends to the ledger (group commit: docs/decisions.md, "Ledger").

    Start it with ``await nursery.start(writer.run)``; append with
    ``await writer.append(body)``; end it with ``await writer.aclose()``, which writes
    every record already sent before the task returns.
    """

    def __init__(
        self,
        file: LedgerFile,
        tail: Tail,
        *,
        clock: Callable[[], dt.datetime] = utc_now,
        to_thread: ToThread = WORKER_THREAD,
        checkpointer: Checkpointer | None = None,
        end: int | None = None,
        sealer: LiveSealer | None = None,
        live_first: int = 0,
    ) -> None:
        """``end`` is the file's size at open (the byte offset of record
        ``tail.next_seq``), needed with a ``checkpointer``, whose tree must hold
        ``tail.next_seq`` leaves. A ``sealer`` (only with a ``checkpointer``: a seal is
        made at a checkpoint) seals the live file, whose first line is ``live_first``,
        once it holds ``sealer.records`` lines."""
        if sealer is not None and checkpointer is None:
            raise ValueError("a sealer needs a checkpointer")
        if checkpointer is not None:
            if end is None:
                raise ValueError("a checkpointer needs the ledger file's size at open")
            if checkpointer.tree.size != tail.next_seq:
                raise ValueError(
                    f"a tree of {checkpointer.tree.size} leaves for a ledger whose "
                    f"next seq is {tail.next_seq}"
                )
        self._checkpointer = checkpointer
        self._sealer = sealer
        self._live_first = live_first
        self._seal_deferred = False
        """A seal was skipped: the next is tried at the next checkpoint due anyway."""
        self._end = end or 0
        self._file = file
        self._to_thread = to_thread
        self._next_seq = tail.next_seq
        self._prev = tail.prev
        self._clock = clock
        # Unbounded: the callers are bounded by connections, and a bounded buffer would
        # make a caller wait on other callers rather than on the disk.
        self._send, self._receive = trio.open_memory_channel[_Request](math.inf)
        self._failure: OSError | None = None
        self.broken = trio.Event()
        """Set once a write or fsync failed (when :attr:`usable` turns False): what must
        stop at once then (an open tunnel: docs/egress.md) waits on it."""
        self._closing = False
        self._started = False
        self._done = trio.Event()

    @classmethod
    def open(cls, path: Path, *, clock: Callable[[], dt.datetime] = utc_now) -> LedgerWriter:
        """Open (or create) the ledger at ``path``. Blocking; raises :class:`LedgerTorn`."""
        tail = open_ledger(path, now=clock())
        return cls(OsLedgerFile.open(path), tail, clock=clock)

    @property
    def usable(self) -> bool:
        """False once a write or fsync failed: every later call is denied
        ``audit_unavailable`` (docs/runbook.md#audit-unavailable)."""
        return self._failure is None

    @property
    def failure(self) -> OSError | None:
        return self._failure

    @property
    def head(self) -> str:
        """``SEQ:HASH`` of the last durable record."""
        return format_head(self._next_seq - 1, self._prev)

    async def append(self, body: Body) -> Appended:
        """Write one record; returns only after it is fsynced.

        Raises :class:`LedgerStopped` at once, without I/O, once the ledger stopped.
        If the caller is cancelled while waiting, the record may still be written.
        """
        if self._failure is not None:
            raise LedgerStopped(AUDIT_UNAVAILABLE_DETAIL) from self._failure
        if self._closing:
            raise LedgerStopped("the ledger writer is closed")
        slot = OneShot[_Reply]()
        try:
            self._send.send_nowait((body, slot))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise LedgerStopped("the ledger writer is closed") from None
        # Every request taken is answered: committed, refused, or abandoned at the end.
        reply = await slot.get()
        if isinstance(reply, BaseException):
            raise reply
        return reply

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The writer task. Returns after :meth:`aclose`, having written what was sent."""
        if self._started:
            raise RuntimeError("a LedgerWriter runs once")
        self._started = True
        try:
            task_status.started()
            while (first := await self._next_request()) is not None:
                batch = [first] if isinstance(first, tuple) else []
                limit = self._batch_limit()
                while batch and len(batch) < limit:
                    try:
                        batch.append(self._receive.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                # Shielded: a write already handed to a thread completes anyway, so
                # its callers are answered and seq/prev follow what is on disk.
                with trio.CancelScope(shield=True):
                    if batch:
                        await self._commit(batch)
                    if self._checkpointer is not None and (
                        self._checkpointer.due() or self._seal_due()
                    ):
                        await self._checkpoint()
                        if self._seal_due():  # that checkpoint filled the live file
                            await self._checkpoint()
            # The clean close: everything sent is written; the last checkpoint covers it.
            if self._checkpointer is not None:
                with trio.CancelScope(shield=True):
                    if self._checkpointer.uncovered:
                        await self._checkpoint()
                    await self._checkpointer.close()
        finally:
            self._closing = True
            self._abandon_waiting()
            self._file.close()
            self._done.set()

    async def _next_request(self) -> _Request | bool | None:
        """The next request; True when a checkpoint's time came first; None once
        :meth:`aclose` closed the channel and every request was taken."""
        deadline = math.inf if self._checkpointer is None else self._checkpointer.deadline
        with trio.move_on_at(deadline):
            try:
                return await self._receive.receive()
            except trio.EndOfChannel:
                return None
        return True

    def _batch_limit(self) -> int:
        """Records the next batch may take: at most the room left in the live file
        (past a skipped seal there is none, and the file grows until the next one)."""
        if self._sealer is None:
            return MAX_BATCH
        room = self._sealer.records - (self._next_seq - self._live_first)
        return min(MAX_BATCH, room) if room > 0 else MAX_BATCH

    def _seal_due(self) -> bool:
        return self._live_full() and not self._seal_deferred and self._failure is None

    def _live_full(self) -> bool:
        sealer = self._sealer
        return sealer is not None and self._next_seq - self._live_first >= sealer.records

    async def _checkpoint(self) -> None:
        """Append a signed checkpoint of every line so far (the checkpointer's steps:
        ledger/checkpointer.py), or, when the live file is full, seal it with that
        checkpoint as the next file's first line. A skipped one leaves the ledger as it
        was."""
        checkpointer = self._checkpointer
        if checkpointer is None or self._failure is not None:
            return
        sealing = self._live_full()
        self._seal_deferred = sealing  # until it is done: a failure tries at the next
        record = await checkpointer.prepare(self._next_seq)
        if record is None:
            return
        if sealing:
            await self._seal(checkpointer, record)
            return
        offset = self._end
        slot = OneShot[_Reply]()
        await self._commit([(record, slot)])
        appended = slot.peek()
        if isinstance(appended, Appended):
            await checkpointer.stored(record, appended.line, offset)

    async def _seal(self, checkpointer: Checkpointer, record: CheckpointRecord) -> None:
        """The live file sealed with ``record`` beginning the next (docs/protocol.md,
        "Segments"). A skipped seal is logged (the checkpoint with it: the ledger is as
        it was); a seal that cannot be completed stops the ledger."""
        assert self._sealer is not None
        line = encode_line(self._next_seq, format_utc(self._clock()), self._prev, record)
        first, last = self._live_first, self._next_seq - 1
        try:
            file = await self._to_thread(self._sealer.seal, first, last, line)
        except SealSkipped:
            log.exception(
                "the live ledger file (lines %d-%d) was not sealed; it stays, and the "
                "next checkpoint tries again",
                first,
                last,
            )
            return
        except OSError as exc:
            self._stop(exc, "a seal of the ledger's live file could not be completed")
            return
        self._file.close()
        self._file = file
        self._next_seq, self._prev = record.size + 1, line_hash(line)
        self._live_first = record.size
        self._end = len(line) + 1
        self._seal_deferred = False
        checkpointer.written([record], [line])
        await checkpointer.stored(record, line, 0)
        log.info(
            "sealed the ledger's lines %d-%d; the live file begins at %d", first, last, last + 1
        )

    async def aclose(self) -> None:
        """Stop taking records, write those already sent, close the file."""
        self._closing = True
        self._send.close()
        if self._started:
            await self._done.wait()
        else:
            self._file.close()
            await trio.lowlevel.checkpoint()

    async def _commit(self, batch: list[_Request]) -> None:
        if self._failure is not None:
            for _, reply in batch:
                self._answer(reply, self._stopped())
            return
        at = format_utc(self._clock())
        seq, prev = self._next_seq, self._prev
        accepted: list[tuple[OneShot[_Reply], Appended]] = []
        bodies: list[Body] = []
        for body, reply in batch:
            try:
                line = encode_line(seq, at, prev, body)
            except (TypeError, ValueError) as exc:
                # A body that cannot be encoded is the caller's bug, not a disk failure:
                # it takes no seq and does not stop the ledger.
                self._answer(reply, exc)
                continue
            prev = line_hash(line)
            accepted.append((reply, Appended(seq=seq, head=format_head(seq, prev), line=line)))
            bodies.append(body)
            seq += 1
        if not accepted:
            return
        data = b"".join([appended.line + b"\n" for _, appended in accepted])
        try:
            await self._to_thread(self._write_and_sync, data)
        except OSError as exc:
            self._stop(exc, "a ledger append failed")
            for reply, _ in accepted:
                self._answer(reply, self._stopped())
            return
        self._next_seq, self._prev = seq, prev
        self._end += len(data)
        if self._checkpointer is not None:
            self._checkpointer.written(bodies, [appended.line for _, appended in accepted])
        for reply, appended in accepted:
            self._answer(reply, appended)

    def _stop(self, exc: OSError, what: str) -> None:
        self._failure = exc
        self.broken.set()
        log.error(
            "%s; the ledger is stopped (%s)",
            what,
            AUDIT_UNAVAILABLE_DETAIL,
            exc_info=(type(exc), exc, exc.__traceback__),
        )

    def _abandon_waiting(self) -> None:
        """The task is ending (cancelled): nobody may wait for ever on an unread record."""
        while True:
            try:
                _, reply = self._receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
            self._answer(reply, LedgerStopped("the ledger writer ended before writing this"))
        self._receive.close()

    def _write_and_sync(self, data: bytes) -> None:
        self._file.write(data)
        self._file.fsync()

    def _stopped(self) -> LedgerStopped:
        # A fresh exception per caller: one instance raised in many tasks would share
        # (and mangle) a traceback.
        stopped = LedgerStopped(AUDIT_UNAVAILABLE_DETAIL)
        stopped.__cause__ = self._failure
        return stopped

    @staticmethod
    def _answer(reply: OneShot[_Reply], value: _Reply) -> None:
        # The caller may have been cancelled and gone; the record stands.
        reply.put(value)
