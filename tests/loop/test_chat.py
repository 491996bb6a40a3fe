"""``bxctl chat`` against the whole stack in process."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
import pytest
import trio
from tests.fakes.llama_server import FakeLlama
from tests.harness.broker import waiting_approvals
from tests.harness.cli import bxctl_in_process
from tests.harness.homes import grant, write_grants
from tests.harness.scripted_loopd import scripted_loopd
from tests.harness.stack import GUARD, READ_NOTES, stack

from boxmaker.home.paths import Home
from boxmaker.loop.serve import Loop


def timeless(text: str) -> str:
    """``text`` with every duration (``1.2 s``) as ``N s``."""
    return re.sub(r"\b\d+\.\d s\b", "N s", text)


async def test_one_turn_shows_the_call_its_outcome_and_the_reply(
    home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    write_grants(home, grant("notes", "read_file", "auto"))
    (home.default_workspace / "notes.txt").write_text("Buy milk.\n")
    fake = FakeLlama(script=[READ_NOTES, {"content": "Your notes say: buy milk."}])
    async with stack(home, fake):
        assert await bxctl_in_process(home, "chat", "--say", "what do my notes say?") == 0
    lines = timeless(capsys.readouterr().out).splitlines()
    assert re.fullmatch(r"session s-[0-9a-f]{12}", lines[0])
    assert lines[1:] == [
        "  [step 1: N s, 5 tokens]",
        '  -> read_file {"path":"notes.txt"}',
        "  <- ok (N s)",
        "     | Buy milk.",
        "Your notes say: buy milk.",
        "  [step 2: N s, 7 tokens]",
    ]


@asynccontextmanager
async def chat_with_a_waiting_call(
    home: Home,
) -> AsyncIterator[tuple[Loop, list[dict[str, Any]], list[int]]]:
    """``bxctl chat --say "read my notes"`` against the stack, once its read_file call
    waits for the owner: (loopd, the approvals listed then, the chat's exit code once
    it has ended on the way out)."""
    write_grants(home, grant("notes", "read_file", "ask"))
    (home.default_workspace / "notes.txt").write_text("Buy milk.\n")
    fake = FakeLlama(script=[READ_NOTES, {"content": "Milk."}])
    codes: list[int] = []
    async with stack(home, fake) as loop, trio.open_nursery() as nursery:

        async def chat() -> None:
            codes.append(await bxctl_in_process(home, "chat", "--say", "read my notes"))

        nursery.start_soon(chat)
        yield loop, await waiting_approvals(home, within=GUARD), codes


async def test_a_waiting_call_shows_the_command_that_approves_it(
    home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    async with chat_with_a_waiting_call(home) as (_, waiting, codes):
        approval = waiting[0]["approval"]
        assert await bxctl_in_process(home, "approve", approval) == 0
    out = capsys.readouterr().out
    assert f"waiting for the owner: approval {approval} (grant notes)" in out
    assert f"approve: bxctl approve {approval}" in out
    # bxctl approve answers once the call has run, so its line falls among the chat's.
    call = waiting[0]["call"]
    approved = f"approved {call}: read_file ran (ok)"
    assert approved in out.splitlines()
    chat_lines = [line for line in out.splitlines() if line != approved]
    assert (
        timeless("\n".join(chat_lines))
        .rstrip()
        .endswith("  <- ok (N s)\n     | Buy milk.\nMilk.\n  [step 2: N s, 2 tokens]")
    )
    assert codes == [0]


async def test_json_prints_each_event_as_it_comes(
    home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeLlama(script=[{"content": "Hello."}])
    async with stack(home, fake):
        assert await bxctl_in_process(home, "chat", "--say", "hi", "--json") == 0
    events = [orjson.loads(line) for line in capsys.readouterr().out.splitlines()]
    # The reply streams (reply_delta, as many as the timing makes), then comes whole.
    shown = [e["kind"] for e in events if e["kind"] not in {"reply_delta", "progress"}]
    assert shown == ["session", "model", "model_done", "reply"]
    assert "".join(e["text"] for e in events if e["kind"] == "reply_delta") == "Hello."


async def test_a_failed_turn_exits_1_with_the_error_on_stderr(
    home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    too_long = {"code": 400, "message": "the prompt is too long", "type": "exceed_context"}
    fake = FakeLlama(script=[{"status": 400, "error": too_long}])
    async with stack(home, fake):
        assert await bxctl_in_process(home, "chat", "--say", "hi") == 1
    assert "error: model_error: HTTP 400: the prompt is too long" in capsys.readouterr().err


async def test_without_loopd_chat_exits_3_saying_how_to_start_it(
    home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await bxctl_in_process(home, "chat", "--say", "hi") == 3
    err = capsys.readouterr().err
    assert "loopd is unreachable" in err
    assert f"start the daemons with `bxctl up --home {home.root}`" in err


async def test_a_bad_session_id_is_a_usage_error(
    home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await bxctl_in_process(home, "chat", "--say", "hi", "--session", "s-nope") == 2
    assert "not a session id" in capsys.readouterr().err


async def test_the_models_words_cannot_drive_the_terminal(
    home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    sneaky = "\x1b[2J\x1b[Happroved \u202egnp.exe"
    fake = FakeLlama(
        script=[{"tool_calls": [{"name": "x\x1b[8m", "arguments": {}}]}, {"content": sneaky}]
    )
    async with stack(home, fake):
        assert await bxctl_in_process(home, "chat", "--say", "hi") == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out
    assert "\u202e" not in out
    assert "  -> x\\u001b[8m {}" in out
    assert "\\u001b[2J\\u001b[Happroved \\u202egnp.exe\n" in out


async def test_a_turn_cut_short_by_loopds_stop_says_why(
    home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    async with chat_with_a_waiting_call(home) as (loop, _, codes):
        loop.request_stop()
    assert codes == [1]
    err = capsys.readouterr().err
    assert "error: stopping: loopd is stopping (bxctl down, or SIGTERM)" in err


async def test_json_prints_the_results_detail_and_times(
    home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeLlama(script=[READ_NOTES, {"content": "Not allowed."}])
    async with stack(home, fake):
        assert await bxctl_in_process(home, "chat", "--say", "read my notes", "--json") == 0
    events = [orjson.loads(line) for line in capsys.readouterr().out.splitlines()]
    [result] = [e for e in events if e["kind"] == "tool_result"]
    assert (result["outcome"], result["reason"]) == ("denied", "no_grant")
    assert "read_file" in result["detail"]
    assert result["elapsed_ms"] >= 0
    assert "output" not in result
    done = [e for e in events if e["kind"] == "model_done"]
    assert [e["step"] for e in done] == [1, 2]
    assert all(e["elapsed_ms"] >= 0 for e in done)


async def test_without_a_terminal_a_denial_shows_its_detail(
    home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeLlama(script=[READ_NOTES, {"content": "Not allowed."}])
    async with stack(home, fake):
        assert await bxctl_in_process(home, "chat", "--say", "read my notes") == 0
    lines = timeless(capsys.readouterr().out).splitlines()
    denied = lines.index("  <- denied: no_grant (N s)")
    assert lines[denied + 1].startswith("     ")
    assert "read_file" in lines[denied + 1]


async def test_a_turn_that_ends_without_a_reply_or_error_says_so(
    home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    async with scripted_loopd(home, [{"kind": "session", "session": "s-0123456789ab"}]):
        assert await bxctl_in_process(home, "chat", "--say", "hi") == 1
    err = capsys.readouterr().err
    assert "loopd ended the turn without a reply or an error: it stopped or failed" in err
    assert str(home.log_file("loopd")) in err
