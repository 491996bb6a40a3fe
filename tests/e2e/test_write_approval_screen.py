"""What the owner sees, in a real terminal (tmux), of a write_file that waits: the
change as a diff against the file as it is, then what approving it did. The real
programs as processes (bxctl up) against the scripted llama-server."""

from __future__ import annotations

import re
import shutil
import sys
from collections.abc import Iterator

import pytest
from tests.harness.cli import WAIT_S, bxctl, listed_approvals, scripted_home, start_bxctl
from tests.harness.screen import shell_pane
from tests.harness.stack import ADD_BREAD, ADD_BREAD_SHOWN, NOTES_AFTER_BREAD

from boxmaker.home.paths import Home

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux"),
]

GRANTS = '[[grant]]\nid = "notes"\ntool = "write_file"\nmode = "ask"\nnote = "my notes"\n'


@pytest.fixture
def home() -> Iterator[Home]:
    script = [ADD_BREAD, {"content": "Added bread."}]
    with scripted_home(script, GRANTS, prefix="bx-scr-") as (home, _, _):
        (home.default_workspace / "notes.txt").write_text("Buy milk.\n")
        bxctl(home, "up")
        yield home


def test_the_owner_sees_the_diff_then_what_approving_did(home: Home) -> None:
    chat = start_bxctl(home, "chat", "--say", "add bread")
    [entry] = listed_approvals(home)
    approval, call = entry["approval"], entry["call"]
    bx = f"{sys.executable} -m boxmaker.cli.app"
    command = (
        f"{bx} approvals --home {home.root}; echo; {bx} approve {approval} --home {home.root}; "
        "echo END-OF-SCREEN; sleep 60"
    )
    with shell_pane(command, width=200, height=60) as pane:
        screen = pane.wait_for("END-OF-SCREEN", WAIT_S)
    lines = [line.rstrip() for line in screen.splitlines()]
    start = lines.index(next(line for line in lines if line.startswith(str(approval))))
    assert lines[start + 1 : start + 9] == ['  arguments  {"path":"notes.txt"}', *ADD_BREAD_SHOWN]
    assert f"approved {call}: write_file ran (ok)" in lines
    out, err = chat.communicate(timeout=WAIT_S)
    assert chat.returncode == 0, err
    assert re.search(r"\nAdded bread\.\n  \[step 2: \d+\.\d s, 3 tokens\]$", out.rstrip())
    assert (home.default_workspace / "notes.txt").read_text() == NOTES_AFTER_BREAD


HIDDEN_CONTENT = "Buy milk.\r\nBuy\u00a0bread. \nPay \u202eall"
"""The model's write: a \\r before the first newline, a no-break space, a trailing space,
a right-to-left override and no final newline."""


@pytest.fixture
def hidden_home() -> Iterator[Home]:
    write = {"name": "write_file", "arguments": {"path": "notes.txt", "content": HIDDEN_CONTENT}}
    script = [{"tool_calls": [write]}, {"content": "Not written."}]
    with scripted_home(script, GRANTS, prefix="bx-scr-") as (home, _, _):
        (home.default_workspace / "notes.txt").write_text("Buy milk.\n")
        bxctl(home, "up")
        yield home


def test_bytes_a_terminal_would_not_draw_are_on_the_screen(hidden_home: Home) -> None:
    """Shown raw, the \\r would move the cursor and the override reorder the line; the
    spaces would look like any other. In tmux each reads as its escape."""
    home = hidden_home
    chat = start_bxctl(home, "chat", "--say", "add bread")
    [entry] = listed_approvals(home)
    bx = f"{sys.executable} -m boxmaker.cli.app"
    command = f"{bx} approvals --home {home.root}; echo END-OF-SCREEN; sleep 60"
    with shell_pane(command, width=200, height=60) as pane:
        screen = pane.wait_for("END-OF-SCREEN", WAIT_S)
    lines = [line.rstrip() for line in screen.splitlines()]
    start = lines.index("  change     replaces 10 bytes with 34 bytes")
    assert lines[start + 1 : start + 9] == [
        "    --- notes.txt (now)",
        "    +++ notes.txt (written)",
        "    @@ -1 +1,3 @@",
        "    -Buy milk.",
        "    +Buy milk.\\u000d",
        "    +Buy\\u00a0bread.\\u0020",
        "    +Pay \\u202eall",
        "    \\ No newline at end of file",
    ]
    bxctl(home, "refuse", entry["approval"], "--reason", "hidden bytes")
    out, err = chat.communicate(timeout=WAIT_S)
    assert chat.returncode == 0, err
    assert "Not written." in out
    assert (home.default_workspace / "notes.txt").read_text() == "Buy milk.\n"
