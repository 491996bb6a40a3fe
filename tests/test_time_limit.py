"""A hang is a failure (tests/harness/time_limit.py): a trio test spinning at a deadline
under the autojump clock fails at its time limit and the run goes on; one blocked in a
worker thread, which no cancel reaches, stops the run with every thread's stack. Each
in a pytest of its own, with a one-second limit."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeini("[pytest]\ntrio_mode = true\ntimeout = 1\n")
    pytester.makeconftest(
        f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n"
        'pytest_plugins = ["tests.harness.time_limit"]\n'
    )
    return pytester


def test_a_task_spinning_at_a_deadline_fails_and_the_run_goes_on(
    suite: pytest.Pytester,
) -> None:
    suite.makepyfile(
        """
        import trio

        async def test_spins(autojump_clock):
            deadline = trio.current_time() + 1
            while trio.current_time() < deadline:  # the clock never jumps: never idle
                await trio.lowlevel.checkpoint()

        async def test_next(autojump_clock):
            await trio.sleep(3600)
        """
    )
    result = suite.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(
        ["*Failed: Timeout: the test ran more than its 1 s of real time*", "*1 failed, 1 passed*"]
    )


def test_a_task_blocked_in_a_thread_stops_the_run_with_the_stacks(
    suite: pytest.Pytester,
) -> None:
    suite.makepyfile(
        """
        import threading
        import trio

        async def test_blocked(autojump_clock):
            never = threading.Event()
            await trio.to_thread.run_sync(never.wait, abandon_on_cancel=False)

        def test_never_reached():
            pass
        """
    )
    result = suite.runpytest_subprocess("-p", "no:cacheprovider", "-v", timeout=60)
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*+ Timeout +*", "*in wait*", "*+ Timeout +*"])
    assert "test_never_reached" not in result.stdout.str()
