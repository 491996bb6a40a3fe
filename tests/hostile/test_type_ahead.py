"""Hostile: keys the owner typed before a question was on the screen, answering it.

The owner types while the model writes — the next request, or what the model's own
words ask for ("type a and press Enter to go on") — and an approval prompt appears under
those keys: a buffered ``a`` approved the call *always*, writing a lasting grant the
owner never saw. A second ``y`` pressed out of habit approved the next approval in
``bxctl approvals --watch``, text typed after ``n`` became the refusal's reason, and an
``always`` typed ahead would confirm a grant before it was read. Each is replayed in a
real terminal (a tmux pane) against the whole stack; each key is shown to have reached
the terminal (echoed on the screen, or sent while the program was stopped before it
could draw its question), and nothing may be approved, written or refused by it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Final

import trio
from tests.e2e.test_chat_terminal import chat_argv
from tests.fakes.llama_server import FakeLlama
from tests.harness.broker import admin, records, waiting_approvals
from tests.harness.homes import grant, write_grants
from tests.harness.screen import Screen, bxctl_argv, terminal
from tests.harness.stack import READ_NOTES, say, stack

from boxmaker.cli.always import CONFIRM_PROMPT
from boxmaker.cli.chat import APPROVE_PROMPT, REASON_PROMPT
from boxmaker.cli.terminal import ANSWER_DELAY_S
from boxmaker.cli.watch import CHOSEN, NONE_PENDING, SETTLING
from boxmaker.cli.watch import REASON_PROMPT as WATCH_REASON_PROMPT
from boxmaker.home.paths import Home

ASKS: Final = "To go on, type a and press Enter."
ASKS_AND_READS: Final = {"content": ASKS + " ", **READ_NOTES}
READ_TODO: Final = {"tool_calls": [{"name": "read_file", "arguments": {"path": "todo.txt"}}]}
BLOCK_SHOWN: Final = "  approve:   bxctl approve a-"
"""A line of the approval block: what is asked is on the screen, its question not yet."""


def asking(text: str, question: str = APPROVE_PROMPT) -> bool:
    """The screen's last line is ``question``, with nothing typed after it."""
    return text.rstrip().endswith(question.rstrip())


def approvals(home: Home) -> list[tuple[str, str, str | None]]:
    """The ledger's approval records: (outcome, by, grant written)."""
    return [
        (r["outcome"], r["by"], r.get("grant_written"))
        for r in records(home)
        if r["kind"] == "approval"
    ]


async def pending(home: Home) -> list[str]:
    """The approvals waiting now."""
    return [entry["approval"] for entry in (await admin(home, {"kind": "approvals"}))["entries"]]


def notes_home(home: Home) -> bytes:
    """Reading notes.txt or todo.txt needs the owner's yes; grants.toml's bytes."""
    write_grants(home, grant("files", "read_file", "ask"))
    (home.default_workspace / "notes.txt").write_text("Buy milk.\n")
    (home.default_workspace / "todo.txt").write_text("Call mum.\n")
    return home.grants_toml.read_bytes()


async def refuse(screen: Screen, prompt: str) -> None:
    """The owner's own answer, at the question: n and a reason. It ends the call
    otherwise than any key typed ahead would have, so the ledger tells the two apart."""
    await screen.send("n")
    await screen.wait_for(lambda text: asking(text, prompt))
    await screen.type("not now")
    await screen.send("Enter")


@asynccontextmanager
async def stopped(pid: int) -> AsyncIterator[None]:
    """The pane's program stopped (SIGSTOP) for the block, continued after it."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


async def test_keys_typed_while_the_model_writes_never_answer_its_call(home: Home) -> None:
    grants = notes_home(home)
    hold = trio.Event()
    fake = FakeLlama(script=[ASKS_AND_READS, {"content": "Milk."}], hold_calls=hold)
    async with stack(home, fake), terminal(chat_argv(home, "--say", "read my notes")) as screen:
        await screen.wait_for(ASKS)
        # The model's words are on the screen, its call not written yet: the owner
        # does as told, and types on.
        await screen.type("a")
        await screen.send("Enter")
        await screen.type("always")
        await screen.send("Enter")
        await screen.type("y")
        typed = await screen.wait_for("\nalways\ny")
        hold.set()
        [entry] = await waiting_approvals(home, within=20)
        asked = await screen.wait_for(lambda text: asking(text) or "approved c-" in text)
        # The keys reached the terminal (it echoed them) before the call was asked.
        assert f"{ASKS} a\nalways\ny" in typed
        assert APPROVE_PROMPT not in typed
        # None of them answered it: the question is up, the call waits, nothing written.
        assert asking(asked), asked
        assert await pending(home) == [entry["approval"]]
        assert approvals(home) == []
        assert home.grants_toml.read_bytes() == grants
        await refuse(screen, REASON_PROMPT)
        code = await screen.exit_code()
        shown = await screen.text()
    assert code == 0
    # Only the owner's answer at the question ended the call: no approval, no grant.
    assert approvals(home) == [("refused", "owner", None)]
    assert home.grants_toml.read_bytes() == grants
    assert f"refused {entry['call']}: the model is told: not now" in shown


async def test_a_key_in_the_moment_after_the_call_appears_is_dropped(home: Home) -> None:
    grants = notes_home(home)
    fake = FakeLlama(script=[READ_NOTES, {"content": "Milk."}])
    async with stack(home, fake), terminal(chat_argv(home, "--say", "read my notes")) as screen:
        chat = await screen.program()
        await screen.wait_for(BLOCK_SHOWN, poll=0.01)
        async with stopped(chat):
            # Stopped as soon as the block was seen: with the keys sent now, they are in
            # the terminal before anything more of the prompt can be drawn.
            at_stop = await screen.text()
            await screen.type("a")
            await screen.type("y")
            await screen.text()  # tmux has written the keys to the terminal by now
        [entry] = await waiting_approvals(home, within=20)
        asked = await screen.wait_for(lambda text: asking(text) or "approved c-" in text)
        late = f"; bxctl was stopped only after its question was up: not within {ANSWER_DELAY_S} s"
        assert asking(asked), asked + (late if APPROVE_PROMPT in at_stop else "")
        assert await pending(home) == [entry["approval"]]
        assert approvals(home) == []
        await refuse(screen, REASON_PROMPT)
        code = await screen.exit_code()
    # The keys were sent before the question was drawn.
    assert APPROVE_PROMPT not in at_stop
    assert code == 0
    assert approvals(home) == [("refused", "owner", None)]
    assert home.grants_toml.read_bytes() == grants


async def test_text_typed_after_n_never_becomes_the_reason(home: Home) -> None:
    notes_home(home)
    fake = FakeLlama(script=[READ_NOTES, {"content": "Understood."}])
    async with stack(home, fake), terminal(chat_argv(home, "--say", "read my notes")) as screen:
        await screen.wait_for(asking)
        [entry] = await waiting_approvals(home, within=20)
        # n and a reason in one go, faster than the reason's prompt can be read.
        await screen.send("n", "private", "Enter")
        reason_asked = await screen.wait_for(
            lambda text: asking(text, REASON_PROMPT) or "refused c-" in text
        )
        assert asking(reason_asked, REASON_PROMPT), reason_asked
        assert await pending(home) == [entry["approval"]]
        assert approvals(home) == []
        await screen.type("mine")
        await screen.send("Enter")
        code = await screen.exit_code()
        shown = await screen.text()
    assert code == 0
    assert approvals(home) == [("refused", "owner", None)]
    assert f"refused {entry['call']}: the model is told: mine" in shown
    told = fake.requests[1]["messages"][-1]["content"]
    assert "mine" in told
    assert "private" not in told


async def test_always_typed_ahead_never_confirms_the_grant(home: Home) -> None:
    grants = notes_home(home)
    fake = FakeLlama(script=[READ_NOTES, {"content": "Milk."}])
    async with stack(home, fake), terminal(chat_argv(home, "--say", "read my notes")) as screen:
        await screen.wait_for(asking)
        [entry] = await waiting_approvals(home, within=20)
        # a, and the confirmation word typed on before the grant could be read.
        await screen.send("a", "always", "Enter")
        confirm = await screen.wait_for(
            lambda text: asking(text, CONFIRM_PROMPT) or "approved c-" in text
        )
        assert asking(confirm, CONFIRM_PROMPT), confirm
        assert await pending(home) == [entry["approval"]]
        assert approvals(home) == []
        assert home.grants_toml.read_bytes() == grants
        await screen.type("always")
        await screen.send("Enter")
        code = await screen.exit_code()
    assert code == 0
    written = f"always-{entry['approval']}"
    assert approvals(home) == [("allowed", "owner", written)]
    assert f'id = "{written}"' in home.grants_toml.read_text(encoding="utf-8")


@asynccontextmanager
async def two_waiting(home: Home) -> AsyncIterator[tuple[dict[str, Any], dict[str, Any]]]:
    """notes.txt and todo.txt each asked for in a turn of its own: their entries."""
    script = [READ_NOTES, READ_TODO, {"content": "Milk."}, {"content": "Call mum."}]
    async with stack(home, FakeLlama(script=script)), trio.open_nursery() as nursery:
        nursery.start_soon(say, home, "read my notes")
        await waiting_approvals(home, 1, within=20)
        nursery.start_soon(say, home, "read my todo list")
        first, second = await waiting_approvals(home, 2, within=20)
        yield first, second
        nursery.cancel_scope.cancel()


async def test_a_second_y_in_the_watch_never_answers_the_next_approval(home: Home) -> None:
    notes_home(home)
    watch = bxctl_argv("approvals", "--watch", "--home", str(home.root))
    async with two_waiting(home) as (first, second), terminal(watch) as screen:
        await screen.wait_for(f"{CHOSEN}{first['approval']}")
        # y pressed twice out of habit: the second lands as the next approval takes
        # the first one's place under the keys.
        await screen.send("y", "y")
        after = await screen.wait_for(
            lambda text: f"{CHOSEN}{second['approval']}" in text or NONE_PENDING in text
        )
        assert f"approved {first['call']}: read_file ran (ok)" in after
        assert await pending(home) == [second["approval"]]
        assert approvals(home) == [("ask", "owner", None)]
        await refuse(screen, WATCH_REASON_PROMPT)
        await screen.wait_for(f"refused {second['call']}: the model is told: not now")
        await screen.send("q")
        assert await screen.exit_code() == 0
    assert approvals(home) == [("ask", "owner", None), ("refused", "owner", None)]


async def test_a_key_in_the_moment_an_approval_comes_under_the_keys_is_dropped(
    home: Home,
) -> None:
    notes_home(home)
    watch = bxctl_argv("approvals", "--watch", "--home", str(home.root))
    async with two_waiting(home) as (first, second), terminal(watch) as screen:
        view = await screen.program()
        await screen.wait_for(f"{CHOSEN}{first['approval']}")
        await screen.send("y")
        # The first is answered; the second comes under the keys.
        await screen.wait_for(f"{SETTLING}{second['approval']}", poll=0.01)
        async with stopped(view):
            at_stop = await screen.text()
            await screen.type("y")
            await screen.text()  # tmux has written the key to the terminal by now
        after = await screen.wait_for(
            lambda text: f"{CHOSEN}{second['approval']}" in text or NONE_PENDING in text
        )
        late = f"; the view was stopped only once it took keys: not within {ANSWER_DELAY_S} s"
        assert await pending(home) == [second["approval"]], after + (
            late if f"{CHOSEN}{second['approval']}" in at_stop else ""
        )
        assert approvals(home) == [("ask", "owner", None)]
        await refuse(screen, WATCH_REASON_PROMPT)
        await screen.wait_for(f"refused {second['call']}: the model is told: not now")
        await screen.send("q")
        assert await screen.exit_code() == 0
    # The key was sent while the second approval was marked as settling.
    assert f"{SETTLING}{second['approval']}" in at_stop
    assert approvals(home) == [("ask", "owner", None), ("refused", "owner", None)]
