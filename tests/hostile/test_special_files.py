"""Hostile: special files where brokerd reads its own files, and transient read errors.

A FIFO at grants.toml, at a session state file or at config.toml used to block the open
for good (no writer ever comes): the call hung, and brokerd then ignored SIGTERM, its
clean stop waiting on a worker thread that never returned. A symlink at grants.toml was
followed, wherever it led (into the workspace the model writes, say). Now each is opened
``O_NONBLOCK | O_NOFOLLOW`` and used only if it is a regular file. And a read error of
grants.toml (EMFILE when brokerd holds many connections, EIO) stayed the answer until
SIGHUP, since the file's stat never moved; now the next call reads again.
"""

from __future__ import annotations

import errno
import functools
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from tests.fakes.llama_server import FakeLlama
from tests.harness.broker import SESSION, call, running, tool_request
from tests.harness.homes import grant, write_config, write_grants
from tests.harness.process import START_S, Daemon, connect, read_frame, send, start
from tests.harness.stack import say, stack

from boxmaker.home.paths import Home
from boxmaker.home.regular_file import read_regular_file

pytestmark = pytest.mark.slow

ANSWER_S = 5.0
"""Real seconds: a call on a special file is answered at once, not after a timeout."""


def plant_fifo(path: Path) -> None:
    """Replace ``path`` by a FIFO in one rename, as an editor replaces a file."""
    temp = path.with_name(path.name + ".fifo")
    os.mkfifo(temp, 0o600)
    temp.replace(path)


def ask(home: Home, frame: dict[str, object]) -> dict[str, object]:
    with connect(home.broker_sock) as sock:
        sock.settimeout(ANSWER_S)
        send(sock, frame)
        return read_frame(sock)


def stops_on_sigterm(daemon: Daemon) -> None:
    daemon.process.send_signal(signal.SIGTERM)
    assert daemon.process.wait(timeout=ANSWER_S) == 0, daemon.stderr()


def test_a_fifo_at_grants_toml_is_denied_and_sigterm_still_stops_brokerd(
    home: Home, daemons: list[Daemon]
) -> None:
    write_grants(home, grant("notes", "read_file", "auto"))
    (home.default_workspace / "notes.txt").write_text("hi\n")
    daemon = start(daemons, home)
    plant_fifo(home.grants_toml)
    answer = ask(home, tool_request("read_file", {"path": "notes.txt"}))
    assert (answer["outcome"], answer["reason"]) == ("denied", "grants_invalid"), answer
    assert answer["detail"] == (
        f"{home.grants_toml}: not a regular file (a FIFO); see docs/runbook.md#grants"
    )
    # Twice: a file that is not regular is not cached, nor does the look hang.
    answer = ask(home, tool_request("read_file", {"path": "notes.txt"}))
    assert answer["reason"] == "grants_invalid"
    daemon.process.send_signal(signal.SIGHUP)  # a forced re-read of the FIFO
    stops_on_sigterm(daemon)


def test_a_fifo_at_a_state_file_is_state_unreadable(home: Home, daemons: list[Daemon]) -> None:
    write_grants(home, grant("notes", "read_file", "auto"))
    (home.default_workspace / "notes.txt").write_text("hi\n")
    daemon = start(daemons, home)
    plant_fifo(home.session_state(SESSION))
    answer = ask(home, tool_request("read_file", {"path": "notes.txt"}))
    assert (answer["outcome"], answer["reason"]) == ("denied", "state_unreadable"), answer
    assert f"state file of {SESSION} in {home.sessions_dir}: not a regular file (a FIFO)" in str(
        answer["detail"]
    )
    stops_on_sigterm(daemon)


def test_a_symlink_at_grants_toml_is_not_followed(home: Home, daemons: list[Daemon]) -> None:
    # The link leads into the workspace, which the model's shell writes: following it
    # would let the model write its own grants.
    planted = home.default_workspace / "grants.toml"
    planted.write_text(grant("mine", "read_file", "auto"))
    (home.default_workspace / "notes.txt").write_text("hi\n")
    home.grants_toml.unlink()
    home.grants_toml.symlink_to(planted)
    daemon = start(daemons, home)
    answer = ask(home, tool_request("read_file", {"path": "notes.txt"}))
    assert (answer["outcome"], answer["reason"]) == ("denied", "grants_invalid"), answer
    assert answer["detail"] == (
        f"{home.grants_toml}: not a regular file (a symlink, which is not followed); "
        "see docs/runbook.md#grants"
    )
    stops_on_sigterm(daemon)


@pytest.mark.parametrize("plant", ["fifo", "symlink"])
def test_a_special_config_toml_refuses_the_start_at_once(home: Home, plant: str) -> None:
    if plant == "fifo":
        plant_fifo(home.config_toml)
        what = "a FIFO"
    else:
        target = home.root / "elsewhere.toml"
        home.config_toml.replace(target)
        home.config_toml.symlink_to(target)
        what = "a symlink, which is not followed"
    done = subprocess.run(
        [sys.executable, "-m", "boxmaker.broker.serve", "serve", "--home", str(home.root)],
        capture_output=True,
        timeout=START_S,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert f"brokerd: config.toml: not a regular file ({what})\n".encode() in done.stderr
    assert b"see docs/runbook.md#config" in done.stderr


class FlakyReader:
    """grants.toml's reader (serve_broker's seam) failing while ``failing`` is set, as
    a read does when brokerd has run out of file descriptors."""

    def __init__(self) -> None:
        self.failing = False

    def __call__(self, path: Path) -> bytes:
        if self.failing:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return read_regular_file(path)


async def test_a_transient_read_error_of_grants_toml_is_not_kept(home: Home) -> None:
    write_config(home, "")
    write_grants(home, grant("notes", "read_file", "auto"))
    (home.default_workspace / "notes.txt").write_text("hi\n")
    reader = FlakyReader()
    frame = functools.partial(tool_request, "read_file", {"path": "notes.txt"})
    with trio.fail_after(30):
        async with running(home, read_grants=reader):
            # The owner edits the file; brokerd's read of the new one fails.
            reader.failing = True
            write_grants(home, grant("notes", "read_file", "auto", note="edited"))
            [answer] = await call(home, frame())
            assert (answer["outcome"], answer["reason"]) == ("denied", "grants_invalid")
            assert answer["detail"] == (
                f"{home.grants_toml}: cannot read it (Too many open files); "
                "see docs/runbook.md#grants"
            )
            reader.failing = False
            # Same file, same stat: the next call reads it again, no SIGHUP needed.
            [answer] = await call(home, frame())
            assert (answer["outcome"], answer["content"]) == ("ok", "hi\n"), answer


async def test_a_fifo_at_a_conversation_ends_the_turn_with_an_error_not_a_hang(
    home: Home,
) -> None:
    """loopd read a session's history with a plain open: a FIFO there blocked the turn
    (and its worker thread) for good. Now the turn ends at once with ``error internal``
    naming the file's kind and the runbook, and the model is never called."""
    session = "s-0123456789ab"
    home.conversations_dir.mkdir(parents=True, exist_ok=True)
    plant_fifo(home.conversation(session))
    fake = FakeLlama(script=[{"content": "never asked"}])
    async with stack(home, fake):
        with trio.fail_after(ANSWER_S):
            events = await say(home, "hello", session=session)
    assert [event["kind"] for event in events] == ["error"]
    assert events[0]["code"] == "internal"
    assert "not a regular file (a FIFO)" in events[0]["detail"]
    assert events[0]["detail"].endswith("see docs/runbook.md#state")
    assert fake.requests == []
