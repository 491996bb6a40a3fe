"""The one NDJSON frame reader of the system (docs/protocol.md; trio has no
line reader).

Every socket reads frames through :class:`FrameReader`: one line per call, at most
``max_frame`` bytes (1 MiB by default, the newline not counted), bytes after a newline
kept for the next call. It has no timeouts: the caller wraps a read in
``trio.fail_after`` where the policy lives (the 5 s first-frame rule is the
connection handler's, e.g. :func:`receive_frame_within`).

After :class:`FrameTooLong`, :class:`TruncatedFrame` or :class:`OverBudget` the stream
is out of step (the rest of that line is unread), so the reader refuses to go on: the
connection is done.

Readers may share a :class:`BufferBudget`: the bytes of unfinished frames that all of
them together may hold (brokerd's broker.sock, ``[broker] max_buffered_bytes``). A
thousand connections each sending 1 MiB without a newline would otherwise make brokerd
hold a gigabyte; with the budget, the reader that would go past it fails
:class:`OverBudget` (the connection is answered ``bad_frame`` and closed), so what a
flood costs is the budget, and it is handed back as each connection ends
(:meth:`FrameReader.close`).
"""

from __future__ import annotations

from typing import Final

import trio

MAX_FRAME: Final = 1024 * 1024
"""At most 1 MiB a frame, not counting its newline (docs/protocol.md, "Limits")."""
CHUNK: Final = 64 * 1024


class FrameError(Exception):
    """The stream did not carry a well-delimited frame; answer ``bad_frame`` and close."""


class FrameTooLong(FrameError):
    def __init__(self, max_frame: int) -> None:
        super().__init__(f"frame longer than {max_frame} bytes")
        self.max_frame = max_frame


class TruncatedFrame(FrameError):
    def __init__(self, received: int) -> None:
        super().__init__(f"the peer closed the stream {received} bytes into a frame")
        self.received = received


class OverBudget(FrameError):
    def __init__(self, budget: BufferBudget) -> None:
        super().__init__(
            f"unfinished frames already hold {budget.limit} bytes ({budget.name}); "
            "send the frame again later"
        )
        self.limit = budget.limit


class BufferBudget:
    """The bytes that all readers sharing it may hold at once (see the module doc).
    Touched from one thread's trio tasks only, so no lock."""

    def __init__(self, limit: int, *, name: str) -> None:
        if limit < 1:
            raise ValueError("a buffer budget is at least 1 byte")
        self.limit = limit
        self.name = name
        self.used = 0
        self.peak = 0

    def take(self, size: int) -> bool:
        if self.used + size > self.limit:
            return False
        self.used += size
        self.peak = max(self.peak, self.used)
        return True

    def give(self, size: int) -> None:
        self.used -= size


class FrameReader:
    """Lines from a :class:`trio.abc.ReceiveStream`.

    ``await reader.receive_line()`` returns the next line without its ``\\n``, or
    ``None`` at a clean end of stream (the peer closed between frames). Never buffers
    more than ``max_frame`` plus one chunk, nor more than ``budget`` leaves it; a reader
    with a budget must be closed (:meth:`close`) when its connection ends.
    """

    def __init__(
        self,
        stream: trio.abc.ReceiveStream,
        *,
        max_frame: int = MAX_FRAME,
        chunk: int = CHUNK,
        budget: BufferBudget | None = None,
    ) -> None:
        if max_frame < 0 or chunk < 1:
            raise ValueError("max_frame must be >= 0 and chunk >= 1")
        self.stream = stream
        self.max_frame = max_frame
        self._chunk = chunk
        self._buffer = bytearray()
        # Where the newline search resumes: the bytes before it hold none, so a long
        # line arriving in many chunks is scanned once, not once per chunk.
        self._scanned = 0
        self._eof = False
        self._failure: FrameError | None = None
        self._budget = budget
        self._held = 0
        """Bytes of ``_buffer`` taken from the budget (all of it, with a budget)."""

    async def receive_line(self) -> bytes | None:
        if self._failure is not None:
            raise FrameError("the stream is out of step after an earlier frame error")
        while True:
            newline = self._buffer.find(b"\n", self._scanned)
            if newline >= 0:
                if newline > self.max_frame:
                    raise self._fail(FrameTooLong(self.max_frame))
                line = bytes(self._buffer[:newline])
                if newline + 1 == len(self._buffer):
                    # A fresh buffer, not an emptied one: deleting from the front keeps
                    # the allocation, and a call may wait minutes after its request.
                    self._buffer = bytearray()
                else:
                    del self._buffer[: newline + 1]
                self._scanned = 0
                self._hand_back()
                return line
            self._scanned = len(self._buffer)
            if len(self._buffer) > self.max_frame:
                raise self._fail(FrameTooLong(self.max_frame))
            if self._eof:
                if self._buffer:
                    raise self._fail(TruncatedFrame(len(self._buffer)))
                return None
            data = await self.stream.receive_some(self._chunk)
            if not data:
                self._eof = True
            elif self._budget is not None:
                if not self._budget.take(len(data)):
                    # Not kept alive by the traceback while the refusal is sent: in a
                    # flood, a thousand connections fail at once.
                    del data
                    raise self._fail(OverBudget(self._budget))
                self._held += len(data)
            self._buffer += data

    def close(self) -> None:
        """The connection is done: drop the buffer and hand its bytes back to the budget.
        Idempotent; the reader reads nothing more."""
        if self._failure is None:
            self._failure = FrameError("the reader was closed")
        self._buffer = bytearray()
        self._hand_back()

    def _hand_back(self) -> None:
        if self._budget is not None:
            self._budget.give(self._held - len(self._buffer))
            self._held = len(self._buffer)

    def _fail(self, error: FrameError) -> FrameError:
        self._failure = error
        self._buffer = bytearray()
        self._hand_back()
        return error


async def receive_frame_within(reader: FrameReader, seconds: float) -> bytes | None:
    """The next line, or :class:`trio.TooSlowError` after ``seconds`` (docs/protocol.md:
    the first frame within 5 s, each later admin request within 60 s)."""
    # A bare CancelScope, not trio.fail_after: this runs for every connection, and the
    # generator-based context manager costs more than the scope itself.
    with trio.CancelScope(deadline=trio.current_time() + seconds):
        return await reader.receive_line()
    raise trio.TooSlowError
