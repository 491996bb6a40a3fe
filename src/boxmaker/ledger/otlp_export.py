"""``bxctl audit export --otlp URL``: the ledger sent to an OpenTelemetry receiver
(docs/operations.md). Needs the optional extra ``boxmaker[otel]`` (``opentelemetry-proto``):
only ``bxctl audit export`` imports this module.

The ledger is read a batch of lines at a time from the byte offset where the last export
stopped, in the file that holds that line, and on across every later file
(:class:`~boxmaker.ledger.follow.LedgerTail`: a seal while it reads skips nothing and
repeats nothing); each line's ``prev`` is checked against the line before (a chain broken since
the last export stops it) and each line is decoded as a typed record. The records
become values by the pure mapping (:mod:`boxmaker.ledger.otel_mapping`), those become
OTLP request bodies (:mod:`boxmaker.ledger.otlp_proto`), POSTed to ``URL/v1/logs`` and
``URL/v1/traces`` (:mod:`boxmaker.ledger.otlp_http`). A batch is made into its bodies
(:mod:`boxmaker.ledger.otlp_batch`) while the ones before are sent: a long one in one of
two worker processes (``trio-parallel``), a short one in a thread; the calls that cross
from one batch into the next are carried over here, and the batches are still sent one
at a time, in order.

The cursor (:class:`Cursor`, a JSON file written atomically) moves only after the
receiver took a batch: first the logs (``logs_through``), then the spans of the calls the
batch ended (``seq``, with the calls still open then). A stopped or crashed export, or a
receiver that was down, resumes from it: nothing is lost and nothing the receiver took is
sent again (a stop waits for the answer to the request in flight). The exceptions are a
crash between the receiver's answer and the cursor's rename, and a cursor that cannot be
written, which stops the export (docs/decisions.md, "Export to OpenTelemetry"). A
receiver that does not take a batch for a while (down, 429, 503...) is tried again with
backoff, or after the ``Retry-After`` it asked for; one that refuses it (400...) stops
the export. The cursor stays in both cases.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Final

import attrs
import trio
import trio_parallel

from boxmaker import __version__
from boxmaker.home.file_ops import write_atomically
from boxmaker.ledger.follow import LedgerTail
from boxmaker.ledger.otel_mapping import CallTracker, OpenCall
from boxmaker.ledger.otlp_batch import BadBatch, BatchJob, BatchPart, make_part, stitch
from boxmaker.ledger.otlp_cursor import (
    RUNBOOK,
    Cursor,
    ExportProblem,
    check_cursor,
    ledger_id,
    read_cursor,
    resume,
)
from boxmaker.ledger.otlp_http import (
    Refused,
    Retry,
    SettingProblem,
    Signal,
    SignalClient,
    Taken,
    settings_of,
)
from boxmaker.ledger.otlp_proto import ProtoEncoder
from boxmaker.ledger.records import line_hash
from boxmaker.ledger.segments import SegmentProblem

__all__ = [
    "RUNBOOK",
    "Backoff",
    "Cursor",
    "ExportProblem",
    "Sent",
    "export_ledger",
    "read_cursor",
]

BATCH_LINES: Final = 4096
"""Ledger lines a batch at most."""
BATCH_BYTES: Final = 1 << 20
"""Ledger bytes a batch at most (a longer line goes alone): a request stays a few MiB
even with ``--capture-content`` (a log record and a span each carry the arguments)."""
REQUEST_TIMEOUT: Final = 5.0
"""Seconds the exporter waits for the receiver's answer to one request."""
WORKERS: Final = 2
"""Batches made at once in worker processes: on two cores, two makers and the sending
between them reach the target that one process cannot (docs/performance.md)."""
PARALLEL_LINES: Final = 1024
"""A batch this long or longer is made in a worker process: a backlog, where a process's
start (a fraction of a second, once) pays for itself."""
WORKER_IDLE: Final = 60.0
"""Seconds an idle worker process waits for another batch before it ends (a following
export that caught up needs none)."""
POLL: Final = 0.5
"""Seconds between looks at the ledger's end with ``--follow``."""


@attrs.frozen
class Backoff:
    """The waits between tries when the receiver does not take a batch: ``first``
    seconds, doubled each time, at most ``most``."""

    first: float = 0.5
    most: float = 30.0


@attrs.frozen
class Sent:
    """What an export sent (and the receiver took)."""

    logs: int
    spans: int
    through: int
    """The last seq the receiver has, -1 for none."""


@attrs.frozen
class _Batch:
    """Lines ``first``-``last`` of the ledger, ready to send: their log records and the
    spans of the calls they ended as request bodies (None for none), and what the
    cursor says once both are taken."""

    first: int
    last: int
    offset: int
    """The byte offset of line ``last``."""
    line_sha256: str
    logs: bytes | None
    log_count: int
    spans: bytes | None
    span_count: int
    open_calls: tuple[OpenCall, ...]


@attrs.frozen
class _Read:
    """A batch's lines as read, before they are made into bodies."""

    job: BatchJob
    offset: int
    """The byte offset of the last line, in the file of the batch's every line."""
    path: Path
    """That file."""


@attrs.define
class _Batcher:
    """Reads the ledger a batch at a time from the line after the cursor's (blocking:
    run in a worker thread, one call at a time), and carries the calls open across the
    batches once each is made (:func:`~boxmaker.ledger.otlp_batch.stitch`)."""

    ledger: str
    tail: LedgerTail
    tracker: CallTracker
    encoder: ProtoEncoder
    """The exporter's own (a batch made in a thread meanwhile uses another): the spans
    of the calls that end in a later batch than they began."""
    capture_content: bool
    expected: int
    """The seq of the next line."""
    prev: str
    """The hash of the line before it."""
    logs_through: int
    """Log records up to this seq were taken already (by an export stopped between a
    batch's logs and its spans)."""

    def read(self, most: int) -> _Read | None:
        """The next batch of at most ``most`` lines; None at the ledger's end. Raises
        :class:`ExportProblem` for files that do not follow each other. Whether the
        lines are records and chained is checked as the batch is made: the next one is
        read as though they were."""
        try:
            lines = self.tail.read_lines(most, BATCH_BYTES, self.expected)
        except (OSError, SegmentProblem) as exc:  # the message names the file
            raise ExportProblem(f"{exc}; run `bxctl audit verify`; see {RUNBOOK}") from None
        if not lines:
            return None
        job = BatchJob(
            self.ledger,
            __version__,
            self.capture_content,
            first=self.expected,
            prev=self.prev,
            logs_through=self.logs_through,
            lines=tuple(raw[:-1] for _, raw in lines),
        )
        self.expected += len(lines)
        self.prev = line_hash(job.lines[-1])
        return _Read(job, offset=lines[-1][0], path=self.tail.path)

    def batch(self, read: _Read, part: BatchPart) -> _Batch:
        """The batch ``read`` is, made into ``part``: the calls open before it carried
        over it."""
        spans, span_count = stitch(read.job, part, self.tracker, self.encoder)
        job = read.job
        return _Batch(
            first=job.first,
            last=job.first + len(job.lines) - 1,
            offset=read.offset,
            line_sha256=part.last_hash,
            logs=part.logs,
            log_count=part.log_count,
            spans=spans or None,
            span_count=span_count,
            open_calls=tuple(self.tracker.open_calls.values()),
        )


@attrs.define
class _Export:
    """One run of the export: the sending side's state between batches."""

    url: str
    cursor_path: Path
    say: Callable[[str], None]
    backoff: Backoff
    clients: dict[Signal, SignalClient]
    cursor: Cursor
    """What the receiver took: the cursor as it is written next."""
    nursery: trio.Nursery
    written: Cursor
    """The cursor as it is on disk."""
    writing: trio.Lock = attrs.field(factory=trio.Lock)
    sent_logs: int = 0
    sent_spans: int = 0
    unwritten: ExportProblem | None = None
    """Why the cursor could not be written: the export stops."""

    async def deliver(self, what: str, signal: Signal, body: bytes, batch: _Batch) -> None:
        """Send until the receiver takes it; the cursor stays meanwhile. Raises
        :class:`ExportProblem` when the receiver refuses it."""
        seqs = f"the {what} of seq {batch.first}-{batch.last}"
        delay = self.backoff.first
        failed = False
        while not isinstance(answer := await self._post(signal, body), Taken):
            await self.write_cursor()  # what the messages say is on disk
            if isinstance(answer, Refused):
                raise ExportProblem(
                    f"the receiver at {self.url} refused {seqs} ({answer.words}): sending them "
                    f"again would not help; the cursor stays at seq {self.cursor.seq}; see "
                    f"{RUNBOOK}"
                )
            failed = True
            wait = delay if answer.wait is None else answer.wait
            self.say(
                f"the receiver at {self.url} did not take {seqs} ({answer.words}); the cursor "
                f"stays at seq {self.cursor.seq}; trying again in {wait:g} s (see {RUNBOOK})"
            )
            await trio.sleep(wait)
            if answer.wait is None:
                delay = min(delay * 2, self.backoff.most)
        if failed:
            self.say(f"the receiver at {self.url} took {seqs}")
        if answer.rejected:
            self.say(
                f"the receiver at {self.url} took {seqs} but rejected {answer.rejected} of them "
                f"({answer.words or 'it gave no reason'}); they are not sent again (see {RUNBOOK})"
            )
        elif answer.words:
            self.say(f"the receiver at {self.url} took {seqs} and said: {answer.words}")

    async def _post(self, signal: Signal, body: bytes) -> Taken | Retry | Refused:
        """One request, its answer awaited even when the export is stopped meanwhile (at
        most the request's timeout): a receiver that took a batch whose answer the
        export never read would get it again from the next run."""
        with trio.CancelScope(shield=True):
            answer = await self.clients[signal].post(body)
        return answer  # noqa: RET504 - mypy counts a scope that might swallow a return

    def move_cursor(self, cursor: Cursor) -> None:
        """The receiver took up to ``cursor``: written in the background (the next
        request is sent meanwhile), in order, the newest when several wait."""
        self.cursor = cursor
        self.nursery.start_soon(self.write_cursor)

    async def write_cursor(self) -> None:
        """Write the newest cursor unless it is on disk already. Shielded, so a stop
        right after the receiver's answer still records what it took."""
        with trio.CancelScope(shield=True):
            async with self.writing:
                cursor = self.cursor
                if cursor is not self.written and self.unwritten is None:
                    data = cursor.to_json()
                    try:
                        await trio.to_thread.run_sync(write_atomically, self.cursor_path, data)
                    except OSError as exc:
                        self.unwritten = ExportProblem(
                            f"the cursor {self.cursor_path} cannot be written ({exc.strerror}); "
                            f"the export stopped, and the next run sends again what the "
                            f"receiver took after seq {self.written.seq}; see {RUNBOOK}"
                        )
                        self.nursery.cancel_scope.cancel()
                        return
                    self.written = cursor

    async def send(self, batch: _Batch) -> None:
        """Send one batch: its logs, then the spans of the calls it ends; the cursor
        after each."""
        at = self.cursor
        if batch.logs is not None:
            await self.deliver("log records", "logs", batch.logs, batch)
            self.sent_logs += batch.log_count
            if batch.spans is not None:
                self.move_cursor(attrs.evolve(at, logs_through=batch.last))
        if batch.spans is not None:
            await self.deliver("spans", "traces", batch.spans, batch)
            self.sent_spans += batch.span_count
        done = Cursor(
            url=self.url,
            ledger=at.ledger,
            seq=batch.last,
            offset=batch.offset,
            line_sha256=batch.line_sha256,
            logs_through=max(batch.last, at.logs_through),
            open_calls=batch.open_calls,
        )
        self.move_cursor(done)


def _clients(url: str) -> dict[Signal, SignalClient]:
    """One client a signal, set by the environment. Blocking (reads TLS files)."""
    base = url.rstrip("/")
    clients: dict[Signal, SignalClient] = {}
    try:
        for signal in ("logs", "traces"):
            settings = settings_of(os.environ, signal)
            clients[signal] = SignalClient(f"{base}/v1/{signal}", signal, settings, REQUEST_TIMEOUT)
    except SettingProblem as exc:
        raise ExportProblem(f"{exc}; see {RUNBOOK}") from None
    return clients


@attrs.define
class _Makers:
    """Where batches are made: a long one in a worker process, :data:`WORKERS` at once
    (started as the first long batch needs one); a short one (an export following the
    ledger as it grows) in a thread, which starts nothing."""

    context: trio_parallel.WorkerContext
    parallel_from: int
    """Lines a batch made in a worker process has at least."""
    processes: trio.CapacityLimiter = attrs.field(factory=lambda: trio.CapacityLimiter(WORKERS))
    thread: trio.CapacityLimiter = attrs.field(factory=lambda: trio.CapacityLimiter(1))

    async def make(self, job: BatchJob) -> BatchPart:
        if len(job.lines) < self.parallel_from:
            return await trio.to_thread.run_sync(make_part, job, limiter=self.thread)
        part: BatchPart = await self.context.run_sync(
            make_part, job, kill_on_cancel=True, limiter=self.processes
        )
        return part


def _how_it_ended(broken: trio_parallel.BrokenWorkerError) -> str:
    """A worker process's end as a person reads it: the library gives the process last."""
    code = getattr(broken.args[-1] if broken.args else None, "exitcode", None)
    if not isinstance(code, int):
        return "no exit status"
    if code >= 0:
        return f"exit status {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


@attrs.define
class _Making:
    """A batch being made: its part once ``done``, or why it cannot be sent."""

    read: _Read
    done: trio.Event = attrs.field(factory=trio.Event)
    part: BatchPart | None = None
    problem: ExportProblem | None = None

    async def make(self, makers: _Makers) -> None:
        job = self.read.job
        try:
            self.part = await makers.make(job)
        except BadBatch as exc:
            self.problem = ExportProblem(
                f"{self.read.path}: {exc}; run `bxctl audit verify`; see {RUNBOOK}"
            )
        except trio_parallel.BrokenWorkerError as exc:
            last = job.first + len(job.lines) - 1
            self.problem = ExportProblem(
                f"the process making seq {job.first}-{last} into requests ended before it "
                f"was done ({_how_it_ended(exc)}); nothing of them was sent; run the export "
                f"again; see {RUNBOOK}"
            )
        self.done.set()

    async def made(self, batcher: _Batcher) -> _Batch:
        """The batch, once made. Raises :class:`ExportProblem`."""
        await self.done.wait()
        if self.problem is not None:
            raise self.problem
        assert self.part is not None
        return batcher.batch(self.read, self.part)


async def _produce(
    batcher: _Batcher,
    makers: _Makers,
    most: int,
    ready: trio.MemorySendChannel[_Making | ExportProblem],
    follow: bool,
    poll: float,
) -> None:
    """Batches into ``ready`` in order, each made meanwhile (up to :data:`WORKERS` at
    once while the one before is sent), then a problem if one stops the export, then
    the end (closed) unless ``follow``."""
    async with ready, trio.open_nursery() as making:
        while True:
            try:
                read = await trio.to_thread.run_sync(batcher.read, most)
            except ExportProblem as exc:
                await ready.send(exc)
                return
            if read is not None:
                pending = _Making(read)
                making.start_soon(pending.make, makers)
                await ready.send(pending)
            elif follow:
                await trio.sleep(poll)
            else:
                return


async def export_ledger(
    path: Path,
    url: str,
    cursor_path: Path,
    *,
    capture_content: bool,
    follow: bool,
    say: Callable[[str], None],
    backoff: Backoff = Backoff(),
    batch_lines: int | None = None,
    poll: float = POLL,
    parallel_from: int | None = None,
) -> Sent:
    """Export the ledger whose live file is ``path`` (all its files: docs/protocol.md,
    "Segments") to the OTLP/HTTP receiver at ``url`` from the cursor at ``cursor_path``
    on (from the oldest file present without one), until its end; with ``follow``, on as
    it grows, across its seals, until cancelled. ``say`` hears about a receiver that
    does not take a batch. A batch of ``parallel_from`` lines or more (default
    :data:`PARALLEL_LINES`) is made in a worker process. Raises :class:`ExportProblem`."""
    if not await trio.to_thread.run_sync(cursor_path.parent.is_dir):
        raise ExportProblem(
            f"{cursor_path.parent}, where the cursor {cursor_path.name} is kept, is not a "
            f"directory: make it, or keep the cursor elsewhere (--cursor FILE); see {RUNBOOK}"
        )
    ledger = await trio.to_thread.run_sync(ledger_id, path)
    cursor = await trio.to_thread.run_sync(read_cursor, cursor_path)
    if cursor is None:
        cursor = Cursor.start(url, ledger)
    check_cursor(cursor_path, cursor, url, ledger)
    tail, expected, prev = await trio.to_thread.run_sync(resume, path.parent, cursor_path, cursor)
    try:
        tracker = CallTracker(ledger, capture_content=capture_content)
        tracker.open_calls = {call.call: call for call in cursor.open_calls}
        encoder = ProtoEncoder(ledger, __version__)
        batcher = _Batcher(
            ledger,
            tail,
            tracker,
            encoder,
            capture_content,
            expected=expected,
            prev=prev,
            logs_through=cursor.logs_through,
        )
        most = BATCH_LINES if batch_lines is None else batch_lines
        clients = await trio.to_thread.run_sync(_clients, url)
        problem: ExportProblem | None = None
        try:
            async with (
                trio_parallel.open_worker_context(idle_timeout=WORKER_IDLE) as context,
                trio.open_nursery() as nursery,
            ):
                run = _Export(url, cursor_path, say, backoff, clients, cursor, nursery, cursor)
                ready, batches = trio.open_memory_channel[_Making | ExportProblem](WORKERS)
                made_apart_from = PARALLEL_LINES if parallel_from is None else parallel_from
                makers = _Makers(context, made_apart_from)
                nursery.start_soon(_produce, batcher, makers, most, ready, follow, poll)
                async for making in batches:
                    try:
                        if isinstance(making, ExportProblem):
                            raise making
                        await run.send(await making.made(batcher))
                    except ExportProblem as exc:
                        problem = exc
                        break
                nursery.cancel_scope.cancel()  # the batches made ahead are not sent
        finally:
            with trio.CancelScope(shield=True):
                for client in clients.values():
                    await client.aclose()
        if run.unwritten is not None:
            raise run.unwritten
        if problem is not None:
            raise problem
        return Sent(run.sent_logs, run.sent_spans, run.cursor.seq)
    finally:
        tail.close()
