"""How brokerd hands blocking work to a worker thread, as a seam.

Every blocking step of brokerd (a file read or write, an fsync, a bind) runs through one
:class:`ToThread`, ``trio.to_thread.run_sync`` unless a test passes its own: under
pytest-trio's autojump clock a run loop waiting on a worker thread is idle, so the
clock would jump past unrelated deadlines; the in-process tests run that work inline
instead (docs/testing.md, "Rules the tests keep").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Protocol, TypeVar, TypeVarTuple, Unpack

import trio

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class ToThread(Protocol):
    """``trio.to_thread.run_sync``'s shape, as far as brokerd uses it."""

    async def __call__(
        self,
        sync_fn: Callable[[Unpack[Ts]], T],
        *args: *Ts,
        abandon_on_cancel: bool = ...,
    ) -> T: ...


WORKER_THREAD: Final[ToThread] = trio.to_thread.run_sync
"""The real thing: a worker thread from trio's cache."""
