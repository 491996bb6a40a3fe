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

from boxmaker.home import Home

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
