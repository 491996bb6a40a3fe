"""An answer from the MCP client's own prompt that tries to count where it must not
(docs/threat-model.md, "An answer from the MCP client").

The party is the software on the requester's side of broker.sock: the MCP client that
``bxctl mcp serve`` relays, or a requester that sends ``client_answer`` frames itself.
Each attack is sent on the call's own broker.sock connection, as the serve sends an
answer, and brokerd's log shows it arrived and was read; the call then still waits, and
only the owner's answer (or a counted one) ends it.

In process: the real brokerd, a raw broker.sock client, the autojump clock.
"""

from __future__ import annotations

import logging
from typing import Final

import orjson
import pytest
import trio
import trio.testing
from tests.harness.broker import Brokerd, Client, admin, body, records_of, tool_request
from tests.harness.homes import grant, write_grants

from boxmaker.home.paths import Home

pytestmark = pytest.mark.usefixtures("inline_threads")

Clock = trio.testing.MockClock
OPTS_IN: Final = ["owner", "mcp-client"]
LOGGER: Final = "boxmaker.brokerd"


def answer(approval_id: str, approve: bool = True) -> bytes:
    frame = {"kind": "client_answer", "v": 1, "approval": approval_id, "approve": approve}
    return orjson.dumps({**frame, "client": "hostile"}) + b"\n"


async def asks(home: Home, path: str) -> tuple[Client, str, str]:
    """A read that asks; its connection, call id and approval id."""
    client = await Client.open(home.broker_sock)
    frame = tool_request("read_file", {"path": path})
    await client.send(frame)
    pending = await client.final()
    assert pending["kind"] == "pending", pending
    return client, frame["call"], pending["approval"]


def ignored(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "ignored a client_answer" in r.getMessage()]


def setup(home: Home) -> None:
    write_grants(
        home,
        grant("owner-only", "read_file", "ask", paths=["secret/**"])
        + grant("client-too", "read_file", "ask", paths=["notes/**"], approvers=OPTS_IN),
    )
    for name in ("secret", "notes"):
        (home.default_workspace / name).mkdir()
        (home.default_workspace / name / "x.txt").write_text(f"{name}\n")


async def test_an_approve_for_a_grant_without_opt_in_does_not_run_the_call(
    home: Home, brokerd: Brokerd, autojump_clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    setup(home)
    await brokerd.start()
    client, call, approval = await asks(home, "secret/x.txt")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        await client.send(answer(approval) * 3)
        await trio.sleep(1)
    # Sent and read: brokerd names the frame it turned away.
    [first, *_] = ignored(caplog)
    assert "grant owner-only does not let the MCP client answer" in first
    assert approval in brokerd.broker.table
    assert [r["kind"] for r in records_of(home, call)] == ["decision"]
    await admin(home, {"kind": "refuse", "approval": approval, "reason": "no"})
    assert (await client.final())["reason"] == "refused"
    await client.aclose()
    await brokerd.stop()
    [_, refusal] = [body(r) for r in records_of(home, call)]
    assert (refusal["by"], refusal.get("approver")) == ("owner", None)


async def test_an_approve_for_another_calls_approval_does_not_run_it(
    home: Home, brokerd: Brokerd, autojump_clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """Even where both grants opt in: a requester answers only its own call's ask."""
    setup(home)
    await brokerd.start()
    victim, victim_call, victim_approval = await asks(home, "notes/x.txt")
    hostile, hostile_call, hostile_approval = await asks(home, "notes/x.txt")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        await hostile.send(answer(victim_approval))
        await trio.sleep(1)
    [line] = ignored(caplog)
    assert f"approval {victim_approval} is not this call's ({hostile_approval})" in line
    assert victim_approval in brokerd.broker.table
    assert hostile_approval in brokerd.broker.table
    for call in (victim_call, hostile_call):
        assert [r["kind"] for r in records_of(home, call)] == ["decision"]
    await victim.aclose()
    await hostile.aclose()


async def test_a_second_answer_cannot_turn_a_refusal_into_a_run(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    """Refuse, then approve, in one write: the first answer ends the entry; the second
    finds nothing to answer, and nothing runs."""
    setup(home)
    await brokerd.start()
    client, call, approval = await asks(home, "notes/x.txt")
    await client.send(answer(approval, approve=False) + answer(approval))
    final = await client.final()
    assert (final["outcome"], final["reason"]) == ("denied", "refused")
    await client.aclose()
    await brokerd.stop()
    outcomes = [body(r).get("outcome") for r in records_of(home, call)]
    assert outcomes == [None, "refused"]  # the decision, the refusal: no result, no run


async def test_an_answer_for_an_approval_the_owner_answered_first_changes_nothing(
    home: Home, brokerd: Brokerd, autojump_clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """The owner refuses one call; its requester answers for it again on a second
    waiting call's connection: the refused call stays refused, the other still waits."""
    setup(home)
    await brokerd.start()
    first, first_call, first_approval = await asks(home, "notes/x.txt")
    second, second_call, second_approval = await asks(home, "notes/x.txt")
    await admin(home, {"kind": "refuse", "approval": first_approval, "reason": "no"})
    assert (await first.final())["reason"] == "refused"
    with caplog.at_level(logging.INFO, logger=LOGGER):
        await second.send(answer(first_approval))
        await trio.sleep(1)
    [line] = ignored(caplog)
    assert f"approval {first_approval} is not this call's ({second_approval})" in line
    assert second_approval in brokerd.broker.table
    assert [r["kind"] for r in records_of(home, second_call)] == ["decision"]
    assert [body(r).get("outcome") for r in records_of(home, first_call)] == [None, "refused"]
    await first.aclose()
    await second.aclose()
