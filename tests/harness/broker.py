"""brokerd in process for tests: the real daemon started on a home, clients that speak
the real sockets with the real frame reader, and readers of the ledger it wrote.

Time: in-process tests run under pytest-trio's ``autojump_clock``. That clock jumps to
the next deadline whenever the run loop is idle, and a loop waiting on a worker thread
*is* idle, so every ``trio.to_thread.run_sync`` (ledger fsync, state reads) could fire
an unrelated deadline (a pending entry's expiry, the test's guard). The
``inline_threads`` fixture has brokerd run those functions inline (serve_broker's
``to_thread`` seam, :func:`inline`), so the only idle moments are
real ones and virtual time is exact. (Process tests use real time instead.)
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final, TypeVar, TypeVarTuple

import attrs
import orjson
import trio

from boxmaker.broker.serve import serve_broker
from boxmaker.broker.state import Broker
from boxmaker.formats.convert import new_call_id
from boxmaker.home.paths import Home
from boxmaker.ledger.verify_files import verify_file
from boxmaker.ledger.writer import LedgerFile, OsLedgerFile
from boxmaker.runtime.ndjson import FrameReader
from boxmaker.runtime.threads import ToThread

SESSION: Final = "s-0000000000a1"
GUARD: Final = 600.0
"""Virtual seconds: a hung test fails instead of stalling (test pending_timeout is 30)."""
PENDING_TIMEOUT: Final = 30.0
T = TypeVar("T")
Ts = TypeVarTuple("Ts")


async def inline(sync_fn: Callable[[*Ts], T], *args: *Ts, abandon_on_cancel: bool = False) -> T:
    """A :class:`~boxmaker.runtime.threads.ToThread` without the thread: ``sync_fn`` runs inline,
    after a checkpoint (see the module docstring; the ``inline_threads`` fixture)."""
    await trio.lowlevel.checkpoint()
    return sync_fn(*args)


def records(home: Home) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in home.audit_log.read_bytes().splitlines()]


def records_of(home: Home, call: str) -> list[dict[str, Any]]:
    return [record for record in records(home) if record.get("call") == call]


def body(record: dict[str, Any]) -> dict[str, Any]:
    """A record without the common fields, for exact comparison."""
    return {k: v for k, v in record.items() if k not in ("seq", "at", "prev")}


def gone_result(call: str, *, stopped: bool) -> dict[str, Any]:
    """The body of the result record of a call whose requester left before its run, or
    while it ran (``stopped``): no output, no label, nothing raised."""
    result: dict[str, Any] = {
        "kind": "result",
        "call": call,
        "status": "failed",
        "reason": "requester_gone",
        "label": {"taint": "public", "untrusted": False},
        "taint_after": "public",
        "untrusted_after": False,
        "output_sha256": None,
        "output_bytes": 0,
    }
    if stopped:
        result["stopped"] = True
    return result


def tool_request(
    tool: str, arguments: dict[str, Any], *, call: str | None = None, session: str = SESSION
) -> dict[str, Any]:
    return {
        "kind": "tool_request",
        "v": 1,
        "call": call or new_call_id(),
        "session": session,
        "tool": tool,
        "arguments": arguments,
    }


@asynccontextmanager
async def running(home: Home, **kwargs: Any) -> AsyncIterator[Broker]:
    """The real brokerd on ``home``, stopped cleanly at the end; the ledger must then
    verify."""
    async with trio.open_nursery() as nursery:
        broker: Broker = await nursery.start(functools.partial(serve_broker, home, **kwargs))
        try:
            yield broker
        finally:
            broker.request_stop()
    report = verify_file(home.audit_log)
    assert report.sound, [str(p) for p in report.problems]


@attrs.define
class Brokerd:
    """The real brokerd on ``home`` in a nursery the ``brokerd`` fixture holds open:
    started once, when the test says, and stopped by the test or by the fixture."""

    home: Home
    nursery: trio.Nursery
    to_thread: ToThread | None = None
    """serve_broker's ``to_thread`` unless the test passes its own (inline_threads)."""
    broker: Broker | None = None
    stopped: trio.Event = attrs.field(factory=trio.Event)

    async def start(self, **kwargs: Any) -> Broker:
        """serve_broker(home, **kwargs), ready: its sockets are listening. Again after
        a stop: a restart on the same home, a new boot."""
        assert self.broker is None or self.stopped.is_set(), "brokerd already started"
        self.stopped = trio.Event()
        if self.to_thread is not None:
            kwargs.setdefault("to_thread", self.to_thread)
        self.broker = await self.nursery.start(self._serve, kwargs)
        return self.broker

    async def _serve(self, kwargs: dict[str, Any], *, task_status: Any) -> None:
        try:
            await serve_broker(self.home, task_status=task_status, **kwargs)
        finally:
            self.stopped.set()

    async def stop(self) -> None:
        """Stop brokerd cleanly (if it runs) and wait for it; the ledger must then verify.
        Idempotent: the fixture calls it again at the end."""
        if self.broker is None or self.stopped.is_set():
            return
        self.broker.request_stop()
        await self.stopped.wait()
        report = verify_file(self.home.audit_log)
        assert report.sound, [str(p) for p in report.problems]


class Client:
    """One connection to a brokerd socket, speaking NDJSON frames."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.reader = FrameReader(stream)

    @classmethod
    async def open(cls, path: Path) -> Client:
        return cls(await trio.open_unix_socket(str(path)))

    async def send(self, frame: dict[str, Any] | bytes) -> None:
        data = frame if isinstance(frame, bytes) else orjson.dumps(frame) + b"\n"
        await self.stream.send_all(data)

    async def receive(self) -> dict[str, Any] | None:
        line = await self.reader.receive_line()
        return None if line is None else orjson.loads(line)

    async def final(self) -> dict[str, Any]:
        """The next frame, which must come: a call never ends without its final frame."""
        frame = await self.receive()
        assert frame is not None, "the connection closed without a final frame"
        return frame

    async def expect_denied(self, reason: str) -> dict[str, Any]:
        """The final frame denies the call for ``reason``; then the connection closes."""
        answer = await self.final()
        assert (answer["outcome"], answer["reason"]) == ("denied", reason), answer
        await self.aclose()
        return answer

    async def ask(self, frame: dict[str, Any]) -> dict[str, Any]:
        await self.send(frame)
        answer = await self.receive()
        assert answer is not None, "the connection closed without an answer"
        return answer

    async def at_eof(self) -> bool:
        """True when the other side closed after what was read (and sent nothing more)."""
        return await self.receive() is None

    async def aclose(self) -> None:
        await self.stream.aclose()


async def call(home: Home, frame: dict[str, Any] | bytes) -> list[dict[str, Any]]:
    """Send one frame on broker.sock; every frame until the broker closes."""
    client = await Client.open(home.broker_sock)
    try:
        await client.send(frame)
        frames = []
        # A socket closed with our unread bytes in it resets instead of ending cleanly
        # (Linux AF_UNIX): after the frames it sent, that is the same end.
        with contextlib.suppress(trio.BrokenResourceError):
            while (received := await client.receive()) is not None:
                frames.append(received)
        return frames
    finally:
        await client.aclose()


async def admin(home: Home, frame: dict[str, Any]) -> dict[str, Any]:
    client = await Client.open(home.admin_sock)
    try:
        return await client.ask(frame)
    finally:
        await client.aclose()


async def waiting_approvals(home: Home, count: int = 1, *, within: float) -> list[dict[str, Any]]:
    """The entries of admin ``approvals`` once there are ``count`` or more, polled as
    ``bxctl approvals --watch`` does (there is no event); ``within`` seconds at most."""
    with trio.fail_after(within):
        while len(entries := (await admin(home, {"kind": "approvals"}))["entries"]) < count:  # noqa: ASYNC110
            await trio.sleep(0.02)
    return entries  # type: ignore[no-any-return]


async def eventually(predicate: Callable[[], bool], step: float = 0.01) -> None:
    """Wait (virtual time) until ``predicate()`` holds; the test's guard bounds it."""
    while not predicate():  # noqa: ASYNC110 - a file on disk has no event to wait on
        await trio.sleep(step)


@attrs.define
class FailingFile:
    """The ledger's file layer, failing every write whose bytes ``fail_when`` picks
    (and every write after that, as a dead disk would)."""

    inner: LedgerFile
    fail_when: Callable[[bytes], bool] = lambda data: False
    failed: bool = False

    @classmethod
    def opener(cls, fail_when: Callable[[bytes], bool]) -> tuple[list[FailingFile], Any]:
        made: list[FailingFile] = []

        def open_file(path: Path) -> LedgerFile:
            file = cls(OsLedgerFile.open(path), fail_when)
            made.append(file)
            return file

        return made, open_file

    def write(self, data: bytes) -> None:
        if self.failed or self.fail_when(data):
            self.failed = True
            raise OSError(5, os.strerror(5))
        self.inner.write(data)

    def fsync(self) -> None:
        self.inner.fsync()

    def close(self) -> None:
        self.inner.close()
