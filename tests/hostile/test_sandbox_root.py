"""Hostile: a shell command that tries to reach the host through the sandbox.

Replayed black-box against the real brokerd (serve() on its real Unix sockets, real
bwrap). Before the fix, with brokerd as root the sandbox's uid 0 was the host's uid 0:
a command could write host sysctls under /proc/sys, and leave setuid-root files in the
workspace; bwrap (the sandbox's pid 1) also showed brokerd's whole environment in
/proc/1/environ and the host workspace path in /proc/1/cmdline.
(docs/runbook.md#sandbox-as-root, docs/runbook.md#sandbox)
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from tests.harness.broker import PENDING_TIMEOUT, call, records_of, running, tool_request
from tests.harness.homes import grant, write_config, write_grants
from tests.harness.sandbox import AS_ROOT, SANDBOX_UID, sandbox_workspace

from boxmaker.home.paths import Home

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
LIMIT = 60.0
"""Real seconds for one test: bwrap runs for real."""


@pytest.fixture
def ws(home: Home) -> Iterator[Path]:
    """A workspace an ordinary uid owns (as root), configured for brokerd."""
    with sandbox_workspace() as workspace:
        # Writable by any uid, so that a sandbox running as host root (before the fix)
        # meets the attack itself, not a permission error.
        workspace.chmod(0o777)
        write_config(
            home, f"workspace = {str(workspace)!r}\n[broker]\npending_timeout = {PENDING_TIMEOUT}\n"
        )
        write_grants(home, grant("sh", "shell", "auto"))
        yield workspace


async def shell(home: Home, command: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The answer to one shell call, and its result record in the ledger."""
    with trio.fail_after(LIMIT):
        async with running(home):
            frame = tool_request("shell", {"command": command})
            frames = await call(home, frame)
    [answer] = frames
    result = records_of(home, frame["call"])[-1]
    assert result["kind"] == "result"
    assert (result["status"], result["reason"]) == (answer["outcome"], answer.get("reason"))
    return answer, result


def failed(answer: dict[str, Any], reason: str) -> str:
    assert (answer["outcome"], answer["reason"]) == ("failed", reason), answer
    detail: str = answer["detail"]
    return detail


# --- 1. not host root, no capabilities, no host knob --------------------------------


async def test_the_sandbox_is_not_host_root_and_has_no_capabilities(home: Home, ws: Path) -> None:
    answer, _ = await shell(
        home, "touch made; grep -E '^(CapEff|CapBnd|CapPrm|CapAmb):' /proc/self/status"
    )
    assert answer["outcome"] == "ok", answer
    caps = dict(line.split(":\t") for line in answer["content"].splitlines())
    assert caps == dict.fromkeys(("CapPrm", "CapEff", "CapBnd", "CapAmb"), "0000000000000000")
    # The host's view: what the sandbox makes belongs to an ordinary uid, never root.
    made = (ws / "made").stat()
    assert made.st_uid != 0
    assert made.st_gid != 0
    assert made.st_uid == (SANDBOX_UID if AS_ROOT else os.getuid())


def host_view(marker: str) -> list[tuple[str, str, str]]:
    """For each host process whose command line has ``marker``: its Uid and Gid lines
    and its uid_map, read from the host (so the map is in the host's terms)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if marker.encode() in (entry / "cmdline").read_bytes():
                status = (entry / "status").read_text().splitlines()
                ids = [line for line in status if line.startswith(("Uid:", "Gid:"))]
                found.append((ids[0], ids[1], (entry / "uid_map").read_text()))
        except (OSError, IndexError):
            continue
    return found


async def test_from_the_host_the_command_is_an_ordinary_uid(home: Home, ws: Path) -> None:
    marker = "1.23456"
    seen: list[tuple[str, str, str]] = []

    async def look() -> None:
        while not seen:
            seen.extend(host_view(marker))
            await trio.sleep(0.01)

    with trio.fail_after(LIMIT):
        async with running(home), trio.open_nursery() as nursery:
            nursery.start_soon(look)
            [answer] = await call(home, tool_request("shell", {"command": f"sleep {marker}"}))
            nursery.cancel_scope.cancel()
    assert answer["outcome"] == "ok", answer
    assert seen, "the sandboxed command was never seen from the host"
    expected = SANDBOX_UID if AS_ROOT else os.getuid()
    uid_line, gid_line, uid_map = seen[0]
    assert uid_line.split()[1:] == [str(expected)] * 4
    assert "0" not in gid_line.split()[1:]
    # Every uid of the sandbox's namespace is, on the host, the ordinary uid.
    assert [line.split()[1:] for line in uid_map.splitlines()] == [[str(expected), "1"]]


@pytest.mark.parametrize(
    "knob", ["kernel/printk_ratelimit", "kernel/core_pattern", "vm/overcommit_ratio"]
)
async def test_host_sysctls_cannot_be_written(home: Home, ws: Path, knob: str) -> None:
    # The value written is the one there: harmless on a host where the write goes through.
    command = f"v=$(cat /proc/sys/{knob}) && printf '%s\\n' \"$v\" > /proc/sys/{knob} && echo WROTE"
    answer, result = await shell(home, command)
    detail = failed(answer, "tool_error")
    assert "WROTE" not in detail
    assert f"/proc/sys/{knob}: Read-only file system" in detail, detail
    assert result["status"] == "failed"


async def test_proc_knobs_are_read_only_mounts(home: Home, ws: Path) -> None:
    answer, _ = await shell(home, "grep -E ' /proc/(sys|irq|bus) ' /proc/self/mountinfo")
    assert answer["outcome"] == "ok", answer
    mounts = {line.split()[4]: line.split()[5] for line in answer["content"].splitlines()}
    assert "/proc/sys" in mounts
    assert all(options.split(",")[0] == "ro" for options in mounts.values()), mounts


@pytest.mark.skipif(not AS_ROOT, reason="brokerd as root refuses a root-owned workspace")
async def test_as_root_a_workspace_of_root_is_refused_and_nothing_runs(home: Home) -> None:
    write_grants(home, grant("sh", "shell", "auto"))
    assert home.default_workspace.stat().st_uid == 0
    answer, result = await shell(home, "touch ran")
    detail = failed(answer, "sandbox_unavailable")
    assert detail == (
        f"brokerd runs as root and the workspace {home.default_workspace} belongs to root; "
        "the sandbox never runs as host root (uid 0): set [runner] sandbox_uid to an "
        "ordinary uid that owns the workspace (or run brokerd as an ordinary user); "
        "see docs/runbook.md#sandbox-as-root"
    )
    assert result["reason"] == "sandbox_unavailable"
    assert not (home.default_workspace / "ran").exists()


@pytest.mark.skipif(not AS_ROOT, reason="only root can run the sandbox as another uid")
async def test_as_root_a_workspace_of_the_root_group_gives_the_owners_number(
    home: Home, ws: Path
) -> None:
    os.chown(ws, SANDBOX_UID, 0)
    answer, _ = await shell(home, "id -u && id -G")
    assert answer["outcome"] == "ok", answer
    assert answer["content"] == f"{SANDBOX_UID}\n{SANDBOX_UID}\n"


@pytest.mark.skipif(not AS_ROOT, reason="only root can run the sandbox as another uid")
async def test_as_root_sandbox_uid_chooses_the_sandbox_uid(home: Home, ws: Path) -> None:
    other = 4242
    os.chown(ws, other, other)
    write_config(home, f"workspace = {str(ws)!r}\n[runner]\nsandbox_uid = {other}\n")
    answer, _ = await shell(home, "touch made && id -u && id -G")
    assert answer["outcome"] == "ok", answer
    assert answer["content"] == f"{other}\n{other}\n"
    assert ((ws / "made").stat().st_uid, (ws / "made").stat().st_gid) == (other, other)


# --- 2. no setuid or setgid file ---------------------------------------------------

SETID_ATTEMPTS = {
    "chmod": "cp /bin/true chmod-suid && chmod 4755 chmod-suid",
    "chmod g+s": "cp /bin/true chmod-sgid && chmod g+s chmod-sgid",
    "install -m": "install -m 6755 /bin/true install-suid",
    "open O_CREAT": (
        "python3 -c \"import os; os.open('open-suid', os.O_CREAT | os.O_WRONLY, 0o4755)\""
    ),
    "mknod": "python3 -c \"import os, stat; os.mknod('fifo-suid', stat.S_IFIFO | 0o4644)\"",
    "fchmod": (
        "python3 -c \"import os; fd = os.open('fchmod-suid', os.O_CREAT | os.O_WRONLY, 0o755);"
        ' os.fchmod(fd, 0o2755)"'
    ),
}


@pytest.mark.parametrize("attempt", SETID_ATTEMPTS)
async def test_no_setuid_or_setgid_file_comes_out(home: Home, ws: Path, attempt: str) -> None:
    answer, _ = await shell(home, SETID_ATTEMPTS[attempt])
    detail = failed(answer, "tool_error")
    assert "Operation not permitted" in detail, detail
    for path in ws.rglob("*"):  # noqa: ASYNC240  (the run is over: nothing to wait for)
        info = path.lstat()
        assert not info.st_mode & (stat.S_ISUID | stat.S_ISGID), (path, oct(info.st_mode))
        assert info.st_uid != 0, path


async def test_modes_without_setid_bits_still_work(home: Home, ws: Path) -> None:
    # The control: the filter refuses setuid/setgid bits, nothing else.
    answer, _ = await shell(
        home, "cp /bin/true t && chmod 700 t && chmod u+x,g-w t && ./t && mkfifo f"
    )
    assert answer["outcome"] == "ok", answer
    assert stat.S_IMODE((ws / "t").stat().st_mode) == 0o700
    assert stat.S_ISFIFO((ws / "f").lstat().st_mode)


# --- 3. nothing of brokerd's environment or host paths -----------------------------


async def test_brokerd_environment_and_paths_do_not_reach_the_sandbox(
    home: Home, ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BOXMAKER_HOSTILE_SECRET", "hunter2-in-brokerd-env")
    command = (
        "for p in /proc/[0-9]*; do echo \"== $p\"; tr '\\0' '\\n' < $p/environ;"
        " tr '\\0' '\\n' < $p/cmdline; done"
    )
    answer, _ = await shell(home, command)
    assert answer["outcome"] == "ok", answer
    content = answer["content"]
    assert "== /proc/1\n" in content
    assert "hunter2" not in content
    assert "BOXMAKER_HOSTILE_SECRET" not in content
    assert str(ws) not in content
    assert str(home.root) not in content
    # pid 1 (bwrap's init) has no environment at all.
    pid1 = content.split("== /proc/1\n", 1)[1].split("==", 1)[0]
    bwrap, option, fd = pid1.splitlines()[:3]
    assert (Path(bwrap).name, option, fd.isdigit()) == ("bwrap", "--args", True)
