"""What the owner sees, in a real terminal (tmux), of a write_file that waits: the
change as a diff against the file as it is, then what approving it did. The real
programs as processes (bxctl up) against the scripted llama-server."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator

import orjson
import pytest
from tests.fakes.llama_server import as_process
from tests.harness.homes import short_home

from boxmaker.home import Home

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux"),
]

WAIT_S = 60.0
WRITE = {
    "tool_calls": [
        {
            "name": "write_file",
            "arguments": {"path": "notes.txt", "content": "Buy milk.\nBuy bread.\n"},
        }
    ]
}
GRANTS = '[[grant]]\nid = "notes"\ntool = "write_file"\nmode = "ask"\nnote = "my notes"\n'


def bxctl(home: Home, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "boxmaker.cli.app", *args, "--home", str(home.root)],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
    )


@pytest.fixture
def home() -> Iterator[Home]:
    with short_home("bx-scr-") as home:
        assert bxctl(home, "init").returncode == 0
        script_file = home.root / "script.json"
        script_file.write_bytes(orjson.dumps([WRITE, {"content": "Added bread."}]))
        with as_process("--script", str(script_file)) as url:
            home.config_toml.write_text(f'[model]\nurl = "{url}"\n')
            home.grants_toml.write_text(GRANTS)
            (home.default_workspace / "notes.txt").write_text("Buy milk.\n")
            assert bxctl(home, "up").returncode == 0
            try:
                yield home
            finally:
                bxctl(home, "down")


def waiting(home: Home) -> dict[str, object]:
    deadline = time.monotonic() + WAIT_S
    while not (entries := orjson.loads(bxctl(home, "approvals", "--json").stdout)):
        assert time.monotonic() < deadline, "no approval appeared"
        time.sleep(0.05)
    [entry] = entries
    return entry  # type: ignore[no-any-return]


def test_the_owner_sees_the_diff_then_what_approving_did(home: Home) -> None:
    chat = subprocess.Popen(
        [
            *(sys.executable, "-m", "boxmaker.cli.app"),
            *("chat", "--say", "add bread", "--home", str(home.root)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    entry = waiting(home)
    approval, call = entry["approval"], entry["call"]
    server = f"bx-scr-{os.getpid()}"
    tmux = ["tmux", "-L", server, "-f", "/dev/null"]
    bx = f"{sys.executable} -m boxmaker.cli.app"
    command = (
        f"{bx} approvals --home {home.root}; echo; {bx} approve {approval} --home {home.root}; "
        "echo END-OF-SCREEN; sleep 60"
    )
    subprocess.run(
        [*tmux, "new-session", "-d", "-x", "200", "-y", "60", "sh", "-c", command], check=True
    )
    try:
        deadline = time.monotonic() + WAIT_S
        while "END-OF-SCREEN" not in (screen := pane(tmux)):
            assert time.monotonic() < deadline, screen
            time.sleep(0.1)
    finally:
        subprocess.run([*tmux, "kill-server"], check=False)
    lines = [line.rstrip() for line in screen.splitlines()]
    start = lines.index(next(line for line in lines if line.startswith(str(approval))))
    assert lines[start + 1 : start + 9] == [
        '  arguments  {"path":"notes.txt"}',
        "  change     replaces 10 bytes with 21 bytes",
        "    --- notes.txt (now)",
        "    +++ notes.txt (written)",
        "    @@ -1 +1,2 @@",
        "     Buy milk.",
        "    +Buy bread.",
        "  grant      notes (mode ask): my notes",
    ]
    assert f"approved {call}: write_file ran (ok)" in lines
    out, err = chat.communicate(timeout=WAIT_S)
    assert chat.returncode == 0, err
    assert re.search(r"\nAdded bread\.\n  \[step 2: \d+\.\d s, 3 tokens\]$", out.rstrip())
    assert (home.default_workspace / "notes.txt").read_text() == "Buy milk.\nBuy bread.\n"


def pane(tmux: list[str]) -> str:
    return subprocess.run(
        [*tmux, "capture-pane", "-p", "-J"], capture_output=True, text=True, check=True
    ).stdout
