"""``bxctl chat`` on a real terminal (a tmux pane), against the whole stack and the
scripted model: what the owner sees, and what their keys do."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio
from tests.fakes.llama_server import FakeLlama
from tests.harness.broker import admin, records, waiting_approvals
from tests.harness.homes import grant, write_grants
from tests.harness.screen import Screen, bxctl_argv, terminal
from tests.harness.scripted_loopd import scripted_loopd
from tests.harness.stack import ADD_BREAD, ADD_BREAD_SHOWN, NOTES_AFTER_BREAD, READ_NOTES, stack

from boxmaker.cli.chat import APPROVE_PROMPT, REASON_PROMPT
from boxmaker.cli.chat_prompt import HOW_TO_LEAVE
from boxmaker.cli.terminal import REFUSED_WITHOUT_REASON
from boxmaker.home.paths import Home


def chat_argv(home: Home, *args: str) -> list[str]:
    return bxctl_argv("chat", *args, "--home", str(home.root))


@asynccontextmanager
async def chat_asked_to_read_notes(
    home: Home, reply: str, *chat_args: str, **grant_extra: str
) -> AsyncIterator[tuple[Screen, FakeLlama]]:
    """The stack, where reading notes.txt needs the owner's yes, and ``bxctl chat
    CHAT_ARGS`` in a terminal; the model asks to read the notes, then replies ``reply``."""
    write_grants(home, grant("notes", "read_file", "ask", **grant_extra))
    (home.default_workspace / "notes.txt").write_text("Buy milk.\n")
    fake = FakeLlama(script=[READ_NOTES, {"content": reply}])
    async with stack(home, fake), terminal(chat_argv(home, *chat_args)) as screen:
        yield screen, fake


async def test_a_waiting_call_is_approved_with_y_in_the_chat(home: Home) -> None:
    async with chat_asked_to_read_notes(
        home, "Your notes say: buy milk.", "--say", "read my notes", note="the notes"
    ) as (screen, _):
        assert not await screen.rang()
        asked = await screen.wait_for(APPROVE_PROMPT)
        rang = await screen.rang()
        await screen.send("y")
        code = await screen.exit_code()
        shown = await screen.text()
    assert rang
    assert code == 0
    assert "grant      notes (mode ask): the notes" in asked
    assert re.search(r"^  approved c-[0-9a-f]{16}: read_file ran \(ok\)$", shown, re.M)
    assert "Your notes say: buy milk." in shown


async def test_a_waiting_write_shows_its_change_in_the_chat_before_the_owner_decides(
    home: Home,
) -> None:
    write_grants(home, grant("notes", "write_file", "ask", note="my notes"))
    (home.default_workspace / "notes.txt").write_text("Buy milk.\n")
    fake = FakeLlama(script=[ADD_BREAD, {"content": "Added bread."}])
    async with stack(home, fake), terminal(chat_argv(home, "--say", "add bread")) as screen:
        asked = await screen.wait_for(APPROVE_PROMPT)
        await screen.send("y")
        code = await screen.exit_code()
        shown = await screen.text()
    assert code == 0
    lines = [line.rstrip() for line in asked.splitlines()]
    start = lines.index(ADD_BREAD_SHOWN[0])
    assert lines[start : start + 7] == ADD_BREAD_SHOWN
    assert re.search(r"^  approved c-[0-9a-f]{16}: write_file ran \(ok\)$", shown, re.M)
    assert (home.default_workspace / "notes.txt").read_text() == NOTES_AFTER_BREAD


async def test_n_refuses_with_the_reason_typed_and_the_model_is_told(home: Home) -> None:
    async with chat_asked_to_read_notes(home, "Understood.", "--say", "read my notes") as (
        screen,
        fake,
    ):
        await screen.wait_for(APPROVE_PROMPT)
        await screen.send("n")
        await screen.wait_for(REASON_PROMPT)
        await screen.type("not my notes today")
        await screen.wait_for(REASON_PROMPT + "not my notes today")
        await screen.send("Enter")
        code = await screen.exit_code()
        shown = await screen.text()
    assert code == 0
    told = r"^  refused c-[0-9a-f]{16}: the model is told: not my notes today$"
    assert re.search(told, shown, re.M)
    assert "  <- denied: refused" in shown
    assert "     not my notes today" in shown
    assert "not my notes today" in fake.requests[1]["messages"][-1]["content"]


async def test_ctrl_c_while_a_call_waits_ends_the_turn_and_withdraws_the_call(home: Home) -> None:
    async with chat_asked_to_read_notes(home, "Milk.", "--say", "read my notes") as (screen, fake):
        await screen.wait_for(APPROVE_PROMPT)
        [entry] = await waiting_approvals(home, within=20)
        await screen.send("C-c")
        code = await screen.exit_code()
        shown = await screen.text()
        with trio.fail_after(5):
            while (await admin(home, {"kind": "approvals"}))["entries"]:  # noqa: ASYNC110
                await trio.sleep(0.02)
        late = await admin(home, {"kind": "approve", "approval": entry["approval"]})
    assert code == 130
    assert "bxctl: interrupted: the turn is ended" in shown
    # brokerd saw its requester gone and recorded the call withdrawn; a late approve
    # hears that, not only that the approval is gone.
    assert late == {
        "kind": "error",
        "code": "no_such_approval",
        "detail": f"approval {entry['approval']} was withdrawn: its requester left before "
        "anyone answered; nothing ran",
    }
    assert len(fake.requests) == 1
    [ended] = [r for r in records(home) if r["kind"] == "approval"]
    assert (ended["call"], ended["outcome"], ended["reason"]) == (
        entry["call"],
        "withdrawn",
        "requester_gone",
    )


async def test_a_call_approved_from_another_terminal_takes_the_prompt_away(home: Home) -> None:
    async with chat_asked_to_read_notes(home, "Milk.", "--say", "read my notes") as (screen, _):
        await screen.wait_for(APPROVE_PROMPT)
        [entry] = await waiting_approvals(home, within=20)
        approved = await admin(home, {"kind": "approve", "approval": entry["approval"]})
        code = await screen.exit_code()
        shown = await screen.text()
    assert approved["outcome"] == "ask"
    assert code == 0
    assert APPROVE_PROMPT not in shown
    assert "  <- ok" in shown
    assert re.search(r"\n  <- ok \(\d+\.\d s\)\n     \| Buy milk\.\nMilk\.\n  \[step 2: ", shown)


async def test_the_calls_output_detail_and_times_are_on_screen(home: Home) -> None:
    write_grants(home, grant("notes", "read_file", "auto", paths=["notes.txt"]))
    (home.default_workspace / "notes.txt").write_text("".join(f"line {n}\n" for n in range(1, 13)))
    read_secret = {"tool_calls": [{"name": "read_file", "arguments": {"path": "secret.txt"}}]}
    fake = FakeLlama(script=[READ_NOTES, read_secret, {"content": "Done."}])
    async with stack(home, fake), terminal(chat_argv(home, "--say", "read")) as screen:
        code = await screen.exit_code()
        shown = await screen.text()
    assert code == 0
    lines = re.sub(r"\b\d+\.\d s\b", "N s", shown).split("\n")
    start = next(n for n, line in enumerate(lines) if line.startswith("  [step 1: "))
    assert lines[start : start + 12] == [
        "  [step 1: N s, 5 tokens]",
        '  -> read_file {"path":"notes.txt"}',
        "  <- ok (N s)",
        *[f"     | line {n}" for n in range(1, 9)],
        "     | … 12 lines in all",
    ]
    denied = lines.index("  <- denied: no_grant (N s)")
    assert lines[denied - 2 : denied] == [
        "  [step 2: N s, 6 tokens]",
        '  -> read_file {"path":"secret.txt"}',
    ]
    assert lines[denied + 1].startswith("     ")
    assert "secret.txt" in lines[denied + 1]
    assert lines[denied + 2 : denied + 4] == ["Done.", "  [step 3: N s, 2 tokens]"]


async def test_progress_shows_on_one_line_and_the_reply_streams_as_it_comes(home: Home) -> None:
    first_words, rest = trio.Event(), trio.Event()
    events: list[dict[str, Any] | trio.Event] = [
        {"kind": "session", "session": "s-0123456789ab"},
        {"kind": "model", "step": 1},
        {"kind": "progress", "step": 1, "elapsed_ms": 500, "tokens": 0},
        {"kind": "progress", "step": 1, "elapsed_ms": 3100, "tokens": 2},
        first_words,
        {"kind": "reply_delta", "text": "Once upon "},
        rest,
        {"kind": "reply_delta", "text": "a time.\nThe end."},
        {"kind": "model_done", "step": 1, "elapsed_ms": 4200, "tokens": 9},
        {"kind": "reply", "final": True, "text": "Once upon a time.\nThe end."},
    ]
    async with (
        scripted_loopd(home, events),
        terminal(chat_argv(home, "--say", "a story")) as screen,
    ):
        progress = await screen.wait_for("  .. step 1: 3 s, 2 tokens")
        first_words.set()
        streaming = await screen.wait_for("Once upon")
        rest.set()
        code = await screen.exit_code()
        shown = await screen.text()
    assert "step 1: 0 s" not in progress  # rewritten in place, not a line each
    assert "  .. step 1" not in streaming  # the text replaces the progress line
    assert "a time" not in streaming
    assert code == 0
    assert shown.count("Once upon a time.") == 1
    assert (
        "session s-0123456789ab\nOnce upon a time.\nThe end.\n  [step 1: 4.2 s, 9 tokens]\n"
        in shown
    )


async def test_in_the_prompt_loop_ctrl_c_ends_the_turn_and_asks_again(home: Home) -> None:
    async with chat_asked_to_read_notes(home, "Hello again.") as (screen, _):
        await screen.wait_for("you> ")
        await screen.type("read my notes")
        await screen.send("Enter")
        await screen.wait_for(APPROVE_PROMPT)
        [_] = await waiting_approvals(home, within=20)
        await screen.send("C-c")
        again = await screen.wait_for(lambda shown: shown.rstrip().endswith("you>"))
        await screen.type("hi")
        await screen.send("Enter")
        await screen.wait_for("Hello again.")
        await screen.send("C-c")
        await screen.wait_for(HOW_TO_LEAVE)
        await screen.send("C-c")
        code = await screen.exit_code()
    assert "bxctl: interrupted: the turn is ended" in again
    assert code == 130


async def test_enter_alone_at_the_reason_refuses_with_the_hints_reason(home: Home) -> None:
    async with chat_asked_to_read_notes(home, "Understood.", "--say", "read my notes") as (
        screen,
        fake,
    ):
        await screen.wait_for(APPROVE_PROMPT)
        await screen.send("n")
        asked = await screen.wait_for(REASON_PROMPT)
        await screen.send("Enter")
        code = await screen.exit_code()
        shown = await screen.text()
    assert f"Enter alone refuses: {REFUSED_WITHOUT_REASON};" in asked
    assert code == 0
    told = rf"^  refused c-[0-9a-f]{{16}}: the model is told: {REFUSED_WITHOUT_REASON}$"
    assert re.search(told, shown, re.M)
    assert REFUSED_WITHOUT_REASON in fake.requests[1]["messages"][-1]["content"]
