"""loopd's one way to act: a tool request on broker.sock (docs/protocol.md).

:meth:`BrokerPort.call` connects, sends the request and reads frames until the final
one. It never raises for the broker's sake: a brokerd that is not running, closes
early, sends something unreadable or stays silent gives a *denied* answer with reason
``broker_unreachable`` or ``broker_timeout``, which the model is told like any denial.

Timeouts (docs/decisions.md, "loopd"): ``reply_timeout`` for the first frame; after a
``pending`` frame, until its ``expires_at`` plus :data:`PENDING_GRACE_S` (brokerd answers
``expired`` at ``expires_at``; the grace covers the clocks and the broker's work).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final

import attrs
import trio

from boxmaker.core.vocabulary import AnswerOutcome
from boxmaker.formats.clock import utc_now
from boxmaker.runtime.ndjson import FrameError, FrameReader
from boxmaker.wire import (
    Answer,
    BadFrame,
    CatalogueAnswer,
    CatalogueRequest,
    ClientAnswer,
    ErrorFrame,
    Pending,
    ToolRequest,
    decode_broker_answer,
    encode_frame,
)

log = logging.getLogger("boxmaker.loopd")

PENDING_GRACE_S: Final = 1.0
BROKER_UNREACHABLE: Final = "broker_unreachable"
BROKER_TIMEOUT: Final = "broker_timeout"
START_BROKERD: Final = "start the daemons with `bxctl up`"


@attrs.frozen
class PortAnswer:
    """What loopd learnt of a call: the broker's answer, or why there is none."""

    outcome: AnswerOutcome
    content: str | None = None
    reason: str | None = None
    detail: str | None = None

    @classmethod
    def unreachable(cls, detail: str) -> PortAnswer:
        return cls(AnswerOutcome.DENIED, reason=BROKER_UNREACHABLE, detail=detail)

    @classmethod
    def timed_out(cls, detail: str) -> PortAnswer:
        return cls(AnswerOutcome.DENIED, reason=BROKER_TIMEOUT, detail=detail)

    @classmethod
    def of(cls, answer: Answer) -> PortAnswer:
        reason = None if answer.reason is None else str(answer.reason)
        return cls(answer.outcome, answer.content, reason, answer.detail)


class _NoAnswer(Exception):
    def __init__(self, answer: PortAnswer) -> None:
        super().__init__(answer.detail)
        self.answer = answer


OnPending = Callable[[Pending], Awaitable[None]]


class BrokerPort:
    def __init__(self, broker_sock: Path, *, reply_timeout: float) -> None:
        self.broker_sock = broker_sock
        self.reply_timeout = reply_timeout

    async def call(
        self,
        request: ToolRequest,
        on_pending: OnPending | None = None,
        *,
        answers: trio.MemoryReceiveChannel[ClientAnswer] | None = None,
    ) -> PortAnswer:
        """The final answer to ``request`` (``on_pending`` hears a pending frame first).
        While the call waits, each ``client_answer`` received on ``answers`` (``bxctl mcp
        serve``: the MCP client's own prompt answered) is sent on the call's connection."""
        try:
            async with await self._connect() as stream:
                reader = FrameReader(stream)
                deadline = trio.current_time() + self.reply_timeout
                await self._send(stream, request, deadline)
                frame = await self._receive(reader, deadline, waiting=False)
                if isinstance(frame, Pending):
                    left = (frame.expires_at - utc_now()) / dt.timedelta(seconds=1)
                    deadline = trio.current_time() + max(left, 0.0) + PENDING_GRACE_S
                    if on_pending is not None:
                        await on_pending(frame)
                    if answers is None:
                        frame = await self._receive(reader, deadline, waiting=True)
                    else:
                        frame = await self._wait_passing_on(stream, reader, deadline, answers)
        except _NoAnswer as no_answer:
            return no_answer.answer
        if isinstance(frame, Answer):
            return PortAnswer.of(frame)
        if isinstance(frame, ErrorFrame):
            detail = f"brokerd refused the request: {frame.code}: {frame.detail}"
            return PortAnswer(AnswerOutcome.DENIED, reason=str(frame.code), detail=detail)
        return PortAnswer.unreachable(f"brokerd sent {type(frame).__name__} where an answer goes")

    async def _wait_passing_on(
        self,
        stream: trio.SocketStream,
        reader: FrameReader,
        deadline: float,
        answers: trio.MemoryReceiveChannel[ClientAnswer],
    ) -> Any:
        """The final frame of a waiting call, while the answers go to brokerd."""
        no_answer: _NoAnswer | None = None
        frame: Any = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_pass_on, stream, answers)
            try:
                frame = await self._receive(reader, deadline, waiting=True)
            except _NoAnswer as exc:
                no_answer = exc  # raised outside the nursery, not in an ExceptionGroup
            nursery.cancel_scope.cancel()
        if no_answer is not None:
            raise no_answer
        return frame

    async def catalogue(self) -> list[dict[str, Any]] | PortAnswer:
        """The tools brokerd offers (its ``catalogue`` frame), or why they could not be had."""
        try:
            async with await self._connect() as stream:
                deadline = trio.current_time() + self.reply_timeout
                await self._send(stream, CatalogueRequest(), deadline)
                frame = await self._receive(FrameReader(stream), deadline, waiting=False)
        except _NoAnswer as no_answer:
            return no_answer.answer
        if isinstance(frame, CatalogueAnswer):
            return frame.tools
        return PortAnswer.unreachable(f"brokerd answered the catalogue with {type(frame).__name__}")

    async def _connect(self) -> trio.SocketStream:
        try:
            return await trio.open_unix_socket(str(self.broker_sock))
        except OSError as exc:
            detail = f"brokerd is not running ({exc.strerror or exc}); {START_BROKERD}"
            raise _NoAnswer(PortAnswer.unreachable(detail)) from None

    async def _send(self, stream: trio.SocketStream, frame: Any, deadline: float) -> None:
        with trio.move_on_at(deadline) as scope:
            try:
                await stream.send_all(encode_frame(frame))
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise _NoAnswer(PortAnswer.unreachable(f"brokerd hung up ({exc})")) from None
        if scope.cancelled_caught:
            raise _NoAnswer(PortAnswer.timed_out("brokerd did not take the request in time"))

    async def _receive(self, reader: FrameReader, deadline: float, *, waiting: bool) -> Any:
        line = None
        with trio.move_on_at(deadline) as scope:
            try:
                line = await reader.receive_line()
            except (trio.BrokenResourceError, trio.ClosedResourceError, FrameError) as exc:
                raise _NoAnswer(PortAnswer.unreachable(f"brokerd hung up ({exc})")) from None
        if scope.cancelled_caught:
            if waiting:
                detail = "brokerd gave no answer by the approval's expiry (plus 1 s)"
            else:
                detail = f"brokerd gave no answer within {self.reply_timeout:g} s"
            raise _NoAnswer(PortAnswer.timed_out(detail))
        if line is None:
            raise _NoAnswer(PortAnswer.unreachable("brokerd closed the call without an answer"))
        try:
            return decode_broker_answer(line)
        except BadFrame as exc:
            detail = f"brokerd sent a frame loopd cannot read: {exc.detail}"
            raise _NoAnswer(PortAnswer.unreachable(detail)) from None


async def _pass_on(
    stream: trio.SocketStream, answers: trio.MemoryReceiveChannel[ClientAnswer]
) -> None:
    async for answer in answers:
        try:
            await stream.send_all(encode_frame(answer))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return  # brokerd closed the call: its final frame says how it ended
