"""``bxctl down`` while ``bxctl chat`` waits for the owner: chat says why the turn ended
(loopd's ``error stopping``) instead of exiting 1 silently. The real programs, started
by ``bxctl up`` against the scripted model."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Final

import orjson
import pytest
from tests.fakes.llama_server import as_process
from tests.harness.homes import grant, short_home

from boxmaker.home import Home

pytestmark = pytest.mark.slow

WAIT_S: Final = 60.0


def bxctl(home: Home, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "boxmaker.cli.app", *args, "--home", str(home.root)],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
    )


def test_bxctl_down_while_a_call_waits_tells_the_chat_why() -> None:
    with short_home("bx-down-") as home:
        assert bxctl(home, "init").returncode == 0
        script = home.root / "script.json"
        read = {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]}
        script.write_bytes(orjson.dumps([read, {"content": "Milk."}]))
        with as_process("--script", str(script)) as url:
            home.config_toml.write_text(f'[model]\nurl = "{url}"\n')
            home.grants_toml.write_text(grant("notes", "read_file", "ask"))
            up = bxctl(home, "up")
            assert up.returncode == 0, up.stderr
            say = ["chat", "--say", "read my notes", "--home", str(home.root)]
            chat = subprocess.Popen(
                [sys.executable, "-m", "boxmaker.cli.app", *say],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            try:
                deadline = time.monotonic() + WAIT_S
                while not orjson.loads(bxctl(home, "approvals", "--json").stdout):
                    assert time.monotonic() < deadline, "no approval appeared"
                    time.sleep(0.05)
                down = bxctl(home, "down")
                out, err = chat.communicate(timeout=WAIT_S)
            finally:
                bxctl(home, "down")
                if chat.poll() is None:
                    chat.kill()
    assert down.returncode == 0
    assert chat.returncode == 1
    assert "waiting for the owner" in out
    assert (
        "error: stopping: loopd is stopping (bxctl down, or SIGTERM): the turn was cut short, "
        "and a call waiting for the owner was withdrawn"
    ) in err
