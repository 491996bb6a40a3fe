"""A shell call whose sandbox cannot run is denied before anyone is asked
(core/before_asking.py, broker/sandbox_check.py): the answer, its decision record, no
approval, ``bxctl grants test`` saying the same, and ``bxctl status`` and ``up`` saying
why (docs/runbook.md#sandbox, #sandbox-as-root).

As root the real case is played: a workspace of root's, mode 0700, which the sandbox's
ordinary uid cannot enter. A missing bubblewrap is played for any user (PATH)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
import trio.testing
from tests.harness.broker import Brokerd, Client, admin, call, records_of, tool_request
from tests.harness.cli import bxctl_in_process
from tests.harness.homes import grant, write_config, write_grants
from tests.harness.sandbox import AS_ROOT, SANDBOX_UID, sandbox_workspace

from boxmaker.broker.sandbox_check import NO_BWRAP_DETAIL
from boxmaker.cli.preflight import sandbox_warnings
from boxmaker.home.paths import Home

pytestmark = pytest.mark.usefixtures("inline_threads")

Clock = trio.testing.MockClock
as_root = pytest.mark.skipif(not AS_ROOT, reason="the sandbox runs as another uid only as root")
SHELL = {"command": "touch ran"}
FIELDS = ("kind", "tool", "arguments", "verdict", "reason", "grant")
"""A decision record's fields (the detail is the answer's, not the record's)."""


@pytest.fixture
def roots_workspace(home: Home) -> Iterator[Path]:
    """A workspace of root's, mode 0700, with ``[runner] sandbox_uid`` an ordinary uid:
    the sandbox cannot enter it. Every shell call asks."""
    with sandbox_workspace() as workspace:
        os.chown(workspace, 0, 0)
        workspace.chmod(0o700)
        write_config(
            home, f"workspace = {str(workspace)!r}\n[runner]\nsandbox_uid = {SANDBOX_UID}\n"
        )
        write_grants(home, grant("sh", "shell", "ask"))
        yield workspace


def unreachable(workspace: Path) -> str:
    return (
        f"the sandbox runs as uid {SANDBOX_UID} (gid {SANDBOX_UID}) and cannot reach the "
        "workspace: the workspace is not searchable by it (mode 0700, owner 0, group 0); "
        f"`bxctl init --workspace {workspace}` gives it to that uid, or use another "
        "workspace; see docs/runbook.md#sandbox-as-root"
    )


async def denied_before_asking(home: Home, detail: str) -> dict[str, Any]:
    """One shell call: denied sandbox_unavailable with ``detail`` at its decision, no
    approval entry, nothing but the decision recorded; its decision record."""
    frame = tool_request("shell", SHELL)
    [answer] = await call(home, frame)
    assert answer == {
        "kind": "answer",
        "final": True,
        "call": frame["call"],
        "outcome": "denied",
        "reason": "sandbox_unavailable",
        "detail": detail,
    }
    assert (await admin(home, {"kind": "approvals"}))["entries"] == []
    [decision] = records_of(home, frame["call"])
    return decision


@as_root
async def test_a_shell_ask_the_sandbox_cannot_run_is_denied_before_anyone_is_asked(
    home: Home,
    roots_workspace: Path,
    brokerd: Brokerd,
    autojump_clock: Clock,
    capsys: pytest.CaptureFixture[str],
) -> None:
    workspace = roots_workspace
    await brokerd.start()
    decision = await denied_before_asking(home, unreachable(workspace))
    assert {key: decision[key] for key in FIELDS} == {
        "kind": "decision",
        "tool": "shell",
        "arguments": SHELL,
        "verdict": "deny",
        "reason": "sandbox_unavailable",
        "grant": "sh",
    }
    assert not (workspace / "ran").exists()
    assert await bxctl_in_process(home, "approvals") == 0
    assert capsys.readouterr().out.strip() == "no pending approvals"
    # bxctl grants test predicts the same, with the same words.
    assert (
        await bxctl_in_process(
            home, "grants", "test", "shell", orjson.dumps(SHELL).decode(), "--json"
        )
        == 0
    )
    predicted = orjson.loads(capsys.readouterr().out)
    assert (predicted["verdict"], predicted["reason"], predicted["detail"], predicted["grant"]) == (
        "deny",
        "sandbox_unavailable",
        unreachable(workspace),
        "sh",
    )
    # Found again at each call: once the sandbox's uid owns it, the owner is asked.
    os.chown(workspace, SANDBOX_UID, SANDBOX_UID)
    client = await Client.open(home.broker_sock)
    frame = await client.ask(tool_request("shell", SHELL))
    assert frame["kind"] == "pending"
    await client.aclose()


@as_root
async def test_a_workspace_of_roots_without_sandbox_uid_is_denied_naming_the_key(
    home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    write_grants(home, grant("sh", "shell", "ask"))
    await brokerd.start()
    detail = (
        f"brokerd runs as root and the workspace {home.default_workspace} belongs to root; "
        "the sandbox never runs as host root (uid 0): set [runner] sandbox_uid to an "
        "ordinary uid that owns the workspace (or run brokerd as an ordinary user); "
        "see docs/runbook.md#sandbox-as-root"
    )
    decision = await denied_before_asking(home, detail)
    assert (decision["verdict"], decision["reason"], decision["grant"]) == (
        "deny",
        "sandbox_unavailable",
        "sh",
    )


async def test_without_bubblewrap_a_shell_ask_is_denied_before_anyone_is_asked(
    home: Home,
    brokerd: Brokerd,
    autojump_clock: Clock,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    write_grants(home, grant("sh", "shell", "ask"))
    await brokerd.start()
    decision = await denied_before_asking(home, NO_BWRAP_DETAIL)
    assert NO_BWRAP_DETAIL.endswith("see docs/runbook.md#sandbox")
    assert (decision["verdict"], decision["reason"], decision["grant"]) == (
        "deny",
        "sandbox_unavailable",
        "sh",
    )


@as_root
async def test_a_shell_call_that_runs_at_once_fails_with_the_same_words(
    home: Home, roots_workspace: Path, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    """An auto grant is not asked about: the run itself fails, with the same finding
    (not bwrap's own "Can't chdir"), and nothing runs."""
    write_grants(home, grant("sh", "shell", "auto"))
    await brokerd.start()
    frame = tool_request("shell", SHELL)
    [answer] = await call(home, frame)
    assert (answer["outcome"], answer["reason"], answer["detail"]) == (
        "failed",
        "sandbox_unavailable",
        unreachable(roots_workspace),
    )
    decision, result = records_of(home, frame["call"])
    assert (decision["verdict"], result["status"], result["reason"]) == (
        "run",
        "failed",
        "sandbox_unavailable",
    )
    assert not (roots_workspace / "ran").exists()


@as_root
async def test_status_says_the_shell_cannot_run_and_why(
    home: Home,
    roots_workspace: Path,
    brokerd: Brokerd,
    autojump_clock: Clock,
    capsys: pytest.CaptureFixture[str],
) -> None:
    await brokerd.start()
    status = await admin(home, {"kind": "status"})
    assert (status["shell_ready"], status["shell_problem"]) == (False, unreachable(roots_workspace))
    await bxctl_in_process(home, "status")
    lines = capsys.readouterr().out.splitlines()
    assert "shell_ready    no" in lines
    assert f"shell_problem  {unreachable(roots_workspace)}" in lines
    os.chown(roots_workspace, SANDBOX_UID, SANDBOX_UID)
    status = await admin(home, {"kind": "status"})
    assert (status["shell_ready"], status["shell_problem"]) == (True, None)


@as_root
async def test_up_warns_that_the_shell_cannot_run_and_why(
    home: Home, roots_workspace: Path, brokerd: Brokerd
) -> None:
    # up asks the running brokerd (a trio run of its own, so a real thread here).
    await brokerd.start()
    with trio.fail_after(10):
        warnings = await trio.to_thread.run_sync(sandbox_warnings, home)
    assert warnings[0] == (
        "warning: the shell tool cannot run here, so brokerd denies every shell call "
        f"sandbox_unavailable before anyone is asked: {unreachable(roots_workspace)}"
    )
    os.chown(roots_workspace, SANDBOX_UID, SANDBOX_UID)
    with trio.fail_after(10):
        warnings = await trio.to_thread.run_sync(sandbox_warnings, home)
    assert not any("shell tool" in warning for warning in warnings)
