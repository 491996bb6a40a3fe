"""Hostile: a shell command that holds more memory, or starts more processes, than
[runner] allows, by routes a per-process limit does not see.

Replayed black-box against the real brokerd (serve() on its real Unix sockets, real
bwrap). Before the fix the sandbox's memory limit was the launcher's ``ulimit -v``
(RLIMIT_AS) of each process: a memfd written and never mapped, the sandbox's tmpfs
(/tmp and /dev/shm, each sized to the limit) and many processes each under the limit
held several times ``memory_limit_mib`` of the host's memory (2.4 GB under a 1 GiB
limit). Now each sandbox is in a cgroup of its own whose memory limit (swap included)
is ``memory_limit_mib`` and whose pids.max is ``process_limit``: the command is killed
at the limit, the answer names it, the kernel's peak (read on the host by brokerd, in
its log) never passed it, and after the call the cgroup is gone, with nothing of the
sandbox left (docs/runbook.md#sandbox-limits).

Each attack prints its progress, so the test proves it ran up to the limit. Where brokerd
can have no cgroup (an ordinary user without a delegated subtree), the attacks are not
bounded, and the tests assert instead that the owner is told (status, ``bxctl up``).
"""

from __future__ import annotations

import logging
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from tests.harness.broker import admin, call, records_of, running, tool_request
from tests.harness.homes import grant, write_config, write_grants
from tests.harness.sandbox import CGROUPS, sandbox_workspace

from boxmaker.broker.cgroup_plan import NoCgroups
from boxmaker.cli.preflight import sandbox_bounds_warning
from boxmaker.home.paths import Home

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
LIMIT = 60.0
"""Real seconds for one test: bwrap runs for real."""
MIB = 1 << 20
RUNNER = """
[runner]
shell_timeout = 20
memory_limit_mib = 64
process_limit = 24
"""
KILLED = "the command was killed: it exceeded [runner] memory_limit_mib (64 MiB) (exit status "
PROGRESS = re.compile(r"held (\d+) MiB")


@pytest.fixture
def ws(home: Home) -> Iterator[Path]:
    with sandbox_workspace() as workspace:
        write_config(home, f"workspace = {str(workspace)!r}\n{RUNNER}")
        write_grants(home, grant("sh", "shell", "auto"))
        yield workspace


async def owner_is_told(home: Home) -> None:
    """No cgroup here: status and ``bxctl up`` say so, naming the runbook."""
    async with running(home):
        status = await admin(home, {"kind": "status"})
        warning = await trio.to_thread.run_sync(sandbox_bounds_warning, home)
    bounds: str = status["sandbox_bounds"]
    assert bounds.startswith(("none: ", "refused: ")), bounds
    assert bounds.endswith("see docs/runbook.md#sandbox-limits") or "#sandbox-limits" in bounds
    assert warning is not None
    assert warning.endswith(bounds)


# A skip in an async fixture does not stop a trio test from running: the guard is a
# mark, and test_with_a_cgroup_the_owner_is_not_warned asserts the owner is told.
bounded = pytest.mark.skipif(
    not CGROUPS,
    reason="no cgroup can be had here: test_with_a_cgroup_the_owner_is_not_warned asserts "
    "that the owner is told instead",
)


@attrs.frozen
class Counted:
    """What brokerd read of the sandbox's cgroup once the command ended (its log)."""

    directory: Path
    peak: int
    limit: int
    oom_kills: int
    forks_refused: int


async def shell(home: Home, command: str, caplog: pytest.LogCaptureFixture) -> dict[str, Any]:
    """The answer to one shell call on the real brokerd, checked against its result
    record."""
    caplog.set_level(logging.DEBUG, logger="boxmaker.brokerd.cgroups")
    with trio.fail_after(LIMIT):
        async with running(home) as broker:
            frame = tool_request("shell", {"command": command})
            [answer] = await call(home, frame)
    assert broker.sandboxes.bounds.describe().startswith("cgroup v"), broker.sandboxes.bounds
    result = records_of(home, frame["call"])[-1]
    assert (result["kind"], result["status"]) == ("result", answer["outcome"])
    return answer


def counted(caplog: pytest.LogCaptureFixture) -> Counted:
    """What the sandbox's cgroup counted, as brokerd logged it; that cgroup is gone."""
    [record] = [r for r in caplog.records if r.getMessage().startswith("sandbox cgroup ")]
    assert isinstance(record.args, tuple)
    directory, peak, limit, oom_kills, forks_refused = (str(arg) for arg in record.args)
    found = Counted(Path(directory), int(peak), int(limit), int(oom_kills), int(forks_refused))
    # Removed on close: nothing of the sandbox is left in it (rmdir refuses otherwise).
    assert not found.directory.exists()
    assert found.limit == 64 * MIB
    # The kernel's count, read on the host: never past the limit.
    assert found.peak <= found.limit
    return found


def failed(answer: dict[str, Any]) -> str:
    assert (answer["outcome"], answer.get("reason")) == ("failed", "tool_error"), answer
    detail: str = answer["detail"]
    assert detail.endswith("; see docs/runbook.md#sandbox-limits"), detail
    return detail


def held(detail: str) -> int:
    """The most MiB the command said it held."""
    return max((int(n) for n in PROGRESS.findall(detail)), default=0)


MEMFD = """python3 -c '
import os, sys
fd = os.memfd_create("hoard")
for mib in range(1, 257):
    os.write(fd, bytes(1 << 20))
    if mib % 4 == 0:
        print("held", mib, "MiB", file=sys.stderr, flush=True)
print("UNBOUNDED")
'"""


@bounded
@pytest.mark.usefixtures("ws")
async def test_a_memfd_never_mapped_is_bounded(
    home: Home, caplog: pytest.LogCaptureFixture
) -> None:
    # 256 MiB written into a memfd, never mapped: RLIMIT_AS never sees it.
    detail = failed(await shell(home, MEMFD, caplog))
    assert detail.startswith(KILLED), detail
    assert "UNBOUNDED" not in detail
    # It got close to the limit, and the memfd's pages were the cgroup's.
    assert held(detail) >= 32, detail
    usage = counted(caplog)
    assert usage.peak >= held(detail) * MIB
    assert usage.oom_kills >= 1


TMPFS = (
    "for d in /tmp /dev/shm; do i=0; while [ $i -lt 40 ]; do"
    " head -c 1048576 /dev/zero > $d/f$i || exit 9; i=$((i+1));"
    ' [ $((i % 4)) -ne 0 ] || echo "held $i MiB in $d" >&2; done; done; echo UNBOUNDED'
)


@bounded
@pytest.mark.usefixtures("ws")
async def test_the_sandboxes_tmpfs_together_are_bounded(
    home: Home, caplog: pytest.LogCaptureFixture
) -> None:
    # 40 MiB in /tmp, then 40 MiB in /dev/shm: each file system under its size (the
    # memory limit), both together over the limit.
    detail = failed(await shell(home, TMPFS, caplog))
    assert detail.startswith(KILLED), detail
    assert "UNBOUNDED" not in detail
    assert "held 40 MiB in /tmp" in detail, detail
    assert "MiB in /dev/shm" in detail, detail
    usage = counted(caplog)
    assert usage.peak >= 40 * MIB
    assert usage.oom_kills >= 1


MANY = """i=0; while [ $i -lt 8 ]; do i=$((i+1)); python3 -c '
import sys, time
hoard = b"x" * (16 << 20)
print("held 16 MiB", file=sys.stderr, flush=True)
time.sleep(3)
' & done; wait; echo UNBOUNDED"""


@bounded
@pytest.mark.usefixtures("ws")
async def test_many_processes_each_under_the_limit_are_bounded_together(
    home: Home, caplog: pytest.LogCaptureFixture
) -> None:
    # Eight processes of 16 MiB each (and python's own), each far under 64 MiB.
    detail = failed(await shell(home, MANY, caplog))
    # `wait` ends 0: the kill is reported all the same, the output being incomplete.
    assert detail.startswith(
        "a process of the command was killed: it exceeded [runner] memory_limit_mib "
        "(64 MiB) (exit status 0"
    ), detail
    # Several got their 16 MiB (some then killed); together they reached the limit.
    assert detail.count("held 16 MiB") >= 3, detail
    usage = counted(caplog)
    assert usage.peak >= 48 * MIB
    assert usage.oom_kills >= 1


PAGE_CACHE = "head -c 41943040 /dev/zero > written && echo wrote 40 MiB"


@bounded
@pytest.mark.usefixtures("ws")
async def test_the_page_cache_of_what_the_command_writes_is_the_sandboxs(
    home: Home, caplog: pytest.LogCaptureFixture
) -> None:
    # 40 MiB written to a workspace file: its pages in the page cache are charged to the
    # sandbox's cgroup (reclaimable, so under the limit the command is not killed).
    answer = await shell(home, PAGE_CACHE, caplog)
    assert (answer["outcome"], answer["content"]) == ("ok", "wrote 40 MiB\n"), answer
    assert counted(caplog).peak >= 32 * MIB


CHAIN = (
    # Each process forks the next and waits for it, so one fork is in flight at a time:
    # concurrent forks can make RLIMIT_NPROC, counted before pids.max, refuse first.
    'f() { echo "depth $1" >&2; [ "$1" -lt 100 ] || exec sleep 1;'
    " f $(($1 + 1)) & wait $!; }; f 1 && echo UNBOUNDED"
)


@bounded
@pytest.mark.usefixtures("ws")
async def test_processes_forking_processes_are_stopped_at_pids_max(
    home: Home, caplog: pytest.LogCaptureFixture
) -> None:
    # 100 processes wanted, 24 tasks allowed (bwrap's two included).
    detail = failed(await shell(home, CHAIN, caplog))
    assert detail.startswith(
        "the command reached [runner] process_limit (24): a new process was refused "
        "(exit status 2: "
    ), detail
    assert "Cannot fork" in detail
    assert "UNBOUNDED" not in detail
    # The top shell, bwrap's two and 21 more: the 22nd process of the chain is refused.
    depth = max(int(n) for n in re.findall(r"depth (\d+)", detail))
    assert depth == 22, detail
    assert counted(caplog).forks_refused == 1


async def test_without_a_cgroup_the_owner_is_told_and_the_per_process_limits_hold(
    home: Home, ws: Path
) -> None:
    # A brokerd that can have no cgroup (an ordinary user without delegation): status
    # and `bxctl up` say so, and what RLIMIT_AS does not see goes through, as the
    # runbook says.
    why = "cgroup v2: brokerd's cgroup /user.slice is not writable by uid 1000"
    with trio.fail_after(LIMIT):
        async with running(home, cgroups=lambda boot: NoCgroups(why)):
            status = await admin(home, {"kind": "status"})
            warning = await trio.to_thread.run_sync(sandbox_bounds_warning, home)
            [answer] = await call(home, tool_request("shell", {"command": MEMFD}))
    bounds = (
        f"none: {why}; only the per-process limits (ulimit) hold, not a total of memory "
        "or processes; see docs/runbook.md#sandbox-limits"
    )
    assert status["sandbox_bounds"] == bounds
    assert warning == (
        "warning: no cgroup bounds the shell sandbox's memory and processes as a whole: " + bounds
    )
    assert answer["outcome"] == "ok", answer
    assert answer["content"].startswith("UNBOUNDED\n\n[stderr]\n"), answer
    assert answer["content"].endswith("held 256 MiB\n"), answer


async def test_with_a_cgroup_the_owner_is_not_warned(home: Home, ws: Path) -> None:
    if not CGROUPS:
        await owner_is_told(home)
        return
    with trio.fail_after(LIMIT):
        async with running(home):
            status = await admin(home, {"kind": "status"})
            warning = await trio.to_thread.run_sync(sandbox_bounds_warning, home)
    assert status["sandbox_bounds"].startswith("cgroup v"), status
    assert warning is None
