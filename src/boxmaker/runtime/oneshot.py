"""One value handed from one trio task to another, once.

The waiting task parks itself (``trio.lowlevel``) instead of on a memory channel pair
or a ``trio.Event``: brokerd makes one per ledger append (thousands a second), and a
channel pair (or an Event with its parking lot) costs several objects and hundreds of
bytes where one task reference does the same for one waiter.
"""

from __future__ import annotations

from typing import Generic, TypeVar

import trio

T = TypeVar("T")


class OneShot(Generic[T]):
    """Holds at most one value; :meth:`get` waits for it."""

    __slots__ = ("_has_value", "_task", "_value")

    def __init__(self) -> None:
        self._has_value = False
        self._value: T | None = None
        self._task: trio.lowlevel.Task | None = None

    @property
    def has_value(self) -> bool:
        return self._has_value

    def peek(self) -> T | None:
        """The value if it was given, else None (no wait)."""
        return self._value

    def put(self, value: T) -> bool:
        """Give the value and wake the waiter, if any. False (and nothing changes) when
        a value was given before."""
        if self._has_value:
            return False
        self._has_value, self._value = True, value
        task, self._task = self._task, None
        if task is not None:
            trio.lowlevel.reschedule(task)
        return True

    async def get(self) -> T:
        """The value, once given. Cancellable: a cancelled wait leaves it as it was."""
        if self._has_value:
            await trio.lowlevel.checkpoint()
        else:
            self._task = trio.lowlevel.current_task()
            await trio.lowlevel.wait_task_rescheduled(self._abort)
        return self._value  # type: ignore[return-value]  # set by put() before the wake

    def _abort(self, _: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
        self._task = None
        return trio.lowlevel.Abort.SUCCEEDED
