"""``bxctl chat``'s prompt on a real terminal (a tmux pane), against the whole stack and
the scripted model: the line edits, the history outlives the chat, Ctrl-C ends a turn
or clears the line and leaves only when pressed twice at an empty prompt, Ctrl-D leaves,
Ctrl-L clears the screen, and the session is named at the start and the end
(cli/chat_prompt.py)."""

from __future__ import annotations

import re
import stat

import orjson
import trio
from tests.fakes.llama_server import FakeLlama
from tests.harness.screen import EXITED, Screen, bxctl_argv, terminal
from tests.harness.stack import stack

from boxmaker.cli.chat_prompt import HOW_TO_LEAVE, KEYS_HELP, PROMPT
from boxmaker.home.paths import Home

SESSION_START = re.compile(r"^session (s-[0-9a-f]{12}) \(new\)$", re.M)


def chat_argv(home: Home, *args: str) -> list[str]:
    return bxctl_argv("chat", *args, "--home", str(home.root))


def said(fake: FakeLlama, request: int) -> str:
    """What the owner's last message was in the model's ``request``-th request."""
    [*_, last] = [m for m in fake.requests[request]["messages"] if m["role"] == "user"]
    content: str = last["content"]
    return content


async def prompt_shows(screen: Screen, line: str) -> str:
    """The screen once its last line is the prompt with ``line`` on it."""
    return await screen.wait_for(lambda text: text.rstrip("\n").endswith(PROMPT + line))


async def test_arrows_edit_the_line_and_the_model_gets_the_edited_text(home: Home) -> None:
    fake = FakeLlama(script=[{"content": "Noted."}])
    async with stack(home, fake), terminal(chat_argv(home)) as screen:
        start = await prompt_shows(screen, "")
        await screen.type("buy milk today")
        await screen.send(*["Left"] * 5)
        await screen.type("and bread ")
        await screen.send("Home")
        await screen.type("please ")
        await prompt_shows(screen, "please buy milk and bread today")
        await screen.send("Enter")
        await screen.wait_for("Noted.")
        await prompt_shows(screen, "")
        await screen.send("C-d")
        code = await screen.exit_code()
        shown = await screen.text()
    assert code == 0
    assert said(fake, 0) == "please buy milk and bread today"
    assert "^[[D" not in shown
    assert KEYS_HELP in start
    [session] = SESSION_START.findall(start)
    # The turn ran in the session named at the start, and the end says how to go on.
    assert f"\nsession {session}\n" in shown
    assert f"session {session}: go on with it: bxctl chat --session {session}\n{EXITED}0]" in (
        shown
    )


async def test_up_recalls_a_line_typed_in_an_earlier_chat(home: Home) -> None:
    fake = FakeLlama(script=[{"content": "First."}, {"content": "Second."}])
    async with stack(home, fake):
        async with terminal(chat_argv(home)) as screen:
            await prompt_shows(screen, "")
            await screen.type("what is in notes.txt")
            await screen.send("Enter")
            await screen.wait_for("First.")
            await prompt_shows(screen, "")
            await screen.send("C-d")
            assert await screen.exit_code() == 0
        kept = home.chat_history.read_bytes()
        mode = stat.S_IMODE(home.chat_history.stat().st_mode)
        async with terminal(chat_argv(home)) as screen:
            await prompt_shows(screen, "")
            await screen.send("Up")
            await prompt_shows(screen, "what is in notes.txt")
            await screen.send("Enter")
            await screen.wait_for("Second.")
            await screen.send("C-d")
            assert await screen.exit_code() == 0
    assert said(fake, 1) == "what is in notes.txt"
    assert kept == orjson.dumps("what is in notes.txt") + b"\n"
    assert mode == 0o600


async def test_ctrl_c_while_the_model_writes_ends_the_turn_and_the_chat_stays(
    home: Home,
) -> None:
    fake = FakeLlama(script=[{"content": "word " * 400}, {"content": "Still here."}])
    fake.token_delay = 0.05
    async with stack(home, fake), terminal(chat_argv(home)) as screen:
        await prompt_shows(screen, "")
        await screen.type("write a lot")
        await screen.send("Enter")
        await screen.wait_for("word word word")
        assert fake.generations == 1
        await screen.send("C-c")
        ended = await prompt_shows(screen, "")
        with trio.fail_after(5):
            while fake.generations:  # noqa: ASYNC110 - the fake has no event for it
                await trio.sleep(0.01)
        await screen.type("are you there")
        await screen.send("Enter")
        await screen.wait_for("Still here.")
        await prompt_shows(screen, "")
        # Ctrl-C at an empty prompt only says how to leave; the second one leaves.
        await screen.send("C-c")
        warned = await screen.wait_for(HOW_TO_LEAVE)
        await prompt_shows(screen, "")
        running = EXITED not in await screen.text()
        await screen.send("C-c")
        code = await screen.exit_code()
    assert "bxctl: interrupted: the turn is ended" in ended
    assert said(fake, 1) == "are you there"
    assert EXITED not in warned
    assert running
    assert code == 130


async def test_ctrl_c_clears_a_typed_line_and_a_key_between_two_ctrl_c_keeps_the_chat(
    home: Home,
) -> None:
    fake = FakeLlama(script=[{"content": "Hello."}])
    async with stack(home, fake), terminal(chat_argv(home)) as screen:
        await prompt_shows(screen, "")
        await screen.type("half a thought")
        await prompt_shows(screen, "half a thought")
        await screen.send("C-c")
        cleared = await prompt_shows(screen, "")
        # Empty Enter asks again, sends nothing.
        await screen.send("Enter")
        await screen.send("C-c")
        await screen.wait_for(HOW_TO_LEAVE)
        await screen.type("x")
        await screen.send("BSpace")
        await screen.send("C-c")
        await screen.wait_for(lambda text: text.count(HOW_TO_LEAVE) == 2)
        still = EXITED not in await screen.text()
        await screen.send("C-d")
        code = await screen.exit_code()
        shown = await screen.text()
    assert "half a thought" not in cleared.splitlines()[-1]
    assert still
    assert code == 0
    assert fake.requests == []
    # Nothing was said: no conversation to go on with is offered.
    assert "go on with it" not in shown


async def test_ctrl_l_clears_the_screen_and_keeps_the_line(home: Home) -> None:
    fake = FakeLlama(script=[{"content": "A reply to clear away."}])
    async with stack(home, fake), terminal(chat_argv(home)) as screen:
        await prompt_shows(screen, "")
        await screen.type("hello")
        await screen.send("Enter")
        await screen.wait_for("A reply to clear away.")
        await prompt_shows(screen, "")
        await screen.type("next")
        await screen.send("C-l")
        with trio.fail_after(10):
            while (visible := await screen.visible()).strip() != PROMPT + "next":  # noqa: ASYNC110
                await trio.sleep(0.05)
        await screen.send("C-u", "C-d")
        code = await screen.exit_code()
    assert visible.startswith(PROMPT + "next")
    assert code == 0
    assert len(fake.requests) == 1
