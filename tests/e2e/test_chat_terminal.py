"""``bxctl chat`` on a real terminal (a tmux pane), against the whole stack and the
scripted model: what the owner sees, and what their keys do."""

from __future__ import annotations

import re

import trio
from tests.fakes.llama_server import FakeLlama
from tests.harness.broker import admin, records
from tests.harness.homes import grant, write_grants
from tests.harness.screen import bxctl_argv, terminal
from tests.harness.stack import READ_NOTES, stack

from boxmaker.cli.chat import APPROVE_PROMPT, REASON_PROMPT
from boxmaker.home import Home


def chat_argv(home: Home, *args: str) -> list[str]:
    return bxctl_argv("chat", *args, "--home", str(home.root))


async def test_a_waiting_call_is_approved_with_y_in_the_chat(home: Home) -> None:
    write_grants(home, grant("notes", "read_file", "ask", note="the notes"))
    (home.default_workspace / "notes.txt").write_text("Buy milk.\n")
    fake = FakeLlama(script=[READ_NOTES, {"content": "Your notes say: buy milk."}])
    async with stack(home, fake), terminal(chat_argv(home, "--say", "read my notes")) as screen:
        asked = await screen.wait_for(APPROVE_PROMPT)
        await screen.send("y")
        code = await screen.exit_code()
        shown = await screen.text()
    print(shown)
    assert code == 0
    assert "grant      notes (mode ask): the notes" in asked
    assert "approved: " in shown
    assert "Your notes say: buy milk." in shown


async def wait_for_approval(home: Home) -> dict[str, object]:
    with trio.fail_after(20):
        while not (listed := await admin(home, {"kind": "approvals"}))["entries"]:  # noqa: ASYNC110
            await trio.sleep(0.02)
    [entry] = listed["entries"]
    return entry  # type: ignore[no-any-return]


async def test_n_refuses_with_the_reason_typed_and_the_model_is_told(home: Home) -> None:
    write_grants(home, grant("notes", "read_file", "ask"))
    (home.default_workspace / "notes.txt").write_text("Buy milk.\n")
    fake = FakeLlama(script=[READ_NOTES, {"content": "Understood."}])
    async with stack(home, fake), terminal(chat_argv(home, "--say", "read my notes")) as screen:
        await screen.wait_for(APPROVE_PROMPT)
        await screen.send("n")
        await screen.wait_for(REASON_PROMPT)
        await screen.type("not my notes today")
        await screen.wait_for(REASON_PROMPT + "not my notes today")
        await screen.send("Enter")
        code = await screen.exit_code()
        shown = await screen.text()
    assert code == 0
    assert "  refused: c-" in shown
    assert "  <- denied: refused" in shown
    assert "     not my notes today" in shown
    assert "not my notes today" in fake.requests[1]["messages"][-1]["content"]


async def test_ctrl_c_while_a_call_waits_ends_the_turn_and_withdraws_the_call(home: Home) -> None:
    write_grants(home, grant("notes", "read_file", "ask"))
    (home.default_workspace / "notes.txt").write_text("Buy milk.\n")
    fake = FakeLlama(script=[READ_NOTES, {"content": "Milk."}])
    async with stack(home, fake), terminal(chat_argv(home, "--say", "read my notes")) as screen:
        await screen.wait_for(APPROVE_PROMPT)
        entry = await wait_for_approval(home)
        await screen.send("C-c")
        code = await screen.exit_code()
        shown = await screen.text()
        with trio.fail_after(5):
            while (await admin(home, {"kind": "approvals"}))["entries"]:  # noqa: ASYNC110
                await trio.sleep(0.02)
        late = await admin(home, {"kind": "approve", "approval": entry["approval"]})
    assert code == 130
    assert "bxctl: interrupted: the turn is ended" in shown
    # brokerd saw its requester gone and recorded the call withdrawn: no approval is left.
    assert late == {
        "kind": "error",
        "code": "no_such_approval",
        "detail": f"no pending approval {entry['approval']}",
    }
    assert len(fake.requests) == 1
    [ended] = [r for r in records(home) if r["kind"] == "approval"]
    assert (ended["call"], ended["outcome"], ended["reason"]) == (
        entry["call"],
        "withdrawn",
        "requester_gone",
    )


async def test_a_call_approved_from_another_terminal_takes_the_prompt_away(home: Home) -> None:
    write_grants(home, grant("notes", "read_file", "ask"))
    (home.default_workspace / "notes.txt").write_text("Buy milk.\n")
    fake = FakeLlama(script=[READ_NOTES, {"content": "Milk."}])
    async with stack(home, fake), terminal(chat_argv(home, "--say", "read my notes")) as screen:
        await screen.wait_for(APPROVE_PROMPT)
        entry = await wait_for_approval(home)
        approved = await admin(home, {"kind": "approve", "approval": entry["approval"]})
        code = await screen.exit_code()
        shown = await screen.text()
    assert approved["outcome"] == "ask"
    assert code == 0
    assert APPROVE_PROMPT not in shown
    assert "  <- ok" in shown
    assert re.search(r"\n  <- ok \(\d+\.\d s\)\n     \| Buy milk\.\nMilk\.\n  \[step 2: ", shown)
