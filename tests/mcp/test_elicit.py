"""``bxctl mcp serve``'s second prompt channel (mcp/elicit.py), in process: the SDK's own
``ClientSession`` with an ``elicitation_callback``, the real brokerd, the autojump clock.

An answer in the client counts only where the grant opts in (``approvers = ["owner",
"mcp-client"]``); where it does not, the client is not even asked and the owner's
answer decides (docs/mcp.md, "Answering in the client")."""

from __future__ import annotations

import datetime as dt
from typing import Any, Final

import mcp_types as types
import pytest
import trio
import trio.testing
from mcp.client.context import ClientRequestContext
from tests.harness.broker import Brokerd, admin, records, records_of, waiting_approvals
from tests.harness.homes import grant, write_grants
from tests.harness.mcp_client import connected, serve_on, text_of

from boxmaker.core.vocabulary import Pending
from boxmaker.home.paths import Home
from boxmaker.mcp.elicit import FIELD, MAX_SHOWN, SCHEMA, UNNAMED, message

pytestmark = pytest.mark.usefixtures("inline_threads")

Clock = trio.testing.MockClock
OPTS_IN: Final = ["owner", "mcp-client"]
INFO: Final = types.Implementation(name="Claude Code", version="2.1")


class Prompt:
    """A client's elicitation callback that answers as told, and keeps what it was asked."""

    def __init__(self, result: types.ElicitResult | types.ErrorData) -> None:
        self.result = result
        self.asked: list[types.ElicitRequestParams] = []

    async def __call__(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        self.asked.append(params)
        return self.result


def accepted(approve: Any) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={FIELD: approve})


async def read_notes(
    home: Home, prompt: Prompt, approvers: list[str] | None, *, owner: str | None = None
) -> tuple[types.CallToolResult, str]:
    """A read of notes.txt on an ask grant; ``owner`` approves or refuses it once it waits
    (when the client's answer did not end it). The result and the call's id."""
    extra = {} if approvers is None else {"approvers": approvers}
    write_grants(home, grant("notes", "read_file", "ask", **extra))
    (home.default_workspace / "notes.txt").write_text("Buy milk.\n")
    results: list[types.CallToolResult] = []
    entry: dict[str, Any] = {}
    async with (
        connected(serve_on(home), elicitation_callback=prompt, client_info=INFO) as client,
        trio.open_nursery() as nursery,
    ):

        async def ask() -> None:
            results.append(await client.call_tool("read_file", {"path": "notes.txt"}))

        nursery.start_soon(ask)
        if owner is not None:
            [entry] = await waiting_approvals(home, within=1)
            await trio.sleep(1)  # the client's answer, if any, has had time to land
            assert not results
            if owner == "approve":
                approved = await admin(home, {"kind": "approve", "approval": entry["approval"]})
                assert approved["outcome"] == "ask"
            else:
                frame = {"kind": "refuse", "approval": entry["approval"], "reason": "no"}
                assert (await admin(home, frame))["kind"] == "refused"
    [result] = results
    calls = {r["call"] for r in records_of_all(home)}
    [call] = calls
    return result, call


def records_of_all(home: Home) -> list[dict[str, Any]]:
    return [r for r in records(home) if r.get("kind") == "decision"]


def approval_record(home: Home, call: str) -> dict[str, Any]:
    [record] = [r for r in records_of(home, call) if r["kind"] == "approval"]
    return record


async def test_an_approve_in_the_client_counts_where_the_grant_opts_in(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    await brokerd.start()
    prompt = Prompt(accepted(True))
    result, call = await read_notes(home, prompt, OPTS_IN)
    assert (result.is_error, text_of(result)) == (False, "Buy milk.\n")
    [asked] = prompt.asked
    assert isinstance(asked, types.ElicitRequestFormParams)
    assert asked.requested_schema == SCHEMA
    approval = approval_record(home, call)
    assert asked.message == (
        'boxmaker: the model asks to run read_file with {"path":"notes.txt"} '
        f"(grant notes, approval {approval['approval']}). The grant lets your answer here "
        "count: approve to run it, or refuse it. The owner may also answer with bxctl "
        f"approve {approval['approval']}."
    )
    assert (approval["outcome"], approval["by"], approval["approver"]) == (
        "ask",
        "mcp-client",
        "mcp-client:Claude Code",
    )


async def test_a_refusal_in_the_client_counts_where_the_grant_opts_in(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    await brokerd.start()
    result, call = await read_notes(home, Prompt(accepted(False)), OPTS_IN)
    assert result.is_error
    assert text_of(result) == "denied (refused): refused in the MCP client Claude Code"
    approval = approval_record(home, call)
    assert (approval["outcome"], approval["by"], approval["approver"]) == (
        "refused",
        "mcp-client",
        "mcp-client:Claude Code",
    )


@pytest.mark.parametrize("approvers", [None, ["owner"]])
async def test_where_the_grant_does_not_opt_in_the_client_is_not_asked_and_the_owner_decides(
    home: Home, brokerd: Brokerd, autojump_clock: Clock, approvers: list[str] | None
) -> None:
    await brokerd.start()
    prompt = Prompt(accepted(True))
    result, call = await read_notes(home, prompt, approvers, owner="refuse")
    assert prompt.asked == []
    assert text_of(result) == "denied (refused): no"
    approval = approval_record(home, call)
    assert (approval["by"], approval.get("approver")) == ("owner", None)


@pytest.mark.parametrize(
    "answer",
    [
        types.ElicitResult(action="decline"),
        types.ElicitResult(action="cancel"),
        types.ElicitResult(action="accept", content={}),
        accepted("yes"),
        types.ErrorData(code=types.INVALID_REQUEST, message="no prompt here"),
    ],
)
async def test_no_answer_from_the_client_leaves_it_to_the_owner(
    home: Home,
    brokerd: Brokerd,
    autojump_clock: Clock,
    answer: types.ElicitResult | types.ErrorData,
) -> None:
    await brokerd.start()
    prompt = Prompt(answer)
    result, call = await read_notes(home, prompt, OPTS_IN, owner="approve")
    assert len(prompt.asked) == 1
    assert text_of(result) == "Buy milk.\n"
    approval = approval_record(home, call)
    assert (approval["by"], approval.get("approver")) == ("owner", None)


async def test_a_client_without_elicitation_is_never_asked(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    write_grants(home, grant("notes", "read_file", "ask", approvers=OPTS_IN))
    await brokerd.start()
    async with connected(serve_on(home)) as client, trio.open_nursery() as nursery:
        results: list[types.CallToolResult] = []

        async def ask() -> None:
            results.append(await client.call_tool("read_file", {"path": "gone.txt"}))

        nursery.start_soon(ask)
        [entry] = await waiting_approvals(home, within=1)
        await admin(home, {"kind": "refuse", "approval": entry["approval"], "reason": "no"})
    assert text_of(results[0]) == "denied (refused): no"


@pytest.mark.parametrize(
    ("name", "recorded"),
    [
        ("Claude Code", "mcp-client:Claude Code"),
        ("evil\x1b[2J\u202ename", "mcp-client:evil\\u001b[2J\\u202ename"),
        ("x" * 100, "mcp-client:" + "x" * 64),
        ("   ", f"mcp-client:{UNNAMED}"),
    ],
)
async def test_the_clients_name_is_recorded_escaped_and_bounded(
    home: Home, brokerd: Brokerd, autojump_clock: Clock, name: str, recorded: str
) -> None:
    await brokerd.start()
    write_grants(home, grant("notes", "read_file", "ask", approvers=OPTS_IN))
    (home.default_workspace / "notes.txt").write_text("Buy milk.\n")
    info = types.Implementation(name=name, version="1")
    async with connected(
        serve_on(home), elicitation_callback=Prompt(accepted(True)), client_info=info
    ) as client:
        result = await client.call_tool("read_file", {"path": "notes.txt"})
    assert text_of(result) == "Buy milk.\n"
    [call] = {r["call"] for r in records_of_all(home)}
    assert approval_record(home, call)["approver"] == recorded


def test_arguments_too_long_to_show_are_not_asked_in_the_client() -> None:
    frame = Pending(
        call="c-0000000000000001",
        approval="a-00000001",
        grant="g",
        expires_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
        approvers=tuple(OPTS_IN),
    )
    # '{"content":"' and '"}' are 14 characters: the boundary is the escaped length.
    assert message("write_file", {"content": "x" * (MAX_SHOWN - 14)}, frame) is not None
    assert message("write_file", {"content": "x" * (MAX_SHOWN - 13)}, frame) is None
    assert message("write_file", {"content": "\x1b" * (MAX_SHOWN // 6)}, frame) is None
    shown = message("write_file", {"content": "\x1b[2J\u202e"}, frame)
    assert shown is not None
    assert '{"content":"\\u001b[2J\\u202e"}' in shown
