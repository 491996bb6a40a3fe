"""A requester that never reads its answer: brokerd's send gives up after its deadline
(10 s), the connection is dropped and its task ends; the call's result is in the ledger,
and every other call is served meanwhile. In process, under the autojump clock."""

from __future__ import annotations

import contextlib
import hashlib

import pytest
import trio
import trio.testing
from tests.harness.broker import SESSION, Brokerd, Client, admin, call, eventually, records_of
from tests.harness.broker import tool_request as request
from tests.harness.homes import grant, write_grants

from boxmaker.core.catalogue import MAX_BYTES
from boxmaker.home.paths import Home

pytestmark = pytest.mark.usefixtures("inline_threads")

Clock = trio.testing.MockClock
SEND_S = 10.0
"""brokerd's deadline for sending one frame to a requester."""


async def test_a_requester_that_never_reads_is_dropped_at_the_send_deadline(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    write_grants(home, grant("read-all", "read_file", "auto"))
    (home.default_workspace / "big.txt").write_bytes(b"x" * MAX_BYTES)
    (home.default_workspace / "small.txt").write_text("small\n")
    broker = await brokerd.start()
    frame = request("read_file", {"path": "big.txt"})
    stalled = await Client.open(home.broker_sock)
    asked_at = trio.current_time()
    await stalled.send(frame)  # and never reads: the answer (1 MiB) fills the socket
    # The result is recorded before the answer is sent, so it is there while brokerd
    # waits for the requester to read.
    await eventually(lambda: len(records_of(home, frame["call"])) == 2)
    assert broker.capacity.connections == 1
    # Meanwhile every other call is served, and admin.sock answers.
    await trio.sleep(SEND_S / 2)
    [answer] = await call(home, request("read_file", {"path": "small.txt"}))
    assert (answer["outcome"], answer["content"]) == ("ok", "small\n")
    assert (await admin(home, {"kind": "status"}))["kind"] == "status"
    # At the deadline the connection is dropped and its task ends.
    await eventually(lambda: broker.capacity.connections == 0)
    assert SEND_S <= trio.current_time() - asked_at <= SEND_S + 0.1
    # What the requester can still read is a cut answer, then the end: never a frame.
    received = b""
    with contextlib.suppress(trio.BrokenResourceError):
        while chunk := await stalled.stream.receive_some(1 << 20):
            received += chunk
    await stalled.aclose()
    assert 0 < len(received) < MAX_BYTES
    assert not received.endswith(b"\n")
    decision, result = records_of(home, frame["call"])
    assert (decision["kind"], decision["verdict"], decision["session"]) == (
        "decision",
        "run",
        SESSION,
    )
    assert (result["kind"], result["status"], result["output_bytes"]) == (
        "result",
        "ok",
        MAX_BYTES,
    )
    assert result["output_sha256"] == hashlib.sha256(b"x" * MAX_BYTES).hexdigest()
