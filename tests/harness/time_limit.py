"""A hang is a failure: each test's time limit (pytest-timeout's ``timeout``, in real
seconds), made to work for trio tests.

pytest-timeout's own ways do not fit a trio test. ``signal`` raises wherever the main
thread is, and in a trio test that is often trio's run loop: trio's state is broken, the
next tests see its debris, and pytest itself can stop with an INTERNALERROR. ``thread``
ends the whole run. And under the autojump clock a task that spins at a deadline (it
checkpoints, so the loop is never idle and the virtual clock never moves) never reaches
a trio deadline: the test's ``fail_after`` guard cannot fire.

So for a trio test (pytest-trio's ``trio`` mark) the limit is a real-time timer thread
that, when it fires, cancels the whole test from inside its trio run
(``TrioToken.run_sync_soon``): the test fails with a message, and the run goes on to the
next test. A test that cannot be cancelled — blocked in a worker thread, or spinning
without a checkpoint — still ends: after a grace, pytest-timeout's ``thread`` way dumps
every thread's stack and stops the run. Other tests keep pytest-timeout's default
(``signal``). (A hypothesis test over trio runs its examples in its own trio.run: only the
grace's stop applies to it.)
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Final

import attrs
import pytest
import pytest_timeout
import trio

GRACE_SHARE: Final = 0.1
"""After the cancel, the test has this share of its limit (at least a second) to end."""


@attrs.define
class Limit:
    """The time limit of the trio test running now, shared with its timer threads."""

    item: pytest.Item
    settings: Any
    lock: threading.Lock = attrs.field(factory=threading.Lock)
    token: trio.lowlevel.TrioToken | None = None
    scope: trio.CancelScope | None = None
    fired: bool = False
    timers: list[threading.Timer] = attrs.field(factory=list)

    def start(self) -> None:
        self._after(self.settings.timeout, self._fire)

    def cancel(self) -> None:
        with self.lock:
            timers, self.timers = self.timers, []
        for timer in timers:
            timer.cancel()

    def _after(self, seconds: float, action: Callable[[], None]) -> None:
        timer = threading.Timer(seconds, action)
        timer.name = f"time limit of {self.item.nodeid}"
        timer.daemon = True
        with self.lock:
            self.timers.append(timer)
        timer.start()

    def _fire(self) -> None:
        """In the timer thread: cancel the test from inside its run; if it cannot be
        cancelled (or is not inside its run yet), stop the run after the grace."""
        with self.lock:
            self.fired = True
            token, scope = self.token, self.scope
        if token is not None and scope is not None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(scope.cancel)
        grace = max(1.0, self.settings.timeout * GRACE_SHARE)
        self._after(grace, self._stop_the_run)

    def _stop_the_run(self) -> None:
        pytest_timeout.timeout_timer(self.item, self.settings)

    async def run_test(self, test: Callable[[], Awaitable[object]]) -> object:
        """``test`` (pytest-trio's run of fixtures and test) under a scope the timer can
        cancel; a cancel by the timer is the test's failure."""
        with trio.CancelScope() as scope:
            with self.lock:
                self.token, self.scope = trio.lowlevel.current_trio_token(), scope
            try:
                return await test()
            except BaseException as exc:
                if self.fired:
                    raise pytest.fail.Exception(self._message()) from exc
                raise
            finally:
                with self.lock:
                    self.token = self.scope = None
        pytest.fail(self._message())

    def _message(self) -> str:
        return (
            f"Timeout: the test ran more than its {self.settings.timeout:g} s of real time "
            "(a task spinning, or waiting for what never comes) and was cancelled"
        )


_running: Limit | None = None
"""The limit of the test being run (one at a time in a process)."""


def run_with_time_limit(async_fn: Callable[[], Awaitable[object]], **run_options: Any) -> object:
    """trio.run for pytest-trio (its ``trio(run=...)`` mark): the test under its limit."""
    limit = _running
    if limit is None:
        return trio.run(async_fn, **run_options)
    return trio.run(limit.run_test, async_fn, **run_options)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every trio test (pytest-trio marked it, trio_mode) runs through
    :func:`run_with_time_limit`: a mark added first is the one pytest-trio reads."""
    for item in items:
        if item.get_closest_marker("trio") is not None:
            item.add_marker(pytest.mark.trio(run=run_with_time_limit), append=False)


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool | None:
    """A trio test's limit is ours (see the module's docstring); others keep
    pytest-timeout's."""
    global _running
    if item.get_closest_marker("trio") is None:
        return None
    _running = Limit(item, settings)
    _running.start()
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_cancel_timer(item: pytest.Item) -> bool | None:
    global _running
    if _running is None or _running.item is not item:
        return None
    _running.cancel()
    _running = None
    return True
