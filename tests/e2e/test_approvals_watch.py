"""``bxctl approvals --watch`` on a real terminal (a tmux pane), against the whole stack:
the owner chooses an approval with the arrow keys and answers it."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from tests.fakes.llama_server import FakeLlama
from tests.harness.broker import waiting_approvals
from tests.harness.homes import grant, write_grants
from tests.harness.screen import bxctl_argv, terminal
from tests.harness.stack import READ_NOTES, say, stack

from boxmaker.cli.terminal import REFUSED_WITHOUT_REASON
from boxmaker.cli.watch import KEYS_HELP, NONE_PENDING, REASON_PROMPT
from boxmaker.home.paths import Home

READ_TODO = {"tool_calls": [{"name": "read_file", "arguments": {"path": "todo.txt"}}]}


async def test_the_owner_chooses_the_second_approval_and_approves_it(home: Home) -> None:
    write_grants(home, grant("files", "read_file", "ask"))
    (home.default_workspace / "notes.txt").write_text("Buy milk.\n")
    (home.default_workspace / "todo.txt").write_text("Call mum.\n")
    fake = FakeLlama(script=[READ_NOTES, READ_TODO, {"content": "Call mum."}])
    turns: dict[str, list[dict[str, Any]]] = {}
    async with stack(home, fake), trio.open_nursery() as nursery:

        async def turn(name: str, text: str) -> None:
            turns[name] = await say(home, text)

        nursery.start_soon(turn, "notes", "read my notes")
        await waiting_approvals(home, 1, within=20)
        nursery.start_soon(turn, "todo", "read my todo list")
        first, second = await waiting_approvals(home, 2, within=20)
        argv = bxctl_argv("approvals", "--watch", "--home", str(home.root))
        async with terminal(argv) as screen:
            # Keys count once the chosen approval is marked ▶ (the view has settled).
            listed = await screen.wait_for(
                lambda text: second["approval"] in text and f"▶ {first['approval']}" in text
            )
            await screen.send("Down")
            await screen.wait_for(f"▶ {second['approval']}")
            await screen.send("y")
            # The view settles on the approval left before it takes the next key.
            after = await screen.wait_for(
                lambda text: (
                    f"approved {second['call']}: read_file ran (ok)" in text
                    and f"▶ {first['approval']}" in text
                )
            )
            await screen.send("q")
            code = await screen.exit_code()
            left = await screen.text()
        nursery.cancel_scope.cancel()
    assert KEYS_HELP in listed
    assert f"▶ {first['approval']}  read_file" in listed
    assert f"  {second['approval']}  read_file" in listed
    assert "pending approvals (1)" in after
    assert second["approval"] not in after.split("approved ")[0]
    assert code == 0
    assert f"approved {second['call']}: read_file ran (ok)" in left
    assert turns["todo"][-1] == {"kind": "reply", "final": True, "text": "Call mum."}
    assert "notes" not in turns


@pytest.mark.parametrize(
    ("typed", "reason"),
    [("private", "private"), ("", REFUSED_WITHOUT_REASON)],
    ids=["a-reason", "enter-alone"],
)
async def test_n_refuses_the_chosen_approval_with_a_reason(
    home: Home, typed: str, reason: str
) -> None:
    """n, a reason, Enter refuses with it; Enter alone refuses with the hint's reason."""
    write_grants(home, grant("files", "read_file", "ask"))
    (home.default_workspace / "notes.txt").write_text("Buy milk.\n")
    fake = FakeLlama(script=[READ_NOTES, {"content": "OK, I will not."}])
    async with stack(home, fake), trio.open_nursery() as nursery:
        nursery.start_soon(say, home, "read my notes")
        [entry] = await waiting_approvals(home, 1, within=20)
        argv = bxctl_argv("approvals", "--watch", "--home", str(home.root))
        async with terminal(argv) as screen:
            await screen.wait_for(f"▶ {entry['approval']}")
            await screen.send("n")
            await screen.wait_for(REASON_PROMPT)
            if typed:
                await screen.type(typed)
            await screen.send("Enter")
            after = await screen.wait_for(NONE_PENDING)
            await screen.send("q")
            assert await screen.exit_code() == 0
    assert f"refused {entry['call']}: the model is told: {reason}" in after
    told = fake.requests[1]["messages"][-1]["content"]
    assert f"denied (refused: the owner refused it). Detail: {reason}." in told
