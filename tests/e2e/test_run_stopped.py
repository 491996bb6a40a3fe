"""A long shell call stops when its requester goes: Ctrl-C in ``bxctl chat`` on a real
terminal, or loopd killed. The real programs (``bxctl up`` against the scripted model),
real bwrap, real time: the sandboxed command is gone from the host within a second, and
the ledger closes the call with a ``failed`` ``requester_gone`` result."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

import orjson
import pytest
from tests.harness.cli import WAIT_S, bxctl, pid_of, scripted_home, start_bxctl
from tests.harness.homes import grant
from tests.harness.sandbox import processes_with, sandbox_workspace
from tests.harness.screen import EXITED, bxctl_argv, shell_pane

from boxmaker.cli.chat_prompt import PROMPT
from boxmaker.home.paths import Home

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap"),
]

MARKER: Final = "31.4159"
LONG_SHELL: Final = {
    "tool_calls": [{"name": "shell", "arguments": {"command": f"exec sleep {MARKER}"}}]
}
STOPPED_WITHIN: Final = 1.0


@contextmanager
def long_shell_home() -> Iterator[Home]:
    """Daemons up on a home whose model asks for a long shell command that an auto grant
    allows, in a workspace the sandbox can use."""
    script = [LONG_SHELL, {"content": "It stopped."}]
    with (
        sandbox_workspace() as workspace,
        scripted_home(script, grant("sh", "shell", "auto"), prefix="bx-stop-") as (home, _, _),
    ):
        config = home.config_toml.read_text()
        home.config_toml.write_text(f"workspace = {str(workspace)!r}\n{config}")
        bxctl(home, "up")
        yield home


def wait_until(condition: Any, what: str, within: float = WAIT_S) -> float:
    """Poll ``condition`` (real time) until it holds: the moment it did."""
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.01)
    return time.monotonic()


def the_stopped_call(home: Home) -> dict[str, Any]:
    """The one shell call's result record, once written; the ledger must verify."""

    def result() -> list[dict[str, Any]]:
        lines = home.audit_log.read_bytes().splitlines()
        return [r for r in map(orjson.loads, lines) if r["kind"] == "result"]

    wait_until(result, "the result record")
    assert bxctl(home, "audit", "verify").returncode == 0
    [record] = result()
    return record


def assert_stopped(record: dict[str, Any]) -> None:
    assert (record["status"], record["reason"], record["output_bytes"], record["stopped"]) == (
        "failed",
        "requester_gone",
        0,
        True,
    )


def test_ctrl_c_in_the_chat_stops_a_running_shell_within_a_second() -> None:
    with long_shell_home() as home:
        chat = shlex.join(bxctl_argv("chat", "--say", "wait", "--home", str(home.root)))
        with shell_pane(
            f'trap : INT; {chat}; echo "{EXITED}$?]"; sleep 600', width=120, height=40
        ) as pane:
            wait_until(lambda: processes_with(MARKER), "the sandboxed command running")
            pressed = time.monotonic()
            pane.send("C-c")
            gone = wait_until(lambda: not processes_with(MARKER), "the command gone", within=10)
            shown = pane.wait_for(EXITED)
        record = the_stopped_call(home)
    assert gone - pressed < STOPPED_WITHIN
    assert f"{EXITED}130]" in shown
    assert "bxctl: interrupted: the turn is ended" in shown
    assert_stopped(record)


def test_ctrl_c_at_the_chats_prompt_loop_stops_a_running_shell_and_the_chat_stays() -> None:
    with long_shell_home() as home:
        chat = shlex.join(bxctl_argv("chat", "--home", str(home.root)))
        with shell_pane(
            f'trap : INT; {chat}; echo "{EXITED}$?]"; sleep 600', width=120, height=40
        ) as pane:
            pane.wait_for(PROMPT)
            pane.send("-l", "wait for it")
            pane.send("Enter")
            wait_until(lambda: processes_with(MARKER), "the sandboxed command running")
            pane.send("C-c")
            wait_until(lambda: not processes_with(MARKER), "the command gone", within=10)
            shown = pane.wait_for("bxctl: interrupted: the turn is ended")
            wait_until(lambda: pane.visible().rstrip("\n").endswith(PROMPT), "the prompt back")
            still = EXITED not in pane.visible()
            pane.send("C-d")
            left = pane.wait_for(EXITED)
        record = the_stopped_call(home)
    assert still
    assert "  -> shell" in shown
    assert f"{EXITED}130]" in left  # the turn Ctrl-C ended was the chat's last
    assert_stopped(record)


def test_a_killed_loopd_stops_a_running_shell_within_a_second() -> None:
    with long_shell_home() as home:
        chat = start_bxctl(home, "chat", "--say", "wait")
        try:
            wait_until(lambda: processes_with(MARKER), "the sandboxed command running")
            killed = time.monotonic()
            os.kill(pid_of(home, "loopd"), signal.SIGKILL)
            gone = wait_until(lambda: not processes_with(MARKER), "the command gone", within=10)
            chat.communicate(timeout=WAIT_S)
        finally:
            if chat.poll() is None:
                chat.kill()
        record = the_stopped_call(home)
    assert gone - killed < STOPPED_WITHIN
    assert chat.returncode != 0
    assert_stopped(record)
