"""Hostile: the model's words on the owner's terminal and in the daemons' logs.

The model chooses tool names, arguments and its reply; the owner's refusal reason and
approval note travel with them; grants.toml's ids and keys come back in problem texts.
Shown raw, such text clears the screen, moves the cursor, sets the window title (escape
sequences, C1 controls), reorders what the owner reads (bidi controls), hides characters
(zero-width ones) or forges a line of a log. The sweep drives the real programs as the
owner would (the scripted model, then brokerd, inferproxy and loopd started by ``bxctl
up``), then reads every bxctl command's text output and every log of the home.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import orjson
import pytest
from tests.harness.cli import WAIT_S, bxctl, listed_approvals, scripted_home, start_bxctl
from tests.harness.sandbox import sandbox_workspace, use_sandbox_workspace
from tests.harness.screen import shell_pane

from boxmaker.home.paths import Home

pytestmark = pytest.mark.slow

# Window title, clear screen, bidi override and isolate, zero-width space, C1 CSI, DEL,
# line separator, then a newline that would start a forged line.
HOSTILE: Final = "\x1b]2;PWNED\x07\x1b[2J\u202e\u2066\u200b\u009b31m\x7f\u2028\ufeff\nFORGED"
# The reply is a block whose own lines are kept: no forged line to look for in it.
REPLY: Final = "done \x1b[2J\u202egnp.exe\u009b2J\nand a second line"
SCRIPT: Final = [
    {"tool_calls": [{"name": "x" + HOSTILE, "arguments": {"path": HOSTILE}}]},
    {"tool_calls": [{"name": "write_file", "arguments": {"path": "out.txt", "content": HOSTILE}}]},
    {"tool_calls": [{"name": "shell", "arguments": {"command": "echo " + HOSTILE}}]},
    {"content": REPLY},
]
GRANTS: Final = """\
[[grant]]
id = "write"
tool = "write_file"
mode = "ask"
note = "the note \\u001b[2J\\u202e of the owner"

[[grant]]
id = "sh"
tool = "shell"
mode = "ask"
"""
# A grants file whose problem text names a grant id and a key chosen in the file.
BAD_GRANTS: Final = """\
[[grant]]
id = "g\\u001b[2J\\u202e"
tool = "shell"
mode = "ask"
"k\\u009b\\u202e" = 1
"""
UNSAFE: Final = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def unsafe_characters(text: str) -> list[str]:
    """Each control, format or separator character in ``text`` but a newline."""
    return [
        f"U+{ord(char):04X}"
        for char in text
        if char != "\n" and unicodedata.category(char) in UNSAFE
    ]


def unsafe_in(where: str, text: str) -> list[str]:
    """What in ``text`` could drive the terminal or forge a line: none, or one entry."""
    found = unsafe_characters(text)
    forged = [line for line in text.split("\n") if line.startswith("FORGED")]
    if not found and not forged:
        return []
    return [f"{where}: {sorted(set(found))}, {len(forged)} forged line(s)"]


@pytest.fixture
def home() -> Iterator[Home]:
    """A home with the scripted model and the three daemons up (bxctl up)."""
    with scripted_home(SCRIPT, GRANTS, prefix="bx-tty-") as (home, _, _), sandbox_workspace() as ws:
        # The shell call must be asked about (as root, not on the home's own workspace).
        use_sandbox_workspace(home, ws)
        bxctl(home, "up")
        yield home


def test_no_outside_text_drives_the_terminal_or_forges_a_log_line(home: Home) -> None:
    shown: dict[str, str] = {}

    def run(*args: str, expect: int = 0) -> str:
        done = bxctl(home, *args, check=False)
        assert done.returncode == expect, (args, done.stdout, done.stderr)
        shown[" ".join(args)] = done.stdout + done.stderr
        return done.stdout

    chat = start_bxctl(home, "chat", "--say", "hi")
    [write] = listed_approvals(home)
    assert write["arguments"] == {"path": "out.txt", "content": HOSTILE}
    approvals = run("approvals")
    # The content is shown as the lines it writes (a new file: "+" lines).
    assert "    +\\u001b]2;PWNED\\u0007\\u001b[2J\\u202e" in approvals
    assert "    +FORGED" in approvals.splitlines()
    assert "the note \\u001b[2J\\u202e of the owner" in approvals
    run("approve", write["approval"], "--note", "fine " + HOSTILE)
    [shell] = listed_approvals(home, besides={write["approval"]})
    run("approvals")
    run("refuse", shell["approval"], "--reason", "no " + HOSTILE)
    out, err = chat.communicate(timeout=WAIT_S)
    assert chat.returncode == 0, err
    shown["chat"] = out + err
    assert f"  -> x{HOSTILE[:4]}" not in out
    assert "  -> x\\u001b]2;PWNED\\u0007" in out
    assert "done \\u001b[2J\\u202egnp.exe\\u009b2J\nand a second line" in out

    assert "call(s)" in run("sessions")
    run("status")
    shows = run("audit", "show")
    run("audit", "verify")
    run("grants", "check")

    # The owner's file, not the model, but its text comes back in problem texts.
    home.grants_toml.write_text(BAD_GRANTS)
    os.kill(int(home.pid_file("brokerd").read_text()), signal.SIGHUP)
    deadline = time.monotonic() + WAIT_S
    while (status := bxctl(home, "status", check=False)).returncode != 1:
        assert time.monotonic() < deadline, status.stdout
        time.sleep(0.05)
    shown["status, grants invalid"] = status.stdout + status.stderr
    assert "grants_problem" in status.stdout
    run("grants", "check", expect=1)

    # A tampered ledger line: verify names what it found in it.
    bxctl(home, "down", check=False)
    with home.audit_log.open("ab") as ledger:
        ledger.write(orjson.dumps({"seq": 10**6, "kind": HOSTILE, "call": HOSTILE}) + b"\n")
        ledger.write(b"not json " + HOSTILE.encode() + b"\n")
    run("audit", "verify", expect=1)
    run("audit", "show")

    logs = {path.name: path.read_text() for path in home.logs_dir.iterdir()}
    assert set(logs) >= {"brokerd.log", "inferproxy.log", "loopd.log"}
    found = [problem for where, text in shown.items() for problem in unsafe_in(where, text)]
    found += [problem for name, text in logs.items() for problem in unsafe_in(name, text)]
    assert found == [], "\n".join(found)
    # Shown, escaped, not dropped.
    assert "tool=x\\u001b]2;PWNED\\u0007\\u001b[2J\\u202e" in shows
    assert "reason=no \\u001b]2;PWNED\\u0007" in shows
    assert "tool=x\\u001b]2;PWNED\\u0007" in logs["brokerd.log"]
    assert "\\u202e" in shown["status, grants invalid"]

    if shutil.which("tmux") is not None:
        assert_audit_show_leaves_the_owners_terminal_alone(home)


def assert_audit_show_leaves_the_owners_terminal_alone(home: Home) -> None:
    """``bxctl audit show`` in a real terminal (tmux): the screen is not cleared, the
    title is not set, and the hostile text reads escaped."""
    command = (
        f"echo BEFORE-SHOW; {sys.executable} -m boxmaker.cli.app audit show "
        f"--home {home.root}; echo AFTER-SHOW; sleep 60"
    )
    with shell_pane(command, width=250, height=80) as pane:
        screen = pane.wait_for("AFTER-SHOW", WAIT_S)
        title = pane.title()
    assert "PWNED" not in title
    assert "BEFORE-SHOW" in screen  # not cleared
    assert "tool=x\\u001b]2;PWNED\\u0007\\u001b[2J\\u202e" in screen


def test_a_reader_that_stops_early_ends_bxctl_quietly(tmp_path: Path) -> None:
    """``bxctl audit show | head -1``: exit 141 as for ``cat``, and no traceback."""
    home = tmp_path / "home"
    bxctl(home, "init")
    record = {"at": "2026-01-01T00:00:00Z", "kind": "decision", "tool": "read_file"}
    with (home / "ledger" / "audit.jsonl").open("ab") as ledger:
        for seq in range(1, 20_001):
            ledger.write(orjson.dumps({"seq": seq, **record, "call": f"c-{seq:016x}"}) + b"\n")
    show = subprocess.Popen(
        [sys.executable, "-m", "boxmaker.cli.app", "audit", "show", "--home", str(home)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert show.stdout is not None
    assert show.stderr is not None
    assert b"decision" in show.stdout.readline() + show.stdout.readline()
    show.stdout.close()  # the reader has seen enough, as head does
    with show.stderr:
        err = show.stderr.read().decode()
    assert show.wait(timeout=WAIT_S) == 141, err
    assert "Traceback" not in err
    assert "BrokenPipeError" not in err
    assert err == ""
