"""``a`` (approve always) at the chat's prompt and in ``bxctl approvals --watch``, on a
real terminal (a tmux pane) against the whole stack: the grant shown before it is
written, the confirmation word, what the owner is told, the grant written — exactly the
one shown —, and the next identical call running without a prompt; a wrong confirmation
or Escape writes nothing and asks again."""

from __future__ import annotations

import re

import pytest
from tests.e2e.test_chat_terminal import chat_argv
from tests.fakes.llama_server import FakeLlama
from tests.harness.broker import records, waiting_approvals
from tests.harness.homes import grant, write_grants
from tests.harness.screen import bxctl_argv, terminal
from tests.harness.stack import READ_NOTES, stack

from boxmaker.cli.always import CONFIRM_PROMPT, CONFIRM_WORD, NOT_CONFIRMED
from boxmaker.cli.chat import APPROVE_PROMPT, REASON_PROMPT
from boxmaker.cli.watch import CHOSEN, KEYS_HELP
from boxmaker.home.paths import Home

WRITTEN = (
    r"^ *approved c-[0-9a-f]{16}: read_file ran \(ok\); grant (always-a-[0-9a-f]{8}) written: "
    r"the same call runs without asking from now on \(an untrusted session is still asked\)$"
)


def confirming(text: str) -> bool:
    """The confirmation's question is up, nothing typed after it."""
    return text.rstrip().endswith(CONFIRM_PROMPT.rstrip())


def asking(text: str) -> bool:
    """The approval's question is up again, nothing typed after it."""
    return text.rstrip().endswith(APPROVE_PROMPT.rstrip())


def shown_grant(screen: str) -> list[str]:
    """The grant the confirmation shows: its TOML lines, the indent taken off."""
    lines = screen.split("\n")
    start = next(n for n, line in enumerate(lines) if line == "    [[grant]]")
    end = lines.index("    (and a note: who approved it, when, for which approval and call)")
    return [line.removeprefix("    ") for line in lines[start:end]]


def written_grant(home: Home, gid: str) -> list[str]:
    """The table grants.toml holds for ``gid``, without its note."""
    text = home.grants_toml.read_text(encoding="utf-8")
    table = "[[grant]]" + text.split("[[grant]]")[-1]
    assert f'id = "{gid}"' in table, text
    return [line for line in table.strip().split("\n") if not line.startswith("note = ")]


async def test_a_at_the_chats_prompt_writes_the_grant_and_the_next_call_runs(home: Home) -> None:
    write_grants(home, grant("notes", "read_file", "ask", note="the notes"))
    (home.default_workspace / "notes.txt").write_text("Buy milk.\n")
    script = [READ_NOTES, {"content": "Milk."}, READ_NOTES, {"content": "Still milk."}]
    fake = FakeLlama(script=script)
    async with stack(home, fake):
        async with terminal(chat_argv(home, "--say", "read my notes")) as screen:
            asked = await screen.wait_for(APPROVE_PROMPT)
            await screen.send("a")
            confirm = await screen.wait_for(confirming)
            await screen.type(CONFIRM_WORD)
            await screen.send("Enter")
            assert await screen.exit_code() == 0
            shown = await screen.text()
        async with terminal(chat_argv(home, "--say", "read them again")) as again:
            assert await again.exit_code() == 0
            second = await again.text()
    assert "[a]lways (exact, no expiry)" in asked
    found = re.search(WRITTEN, shown, re.M)
    assert found is not None, shown
    written = found.group(1)
    # The confirmation named the grant, key by key, and that grant was written.
    assert "  always: this grant is added to grants.toml (no expiry):" in confirm
    assert shown_grant(confirm) == [
        "[[grant]]",
        f'id = "{written}"',
        'tool = "read_file"',
        'mode = "auto"',
        "wins_over_ask = true",
        'paths = ["notes.txt"]',
        'max_taint = "secret"',
        'if_untrusted = "ask"',
    ]
    assert shown_grant(confirm) == written_grant(home, written)
    assert "  from now on it runs, without asking: read_file of exactly the path: notes.txt" in (
        confirm
    )
    assert "  (an untrusted session is still asked)" in confirm
    assert APPROVE_PROMPT not in second
    assert "Still milk." in second
    decisions = [(r["verdict"], r["grant"]) for r in records(home) if r["kind"] == "decision"]
    assert decisions == [("ask", "notes"), ("run", written)]


@pytest.mark.usefixtures("shell_workspace")
async def test_a_wrong_confirmation_writes_nothing_and_asks_again(home: Home) -> None:
    write_grants(home, grant("sh", "shell", "ask"))
    grants = home.grants_toml.read_bytes()
    command = 'cat *.txt "[x]"'
    call = {"tool_calls": [{"name": "shell", "arguments": {"command": command}}]}
    fake = FakeLlama(script=[call, {"content": "I will not."}])
    async with stack(home, fake), terminal(chat_argv(home, "--say", "cat them")) as screen:
        await screen.wait_for(APPROVE_PROMPT)
        await screen.send("a")
        confirm = await screen.wait_for(confirming)
        await screen.type("yes")
        await screen.send("Enter")
        wrong = await screen.wait_for(asking)
        await screen.send("a")
        # The first confirmation's line stays above, with the answer typed.
        await screen.wait_for(lambda text: confirming(text) and text.count(CONFIRM_PROMPT) == 2)
        await screen.send("Escape")
        escaped = await screen.wait_for(
            lambda text: text.count(NOT_CONFIRMED) == 2 and asking(text)
        )
        [entry] = await waiting_approvals(home, within=20)
        waiting = [r for r in records(home) if r["kind"] == "approval"]
        await screen.send("n")
        await screen.wait_for(REASON_PROMPT)
        await screen.type("no")
        await screen.send("Enter")
        assert await screen.exit_code() == 0
    # What the grant would match: the command line exactly, glob syntax escaped.
    assert shown_grant(confirm)[:6] == [
        "[[grant]]",
        f'id = "always-{entry["approval"]}"',
        'tool = "shell"',
        'mode = "auto"',
        "wins_over_ask = true",
        'commands = ["cat [*].txt \\"[[]x]\\""]',
    ]
    runs = f"  from now on it runs, without asking: shell with exactly the command line: {command}"
    assert runs in confirm
    assert f"{CONFIRM_PROMPT}yes\n  {NOT_CONFIRMED}\n" in wrong
    # Escape takes the confirmation's line away and says so.
    assert f"is still asked)\n  {NOT_CONFIRMED}\n{APPROVE_PROMPT}" in escaped, escaped
    assert escaped.count(CONFIRM_PROMPT) == 1
    assert waiting == []
    assert [(r["outcome"], r["by"]) for r in records(home) if r["kind"] == "approval"] == [
        ("refused", "owner")
    ]
    assert home.grants_toml.read_bytes() == grants


async def test_a_in_the_approvals_view_approves_always(home: Home) -> None:
    write_grants(home, grant("notes", "read_file", "ask"))
    (home.default_workspace / "notes.txt").write_text("Buy milk.\n")
    fake = FakeLlama(script=[READ_NOTES, {"content": "Milk."}])
    watch = bxctl_argv("approvals", "--watch", "--home", str(home.root))
    async with stack(home, fake), terminal(chat_argv(home, "--say", "read my notes")) as chat:
        await chat.wait_for(APPROVE_PROMPT)
        [entry] = await waiting_approvals(home, within=20)
        async with terminal(watch) as view:
            await view.wait_for(f"{CHOSEN}{entry['approval']}  read_file")
            await view.send("a")
            confirm = await view.wait_for(confirming)
            await view.type(CONFIRM_WORD)
            await view.send("Enter")
            await view.wait_for(lambda text: "written: the same call" in text)
            await view.send("q")
            assert await view.exit_code() == 0
            left = await view.text()
        assert await chat.exit_code() == 0
    assert KEYS_HELP.startswith("↑/↓ or k/j choose · y approve · a always (exact, no expiry)")
    # What the owner did stays in the scrollback once the view is left.
    found = re.search(WRITTEN, left, re.M)
    assert found is not None, left
    assert shown_grant(confirm) == written_grant(home, found.group(1))


async def test_a_call_no_grant_can_name_is_said_so_and_asked_again(home: Home) -> None:
    write_grants(home, grant("ls", "list_dir", "ask"))
    grants = home.grants_toml.read_bytes()
    call = {"tool_calls": [{"name": "list_dir", "arguments": {"path": "."}}]}
    fake = FakeLlama(script=[call, {"content": "Fine."}])
    async with stack(home, fake), terminal(chat_argv(home, "--say", "list")) as screen:
        await screen.wait_for(APPROVE_PROMPT)
        await screen.send("a")
        told = await screen.wait_for(
            lambda text: "no grant can be written" in text and asking(text)
        )
        await screen.send("n")
        await screen.wait_for(REASON_PROMPT)
        await screen.type("no")
        await screen.send("Enter")
        assert await screen.exit_code() == 0
    # grant_scope's own reason, and no confirmation asked for.
    assert (
        "  no grant can be written for this call: a glob cannot name the workspace root "
        "alone; approve it once\n" + APPROVE_PROMPT
    ) in told
    assert CONFIRM_PROMPT not in told
    assert [(r["outcome"], r["by"]) for r in records(home) if r["kind"] == "approval"] == [
        ("refused", "owner")
    ]
    assert home.grants_toml.read_bytes() == grants
