"""``bxctl sessions``: the conversations kept in the home, the last used first, with
their first words and what brokerd knows of each (cli/sessions.py)."""

from __future__ import annotations

import os
from typing import Any

import orjson
import pytest
from tests.harness.broker import SESSION, Brokerd, call, tool_request
from tests.harness.cli import bxctl_in_process
from tests.harness.homes import grant, write_grants

from boxmaker.cli.common import Exit
from boxmaker.home.paths import Home

OLDER, NEWER = "s-00000000000c", "s-00000000000d"


def keep_conversation(home: Home, session: str, said: str, mtime: float) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": said},
        {"role": "assistant", "content": "OK."},
    ]
    path = home.conversation(session)
    path.write_bytes(b"".join(orjson.dumps(m) + b"\n" for m in messages))
    os.utime(path, (mtime, mtime))


def conversations(home: Home) -> None:
    keep_conversation(home, OLDER, "Read notes.txt please", 1_700_000_000)
    keep_conversation(home, NEWER, "What is\nin todo.txt " + "and more " * 20, 1_800_000_000)
    # Not a conversation: skipped.
    (home.conversations_dir / "notes.txt").write_text("x")
    (home.conversations_dir / "s-00000000000e.jsonl").symlink_to(home.conversation(OLDER))


async def test_sessions_lists_conversations_newest_first_with_brokerds_view(
    home: Home, brokerd: Brokerd, capsys: pytest.CaptureFixture[str]
) -> None:
    conversations(home)
    write_grants(home, grant("r", "read_file", "auto"))
    (home.default_workspace / "n.txt").write_text("x")
    await brokerd.start()
    await call(home, tool_request("read_file", {"path": "n.txt"}, session=OLDER))
    await call(home, tool_request("read_file", {"path": "n.txt"}))
    code = await bxctl_in_process(home, "sessions")
    text = capsys.readouterr().out
    code_json = await bxctl_in_process(home, "sessions", "--json")
    listed = orjson.loads(capsys.readouterr().out)
    assert code == code_json == Exit.DONE
    lines = text.splitlines()
    assert [line.split()[0] for line in lines if not line.startswith(" ")] == [
        NEWER,
        OLDER,
        SESSION,
    ]
    assert lines[0].startswith(f"{NEWER}  last used 2027-01-15 ")
    assert lines[1] == "    What is in todo.txt and more and more and more and more and…"
    assert lines[2].startswith(f"{OLDER}  last used 2023-11-14 ")
    assert lines[2].endswith("; taint internal, trusted, 1 call(s)")
    assert lines[3] == "    Read notes.txt please"
    assert lines[4] == f"{SESSION}  no conversation kept; taint internal, trusted, 1 call(s)"
    assert listed == [
        {
            "session": NEWER,
            "last_used": "2027-01-15T08:00:00.000Z",
            "first_words": "What is in todo.txt and more and more and more and more and…",
            "taint": None,
            "untrusted": None,
            "calls": None,
        },
        {
            "session": OLDER,
            "last_used": "2023-11-14T22:13:20.000Z",
            "first_words": "Read notes.txt please",
            "taint": "internal",
            "untrusted": False,
            "calls": 1,
        },
        {
            "session": SESSION,
            "last_used": None,
            "first_words": None,
            "taint": "internal",
            "untrusted": False,
            "calls": 1,
        },
    ]


async def test_with_brokerd_down_the_conversations_are_still_listed(
    home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    conversations(home)
    code = await bxctl_in_process(home, "sessions")
    out, err = capsys.readouterr()
    assert code == Exit.UNREACHABLE
    assert [line.split()[0] for line in out.splitlines() if not line.startswith(" ")] == [
        NEWER,
        OLDER,
    ]
    assert "(what brokerd knows of each is not shown)" in err


async def test_no_sessions(home: Home, capsys: pytest.CaptureFixture[str]) -> None:
    home.conversations_dir.mkdir(parents=True, exist_ok=True)
    assert await bxctl_in_process(home, "sessions") == Exit.UNREACHABLE
    assert capsys.readouterr().out == "no sessions\n"
