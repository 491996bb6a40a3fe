"""Hostile: the owner's chat history, ``state/chat_history`` (home/chat_history.py).

bxctl may run as root, and the file holds what the owner typed. Whatever could put a
symlink at the path (anything that can write the home's state directory) would have had
bxctl write the owner's lines into the file the link names, anywhere on the system, and
show that file's lines at the prompt; a FIFO there would have hung the chat at its start;
a line with escape sequences would have reached the terminal. Now the file is read
without following a link and only when it is a regular file, written only by renaming a
fresh 0600 file over the path (a link there is replaced, never written through), and only
printable JSON text is taken from it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import orjson
import pytest
from tests.fakes.llama_server import FakeLlama
from tests.harness.screen import bxctl_argv, terminal
from tests.harness.stack import stack

from boxmaker.cli.chat_prompt import PROMPT
from boxmaker.home.chat_history import MAX_ENTRIES, add_chat_line, read_chat_history
from boxmaker.home.paths import Home
from boxmaker.home.regular_file import NotRegularFile

VICTIM_LINE = "the victim's own line"


def victim(tmp_path: Path) -> Path:
    """A file outside the home, in the history's format, that a link will point at."""
    path = tmp_path / "victim"
    path.write_bytes(orjson.dumps(VICTIM_LINE) + b"\n")
    return path


def test_a_link_at_the_history_is_neither_read_nor_written_through(
    home: Home, tmp_path: Path
) -> None:
    target = victim(tmp_path)
    before = target.read_bytes()
    home.chat_history.symlink_to(target)
    with pytest.raises(NotRegularFile, match="symlink"):
        read_chat_history(home.chat_history)
    kept = add_chat_line(home.chat_history, "my private line")
    assert target.read_bytes() == before
    assert kept == ["my private line"]
    # The link itself was replaced by the owner's own file.
    assert not home.chat_history.is_symlink()
    assert stat.S_IMODE(home.chat_history.stat().st_mode) == 0o600
    assert read_chat_history(home.chat_history) == ["my private line"]


def test_a_fifo_at_the_history_neither_hangs_nor_is_kept(home: Home) -> None:
    os.mkfifo(home.chat_history)
    with pytest.raises(NotRegularFile, match="FIFO"):
        read_chat_history(home.chat_history)
    assert add_chat_line(home.chat_history, "hello") == ["hello"]
    assert stat.S_ISREG(home.chat_history.lstat().st_mode)


def test_control_characters_in_the_file_never_reach_the_prompt(home: Home) -> None:
    planted = ["\x1b]0;owned\x07title", "fine line", "bell\x07", 42, "line\nbreak"]
    home.chat_history.write_bytes(b"".join(orjson.dumps(p) + b"\n" for p in planted) + b"{x\n")
    assert read_chat_history(home.chat_history) == ["fine line"]
    assert add_chat_line(home.chat_history, "\x1b[2Jclear") == ["fine line"]


def test_the_history_is_bounded_and_private_whatever_was_there(home: Home) -> None:
    home.chat_history.write_bytes(b"".join(orjson.dumps(f"l{n}") + b"\n" for n in range(900)))
    home.chat_history.chmod(0o644)
    kept = add_chat_line(home.chat_history, "newest")
    assert len(kept) == MAX_ENTRIES
    assert kept[-1] == "newest"
    assert kept[0] == f"l{900 - MAX_ENTRIES + 1}"
    assert stat.S_IMODE(home.chat_history.stat().st_mode) == 0o600


async def test_the_chat_with_a_planted_link_recalls_nothing_of_its_target(
    home: Home, tmp_path: Path
) -> None:
    target = victim(tmp_path)
    before = target.read_bytes()
    home.chat_history.symlink_to(target)
    fake = FakeLlama(script=[{"content": "Hi."}])
    argv = bxctl_argv("chat", "--home", str(home.root))
    async with stack(home, fake), terminal(argv) as screen:
        started = await screen.wait_for(PROMPT)
        await screen.send("Up")
        await screen.type("typed")
        await screen.wait_for(PROMPT + "typed")
        await screen.send("Enter")
        await screen.wait_for(lambda text: "Hi." in text and text.rstrip("\n").endswith(PROMPT))
        await screen.send("C-d")
        assert await screen.exit_code() == 0
        shown = await screen.text()
    assert f"chat history not read: {home.chat_history}: not a regular file (a symlink" in started
    assert VICTIM_LINE not in shown
    assert target.read_bytes() == before
    assert not home.chat_history.is_symlink()
    assert read_chat_history(home.chat_history) == ["typed"]
    assert fake.requests[0]["messages"][-1]["content"] == "typed"
