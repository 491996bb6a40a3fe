"""Hostile: what the model, a file or a tool's output can put on the owner's chat screen.

``bxctl chat`` now shows the head of every tool's output, the detail of every denial,
the reply as it streams, and asks the owner to decide right there in cbreak mode. The
attacker writes a file the model reads, chooses the model's reply and the text it
streams: escape sequences (clear the screen, home the cursor, set the window title),
C1 controls, bidi overrides, a carriage return that would let a line overwrite the
start of itself ("approved" over "denied"), and lines long enough to push the prompt off
the screen. Read through a real terminal (a tmux pane): nothing of it may act on the
terminal, forge the start of a line, or keep the approval prompt from working.
"""

from __future__ import annotations

import re
from typing import Any, Final

import trio
from tests.e2e.test_chat_terminal import chat_argv
from tests.fakes.llama_server import FakeLlama
from tests.harness.homes import grant, write_grants
from tests.harness.screen import terminal
from tests.harness.scripted_loopd import scripted_loopd
from tests.harness.stack import READ_NOTES, stack

from boxmaker.cli.chat import APPROVE_PROMPT
from boxmaker.home.paths import Home

# Window title, clear screen, cursor home, C1 CSI, bidi override, then a carriage
# return and a forged start of the line.
HOSTILE: Final = "\x1b]2;PWNED\x07\x1b[2J\x1b[H\u009b31m\u202egnp.exe\rFORGED"
LONG: Final = "L" * 5000
READ_TODO: Final = {"tool_calls": [{"name": "read_file", "arguments": {"path": "todo.txt"}}]}


def no_forged_line(shown: str) -> bool:
    return not any(line.lstrip().startswith("FORGED") for line in shown.split("\n"))


async def test_file_content_and_reply_cannot_drive_the_terminal_or_break_the_prompt(
    home: Home,
) -> None:
    write_grants(
        home,
        grant("notes", "read_file", "auto", paths=["notes.txt"])
        + grant("todo", "read_file", "ask", paths=["todo.txt"]),
    )
    (home.default_workspace / "notes.txt").write_text(f"{HOSTILE}\n{LONG}\nlast\n")
    (home.default_workspace / "todo.txt").write_text("Call mum.\n")
    reply = f"done {HOSTILE}\n{LONG}"
    fake = FakeLlama(script=[READ_NOTES, READ_TODO, {"content": reply}])
    async with stack(home, fake), terminal(chat_argv(home, "--say", "read")) as screen:
        before = await screen.title()
        asked = await screen.wait_for(APPROVE_PROMPT)
        await screen.send("y")
        code = await screen.exit_code()
        shown = await screen.text()
        after = await screen.title()
    assert code == 0
    assert before == after
    assert "PWNED" not in after
    # The screen was never cleared: the turn's first line is still there.
    assert shown.lstrip().startswith("session s-")
    escaped = "\\u001b]2;PWNED\\u0007\\u001b[2J\\u001b[H\\u009b31m\\u202egnp.exe\\u000dFORGED"
    assert f"     | {escaped}" in asked
    assert f"     | {'L' * 199}…" in asked
    assert "     | last\n" in asked
    assert f"done {escaped}" in shown
    assert no_forged_line(shown)
    assert re.search(r"^  approved c-[0-9a-f]{16}: read_file ran \(ok\)$", shown, re.M)


async def test_streamed_text_and_a_tool_result_cannot_drive_the_terminal(home: Home) -> None:
    events: list[dict[str, Any] | trio.Event] = [
        {"kind": "session", "session": "s-0123456789ab"},
        {"kind": "model", "step": 1},
        {"kind": "tool_call", "call": "c-0123456789abcdef", "tool": "x", "arguments": {}},
        {
            "kind": "tool_result",
            "call": "c-0123456789abcdef",
            "outcome": "failed",
            "reason": "tool_error",
            "detail": f"exit status 1: {HOSTILE}",
            "exit_code": 1,
            "output": {"lines": [HOSTILE], "total_lines": 1},
            "stderr": {"lines": [HOSTILE], "total_lines": 1},
            "elapsed_ms": 5,
        },
        {"kind": "model", "step": 2},
        {"kind": "reply_delta", "text": "ok "},
        {"kind": "reply_delta", "text": HOSTILE},
        {"kind": "reply", "final": True, "text": "ok " + HOSTILE},
    ]
    async with scripted_loopd(home, events), terminal(chat_argv(home, "--say", "go")) as screen:
        before = await screen.title()
        code = await screen.exit_code()
        shown = await screen.text()
        after = await screen.title()
    assert code == 0
    assert before == after
    assert shown.lstrip().startswith("session s-0123456789ab")
    assert no_forged_line(shown)
    escaped = "\\u001b]2;PWNED\\u0007\\u001b[2J\\u001b[H\\u009b31m\\u202egnp.exe\\u000dFORGED"
    assert f"     exit status 1: {escaped}" in shown
    assert f"     | {escaped}" in shown
    assert f"     ! {escaped}" in shown
    assert f"ok {escaped}" in shown
    assert shown.count(escaped) == 4
