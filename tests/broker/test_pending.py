"""broker/pending.py: the approvals table's endings, and a waiting call's own wait.

PendingCalls is driven directly (its methods do not await); the waiting connection is
driven through the real brokerd: bytes after the request do not end a wait, a close
ends it at once, and a waiting call sets no timer of its own but its deadline.
"""

from __future__ import annotations

import datetime as dt
import socket
from typing import Any

import orjson
import pytest
import trio
import trio.testing
from tests.harness.broker import (
    GUARD,
    PENDING_TIMEOUT,
    Client,
    eventually,
    inline,
    records_of,
    running,
    tool_request,
)
from tests.harness.homes import grant, write_grants

from boxmaker.broker.pending import (
    REMEMBER_ENDED,
    ApproveCommand,
    DeadlineMissed,
    PendingCalls,
    RefuseCommand,
    report,
)
from boxmaker.core import call_events as ev
from boxmaker.core.approvals import GrantRef, PendingEntry
from boxmaker.core.call_events import AdminReply
from boxmaker.core.labels import Taint
from boxmaker.core.owner_answer import EarlierEnd
from boxmaker.home.paths import Home

pytestmark = pytest.mark.usefixtures("inline_threads")


def make(approval: str = "a-00000001", *, now: float = 100.0) -> PendingEntry:
    return PendingEntry.create(
        approval=approval,
        call="c-" + approval[2:] * 2,
        session="s-0123456789ab",
        tool="read_file",
        arguments={"path": "notes.txt"},
        grant=GrantRef(id="g", mode="ask"),
        taint=Taint.PUBLIC,
        untrusted=False,
        requested_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
        now=now,
        timeout=300.0,
    )


def channel() -> tuple[trio.MemorySendChannel[AdminReply], trio.MemoryReceiveChannel[AdminReply]]:
    return trio.open_memory_channel[AdminReply](1)


def test_end_takes_the_entry_and_delivers_once() -> None:
    pending = PendingCalls()
    entry = make()
    assert pending.add(entry)
    assert pending.ending(entry.approval) is None
    ended = pending.end(entry.approval, ev.RequesterGone())
    assert ended is not None
    assert (ended.entry, ended.command) == (entry, ev.RequesterGone())
    assert pending.ending(entry.approval) == ev.RequesterGone()
    assert entry.approval not in pending.table
    # A second taker finds it gone; the first ending stays.
    assert pending.end(entry.approval, ev.Stopping()) is None
    assert pending.ending(entry.approval) == ev.RequesterGone()
    assert not pending.was_expired(entry.approval)
    pending.forget(entry.approval)
    assert pending.waiters == {}


def test_an_owner_answer_before_the_deadline_is_delivered() -> None:
    pending = PendingCalls()
    entry = make()
    pending.add(entry)
    send, receive = channel()
    command = RefuseCommand("no", send)
    ended = pending.end(entry.approval, command, now=entry.deadline - 0.001)
    assert ended is not None
    assert ended.entry is entry
    assert ended.command is command
    assert pending.ending(entry.approval) is command
    pending.forget(entry.approval)
    # The call's task is done: an admin still waiting on the reply hears the end.
    with pytest.raises(trio.EndOfChannel):
        receive.receive_nowait()


def test_an_owner_answer_at_the_deadline_is_the_expiry() -> None:
    pending = PendingCalls()
    entry = make()
    pending.add(entry)
    send, _ = channel()
    ended = pending.end(entry.approval, ApproveCommand(None, send), now=entry.deadline)
    assert ended is not None
    assert ended.command == ev.Expired()
    assert pending.was_expired(entry.approval)
    assert pending.end(entry.approval, ApproveCommand(None, send), now=0.0) is None


def test_expired_ids_are_remembered_up_to_a_bound() -> None:
    pending = PendingCalls()
    first = make("a-00000000")
    pending.add(first)
    pending.end(first.approval, ev.Expired())
    assert pending.was_expired(first.approval)
    for number in range(1, REMEMBER_ENDED + 1):
        entry = make(f"a-{number:08x}")
        pending.add(entry)
        pending.end(entry.approval, ev.Expired())
        pending.forget(entry.approval)
    assert not pending.was_expired(first.approval)
    assert pending.was_expired(f"a-{REMEMBER_ENDED:08x}")


def test_an_entry_whose_requester_left_is_remembered_as_withdrawn() -> None:
    pending = PendingCalls()
    left, answered = make("a-00000001"), make("a-00000002")
    pending.add(left)
    pending.add(answered)
    pending.end(left.approval, ev.RequesterGone())
    send, _ = channel()
    pending.end(answered.approval, RefuseCommand("no", send), now=0.0)
    assert pending.earlier_end(left.approval) is EarlierEnd.WITHDRAWN
    assert not pending.was_expired(left.approval)
    # An owner's answer is not remembered: the other owner hears no_such_approval.
    assert pending.earlier_end(answered.approval) is None


def test_withdraw_all_ends_every_entry_and_closes_the_table() -> None:
    pending = PendingCalls()
    entries = [make(f"a-0000000{n}") for n in range(3)]
    for entry in entries:
        pending.add(entry)
    assert pending.withdraw_all() == 3
    assert len(pending.table) == 0
    assert [pending.ending(e.approval) for e in entries] == [ev.Stopping()] * 3
    assert not pending.add(make("a-00000009"))
    assert "a-00000009" not in pending.table


def test_new_approval_ids_are_neither_pending_nor_remembered_as_expired() -> None:
    drawn = iter(["a-00000001", "a-00000002", "a-00000001", "a-00000002", "a-00000003"])
    pending = PendingCalls(new_id=lambda: next(drawn))
    first = make(pending.new_approval_id())
    pending.add(first)
    second = make(pending.new_approval_id())
    pending.add(second)
    pending.end(second.approval, ev.Expired())
    assert pending.new_approval_id() == "a-00000003"
    assert len({PendingCalls().new_approval_id() for _ in range(100)}) == 100


def test_forget_takes_an_entry_still_there_and_is_idempotent() -> None:
    pending = PendingCalls()
    entry = make()
    pending.add(entry)
    pending.forget(entry.approval)
    assert entry.approval not in pending.table
    assert pending.waiters == {}
    pending.forget(entry.approval)
    pending.forget("a-ffffffff")


def test_report_tells_the_admin_once_and_a_gone_admin_is_no_error() -> None:
    send, receive = channel()
    report(send, ev.RefusedReply())
    assert receive.receive_nowait() == ev.RefusedReply()
    with pytest.raises(trio.EndOfChannel):
        receive.receive_nowait()
    send, receive = channel()
    receive.close()
    report(send, ev.RefusedReply())
    with pytest.raises(trio.ClosedResourceError):
        send.send_nowait(ev.RefusedReply())


async def test_the_deadline_scope_and_woke(autojump_clock: trio.testing.MockClock) -> None:
    pending = PendingCalls()
    entry = make(now=trio.current_time())
    pending.add(entry)
    with pending.deadline(entry) as scope:
        assert scope.deadline == entry.deadline
        await trio.sleep_forever()
    assert trio.current_time() == entry.deadline
    assert pending.woke(entry, trio.current_time()) == ev.Expired()
    assert pending.was_expired(entry.approval)


async def test_end_cancels_the_waiting_scope() -> None:
    pending = PendingCalls()
    entry = make(now=trio.current_time())
    pending.add(entry)

    async def stop() -> None:
        await trio.lowlevel.checkpoint()
        pending.end(entry.approval, ev.Stopping())

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stop)
            with pending.deadline(entry) as scope:
                await trio.sleep_forever()
    assert scope.cancelled_caught
    assert pending.woke(entry, trio.current_time()) == ev.Stopping()


async def test_woken_early_it_waits_again(autojump_clock: trio.testing.MockClock) -> None:
    pending = PendingCalls()
    entry = make(now=trio.current_time())
    pending.add(entry)
    assert pending.woke(entry, entry.deadline - 0.001) is None
    assert entry.approval in pending.table
    with pending.deadline(entry) as scope:
        await trio.sleep(1)  # the wait ends before its deadline, without an ending
    assert not scope.cancelled_caught
    assert pending.woke(entry, trio.current_time()) is None
    assert entry.approval in pending.table


async def test_woken_by_its_deadline_it_must_have_expired(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The wait's deadline is trio's, the expiry the table's boundary: were they ever
    different (the boundary written ``>`` instead of ``>=``), the call would wait again,
    be cancelled at once, and spin at its deadline for ever, stalling brokerd. It raises
    instead, at once."""
    pending = PendingCalls()
    entry = make(now=trio.current_time())
    pending.add(entry)
    with pending.deadline(entry) as scope:
        await trio.sleep_forever()
    assert scope.cancelled_caught
    # As the boundary would say were it off by one: not yet expired.
    before = entry.deadline - 0.001
    with pytest.raises(DeadlineMissed) as missed:
        pending.woke(entry, before)
    assert str(missed.value) == (
        f"approval {entry.approval}: woken by its deadline {entry.deadline!r} at {before!r}, "
        "but not expired"
    )
    assert entry.approval in pending.table
    assert pending.ending(entry.approval) is None


# --- the waiting connection, through brokerd ------------------------------------------


async def ask_call(home: Home, frame: dict[str, Any]) -> tuple[Client, dict[str, Any]]:
    client = await Client.open(home.broker_sock)
    await client.send(frame)
    pending = await client.final()
    assert pending["kind"] == "pending", pending
    return client, pending


async def test_bytes_after_the_request_do_not_end_the_wait_and_a_close_ends_it_at_once(
    home: Home, autojump_clock: trio.testing.MockClock
) -> None:
    write_grants(home, grant("notes", "read_file", "ask"))
    with trio.fail_after(GUARD):
        async with running(home, to_thread=inline) as broker:
            frame = tool_request("read_file", {"path": "notes.txt"})
            c = frame["call"]
            client, pending = await ask_call(home, frame)
            for _ in range(3):
                await client.stream.send_all(b'{"kind":"noise"}\n' * 100)
                await trio.sleep(5)
            assert pending["approval"] in broker.table
            assert len(records_of(home, c)) == 1
            closed_at = trio.current_time()
            await client.aclose()
            await eventually(lambda: len(records_of(home, c)) == 2, step=0.001)
            assert trio.current_time() - closed_at < 0.01
            assert len(broker.table) == 0
    [_, withdrawn] = records_of(home, c)
    assert (withdrawn["outcome"], withdrawn["reason"]) == ("withdrawn", "requester_gone")


class _Steps(trio.abc.Instrument):
    """The names of the tasks that ran a step."""

    def __init__(self, besides: trio.lowlevel.Task) -> None:
        self.besides = besides
        self.names: set[str] = set()

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is not self.besides:
            self.names.add(task.name.rsplit(".", 1)[-1])


async def test_a_waiting_call_is_not_woken_while_nothing_happens(
    home: Home, autojump_clock: trio.testing.MockClock
) -> None:
    """No look a second, per call or broker-wide: a pending call's task sleeps until its
    socket, its ending or its deadline wakes it."""
    write_grants(home, grant("notes", "read_file", "ask"))
    with trio.fail_after(GUARD):
        async with running(home, to_thread=inline) as broker:
            clients = [
                (await ask_call(home, tool_request("read_file", {"path": "notes.txt"})))[0]
                for _ in range(3)
            ]
            await trio.testing.wait_all_tasks_blocked()
            steps = _Steps(besides=trio.lowlevel.current_task())
            trio.lowlevel.add_instrument(steps)
            try:
                await trio.sleep(PENDING_TIMEOUT - 0.001)
            finally:
                trio.lowlevel.remove_instrument(steps)
            # Only the grants watcher's two-second look at grants.toml ran.
            assert steps.names <= {"_watch_grants"}, steps.names
            assert len(broker.table) == 3
            for client in clients:
                await client.aclose()


def test_the_look_peeks_and_the_wait_drains() -> None:
    """Requester.gone peeks (the bytes stay); left() reads and drops them."""
    from boxmaker.broker.connection import Requester

    left, right = socket.socketpair()
    with left, right:
        requester = Requester(trio.SocketStream(trio.socket.from_stdlib_socket(left)))
        right.sendall(orjson.dumps({"kind": "noise"}))
        assert not requester.gone()
        assert not requester.gone()
        assert not requester.left()
        assert not requester.left()  # nothing left to read: still not gone
        right.close()
        assert requester.gone()
        assert requester.left()
