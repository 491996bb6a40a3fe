"""``bxctl mcp serve`` end to end: the real brokerd as a process, the serve started by the
SDK's own ``stdio_client`` as an MCP client starts it, the owner's answers from another
terminal (``bxctl approve``/``refuse`` as processes), the ledger read at the end.

One brokerd for the module (each test uses its own files and grants), so the file stays
fast: the serve's start (the SDK's import) is most of each test's time. Real time, every
wait bounded."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any, Final

import mcp_types as types
import orjson
import pytest
import trio
from tests.harness.broker import records, records_of
from tests.harness.cli import bxctl, listed_approvals
from tests.harness.homes import grant, short_home, write_config, write_grants
from tests.harness.mcp_client import served, text_of
from tests.harness.process import Daemon

from boxmaker.core.catalogue import catalogue_tools
from boxmaker.home.paths import Home
from boxmaker.mcp.tools import ANNOTATIONS

pytestmark = pytest.mark.slow

PENDING_S: Final = 6
"""brokerd's pending timeout here: long enough for a `bxctl approve` process to answer
on a loaded machine, short enough for the expiry test."""
WAIT_S: Final = 30.0
GRANTS: Final = "".join(
    [
        grant("notes", "read_file", "auto", paths=["notes.txt"]),
        grant("asked", "read_file", "ask", paths=["asked/**"]),
        # Claude Code's own tools, decided through permission_prompt.
        grant("claude-reads", "claude.Read", "auto"),
        grant("claude-edits", "claude.Edit", "ask"),
    ]
)


@pytest.fixture(scope="module")
def stack() -> Iterator[Home]:
    """A home with brokerd running (a process), shared by the module's tests."""
    with short_home("bx-mcp-") as home:
        write_config(home, f"[broker]\npending_timeout = {PENDING_S}\n")
        write_grants(home, GRANTS)
        (home.default_workspace / "notes.txt").write_text("Buy milk.\n")
        (home.default_workspace / "asked").mkdir()
        daemon = Daemon(home)
        try:
            daemon.wait_ready()
            yield home
        finally:
            daemon.kill()


async def owner(home: Home, *args: str) -> dict[str, Any]:
    """``bxctl ARGS`` in another process, as from another terminal; its JSON output."""
    done = await trio.to_thread.run_sync(functools.partial(bxctl, home, *args, "--json"))
    return orjson.loads(done.stdout)  # type: ignore[no-any-return]


async def waiting(home: Home, matches: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The pending approval that ``matches``, once ``bxctl approvals`` lists it."""
    with trio.fail_after(WAIT_S):
        while True:
            entries = await trio.to_thread.run_sync(listed_approvals, home)
            if mine := [e for e in entries if matches(e)]:
                return mine[0]
            await trio.sleep(0.05)


def reading(path: str) -> Callable[[dict[str, Any]], bool]:
    return lambda entry: entry["arguments"] == {"path": path}


async def ended(home: Home, approval: str) -> None:
    """Wait until the ledger records how ``approval`` ended (the caller bounds it)."""
    while not [r for r in records(home) if r.get("approval") == approval]:  # noqa: ASYNC110
        await trio.sleep(0.05)


def ending_of(home: Home, approval: str) -> dict[str, Any]:
    [record] = [r for r in records(home) if r.get("approval") == approval]
    return record


async def test_the_tools_an_auto_read_and_a_denial_with_its_reason(stack: Home) -> None:
    with trio.fail_after(WAIT_S):
        async with served(stack) as client:
            listed = (await client.list_tools()).tools
            read = await client.call_tool("read_file", {"path": "notes.txt"})
            denied = await client.call_tool("read_file", {"path": "secret.txt"})
    functions = [entry["function"] for entry in catalogue_tools()]
    assert [(t.name, t.input_schema, t.annotations) for t in listed] == [
        *((f["name"], f["parameters"], ANNOTATIONS[f["name"]]) for f in functions),
        ("permission_prompt", listed[-1].input_schema, None),
    ]
    assert (read.is_error, text_of(read)) == (False, "Buy milk.\n")
    assert (denied.is_error, text_of(denied)) == (
        True,
        "denied (no_grant): no grant allows read_file on secret.txt",
    )
    decisions = [r for r in records(stack) if r["kind"] == "decision"]
    [auto] = [r for r in decisions if r["arguments"] == {"path": "notes.txt"}]
    [deny] = [r for r in decisions if r["arguments"] == {"path": "secret.txt"}]
    assert (auto["verdict"], auto["grant"]) == ("run", "notes")
    assert (deny["verdict"], deny["reason"], deny["session"]) == (
        "deny",
        "no_grant",
        auto["session"],
    )


async def test_an_ask_is_approved_from_another_terminal_with_progress_meanwhile(
    stack: Home,
) -> None:
    (stack.default_workspace / "asked" / "plan.txt").write_text("the plan\n")
    heard: list[str | None] = []

    async def progress(done: float, total: float | None, message: str | None) -> None:
        heard.append(message)

    with trio.fail_after(WAIT_S):
        async with served(stack) as client, trio.open_nursery() as nursery:
            results: list[types.CallToolResult] = []

            async def ask() -> None:
                args = {"path": "asked/plan.txt"}
                results.append(
                    await client.call_tool("read_file", args, progress_callback=progress)
                )

            nursery.start_soon(ask)
            entry = await waiting(stack, reading("asked/plan.txt"))
            approved = await owner(stack, "approve", entry["approval"])
    assert approved["outcome"] == "ask"
    [result] = results
    assert (result.is_error, text_of(result)) == (False, "the plan\n")
    assert heard[0] == (
        f"waiting for the owner: bxctl approve {entry['approval']} (grant asked); "
        f"expires at {entry['expires_at']}"
    )
    kinds = [r["kind"] for r in records_of(stack, entry["call"])]
    assert kinds == ["decision", "approval", "result"]


async def test_a_refusal_reaches_the_client_with_the_owners_reason(stack: Home) -> None:
    with trio.fail_after(WAIT_S):
        async with served(stack) as client, trio.open_nursery() as nursery:
            results: list[types.CallToolResult] = []

            async def ask() -> None:
                results.append(await client.call_tool("read_file", {"path": "asked/r.txt"}))

            nursery.start_soon(ask)
            entry = await waiting(stack, reading("asked/r.txt"))
            await owner(stack, "refuse", entry["approval"], "--reason", "not that one")
    [result] = results
    assert (result.is_error, text_of(result)) == (True, "denied (refused): not that one")
    assert ending_of(stack, entry["approval"])["outcome"] == "refused"


async def test_an_unanswered_ask_expires_and_the_client_is_told(stack: Home) -> None:
    with trio.fail_after(WAIT_S):
        async with served(stack) as client:
            result = await client.call_tool("read_file", {"path": "asked/e.txt"})
    assert (result.is_error, text_of(result)) == (
        True,
        f"denied (expired): no approval within {PENDING_S} s",
    )


async def test_a_call_the_client_cancels_is_withdrawn_in_the_ledger(stack: Home) -> None:
    with trio.fail_after(WAIT_S):
        async with served(stack) as client:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(client.call_tool, "read_file", {"path": "asked/c.txt"})
                entry = await waiting(stack, reading("asked/c.txt"))
                nursery.cancel_scope.cancel()  # the SDK sends notifications/cancelled
            await ended(stack, entry["approval"])
            # The serve goes on: the same connection's next call is answered.
            after = await client.call_tool("read_file", {"path": "notes.txt"})
    withdrawn = ending_of(stack, entry["approval"])
    assert (withdrawn["outcome"], withdrawn["reason"], withdrawn["by"]) == (
        "withdrawn",
        "requester_gone",
        "broker",
    )
    assert text_of(after) == "Buy milk.\n"


async def test_a_client_that_goes_away_withdraws_its_waiting_call(stack: Home) -> None:
    with trio.fail_after(WAIT_S):
        async with trio.open_nursery() as nursery:

            async def client_side() -> None:
                async with served(stack) as client:
                    await client.call_tool("read_file", {"path": "asked/d.txt"})

            nursery.start_soon(client_side)
            entry = await waiting(stack, reading("asked/d.txt"))
            nursery.cancel_scope.cancel()  # the client process's end: the serve's stdin closes
        await ended(stack, entry["approval"])
    assert ending_of(stack, entry["approval"])["reason"] == "requester_gone"
    assert not await trio.to_thread.run_sync(
        lambda: orjson.loads(bxctl(stack, "approvals", "--json").stdout)
    )


async def test_the_permission_prompt_decides_claude_code_shaped_requests(stack: Home) -> None:
    """Claude Code's --permission-prompt-tool, as it calls it: {tool_name, input,
    tool_use_id}. brokerd decides claude.<tool_name>: a grant's auto allows, no grant
    denies, an ask waits for the owner."""
    read = {"tool_name": "Read", "input": {"file_path": "/w/notes.txt"}, "tool_use_id": "toolu_1"}
    bash = {"tool_name": "Bash", "input": {"command": "rm -rf /"}, "tool_use_id": "toolu_2"}
    edit = {
        "tool_name": "Edit",
        "input": {"file_path": "a.py", "old_string": "x", "new_string": "y"},
    }
    with trio.fail_after(WAIT_S):
        async with served(stack) as client, trio.open_nursery() as nursery:
            allowed = await client.call_tool("permission_prompt", read)
            denied = await client.call_tool("permission_prompt", bash)
            asked: list[types.CallToolResult] = []

            async def ask() -> None:
                asked.append(await client.call_tool("permission_prompt", edit))

            nursery.start_soon(ask)
            entry = await waiting(stack, lambda entry: entry["tool"] == "claude.Edit")
            await owner(stack, "approve", entry["approval"])
    assert not allowed.is_error
    assert orjson.loads(text_of(allowed)) == {
        "behavior": "allow",
        "updatedInput": {"file_path": "/w/notes.txt"},
    }
    assert orjson.loads(text_of(denied)) == {
        "behavior": "deny",
        "message": 'denied (no_grant): no grant allows claude.Bash on {"command":"rm -rf /"}',
    }
    [approved] = asked
    assert orjson.loads(text_of(approved)) == {"behavior": "allow", "updatedInput": edit["input"]}
    assert entry["arguments"] == edit["input"]
    decisions = [r for r in records(stack) if str(r.get("tool", "")).startswith("claude.")]
    assert [(d["tool"], d["verdict"], d["arguments"]) for d in decisions] == [
        ("claude.Read", "run", read["input"]),
        ("claude.Bash", "deny", bash["input"]),
        ("claude.Edit", "ask", edit["input"]),
    ]
