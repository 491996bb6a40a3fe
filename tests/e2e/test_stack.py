"""The real programs end to end: the scripted llama-server, then brokerd,
inferproxy and loopd started by ``bxctl up``, driven only through ``bxctl`` as the
owner would, each a separate process. Real time, every wait bounded."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from tests.harness.cli import WAIT_S, bxctl, listed_approvals, scripted_home, start_bxctl

from boxmaker.home.paths import Home

pytestmark = pytest.mark.slow

READ_NOTES = {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]}


class Stack:
    """A home with the fake model and the three daemons up."""

    def __init__(self, home: Home, record: Path) -> None:
        self.home = home
        self.record = record

    def model_requests(self) -> list[dict[str, Any]]:
        return [orjson.loads(line) for line in self.record.read_bytes().splitlines()]

    def records(self) -> list[dict[str, Any]]:
        return [orjson.loads(line) for line in self.home.audit_log.read_bytes().splitlines()]

    def chat(self, text: str) -> subprocess.Popen[str]:
        return start_bxctl(self.home, "chat", "--say", text, "--json")

    def wait_for_approval(self) -> dict[str, Any]:
        [entry] = listed_approvals(self.home)
        return entry


def events_of(chat: subprocess.Popen[str]) -> tuple[int, list[dict[str, Any]]]:
    out, err = chat.communicate(timeout=WAIT_S)
    assert chat.returncode == 0, err
    return chat.returncode, [orjson.loads(line) for line in out.splitlines()]


@pytest.fixture
def stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    """Parametrized with (script, grants, pending_timeout)."""
    script, grants, pending_timeout = request.param
    config = f"[broker]\npending_timeout = {pending_timeout}\n"
    with scripted_home(script, grants, config, prefix="bx-e2e-") as (home, _, record):
        (home.default_workspace / "notes.txt").write_text("Buy milk.\n")
        up = bxctl(home, "up")
        # The three daemons (no built-in model: [model] url names the fake), then
        # where the owner finds things.
        assert [line.split(":")[0] for line in up.stdout.splitlines()] == [
            *("brokerd", "inferproxy", "loopd"),
            *("broker socket", "admin socket", "infer socket", "loop socket"),
            *("logs", "model"),
        ]
        try:
            yield Stack(home, record)
        finally:
            down = bxctl(home, "down")
            assert down.stdout.splitlines() == [
                "loopd: stopped",
                "inferproxy: stopped",
                "brokerd: stopped",
                "model: not running",  # [model] url names the fake: no built-in model
            ]


ASK = '[[grant]]\nid = "notes"\ntool = "read_file"\nmode = "ask"\nnote = "my notes"\n'


@pytest.mark.parametrize(
    "stack", [([READ_NOTES, {"content": "I may not read it."}], "", 300)], indirect=True
)
def test_without_a_grant_the_call_is_denied_and_the_model_told(stack: Stack) -> None:
    code, events = events_of(stack.chat("what do my notes say?"))
    assert code == 0
    result = next(e for e in events if e["kind"] == "tool_result")
    assert (result["outcome"], result["reason"]) == ("denied", "no_grant")
    assert stack.model_requests()[1]["messages"][-1]["content"].startswith(
        "I could not do that: the call was denied (no_grant: "
    )
    assert events[-1]["text"] == "I may not read it."
    [decision] = [r for r in stack.records() if r.get("call") == result["call"]]
    assert (decision["kind"], decision["verdict"], decision["reason"]) == (
        "decision",
        "deny",
        "no_grant",
    )
    assert bxctl(stack.home, "audit", "verify").returncode == 0


@pytest.mark.parametrize(
    "stack", [([READ_NOTES, {"content": "Your notes say: buy milk."}], ASK, 300)], indirect=True
)
def test_an_ask_is_shown_to_the_owner_approved_run_and_recorded(stack: Stack) -> None:
    chat = stack.chat("what do my notes say?")
    entry = stack.wait_for_approval()
    assert (entry["tool"], entry["arguments"], entry["grant"]["id"], entry["grant"]["note"]) == (
        "read_file",
        {"path": "notes.txt"},
        "notes",
        "my notes",
    )
    shown = bxctl(stack.home, "approvals").stdout
    assert f"bxctl approve {entry['approval']}" in shown
    assert "notes (mode ask): my notes" in shown
    bxctl(stack.home, "approve", entry["approval"])
    code, events = events_of(chat)
    assert code == 0
    # reply_delta and progress: as many as the timing makes.
    assert [e["kind"] for e in events if e["kind"] not in {"reply_delta", "progress"}] == [
        "session",
        "model",
        "model_done",
        "tool_call",
        "waiting",
        "tool_result",
        "model",
        "model_done",
        "reply",
    ]
    assert stack.model_requests()[1]["messages"][-1]["content"] == "Buy milk.\n"
    kinds = [r["kind"] for r in stack.records() if r.get("call") == entry["call"]]
    assert kinds == ["decision", "approval", "result"]
    verify = bxctl(stack.home, "audit", "verify")
    assert "complete 1" in verify.stdout, verify.stdout


@pytest.mark.parametrize(
    "stack", [([READ_NOTES, {"content": "Understood."}], ASK, 300)], indirect=True
)
def test_a_refusal_reaches_the_model_with_the_owners_reason(stack: Stack) -> None:
    chat = stack.chat("read my notes")
    entry = stack.wait_for_approval()
    bxctl(stack.home, "refuse", entry["approval"], "--reason", "not today, thanks")
    code, events = events_of(chat)
    assert code == 0
    result = next(e for e in events if e["kind"] == "tool_result")
    assert (result["outcome"], result["reason"]) == ("denied", "refused")
    told = stack.model_requests()[1]["messages"][-1]["content"]
    assert told.startswith("I could not do that: the call was denied (refused: ")
    assert "not today, thanks" in told
    approval = [r for r in stack.records() if r.get("call") == entry["call"]][-1]
    assert (approval["kind"], approval["outcome"], approval["by"]) == (
        "approval",
        "refused",
        "owner",
    )
    assert bxctl(stack.home, "audit", "verify").returncode == 0


@pytest.mark.parametrize(
    "stack", [([READ_NOTES, {"content": "Nobody answered."}], ASK, 1)], indirect=True
)
def test_an_unanswered_ask_expires_and_the_model_is_told(stack: Stack) -> None:
    code, events = events_of(stack.chat("read my notes"))
    assert code == 0
    result = next(e for e in events if e["kind"] == "tool_result")
    assert (result["outcome"], result["reason"]) == ("denied", "expired")
    assert stack.model_requests()[1]["messages"][-1]["content"].startswith(
        "I could not do that: the call was denied (expired: "
    )
    approval = [r for r in stack.records() if r.get("call") == result["call"]][-1]
    assert (approval["outcome"], approval["by"]) == ("expired", "expiry")
    assert bxctl(stack.home, "audit", "verify").returncode == 0
