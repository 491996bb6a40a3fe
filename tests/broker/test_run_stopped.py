"""A running call belongs to its connection (broker/connection.py): when the requester
leaves while its tool runs, brokerd stops the run — the sandbox's processes killed, a
fetch closed — and the ledger closes the call with a ``failed`` ``requester_gone``
result; an owner whose approve let it run hears so. A requester that can no longer be
written to (it shut its reading side) ends its waiting call at the pending frame.

The real brokerd in process on its real sockets, real bwrap, real time (the sandbox and
the kernel's sockets do not follow a mock clock).
"""

from __future__ import annotations

import functools
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest
import trio
from tests.harness.broker import (
    PENDING_TIMEOUT,
    Client,
    admin,
    body,
    gone_result,
    records_of,
    running,
    tool_request,
    waiting_approvals,
)
from tests.harness.homes import grant, write_config, write_grants
from tests.harness.sandbox import processes_with, sandbox_workspace, wait_gone

from boxmaker.core.call import RUN_STOPPED_DETAIL
from boxmaker.home.paths import Home

pytestmark = pytest.mark.slow
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")

LIMIT: Final = 60.0
"""Real seconds for one test."""
MARKER: Final = "31.4159"
"""``sleep 31.4159``: long past the test, and found from the host by its argv."""
LONG_COMMAND: Final = f"touch started && exec sleep {MARKER}"
STOPPED_WITHIN: Final = 1.0
"""Seconds from the requester's leaving to the sandbox's processes gone."""


@pytest.fixture
def ws(home: Home) -> Iterator[Path]:
    """A workspace the sandbox can use, whoever runs the tests."""
    with sandbox_workspace() as workspace:
        write_config(
            home, f"workspace = {str(workspace)!r}\n[broker]\npending_timeout = {PENDING_TIMEOUT}\n"
        )
        yield workspace


async def until(condition: Any, within: float = 20.0) -> None:
    with trio.fail_after(within):
        while not condition():  # noqa: ASYNC110  (files and /proc: no event to wait on)
            await trio.sleep(0.01)


async def leave_once_running(client: Client, ws: Path) -> float:
    """Wait until the long command runs (it touched its file, and the host sees it),
    then leave: how long its processes outlived the leaving."""
    await until(lambda: (ws / "started").exists() and processes_with(MARKER))
    left = trio.current_time()
    await client.aclose()
    assert await wait_gone(MARKER, within=5.0) == []
    return trio.current_time() - left


async def result_of(home: Home, call: str) -> dict[str, Any]:
    await until(lambda: records_of(home, call)[-1]["kind"] == "result")
    return records_of(home, call)[-1]


@needs_bwrap
async def test_a_shell_whose_requester_leaves_is_killed_and_recorded_requester_gone(
    home: Home, ws: Path
) -> None:
    write_grants(home, grant("sh", "shell", "auto"))
    frame = tool_request("shell", {"command": LONG_COMMAND})
    with trio.fail_after(LIMIT):
        async with running(home):
            client = await Client.open(home.broker_sock)
            await client.send(frame)
            outlived = await leave_once_running(client, ws)
            result = await result_of(home, frame["call"])
    assert outlived < STOPPED_WITHIN
    [decision, _] = records_of(home, frame["call"])
    assert (decision["kind"], decision["verdict"]) == ("decision", "run")
    assert body(result) == gone_result(frame["call"], stopped=True)


@needs_bwrap
async def test_an_approved_shell_stopped_by_its_requester_leaving_tells_the_owner(
    home: Home, ws: Path
) -> None:
    write_grants(home, grant("sh", "shell", "ask"))
    frame = tool_request("shell", {"command": LONG_COMMAND})
    approved: list[dict[str, Any]] = []
    with trio.fail_after(LIMIT):
        async with running(home), trio.open_nursery() as nursery:
            client = await Client.open(home.broker_sock)
            await client.send(frame)
            assert (await client.final())["kind"] == "pending"
            [entry] = await waiting_approvals(home, within=20)

            async def approve() -> None:
                # brokerd answers an approve once the run it let start has ended.
                approved.append(
                    await admin(home, {"kind": "approve", "approval": entry["approval"]})
                )

            nursery.start_soon(approve)
            outlived = await leave_once_running(client, ws)
            result = await result_of(home, frame["call"])
    assert outlived < STOPPED_WITHIN
    assert approved == [
        {
            "kind": "approved",
            "outcome": "ask",
            "call": frame["call"],
            "reason": None,
            "detail": None,
            "tool": "shell",
            "ran": {"outcome": "failed", "reason": "requester_gone", "detail": RUN_STOPPED_DETAIL},
        }
    ]
    kinds = [
        (r["kind"], r.get("verdict") or r.get("outcome")) for r in records_of(home, frame["call"])
    ]
    assert kinds == [("decision", "ask"), ("approval", "ask"), ("result", None)]
    assert body(result) == gone_result(frame["call"], stopped=True)


async def test_a_fetch_whose_requester_leaves_is_closed_and_recorded_requester_gone(
    home: Home,
) -> None:
    """http_get to a local server that never answers: the connection it opened is closed
    as soon as the requester leaves, long before the fetch's own 10 s."""
    asked = trio.Event()
    closed = trio.Event()

    async def never_answer(stream: trio.SocketStream) -> None:
        async with stream:
            async for _ in stream:
                asked.set()
            closed.set()

    async with trio.open_nursery() as servers:
        [listener] = await servers.start(
            functools.partial(trio.serve_tcp, never_answer, 0, host="127.0.0.1")
        )
        port = listener.socket.getsockname()[1]
        write_grants(home, grant("web", "http_get", "auto", hosts=[f"127.0.0.1:{port}"]))
        frame = tool_request("http_get", {"url": f"http://127.0.0.1:{port}/slow"})
        with trio.fail_after(LIMIT):
            async with running(home):
                client = await Client.open(home.broker_sock)
                await client.send(frame)
                await asked.wait()
                left = trio.current_time()
                await client.aclose()
                await closed.wait()
                outlived = trio.current_time() - left
                result = await result_of(home, frame["call"])
        servers.cancel_scope.cancel()
    assert outlived < STOPPED_WITHIN
    assert body(result) == gone_result(frame["call"], stopped=True)


async def test_a_requester_that_shut_its_reading_side_is_withdrawn_at_the_pending_frame(
    home: Home,
) -> None:
    """The pending frame cannot be sent (EPIPE), so the entry ends there: otherwise the
    call would wait with nobody to answer, and the last look (a peek, which sees the
    requester's writing side open) would let an approve run it."""
    write_grants(home, grant("notes", "read_file", "ask"))
    frame = tool_request("read_file", {"path": "notes.txt"})
    with trio.fail_after(LIMIT):
        async with running(home):
            client = await Client.open(home.broker_sock)
            client.stream.socket.shutdown(socket.SHUT_RD)
            await client.send(frame)
            await until(
                lambda: any(r["kind"] == "approval" for r in records_of(home, frame["call"]))
            )
            listed = (await admin(home, {"kind": "approvals"}))["entries"]
            await client.aclose()
    assert listed == []
    [decision, approval] = records_of(home, frame["call"])
    assert decision["verdict"] == "ask"
    assert (approval["outcome"], approval["reason"], approval["by"]) == (
        "withdrawn",
        "requester_gone",
        "broker",
    )
