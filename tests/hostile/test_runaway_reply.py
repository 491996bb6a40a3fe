"""Hostile: a model that never ends its reply (docs/threat-model.md).

A model that writes the same tag or phrase again and again — the built-in model did so
after almost every denial, until ``max_tokens`` — holds the owner's turn for minutes and
fills the conversation with the loop. Here the scripted model writes a loop with no end
in sight, with ``[model] max_tokens`` and ``[loop] max_step_tokens`` set far above it, so
only loopd's repetition guard can end the turn: the stream is closed at the repeat, the
model's slot is free, the reply and the history hold the text up to the repeat, and the
owner is told, on loop.sock and on the chat screen.
"""

from __future__ import annotations

from typing import Final

import trio
from tests.e2e.test_chat_terminal import chat_argv
from tests.fakes.llama_server import FakeLlama
from tests.harness.homes import write_config
from tests.harness.screen import terminal
from tests.harness.stack import say, stack

from boxmaker.home.paths import Home

BEFORE: Final = "I could not read the file.\n"
LOOP: Final = BEFORE + "<error>" * 20_000
"""35,000 tokens of the scripted model's (four characters a token)."""
KEPT: Final = BEFORE + "<error>"
NO_CAP: Final = "[model]\nmax_tokens = 100000\n[loop]\nmax_step_tokens = 100000\n"
TOKEN_S: Final = 0.002
"""Each token's time: the whole loop would take 70 s."""
CUT_WITHIN: Final = 60
"""Tokens the guard lets through: the text before the loop, and the 120 characters of
repeats that make it a loop (docs/decisions.md, "A turn always ends")."""


async def test_a_reply_that_loops_is_cut_at_its_repeat_and_the_slot_freed(home: Home) -> None:
    write_config(home, NO_CAP)
    fake = FakeLlama(script=[{"content": LOOP}, {"content": "Fine."}], token_delay=TOKEN_S)
    async with stack(home, fake):
        started = trio.current_time()
        events = await say(home, "hello")
        took = trio.current_time() - started
        with trio.fail_after(2):
            while fake.generations:  # noqa: ASYNC110
                await trio.sleep(0.01)
        again = await say(home, "and now?", session=events[0]["session"])
    # The model really was asked for more than the loop's length.
    assert fake.requests[0]["max_tokens"] == 100_000
    assert fake.usage[0]["completion_tokens"] > 30_000
    [done] = [event for event in events if event["kind"] == "model_done"]
    assert done["cut"] == "repeated"
    assert 0 < done["tokens"] <= CUT_WITHIN
    assert took < 10.0
    assert events[-1] == {"kind": "reply", "final": True, "text": KEPT}
    # The next turn's model sees the reply up to the repeat, not the loop.
    assert again[-1]["text"] == "Fine."
    assert fake.requests[1]["messages"][-2] == {"role": "assistant", "content": KEPT}


async def test_the_owner_is_told_the_reply_was_cut(home: Home) -> None:
    write_config(home, NO_CAP)
    fake = FakeLlama(script=[{"content": LOOP}], token_delay=TOKEN_S)
    async with stack(home, fake), terminal(chat_argv(home, "--say", "hello")) as screen:
        code = await screen.exit_code()
        shown = await screen.text()
    assert code == 0
    assert "  [cut: the model was repeating itself; its text ends before the repeats]" in shown
    assert fake.usage[0]["completion_tokens"] > 30_000
