"""``a`` (approve always) at the chat's prompt and in ``bxctl approvals --watch``, on a
real terminal (a tmux pane) against the whole stack: what the owner is told, the grant
written, and the next identical call running without a prompt."""

from __future__ import annotations

import re

from tests.e2e.test_chat_terminal import chat_argv
from tests.fakes.llama_server import FakeLlama
from tests.harness.broker import records
from tests.harness.homes import grant, write_grants
from tests.harness.screen import bxctl_argv, terminal
from tests.harness.stack import READ_NOTES, stack

from boxmaker.cli.chat import APPROVE_PROMPT
from boxmaker.cli.watch import KEYS_HELP
from boxmaker.home import Home

WRITTEN = (
    r"^ *approved c-[0-9a-f]{16}: read_file ran \(ok\); grant (always-a-[0-9a-f]{8}) written: "
    r"the same call runs without asking from now on \(an untrusted session is still asked\)$"
)


async def test_a_at_the_chats_prompt_writes_the_grant_and_the_next_call_runs(home: Home) -> None:
    write_grants(home, grant("notes", "read_file", "ask", note="the notes"))
    (home.default_workspace / "notes.txt").write_text("Buy milk.\n")
    script = [READ_NOTES, {"content": "Milk."}, READ_NOTES, {"content": "Still milk."}]
    fake = FakeLlama(script=script)
    async with stack(home, fake):
        async with terminal(chat_argv(home, "--say", "read my notes")) as screen:
            asked = await screen.wait_for(APPROVE_PROMPT)
            await screen.send("a")
            assert await screen.exit_code() == 0
            shown = await screen.text()
        async with terminal(chat_argv(home, "--say", "read them again")) as again:
            assert await again.exit_code() == 0
            second = await again.text()
    assert "[a]lways (exact, no expiry)" in asked
    found = re.search(WRITTEN, shown, re.M)
    assert found is not None, shown
    written = found.group(1)
    assert f'id = "{written}"' in home.grants_toml.read_text(encoding="utf-8")
    assert APPROVE_PROMPT not in second
    assert "Still milk." in second
    decisions = [(r["verdict"], r["grant"]) for r in records(home) if r["kind"] == "decision"]
    assert decisions == [("ask", "notes"), ("run", written)]


async def test_a_in_the_approvals_view_approves_always(home: Home) -> None:
    write_grants(home, grant("notes", "read_file", "ask"))
    (home.default_workspace / "notes.txt").write_text("Buy milk.\n")
    fake = FakeLlama(script=[READ_NOTES, {"content": "Milk."}])
    watch = bxctl_argv("approvals", "--watch", "--home", str(home.root))
    async with stack(home, fake), terminal(chat_argv(home, "--say", "read my notes")) as chat:
        await chat.wait_for(APPROVE_PROMPT)
        async with terminal(watch) as view:
            await view.wait_for(lambda text: "read_file" in text and "a always" in text)
            await view.send("a")
            await view.wait_for(lambda text: "written: the same call" in text)
            await view.send("q")
            assert await view.exit_code() == 0
            left = await view.text()
        assert await chat.exit_code() == 0
    assert KEYS_HELP.startswith("↑/↓ or k/j choose · y approve · a always (exact, no expiry)")
    # What the owner did stays in the scrollback once the view is left.
    assert re.search(WRITTEN, left, re.M) is not None, left
    assert 'id = "always-a-' in home.grants_toml.read_text(encoding="utf-8")
