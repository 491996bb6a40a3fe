"""The one NDJSON frame reader of the system (spec §6.1; STYLE: trio has no line reader).

Every socket reads frames through :class:`FrameReader`: one line per call, at most
``max_frame`` bytes (1 MiB by default, the newline not counted), bytes after a newline
kept for the next call. It has no timeouts: the caller wraps a read in
``trio.fail_after`` where the policy lives (the 5 s first-frame rule is the
connection handler's, e.g. :func:`receive_frame_within`).

After :class:`FrameTooLong` or :class:`TruncatedFrame` the stream is out of step (the
rest of that line is unread), so the reader refuses to go on: the connection is done.
"""

from __future__ import annotations

from typing import Final

import trio

MAX_FRAME: Final = 1024 * 1024
"""Spec §6.1: at most 1 MiB a frame, not counting its newline."""
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


class FrameReader:
    """Lines from a :class:`trio.abc.ReceiveStream`.

    ``await reader.receive_line()`` returns the next line without its ``\\n``, or
    ``None`` at a clean end of stream (the peer closed between frames). Never buffers
    more than ``max_frame`` plus one chunk.
    """

    def __init__(
        self, stream: trio.abc.ReceiveStream, *, max_frame: int = MAX_FRAME, chunk: int = CHUNK
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

    async def receive_line(self) -> bytes | None:
        if self._failure is not None:
            raise FrameError("the stream is out of step after an earlier frame error")
        while True:
            newline = self._buffer.find(b"\n", self._scanned)
            if newline >= 0:
                if newline > self.max_frame:
                    raise self._fail(FrameTooLong(self.max_frame))
                line = bytes(self._buffer[:newline])
                del self._buffer[: newline + 1]
                self._scanned = 0
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
            self._buffer += data

    def _fail(self, error: FrameError) -> FrameError:
        self._failure = error
        self._buffer.clear()
        return error


async def receive_frame_within(reader: FrameReader, seconds: float) -> bytes | None:
    """The next line, or :class:`trio.TooSlowError` after ``seconds`` (spec §6.1, §7:
    the first frame within 5 s, each later admin request within 60 s)."""
    # A bare CancelScope, not trio.fail_after: this runs for every connection, and the
    # generator-based context manager costs more than the scope itself.
    with trio.CancelScope(deadline=trio.current_time() + seconds):
        return await reader.receive_line()
    raise trio.TooSlowError
