"""write_file approvals show the change (docs/protocol.md, ``approvals``' ``preview``),
and a write into a directory that does not exist is denied before anyone is asked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import trio.testing
from tests.fakes.llama_server import FakeLlama
from tests.harness.broker import Brokerd, Client, records_of, tool_request
from tests.harness.cli import bxctl_in_process
from tests.harness.homes import grant, write_grants
from tests.harness.stack import say, stack

from boxmaker.broker.preview import MAX_SHOWN_LINES, preview_write
from boxmaker.core.labels import LabelRules
from boxmaker.home import Home
from boxmaker.wire import ChangePreview

pytestmark = pytest.mark.usefixtures("inline_threads")

Clock = trio.testing.MockClock
RULES = LabelRules()


@pytest.fixture
async def writing_home(home: Home, brokerd: Brokerd) -> Home:
    """brokerd running on a home where notes.txt holds three lines and every
    write_file asks the owner."""
    (home.default_workspace / "notes.txt").write_text("one\ntwo\nthree\n")
    write_grants(home, grant("write-any", "write_file", "ask"))
    await brokerd.start()
    return home


async def pending_write(home: Home, path: str, content: str) -> tuple[Client, dict[str, Any]]:
    client = await Client.open(home.broker_sock)
    frame = await client.ask(tool_request("write_file", {"path": path, "content": content}))
    return client, frame


def test_a_change_is_a_unified_diff_against_the_file_as_it_is(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("one\ntwo\nthree\n")
    preview = preview_write(tmp_path, RULES, "notes.txt", "one\n2\nthree\nfour\n")
    assert preview == ChangePreview(
        summary="replaces 14 bytes with 17 bytes",
        lines=[
            "--- notes.txt (now)",
            "+++ notes.txt (written)",
            "@@ -1,3 +1,4 @@",
            " one",
            "-two",
            "+2",
            " three",
            "+four",
        ],
    )


def test_a_new_file_shows_its_lines_and_size(tmp_path: Path) -> None:
    preview = preview_write(tmp_path, RULES, "new.txt", "a\nb\n")
    assert preview == ChangePreview(summary="creates 4 bytes", lines=["+a", "+b"])
    same = (tmp_path / "same.txt", "x\n")
    same[0].write_text(same[1])
    assert preview_write(tmp_path, RULES, "same.txt", "x\n").summary == (
        "no change: same.txt already holds these 2 bytes"
    )


def test_what_is_shown_is_bounded(tmp_path: Path) -> None:
    content = "".join(f"line {n}\n" for n in range(1000))
    preview = preview_write(tmp_path, RULES, "long.txt", content)
    assert len(preview.lines) == MAX_SHOWN_LINES
    assert preview.lines_left_out == 1000 - MAX_SHOWN_LINES
    wide = preview_write(tmp_path, RULES, "wide.txt", "x" * 5000)
    assert wide.lines == ["+" + "x" * 399 + "… (5001 characters)"]


def test_binary_content_is_described_not_dumped(tmp_path: Path) -> None:
    (tmp_path / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\xff")
    assert preview_write(tmp_path, RULES, "image.png", "text\n").summary == (
        "replaces 11 bytes with 5 bytes; binary content (not shown)"
    )
    assert preview_write(tmp_path, RULES, "nul.bin", "a\0b").summary == (
        "creates 3 bytes; binary content (not shown)"
    )


def test_a_secret_file_is_not_shown_only_the_new_content(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("TOKEN=hunter2\n")
    preview = preview_write(tmp_path, RULES, ".env", "TOKEN=new\n")
    assert preview == ChangePreview(
        summary="replaces 14 bytes with 10 bytes; "
        "the file is secret ([labels]), only the new content",
        lines=["+TOKEN=new"],
    )


async def test_bxctl_approvals_shows_the_diff_and_json_carries_it(
    writing_home: Home, autojump_clock: Clock, capsys: pytest.CaptureFixture[str]
) -> None:
    home = writing_home
    client, frame = await pending_write(home, "notes.txt", "one\n2\nthree\n")
    assert frame["kind"] == "pending", frame
    assert await bxctl_in_process(home, "approvals") == 0
    block = capsys.readouterr().out.splitlines()
    assert block[1:10] == [
        '  arguments  {"path":"notes.txt"}',
        "  change     replaces 14 bytes with 12 bytes",
        "    --- notes.txt (now)",
        "    +++ notes.txt (written)",
        "    @@ -1,3 +1,3 @@",
        "     one",
        "    -two",
        "    +2",
        "     three",
    ]
    # Fresh: the file as it is when the list is asked for, not when the model asked.
    (home.default_workspace / "notes.txt").write_text("one\n2\nthree\n")
    assert await bxctl_in_process(home, "approvals", "--json") == 0
    [entry] = orjson.loads(capsys.readouterr().out)
    assert entry["preview"] == {
        "summary": "no change: notes.txt already holds these 12 bytes",
        "lines": [],
        "lines_left_out": 0,
    }
    await client.aclose()


async def test_a_write_into_a_missing_directory_is_denied_before_anyone_is_asked(
    writing_home: Home, autojump_clock: Clock, capsys: pytest.CaptureFixture[str]
) -> None:
    home = writing_home
    client, answer = await pending_write(home, "drafts/2026/plan.md", "# plan\n")
    # Not pending: the model hears why at once.
    assert answer == {
        "kind": "answer",
        "final": True,
        "call": answer["call"],
        "outcome": "denied",
        "reason": "not_found",
        "detail": "drafts/2026/plan.md: the directory drafts does not exist "
        "(write_file does not create directories)",
    }
    assert await bxctl_in_process(home, "approvals") == 0
    assert capsys.readouterr().out.strip() == "no pending approvals"
    [decision] = records_of(home, answer["call"])
    assert (decision["kind"], decision["verdict"], decision["reason"], decision["grant"]) == (
        "decision",
        "deny",
        "not_found",
        "write-any",
    )
    await client.aclose()
    (home.default_workspace / "drafts").mkdir()
    client, answer = await pending_write(home, "drafts/2026/plan.md", "# plan\n")
    assert answer["detail"].startswith("drafts/2026/plan.md: the directory drafts/2026 does")
    await client.aclose()
    (home.default_workspace / "drafts" / "2026").mkdir()
    client, frame = await pending_write(home, "drafts/2026/plan.md", "# plan\n")
    assert frame["kind"] == "pending"
    await client.aclose()


async def test_the_model_is_told_which_directory_is_missing(home: Home) -> None:
    write_grants(home, grant("write-any", "write_file", "ask"))
    write = {
        "tool_calls": [
            {"name": "write_file", "arguments": {"path": "drafts/plan.md", "content": "x"}}
        ]
    }
    fake = FakeLlama(script=[write, {"content": "The folder is missing."}])
    async with stack(home, fake):
        events = await say(home, "save my plan")
    assert events[-1]["text"] == "The folder is missing."
    assert fake.requests[1]["messages"][-1]["content"] == (
        "denied: not_found — drafts/plan.md: the directory drafts does not exist "
        "(write_file does not create directories)"
    )
