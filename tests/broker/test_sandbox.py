"""The shell sandbox set up ahead of its call (broker/sandbox.py, broker/sandbox_pool.py,
docs/decisions.md, "The runner and the sandbox").

The runner's tests (test_runner.py) check what a sandbox lets a command do; these check
that a sandbox set up ahead changes nothing of that: the command arrives exactly, each
sandbox serves one call, and a sandbox is used only when it matches and is young enough.
Time is the mock clock's: ``mock_clock`` never moves unless a test jumps it.
"""

from __future__ import annotations

import errno
import shutil
import struct
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.harness.sandbox import AS_ROOT, SANDBOX_UID, sandbox_workspace
from trio.testing import MockClock, wait_all_tasks_blocked

from boxmaker.broker.sandbox import WARM_MAX_AGE, Sandbox, ShellRun
from boxmaker.broker.sandbox_plan import Launch, SandboxLimits, SandboxUser, sandbox_argv
from boxmaker.broker.sandbox_pool import SandboxPool
from boxmaker.broker.seccomp import filter_program

BWRAP = shutil.which("bwrap")
pytestmark = pytest.mark.skipif(BWRAP is None, reason="bubblewrap is not installed")
# As root (CI), the sandbox runs as an ordinary uid that owns the workspace: never root.
USER = SandboxUser(SANDBOX_UID, SANDBOX_UID) if AS_ROOT else None


def argv_for(workspace: Path) -> Launch:
    assert BWRAP is not None
    return Launch(sandbox_argv(BWRAP, workspace), USER)


@pytest.fixture
def ws() -> Iterator[Path]:
    with sandbox_workspace() as workspace:
        yield workspace


@asynccontextmanager
async def running_pool() -> AsyncIterator[SandboxPool]:
    pool = SandboxPool()
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        yield pool
        nursery.cancel_scope.cancel()


async def shell(pool: SandboxPool, argv: Launch, command: str) -> ShellRun:
    async with pool.sandbox(argv) as sandbox:
        return await sandbox.run(command, time_limit=30, output_cap=65536)


def stdout(run: ShellRun) -> str:
    assert (run.ran, run.returncode, run.timed_out) == (True, 0, False), run
    return bytes(run.out.head).decode()


async def test_nothing_is_set_up_before_the_first_shell_call(ws: Path) -> None:
    async with running_pool() as pool:
        await wait_all_tasks_blocked()
        assert pool.warm is None
        assert stdout(await shell(pool, argv_for(ws), "echo first")) == "first\n"
        await wait_all_tasks_blocked()
        assert pool.warm is not None


async def test_the_next_call_uses_the_sandbox_set_up_after_the_last(
    ws: Path, mock_clock: MockClock
) -> None:
    argv = argv_for(ws)
    async with running_pool() as pool:
        await shell(pool, argv, "true")
        await wait_all_tasks_blocked()
        warm = pool.warm
        assert warm is not None
        assert warm.process.poll() is None
        async with pool.sandbox(argv) as sandbox:
            assert sandbox is warm
            assert pool.warm is None
            assert stdout(await sandbox.run("echo two", time_limit=30, output_cap=99)) == "two\n"
        # Torn down after its one call, and the next one set up.
        assert warm.process.returncode is not None
        await wait_all_tasks_blocked()
        assert pool.warm is not None
        assert pool.warm is not warm


async def test_nothing_of_one_call_is_seen_by_the_next(ws: Path) -> None:
    argv = argv_for(ws)
    async with running_pool() as pool:
        assert stdout(await shell(pool, argv, "echo left > /tmp/left; echo ok")) == "ok\n"
        await wait_all_tasks_blocked()
        assert pool.warm is not None
        run = await shell(pool, argv, "test -e /tmp/left")
        assert (run.ran, run.returncode) == (True, 1)
        # The sandbox's pid namespace is new too: its init and the command, nothing else.
        listing = stdout(await shell(pool, argv, "ls /proc | grep -c '^[0-9]'"))
        assert int(listing) <= 4, listing


async def test_a_sandbox_of_another_argv_is_torn_down_unused() -> None:
    with sandbox_workspace() as first, sandbox_workspace() as second:
        await _another_argv(first, second)


async def _another_argv(first: Path, second: Path) -> None:
    async with running_pool() as pool:
        await shell(pool, argv_for(first), "true")
        await wait_all_tasks_blocked()
        warm = pool.warm
        assert warm is not None
        async with pool.sandbox(argv_for(second)) as sandbox:
            assert sandbox is not warm
            await sandbox.run("echo here > where", time_limit=30, output_cap=99)
        assert (second / "where").read_text() == "here\n"
        assert not (first / "where").exists()
        await wait_all_tasks_blocked()
        assert warm.process.returncode is not None
        assert pool.warm is not None
        assert pool.warm.launch == argv_for(second)


@pytest.mark.parametrize(("age", "used"), [(WARM_MAX_AGE - 0.001, True), (WARM_MAX_AGE, False)])
async def test_a_sandbox_is_used_only_while_younger_than_the_limit(
    ws: Path, mock_clock: MockClock, age: float, used: bool
) -> None:
    argv = argv_for(ws)
    async with running_pool() as pool:
        await shell(pool, argv, "true")
        await wait_all_tasks_blocked()
        warm = pool.warm
        assert warm is not None
        mock_clock.jump(age)
        async with pool.sandbox(argv) as sandbox:
            assert (sandbox is warm) is used
            assert stdout(await sandbox.run("echo ran", time_limit=30, output_cap=99)) == "ran\n"
        await wait_all_tasks_blocked()
        assert warm.process.returncode is not None


async def test_stopping_the_pool_tears_the_waiting_sandbox_down(ws: Path) -> None:
    async with running_pool() as pool:
        await shell(pool, argv_for(ws), "true")
        await wait_all_tasks_blocked()
        warm = pool.warm
        assert warm is not None
    assert warm.process.returncode is not None
    assert pool.warm is None


async def test_a_pool_that_is_not_running_sets_up_nothing_ahead(ws: Path) -> None:
    pool = SandboxPool()
    assert stdout(await shell(pool, argv_for(ws), "echo own")) == "own\n"
    await wait_all_tasks_blocked()
    assert pool.warm is None


# What the command sees of itself: /proc/$$/cmdline is the shell's argv. `exit` stops
# the shell before it parses the rest, so the payload can be anything at all.
SELF = "cat /proc/$$/cmdline; exit 0\n"


@settings(max_examples=30, deadline=None)
@given(
    payload=st.text(
        alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"),
        max_size=200,
    )
)
async def test_the_command_reaches_the_shell_exactly(payload: str) -> None:
    command = SELF + payload
    run = await shell(SandboxPool(), argv_for(Path("/tmp")), command)
    assert bytes(run.out.head) == b"/bin/sh\0-c\0" + command.encode() + b"\0"


async def test_a_long_command_is_handed_over_whole(ws: Path) -> None:
    # More than a pipe's buffer (64 KiB), less than one argument may be (128 KiB): the
    # hand-over must not block the trio thread.
    command = "echo " + "x" * 100_000 + " | wc -c"
    assert stdout(await shell(SandboxPool(), argv_for(ws), command)) == "100001\n"


# --- never root, and never without the seccomp filter ----------------------------------


@pytest.mark.parametrize("user", [SandboxUser(0, 0), SandboxUser(0, 65534)])
def test_a_sandbox_never_starts_as_root(ws: Path, user: SandboxUser) -> None:
    launch = Launch(argv_for(ws).argv, user)
    with pytest.raises(OSError, match=r"the sandbox never runs as host root \(uid 0\)"):
        Sandbox.start(launch)


def test_a_sandbox_never_starts_in_the_root_group(ws: Path) -> None:
    launch = Launch(argv_for(ws).argv, SandboxUser(65534, 0))
    with pytest.raises(OSError, match=r"never runs in the host's root group \(gid 0\)"):
        Sandbox.start(launch)


@pytest.mark.skipif(not AS_ROOT, reason="brokerd's own uid is root only when run as root")
def test_as_root_a_sandbox_without_a_user_is_refused(ws: Path) -> None:
    with pytest.raises(OSError, match=r"never runs as host root"):
        Sandbox.start(Launch(argv_for(ws).argv, None))


def test_without_a_filter_for_the_architecture_nothing_starts(ws: Path) -> None:
    with pytest.raises(OSError, match=r"no seccomp filter for this architecture"):
        Sandbox.start(argv_for(ws), seccomp_filter=lambda: None)


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_filter_is_classic_bpf_ending_in_its_returns(machine: str) -> None:
    program = filter_program(machine)
    assert program is not None
    assert len(program) % 8 == 0
    # struct sock_filter: u16 code, u8 jt, u8 jf, u32 k; the last four are returns.
    codes = [struct.unpack("=HBBI", program[at : at + 8]) for at in range(0, len(program), 8)]
    assert len(codes) < 64
    assert [(code, k) for code, _, _, k in codes[-4:]] == [
        (0x06, 0x7FFF0000),  # allow
        (0x06, 0x00050000 | errno.EPERM),  # a setuid/setgid mode
        (0x06, 0x00050000 | errno.EPERM),  # another ABI
        (0x06, 0x00050000 | errno.ENOSYS),  # openat2, io_uring_setup
    ]
    # Every jump lands inside the program.
    for at, (code, jt, jf, _) in enumerate(codes):
        if code & 0x07 == 0x05:  # BPF_JMP
            assert at + 1 + max(jt, jf) < len(codes)


def test_there_is_no_filter_for_an_unknown_architecture() -> None:
    assert filter_program("riscv64") is None
    assert filter_program("i686") is None


async def test_the_limits_reach_the_command(ws: Path) -> None:
    assert BWRAP is not None
    limits = SandboxLimits(memory=300 << 20, processes=40, file_size=5 << 20, cpu_time=9)
    launch = Launch(sandbox_argv(BWRAP, ws, limits), USER, limits)
    command = "grep -E '^Max (cpu time|file size|processes|address space) ' /proc/self/limits"
    lines = stdout(await shell(SandboxPool(), launch, command)).splitlines()
    assert [line.split()[-3:] for line in lines] == [
        ["9", "10", "seconds"],
        [str(5 << 20), str(5 << 20), "bytes"],
        ["40", "40", "processes"],
        [str(300 << 20), str(300 << 20), "bytes"],
    ]
