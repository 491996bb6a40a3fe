"""OneShot: one value from one task to another, once (src/boxmaker/runtime/oneshot.py)."""

from __future__ import annotations

import trio
import trio.testing

from boxmaker.runtime.oneshot import OneShot


async def test_a_value_given_first_is_got_at_once() -> None:
    slot = OneShot[int]()
    assert (slot.has_value, slot.peek()) == (False, None)
    assert slot.put(7)
    assert (slot.has_value, slot.peek()) == (True, 7)
    assert await slot.get() == 7


async def test_a_waiting_task_wakes_with_the_value() -> None:
    slot = OneShot[str]()
    got: list[str] = []

    async def waiter() -> None:
        got.append(await slot.get())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []
        assert slot.put("late")
    assert got == ["late"]


async def test_only_the_first_value_counts() -> None:
    slot = OneShot[int]()
    assert slot.put(1)
    assert not slot.put(2)
    assert await slot.get() == 1


async def test_a_cancelled_wait_leaves_the_slot_as_it_was(
    autojump_clock: trio.testing.MockClock,
) -> None:
    slot = OneShot[int]()
    with trio.move_on_after(1) as scope:
        await slot.get()
    assert scope.cancelled_caught
    assert not slot.has_value
    # Nobody waits now: a put wakes nobody and keeps the value for a later get.
    assert slot.put(3)
    assert await slot.get() == 3
