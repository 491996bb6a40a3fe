"""The NDJSON frame reader (docs/protocol.md): lines, the 1 MiB cap, EOF, no timeouts inside."""

from __future__ import annotations

import itertools

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from boxmaker.runtime.ndjson import (
    MAX_FRAME,
    BufferBudget,
    FrameError,
    FrameReader,
    FrameTooLong,
    OverBudget,
    TruncatedFrame,
    receive_frame_within,
)


class ChunkStream(trio.abc.ReceiveStream):
    """Hands out pre-cut chunks, one per receive_some, then EOF; counts the reads."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = list(chunks)
        self.reads = 0
        self.largest_request = 0

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()
        self.reads += 1
        self.largest_request = max(self.largest_request, max_bytes or 0)
        if not self.chunks:
            return b""
        chunk = self.chunks.pop(0)
        if max_bytes is not None and len(chunk) > max_bytes:
            self.chunks.insert(0, chunk[max_bytes:])
            chunk = chunk[:max_bytes]
        return chunk

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


async def read_all(reader: FrameReader) -> list[bytes]:
    lines = []
    while (line := await reader.receive_line()) is not None:
        lines.append(line)
    return lines


def cut(data: bytes, positions: list[int]) -> list[bytes]:
    bounds = [0, *sorted(set(positions)), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds) if b > a]


lines_st = st.lists(st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")), max_size=6)


@given(lines=lines_st, data=st.data())
async def test_any_chunking_gives_the_same_lines(lines: list[bytes], data: st.DataObject) -> None:
    payload = b"".join(line + b"\n" for line in lines)
    positions = data.draw(st.lists(st.integers(0, len(payload)), max_size=8))
    reader = FrameReader(ChunkStream(cut(payload, positions)), chunk=64)
    assert await read_all(reader) == lines
    assert await reader.receive_line() is None


async def test_a_split_at_every_position() -> None:
    payload = b'{"kind":"catalogue","v":1}\n{"kind":"status"}\n'
    for position in range(len(payload) + 1):
        reader = FrameReader(ChunkStream(cut(payload, [position])))
        assert await read_all(reader) == [b'{"kind":"catalogue","v":1}', b'{"kind":"status"}']


async def test_several_frames_in_one_chunk_need_one_read() -> None:
    stream = ChunkStream([b"a\nbb\n\nccc\n"])
    reader = FrameReader(stream)
    assert await reader.receive_line() == b"a"
    assert await reader.receive_line() == b"bb"
    assert await reader.receive_line() == b""
    assert await reader.receive_line() == b"ccc"
    assert stream.reads == 1
    assert await reader.receive_line() is None


@pytest.mark.parametrize("chunk", [1, 7, 64 * 1024])
async def test_exactly_the_cap_is_accepted(chunk: int) -> None:
    frame = b"x" * 100
    payload = frame + b"\n" + b"y\n"
    reader = FrameReader(
        ChunkStream(cut(payload, list(range(0, len(payload), chunk)))), max_frame=100
    )
    assert await reader.receive_line() == frame
    assert await reader.receive_line() == b"y"


@pytest.mark.parametrize("with_newline", [True, False])
@pytest.mark.parametrize("chunk", [1, 7, 101, 4096])
async def test_one_byte_over_the_cap_is_refused(chunk: int, with_newline: bool) -> None:
    payload = b"x" * 101 + (b"\n" if with_newline else b"")
    reader = FrameReader(
        ChunkStream(cut(payload, list(range(0, len(payload), chunk)))), max_frame=100
    )
    with pytest.raises(FrameTooLong):
        await reader.receive_line()
    with pytest.raises(FrameError, match="out of step"):
        await reader.receive_line()


async def test_the_default_cap_is_one_mebibyte() -> None:
    assert MAX_FRAME == 1048576
    at_cap = b"x" * MAX_FRAME
    reader = FrameReader(ChunkStream(cut(at_cap + b"\n", [70000, 500000])))
    assert await reader.receive_line() == at_cap
    reader = FrameReader(ChunkStream([at_cap, b"x\n"]), chunk=MAX_FRAME)
    with pytest.raises(FrameTooLong):
        await reader.receive_line()


async def test_a_long_line_is_refused_at_once_without_reading_it_all() -> None:
    chunks = [b"x" * 1000] * 1000  # a 1 MB line, never ending
    stream = ChunkStream(chunks)
    reader = FrameReader(stream, max_frame=4096, chunk=1000)
    with pytest.raises(FrameTooLong):
        await reader.receive_line()
    # cap + one chunk at most: 4096 bytes are exceeded on the fifth read.
    assert stream.reads == 5
    assert stream.largest_request == 1000


async def test_eof_mid_frame_is_truncated() -> None:
    reader = FrameReader(ChunkStream([b"whole\n", b"hal", b"f"]))
    assert await reader.receive_line() == b"whole"
    with pytest.raises(TruncatedFrame) as raised:
        await reader.receive_line()
    assert raised.value.received == 4


async def test_clean_eof_is_none_and_stays_none() -> None:
    stream = ChunkStream([b"a\n"])
    reader = FrameReader(stream)
    assert await reader.receive_line() == b"a"
    assert await reader.receive_line() is None
    assert await reader.receive_line() is None
    assert stream.reads == 2


async def test_readers_sharing_a_budget_hold_at_most_it_together() -> None:
    budget = BufferBudget(100, name="[test] budget")
    left, right = trio.testing.memory_stream_pair()
    first = FrameReader(right, chunk=60, budget=budget)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(first.receive_line)  # a line that never ends
        await left.send_all(b"x" * 64)
        await trio.testing.wait_all_tasks_blocked()
        assert budget.used == 64
        second = FrameReader(ChunkStream([b"y" * 50]), budget=budget)
        with pytest.raises(OverBudget, match=r"already hold 100 bytes \(\[test\] budget\)"):
            await second.receive_line()
        assert budget.used == 64  # the refused chunk was never counted
        third = FrameReader(ChunkStream([b"z" * 30, b"\n"]), budget=budget)
        assert await third.receive_line() == b"z" * 30  # what fits still gets through
        assert budget.used == 64
        nursery.cancel_scope.cancel()
    first.close()
    assert budget.used == 0
    first.close()
    assert budget.used == 0
    with pytest.raises(FrameError, match="out of step"):
        await first.receive_line()


async def test_a_complete_line_gives_its_bytes_back() -> None:
    budget = BufferBudget(1000, name="[test] budget")
    reader = FrameReader(ChunkStream([b"abc\nde", b"f\n"]), budget=budget)
    assert await reader.receive_line() == b"abc"
    assert budget.used == 2  # "de" waits for its newline
    assert await reader.receive_line() == b"def"
    assert budget.used == 0
    assert await reader.receive_line() is None
    assert budget.used == 0
    assert budget.peak == 6


async def test_a_failed_frame_gives_its_bytes_back() -> None:
    budget = BufferBudget(1000, name="[test] budget")
    reader = FrameReader(ChunkStream([b"x" * 50]), max_frame=20, chunk=30, budget=budget)
    with pytest.raises(FrameTooLong):
        await reader.receive_line()
    assert budget.used == 0
    reader = FrameReader(ChunkStream([b"cut"]), budget=budget)
    with pytest.raises(TruncatedFrame):
        await reader.receive_line()
    assert budget.used == 0


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="chunk"):
        FrameReader(ChunkStream([]), chunk=0)


async def test_memory_stream_pair_across_sends() -> None:
    left, right = trio.testing.memory_stream_pair()
    reader = FrameReader(right)
    async with trio.open_nursery() as nursery:

        async def send() -> None:
            await left.send_all(b'{"a":')
            await trio.testing.wait_all_tasks_blocked()
            await left.send_all(b'1}\n{"b":2}\n{"c"')
            await left.send_all(b":3}\n")
            await left.aclose()

        nursery.start_soon(send)
        assert await read_all(reader) == [b'{"a":1}', b'{"b":2}', b'{"c":3}']


async def test_lockstep_stream() -> None:
    left, right = trio.testing.lockstep_stream_pair()
    reader = FrameReader(right)
    async with trio.open_nursery() as nursery:

        async def send() -> None:
            for piece in (b"on", b"e\ntw", b"o\n"):
                await left.send_all(piece)
            await left.aclose()

        nursery.start_soon(send)
        assert await read_all(reader) == [b"one", b"two"]


async def test_a_real_socketpair() -> None:
    a, b = trio.socket.socketpair()
    with a, b:
        writer = trio.SocketStream(a)
        reader = FrameReader(trio.SocketStream(b))
        frames = [b"x" * 200_000, b"", b'{"kind":"status"}']
        async with trio.open_nursery() as nursery:

            async def send() -> None:
                await writer.send_all(b"".join(frame + b"\n" for frame in frames) + b"tail")
                await writer.send_eof()

            nursery.start_soon(send)
            for frame in frames:
                assert await reader.receive_line() == frame
            with pytest.raises(TruncatedFrame):
                await reader.receive_line()


async def test_the_caller_owns_the_deadline(autojump_clock: trio.testing.MockClock) -> None:
    left, right = trio.testing.memory_stream_pair()
    reader = FrameReader(right)
    start = trio.current_time()
    with pytest.raises(trio.TooSlowError):
        await receive_frame_within(reader, 5)
    assert trio.current_time() - start == pytest.approx(5)
    # A timed-out read loses nothing: the reader goes on where it was.
    await left.send_all(b"late\n")
    assert await receive_frame_within(reader, 5) == b"late"
