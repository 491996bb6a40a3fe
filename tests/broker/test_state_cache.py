"""brokerd's in-memory session states and its broker-wide look and expiry (docs/decisions.md,
"brokerd's hot path and memory"): a cached state is trusted only while the file's stat key
is unchanged."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import trio
import trio.lowlevel
from tests.harness.broker import running

from boxmaker.broker.connection import Requester
from boxmaker.broker.session_states import SessionStates
from boxmaker.core.labels import FRESH, Label, Taint
from boxmaker.core.state import StateUnreadable, encode_state
from boxmaker.home.paths import Home
from boxmaker.home.state_files import RACY_NS, read_state, read_state_keyed, state_key, state_path

T = TypeVar("T")

SESSION = "s-0123456789ab"
INTERNAL = Label(Taint.INTERNAL, False)
SECRET = Label(Taint.SECRET, False)


def _write(directory: Path, data: bytes, *, age_s: float = 10.0) -> None:
    """Replace the state file (a new inode), its mtime ``age_s`` in the past (its ctime
    is now: a rename sets it)."""
    path = state_path(directory, SESSION)
    temp = directory / ".test.tmp"
    temp.write_bytes(data)
    then = time.time_ns() - int(age_s * 1e9)
    os.utime(temp, ns=(then, then))
    temp.replace(path)


def test_no_file_has_no_key_and_may_be_cached(tmp_path: Path) -> None:
    assert state_key(tmp_path, SESSION) is None
    assert read_state_keyed(tmp_path, SESSION) == (None, FRESH, True)


def test_a_file_just_changed_is_not_cached(tmp_path: Path) -> None:
    state_path(tmp_path, SESSION).write_bytes(encode_state(INTERNAL))
    key, value, cacheable = read_state_keyed(tmp_path, SESSION)
    assert key is not None
    assert value == INTERNAL
    # ctime is "now": within RACY_NS of the read, so not cached.
    assert not cacheable


def test_an_unreadable_file_is_never_cached(tmp_path: Path) -> None:
    _write(tmp_path, b"not json")
    _, value, cacheable = read_state_keyed(tmp_path, SESSION)
    assert isinstance(value, StateUnreadable)
    assert not cacheable


async def test_a_cached_state_follows_the_file(tmp_path: Path) -> None:
    states = SessionStates(tmp_path)
    assert await states.read(SESSION) == FRESH
    _write(tmp_path, encode_state(INTERNAL))
    assert await states.read(SESSION) == INTERNAL
    # Damaged behind brokerd's back: the stat key moves, the re-read says unreadable.
    _write(tmp_path, b"not json")
    assert isinstance(await states.read(SESSION), StateUnreadable)
    _write(tmp_path, encode_state(SECRET))
    assert await states.read(SESSION) == SECRET
    state_path(tmp_path, SESSION).unlink()
    assert await states.read(SESSION) == FRESH


async def test_an_unchanged_file_is_not_read_again(tmp_path: Path) -> None:
    _write(tmp_path, encode_state(INTERNAL))
    # The rename set ctime to now: only a read RACY_NS later may be cached.
    await trio.sleep(RACY_NS / 1e9 + 0.02)
    threads = {"allowed": True}
    hops: list[object] = []

    async def counting(fn: Callable[..., T], *args: object, abandon_on_cancel: bool = False) -> T:
        if threads["allowed"]:
            return await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=abandon_on_cancel)
        hops.append(fn)
        raise AssertionError("no thread hop for an unchanged state")

    states = SessionStates(tmp_path, to_thread=counting)
    assert await states.read(SESSION) == INTERNAL
    threads["allowed"] = False
    assert await states.read(SESSION) == INTERNAL
    assert hops == []
    states.forget(SESSION)
    threads["allowed"] = True
    assert await states.read(SESSION) == INTERNAL


async def test_the_look_keeps_no_second_descriptor() -> None:
    left, right = trio.socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    stream = trio.SocketStream(left)
    requester = Requester(stream)
    before = len(os.listdir("/proc/self/fd"))
    assert not requester.gone()
    assert len(os.listdir("/proc/self/fd")) == before
    right.close()
    assert requester.gone()
    # The look did not close or steal the stream's descriptor.
    assert stream.socket.fileno() >= 0
    await stream.aclose()
    assert requester.gone()


async def test_bytes_after_the_request_are_not_gone() -> None:
    left, right = trio.socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    requester = Requester(trio.SocketStream(left))
    await right.send(b"more")
    assert not requester.gone()
    right.close()
    left.close()


async def test_two_raises_of_one_session_at_once_both_stand(home: Home) -> None:
    """A state only rises: two results of one session raised at the same
    moment (two threads) must not undo each other. A slow read-join-write makes the
    window wide enough that, unserialized, both would join onto the old state."""
    from boxmaker.broker import connection

    def slow_raise(directory: Path, session: str, label: Label) -> Label | StateUnreadable:
        current = read_state(directory, session)
        time.sleep(0.2)
        assert isinstance(current, Label)
        joined = current.join(label)
        state_path(directory, session).write_bytes(encode_state(joined))
        return joined

    with trio.fail_after(30):
        async with running(home, raise_state=slow_raise) as broker, trio.open_nursery() as nursery:
            nursery.start_soon(connection._raise_state, broker, SESSION, INTERNAL)
            nursery.start_soon(connection._raise_state, broker, SESSION, Label(Taint.PUBLIC, True))
    assert read_state(home.sessions_dir, SESSION) == Label(Taint.INTERNAL, True)
