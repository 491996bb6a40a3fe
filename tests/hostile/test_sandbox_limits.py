"""Hostile: a shell command that tries to exhaust the host through the sandbox.

Replayed black-box against the real brokerd (serve() on its real Unix sockets, real
bwrap). Before the fix, nothing limited a sandboxed command's memory, processes, file
size or CPU time (2 GiB and 500 processes went through); now [runner] memory_limit_mib,
process_limit, file_size_limit_mib and cpu_time_limit hold, and a command they stop is a
failed tool_error whose detail names the limit (docs/runbook.md#sandbox-limits).
Where each sandbox has a cgroup of its own (CGROUPS: as root here and in CI), the
process limit is the cgroup's pids.max and is named for certain, and the memory file
systems are bounded by the memory limit together (tests/hostile/test_memory_escape.py).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from tests.harness.broker import call, records_of, running, tool_request
from tests.harness.homes import grant, write_config, write_grants
from tests.harness.sandbox import CGROUPS, sandbox_workspace

from boxmaker.home.paths import Home

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
LIMIT = 60.0
"""Real seconds for one test: bwrap runs for real."""
RUNNER = """
[runner]
shell_timeout = 15
memory_limit_mib = 64
process_limit = 24
file_size_limit_mib = 1
cpu_time_limit = 1
"""


@pytest.fixture
def ws(home: Home) -> Iterator[Path]:
    with sandbox_workspace() as workspace:
        write_config(home, f"workspace = {str(workspace)!r}\n{RUNNER}")
        write_grants(home, grant("sh", "shell", "auto"))
        yield workspace


async def failed_shell(home: Home, command: str) -> str:
    """The detail of a shell call that must fail with tool_error, checked against its
    result record."""
    with trio.fail_after(LIMIT):
        async with running(home):
            frame = tool_request("shell", {"command": command})
            [answer] = await call(home, frame)
    result: dict[str, Any] = records_of(home, frame["call"])[-1]
    assert (answer["outcome"], answer.get("reason")) == ("failed", "tool_error"), answer
    assert (result["kind"], result["status"], result["reason"]) == (
        "result",
        "failed",
        "tool_error",
    )
    detail: str = answer["detail"]
    return detail


async def test_memory_over_the_limit_is_refused(home: Home, ws: Path) -> None:
    detail = await failed_shell(home, "python3 -c 'bytearray(256 << 20)' && echo ALLOCATED")
    assert detail.startswith(
        "the command probably reached [runner] memory_limit_mib (64 MiB) (exit status 1: "
    ), detail
    assert "MemoryError" in detail
    assert detail.endswith("; see docs/runbook.md#sandbox-limits")


def process_limit_detail(limit: int) -> str:
    """How a command stopped by the process limit is named: for certain where the
    sandbox's cgroup counted the refused fork."""
    if CGROUPS:
        return f"the command reached [runner] process_limit ({limit}): a new process was refused ("
    return f"the command probably reached [runner] process_limit ({limit}) ("


async def test_processes_over_the_limit_cannot_start(home: Home, ws: Path) -> None:
    command = "i=0; while [ $i -lt 100 ]; do sleep 3 & i=$((i+1)); done; echo STARTED $i"
    detail = await failed_shell(home, command)
    assert detail.startswith(process_limit_detail(24)), detail
    assert "STARTED" not in detail


async def test_a_file_over_the_limit_is_cut_and_the_command_killed(home: Home, ws: Path) -> None:
    detail = await failed_shell(home, "head -c 4194304 /dev/zero > big")
    # dash reports the writer's death (SIGXFSZ) as its own exit status 128 + 25.
    assert detail.startswith(
        "the command was killed (SIGXFSZ): it exceeded [runner] file_size_limit_mib (1 MiB) "
    ), detail
    assert (ws / "big").stat().st_size == 1 << 20


async def test_cpu_time_over_the_limit_kills_the_command(home: Home, ws: Path) -> None:
    start = trio.current_time()
    detail = await failed_shell(home, "while :; do :; done")
    assert detail.startswith(
        "the command was killed (SIGXCPU): it exceeded [runner] cpu_time_limit (1 s) "
    ), detail
    # Long before shell_timeout (15 s), which answered `timeout` before the fix.
    assert trio.current_time() - start < 10


async def test_within_the_limits_a_command_runs(home: Home, ws: Path) -> None:
    # The control: the same kinds of work, under the limits, succeed.
    command = (
        "python3 -c 'bytearray(8 << 20)' && head -c 100000 /dev/zero > small"
        " && sleep 0.1 & sleep 0.1 & wait && echo fine"
    )
    with trio.fail_after(LIMIT):
        async with running(home):
            [answer] = await call(home, tool_request("shell", {"command": command}))
    assert (answer["outcome"], answer["content"]) == ("ok", "fine\n"), answer
    assert (ws / "small").stat().st_size == 100000


@pytest.mark.parametrize(
    ("command", "limit"),
    [
        # 2 GiB of address space, never touched: cheap where it goes through.
        (
            "python3 -c 'import mmap; mmap.mmap(-1, 2 << 30)'",
            "the command probably reached [runner] memory_limit_mib (1024 MiB) (",
        ),
        (
            "i=0; while [ $i -lt 300 ]; do sleep 1 & i=$((i+1)); done; wait; echo STARTED $i",
            process_limit_detail(256),
        ),
    ],
)
async def test_the_default_limits_hold(home: Home, command: str, limit: str) -> None:
    with sandbox_workspace() as workspace:
        write_config(home, f"workspace = {str(workspace)!r}\n")
        write_grants(home, grant("sh", "shell", "auto"))
        detail = await failed_shell(home, command)
    assert detail.startswith(limit), detail


@pytest.mark.parametrize("directory", ["/tmp", "/dev/shm"])
async def test_memory_file_systems_hold_no_more_than_the_memory_limit(
    home: Home, ws: Path, directory: str
) -> None:
    # 100 files of 1,000,000 bytes, each under file_size_limit_mib: 95 MiB in memory.
    command = (
        f"i=0; while [ $i -lt 100 ]; do head -c 1000000 /dev/zero > {directory}/f$i || exit 9;"
        " i=$((i+1)); done"
    )
    detail = await failed_shell(home, command)
    if CGROUPS:
        # The file system's pages count against the memory limit with all the rest of
        # the sandbox's memory: the limit is reached before the file system is full.
        assert detail.startswith(
            "the command was killed: it exceeded [runner] memory_limit_mib (64 MiB) ("
        ), detail
    else:
        assert detail.startswith("exit status 9: "), detail
        assert "No space left on device" in detail


async def test_dev_is_read_only(home: Home, ws: Path) -> None:
    detail = await failed_shell(home, "touch /dev/filler")
    assert "Read-only file system" in detail, detail
