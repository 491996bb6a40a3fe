"""``bxctl down`` while ``bxctl chat`` waits for the owner: chat says why the turn ended
(loopd's ``error stopping``) instead of exiting 1 silently. The real programs, started
by ``bxctl up`` against the scripted model."""

from __future__ import annotations

import pytest
from tests.harness.cli import WAIT_S, bxctl, listed_approvals, scripted_home, start_bxctl
from tests.harness.homes import grant
from tests.harness.stack import READ_NOTES

pytestmark = pytest.mark.slow


def test_bxctl_down_while_a_call_waits_tells_the_chat_why() -> None:
    script = [READ_NOTES, {"content": "Milk."}]
    grants = grant("notes", "read_file", "ask")
    with scripted_home(script, grants, prefix="bx-down-") as (home, _, _):
        bxctl(home, "up")
        chat = start_bxctl(home, "chat", "--say", "read my notes")
        try:
            listed_approvals(home)
            down = bxctl(home, "down", check=False)
            out, err = chat.communicate(timeout=WAIT_S)
        finally:
            if chat.poll() is None:
                chat.kill()
    assert down.returncode == 0
    assert chat.returncode == 1
    assert "waiting for the owner" in out
    assert (
        "error: stopping: loopd is stopping (bxctl down, or SIGTERM): the turn was cut short, "
        "and a call waiting for the owner was withdrawn"
    ) in err
