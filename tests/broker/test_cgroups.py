"""Each sandbox's cgroup (broker/cgroups.py, docs/runbook.md#sandbox-limits).

1. Which cgroups can be had, and how: :func:`plan_cgroups` on fixture texts of
   /proc/self/mountinfo and /proc/self/cgroup, with a probe that says what exists and is
   writable: v2 with a delegated subtree, v2's root, v2 without delegation, hybrid v1
   (this machine's texts), v1 without pids, v1 read-only, none.
2. The layer against the real hierarchies of the machine (skipped where brokerd, run
   by these tests, can have none): making the subtree and a child, its limits, a
   process joining through the sandbox's joiner, killing, removing, and the failure
   paths (a write the kernel refuses, rmdir's EBUSY, a subtree left by a dead brokerd).
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing
from tests.harness.runner import spec_for
from tests.harness.sandbox import AS_ROOT, CGROUPS, sandbox_workspace

from boxmaker.broker import sandbox
from boxmaker.broker.cgroup_plan import (
    CgroupPlan,
    Hierarchy,
    HostProbe,
    Mount,
    NoCgroups,
    parse_mountinfo,
    parse_self_cgroup,
    plan_cgroups,
)
from boxmaker.broker.cgroups import (
    JOIN_FAILED_WORDS,
    JOINER,
    SETPRIV_MISSING,
    CgroupError,
    CgroupTree,
    SandboxBounds,
    SandboxCgroup,
    remove_leftovers,
)
from boxmaker.broker.run_spec import RunSpec
from boxmaker.broker.runner import execute
from boxmaker.broker.sandbox_plan import Launch
from boxmaker.broker.sandbox_pool import SandboxPool
from boxmaker.core.reasons import Reason
from boxmaker.home.config import RunnerConfig

# --- 1. the plan, on fixture texts ---------------------------------------------------

ROOT_UID = 0
USER_UID = 1000


@attrs.frozen
class FakeProbe:
    """The machine as a fixture: file texts (existence) and what is writable."""

    files: Mapping[str, str] = attrs.Factory(dict)
    writable_paths: frozenset[str] = frozenset()

    def read(self, path: Path) -> str | None:
        return self.files.get(str(path))

    def exists(self, path: Path) -> bool:
        return str(path) in self.files

    def writable(self, path: Path) -> bool:
        return str(path) in self.writable_paths


def writable(directory: str) -> frozenset[str]:
    """A cgroup directory brokerd may write: the directory and its control files."""
    return frozenset(
        f"{directory}{name}" for name in ("", "/cgroup.procs", "/cgroup.subtree_control")
    )


PURE_V2_MOUNTS = """\
22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
24 22 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec shared:9 - cgroup2 cgroup2 rw,nsdelegate
"""
USER_SCOPE = "/user.slice/user-1000.slice/user@1000.service/app.slice/run-boxmaker.scope"
USER_SCOPE_DIR = f"/sys/fs/cgroup{USER_SCOPE}"

# This machine's texts (docs/runbook.md#sandbox-limits): v1 memory and pids, and a v2
# mount that carries no controller.
HYBRID_MOUNTS = """\
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
HYBRID_SELF = """\
9:name=systemd:/
8:pids:/
4:memory:/process_api/44008d19908584ec30c449bf075fa664
1:cpu:/
0::/
"""
HYBRID_MEMORY = "/sys/fs/cgroup/memory/process_api/44008d19908584ec30c449bf075fa664"


def test_v2_with_a_delegated_subtree_is_used_from_a_leaf() -> None:
    probe = FakeProbe(
        {
            f"{USER_SCOPE_DIR}/cgroup.controllers": "memory pids\n",
            f"{USER_SCOPE_DIR}/cgroup.type": "domain\n",
        },
        writable(USER_SCOPE_DIR),
    )
    plan = plan_cgroups(PURE_V2_MOUNTS, f"0::{USER_SCOPE}\n", uid=USER_UID, probe=probe)
    # Below the root: brokerd moves into a leaf before it hands the controllers down.
    assert plan == CgroupPlan(
        (Hierarchy(2, Path(USER_SCOPE_DIR), USER_SCOPE, frozenset({"memory", "pids"}), True),)
    )


def test_v2_root_holds_brokerd_and_needs_no_leaf() -> None:
    probe = FakeProbe(
        {"/sys/fs/cgroup/cgroup.controllers": "cpuset cpu io memory hugetlb pids rdma misc\n"},
        writable("/sys/fs/cgroup"),
    )
    plan = plan_cgroups(PURE_V2_MOUNTS, "0::/\n", uid=ROOT_UID, probe=probe)
    assert plan == CgroupPlan(
        (Hierarchy(2, Path("/sys/fs/cgroup"), "/", frozenset({"memory", "pids"}), False),)
    )


def test_v2_without_delegation_is_none_and_says_why() -> None:
    session = "/user.slice/user-1000.slice/session-3.scope"
    probe = FakeProbe({f"/sys/fs/cgroup{session}/cgroup.controllers": "memory pids\n"})
    plan = plan_cgroups(PURE_V2_MOUNTS, f"0::{session}\n", uid=USER_UID, probe=probe)
    assert plan == NoCgroups(
        f"cgroup v2: brokerd's cgroup {session} is not writable by uid 1000 "
        "(no subtree delegated to it)"
    )


def test_v2_without_the_memory_controller_is_none_and_says_why() -> None:
    probe = FakeProbe(
        {
            f"{USER_SCOPE_DIR}/cgroup.controllers": "pids\n",
            "/sys/fs/cgroup/cgroup.controllers": "cpu memory pids\n",
        },
        writable(USER_SCOPE_DIR),
    )
    plan = plan_cgroups(PURE_V2_MOUNTS, f"0::{USER_SCOPE}\n", uid=USER_UID, probe=probe)
    assert plan == NoCgroups(
        f"cgroup v2: brokerd's cgroup {USER_SCOPE} does not carry the memory controller"
    )


def test_hybrid_v1_uses_the_memory_and_pids_hierarchies() -> None:
    probe = FakeProbe(
        {"/sys/fs/cgroup/unified/cgroup.controllers": ""},
        frozenset({HYBRID_MEMORY, "/sys/fs/cgroup/pids", "/sys/fs/cgroup/unified"}),
    )
    plan = plan_cgroups(HYBRID_MOUNTS, HYBRID_SELF, uid=ROOT_UID, probe=probe)
    assert plan == CgroupPlan(
        (
            Hierarchy(
                1,
                Path(HYBRID_MEMORY),
                "/process_api/44008d19908584ec30c449bf075fa664",
                frozenset({"memory"}),
            ),
            Hierarchy(1, Path("/sys/fs/cgroup/pids"), "/", frozenset({"pids"})),
        )
    )


def test_v1_without_pids_bounds_memory_and_says_so() -> None:
    mounts = "\n".join(line for line in HYBRID_MOUNTS.splitlines() if "pids" not in line)
    probe = FakeProbe(writable_paths=frozenset({HYBRID_MEMORY}))
    plan = plan_cgroups(mounts, HYBRID_SELF, uid=ROOT_UID, probe=probe)
    assert isinstance(plan, CgroupPlan)
    assert [h.controllers for h in plan.hierarchies] == [frozenset({"memory"})]
    assert plan.missing == "no pids controller"


def test_v1_read_only_is_none_and_says_why() -> None:
    # A container's /sys/fs/cgroup mounted read-only, its own cgroup the mount's root.
    mounts = "35 31 0:32 /docker/abc /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup ro,memory\n"
    plan = plan_cgroups(mounts, "4:memory:/docker/abc\n", uid=ROOT_UID, probe=FakeProbe())
    assert plan == NoCgroups(
        "cgroup v1: brokerd's memory cgroup /docker/abc is not writable by root"
    )


def test_no_cgroup_file_system_is_none() -> None:
    mounts = "22 1 0:21 / /proc rw - proc proc rw\n"
    plan = plan_cgroups(mounts, "", uid=ROOT_UID, probe=FakeProbe())
    assert plan == NoCgroups("no cgroup file system is mounted")
    assert plan.describe() == (
        "none: no cgroup file system is mounted; only the per-process limits (ulimit) "
        "hold, not a total of memory or processes; see docs/runbook.md#sandbox-limits"
    )


def test_a_mount_shows_only_cgroups_under_its_root() -> None:
    # Mounted from /docker/abc: brokerd's /docker/abc/x is at the mount point's x; a
    # cgroup outside it is not reachable through this mount.
    mounts = "35 31 0:32 /docker/abc /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    inside = "/sys/fs/cgroup/memory/x"
    plan = plan_cgroups(
        mounts,
        "4:memory:/docker/abc/x\n",
        uid=ROOT_UID,
        probe=FakeProbe(writable_paths=frozenset({inside})),
    )
    assert isinstance(plan, CgroupPlan)
    assert plan.hierarchies[0].own == Path(inside)
    outside = plan_cgroups(mounts, "4:memory:/other\n", uid=ROOT_UID, probe=FakeProbe())
    assert outside == NoCgroups("no cgroup file system is mounted")


def test_mountinfo_escapes_and_controllers_are_read() -> None:
    text = (
        "35 31 0:32 / /sys/fs/cgroup/mem\\040ory rw - cgroup cgroup rw,memory,pids\n"
        "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
        "not a mountinfo line\n"
    )
    assert parse_mountinfo(text) == [
        Mount(Path("/sys/fs/cgroup/mem ory"), "/", 1, frozenset({"memory", "pids"})),
        Mount(Path("/sys/fs/cgroup/unified"), "/", 2, frozenset()),
    ]
    assert parse_self_cgroup("3:cpu,cpuacct:/a\n0::/b:c\nbad\n") == {
        "cpu": "/a",
        "cpuacct": "/a",
        "": "/b:c",
    }


# --- 2. the layer, against the machine's hierarchies ----------------------------------

needs_cgroups = pytest.mark.skipif(
    not CGROUPS, reason="brokerd can have no cgroup here (docs/runbook.md#sandbox-limits)"
)
MIB = 1 << 20


def machine_plan() -> CgroupPlan:
    texts = [Path(name).read_text() for name in ("/proc/self/mountinfo", "/proc/self/cgroup")]
    plan = plan_cgroups(*texts, uid=os.geteuid(), probe=HostProbe())
    assert isinstance(plan, CgroupPlan)
    return plan


@pytest.fixture
def tree(request: pytest.FixtureRequest) -> Iterator[CgroupTree]:
    """A subtree of this test's own, removed afterwards."""
    made = CgroupTree.make(machine_plan(), f"boxmaker-{os.getpid()}-b-test{id(request)}")
    try:
        yield made
    finally:
        made.remove()
        for hierarchy in made.plan.hierarchies:
            assert not (hierarchy.own / made.name).exists()


def read(path: Path) -> str:
    return path.read_text().strip()


def joined(cgroup: SandboxCgroup, *argv: str, capture: bool = False) -> subprocess.Popen[bytes]:
    """``argv`` started through the sandbox's joiner, in ``cgroup`` from its start."""
    output = subprocess.PIPE if capture else subprocess.DEVNULL
    return subprocess.Popen(
        ["/bin/sh", "-c", JOINER, "join", *cgroup.procs_files, "--", *argv],
        stdout=output,
        stderr=output,
    )


def await_processes(cgroup: SandboxCgroup, count: int) -> set[int]:
    deadline = time.monotonic() + 10
    while len(found := cgroup.processes()) != count:
        assert time.monotonic() < deadline, found
        time.sleep(0.01)
    return found


@needs_cgroups
def test_a_child_is_made_with_its_limits_and_removed(tree: CgroupTree) -> None:
    child = tree.child(memory=32 * MIB, processes=7)
    assert child.limit == 32 * MIB
    if child.version == 1:
        assert read(child.memory / "memory.limit_in_bytes") == str(32 * MIB)
        if tree.swap:
            assert read(child.memory / "memory.memsw.limit_in_bytes") == str(32 * MIB)
    else:
        assert read(child.memory / "memory.max") == str(32 * MIB)
    if child.pids is not None:
        assert read(child.pids / "pids.max") == "7"
    assert all(directory.is_dir() for directory in child.directories)
    assert child.remove() is None
    assert not any(directory.exists() for directory in child.directories)
    # Removing what is gone already is no failure.
    assert child.remove() is None


@needs_cgroups
def test_this_machine_bounds_memory_swap_and_pids(tree: CgroupTree) -> None:
    # CI and this machine: the v1 memory and pids controllers, swap accounted.
    if tree.plan.version != 1:
        pytest.skip("not a v1 machine")
    assert tree.describe() == "cgroup v1: memory+swap, pids"


@needs_cgroups
def test_a_joined_process_is_in_the_cgroup_from_its_start_and_killed_with_its_children(
    tree: CgroupTree,
) -> None:
    child = tree.child(memory=64 * MIB, processes=16)
    process = joined(child, "/bin/sh", "-c", "sleep 60 & sleep 60 & exec sleep 60")
    try:
        found = await_processes(child, 3)
        assert process.pid in found
        places = parse_self_cgroup(Path(f"/proc/{process.pid}/cgroup").read_text())
        for hierarchy in tree.plan.hierarchies:
            key = "" if hierarchy.version == 2 else next(iter(hierarchy.controllers))
            assert places[key] == f"{hierarchy.path.rstrip('/')}/{tree.name}/sandbox-1"
        # rmdir refuses while processes are in it.
        failure = child.remove()
        assert failure is not None
        assert failure.errno == errno.EBUSY
        child.kill()
        assert process.wait(10) == -signal.SIGKILL
        await_processes(child, 0)
    finally:
        process.kill()
        process.wait()
    assert child.remove() is None


@needs_cgroups
def test_the_joiner_fails_closed_when_it_cannot_join() -> None:
    done = subprocess.run(
        ["/bin/sh", "-c", JOINER, "join", "/nonexistent/cgroup.procs", "--", "echo", "RAN"],
        capture_output=True,
        check=False,
    )
    assert done.returncode == 125
    assert done.stdout == b""
    assert done.stderr.decode().strip().endswith(JOIN_FAILED_WORDS)


@needs_cgroups
def test_the_kernel_counts_an_oom_kill_and_a_refused_fork(tree: CgroupTree) -> None:
    child = tree.child(memory=16 * MIB, processes=3)
    memfd = (
        "import os\nfd = os.memfd_create('x')\n"
        "for _ in range(64):\n    os.write(fd, bytes(1 << 20))\nprint('UNBOUNDED')"
    )
    process = joined(child, "/usr/bin/python3", "-c", memfd, capture=True)
    out, _ = process.communicate(timeout=30)
    assert (process.returncode, out) == (-signal.SIGKILL, b"")
    usage = child.usage()
    assert usage.oom_kills == 1
    assert usage.memory_peak is not None
    assert 8 * MIB < usage.memory_peak <= 16 * MIB
    if child.pids is not None:
        forks = joined(child, "/bin/sh", "-c", "sleep 1 & sleep 1 & sleep 1 & wait", capture=True)
        _, err = forks.communicate(timeout=30)
        assert b"Cannot fork" in err, err
        assert child.usage().forks_refused >= 1
        # The sleeps it did start outlive it: kill them.
        child.kill()
        await_processes(child, 0)
    assert child.remove() is None


@needs_cgroups
def test_a_write_the_kernel_refuses_leaves_no_cgroup(tree: CgroupTree) -> None:
    if tree.plan.version != 1 or len(tree.plan.hierarchies) != 2:
        pytest.skip("needs v1 memory and pids")
    # pids.max takes no negative number: the memory child made first is removed again.
    with pytest.raises(CgroupError) as raised:
        tree.child(memory=64 * MIB, processes=-1)
    assert raised.value.errno == errno.EINVAL
    assert str(raised.value.strerror).endswith("/sandbox-1/pids.max: Invalid argument")
    for hierarchy in tree.plan.hierarchies:
        assert list((hierarchy.own / tree.name).glob("sandbox-*")) == []


@needs_cgroups
def test_a_subtree_removed_by_hand_is_made_again(tree: CgroupTree) -> None:
    for hierarchy in tree.plan.hierarchies:
        (hierarchy.own / tree.name).rmdir()
    child = tree.child(memory=64 * MIB, processes=8)
    assert all(directory.is_dir() for directory in child.directories)
    assert child.remove() is None


@needs_cgroups
def test_leftovers_of_a_dead_brokerd_are_killed_and_removed_and_nothing_else(
    tree: CgroupTree,
) -> None:
    ended = subprocess.Popen(["true"])
    ended.wait()
    own = tree.plan.hierarchies[0].own
    dead = own / f"boxmaker-{ended.pid}-b-0123456789abcdef"
    (dead / "sandbox-3").mkdir(parents=True)
    # A sandbox that outlived its brokerd (killed while bwrap set up: bwrap's
    # --die-with-parent came too late), and one of ours, which runs on.
    orphan = SandboxCgroup(tree.plan.version, dead / "sandbox-2", None, 0)
    orphan.memory.mkdir()
    ours = tree.child(memory=64 * MIB, processes=8)
    orphaned, running = joined(orphan, "sleep", "60"), joined(ours, "sleep", "60")
    try:
        await_processes(orphan, 1)
        await_processes(ours, 1)
        assert remove_leftovers(own) == [dead.name]
        assert orphaned.wait(10) == -signal.SIGKILL
        assert not dead.exists()
        assert running.poll() is None
        assert (own / tree.name).is_dir()
    finally:
        for process in (orphaned, running):
            process.kill()
            process.wait()
        await_processes(ours, 0)
        assert ours.remove() is None


@needs_cgroups
async def test_close_kills_what_is_left_and_a_busy_cgroup_is_logged_not_raised(
    tree: CgroupTree, caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock
) -> None:
    child = tree.child(memory=64 * MIB, processes=8)
    process = joined(child, "sleep", "60")
    await_processes(child, 1)
    # A cgroup below it keeps it busy for ever: rmdir fails EBUSY at every try.
    blocker = child.memory / "below"
    blocker.mkdir()
    try:
        with caplog.at_level(logging.WARNING, "boxmaker.brokerd.sandbox"):
            await sandbox._remove_cgroup(child)
        assert process.wait(10) == -signal.SIGKILL
        [record] = caplog.records
        assert record.getMessage() == (
            f"the sandbox's cgroup {child.memory} could not be removed: Device or resource busy"
        )
    finally:
        process.kill()
        process.wait()
        blocker.rmdir()
    assert child.remove() is None


def test_no_cgroup_description_names_the_runbook() -> None:
    assert NoCgroups("x").describe().endswith("; see docs/runbook.md#sandbox-limits")


# --- 3. a sandbox in its cgroup ----------------------------------------------------------


@pytest.fixture
def ws() -> Iterator[Path]:
    with sandbox_workspace() as workspace:
        yield workspace


def shell_spec(ws: Path, command: str) -> RunSpec:
    config = RunnerConfig(memory_limit_mib=64, process_limit=24)
    return spec_for("shell", {"command": command}, ws, config=config)


@needs_cgroups
async def test_bwrap_and_all_it_starts_are_in_the_cgroup_before_the_command(
    tree: CgroupTree, ws: Path
) -> None:
    launch = shell_spec(ws, "true").sandbox
    assert isinstance(launch, Launch)
    pool = SandboxPool(SandboxBounds(tree))
    async with pool.sandbox(launch) as box:
        assert box.cgroup is not None
        # bwrap, the sandbox's pid 1 and the launcher waiting for its command.
        found = await_processes(box.cgroup, 3)
        assert box.process.pid in found
        run = await box.run("cat /proc/self/cgroup", time_limit=30, output_cap=4096)
        directories = box.cgroup.directories
    # In a cgroup namespace rooted at its own cgroup: no host cgroup path inside.
    places = parse_self_cgroup(bytes(run.out.head).decode())
    assert (places["memory"], places.get("pids", "/")) == ("/", "/")
    assert not any(directory.exists() for directory in directories)


@needs_cgroups
async def test_a_sandbox_whose_cgroup_cannot_be_made_does_not_run(
    tree: CgroupTree, ws: Path
) -> None:
    # Its name is taken: mkdir fails, and the call fails closed.
    for hierarchy in tree.plan.hierarchies:
        (hierarchy.own / tree.name / "sandbox-1").mkdir()
    try:
        result = await execute(shell_spec(ws, "touch ran"), SandboxPool(SandboxBounds(tree)))
    finally:
        for hierarchy in tree.plan.hierarchies:
            (hierarchy.own / tree.name / "sandbox-1").rmdir()
    assert (result.reason, result.detail) == (
        Reason.SANDBOX_UNAVAILABLE,
        f"the sandbox's cgroup could not be made: "
        f"{tree.plan.hierarchies[0].own / tree.name / 'sandbox-1'}: File exists; "
        "see docs/runbook.md#sandbox-limits",
    )
    assert not (ws / "ran").exists()


@needs_cgroups
@pytest.mark.skipif(not AS_ROOT, reason="setpriv is needed by brokerd as root only")
async def test_as_root_without_setpriv_the_shell_fails_closed(tree: CgroupTree, ws: Path) -> None:
    bounds = SandboxBounds(tree, setpriv=None)
    assert bounds.describe() == f"refused: {SETPRIV_MISSING} ({tree.describe()})"
    result = await execute(shell_spec(ws, "touch ran"), SandboxPool(bounds))
    assert (result.reason, result.detail) == (Reason.SANDBOX_UNAVAILABLE, SETPRIV_MISSING)
    assert SETPRIV_MISSING.endswith("; see docs/runbook.md#sandbox-limits")
    assert not (ws / "ran").exists()


@needs_cgroups
@pytest.mark.parametrize("ending", ["time limit", "cancelled"])
async def test_a_call_that_ends_early_leaves_no_process_and_no_cgroup(
    tree: CgroupTree, ws: Path, ending: str
) -> None:
    # The command and a process it started in the background still run when the call
    # ends: at its time limit, or cancelled (its requester left).
    launch = shell_spec(ws, "true").sandbox
    assert isinstance(launch, Launch)
    pool = SandboxPool(SandboxBounds(tree))
    with trio.move_on_after(1 if ending == "cancelled" else 30):
        async with pool.sandbox(launch) as box:
            assert box.cgroup is not None
            cgroup = box.cgroup
            limit = 0.5 if ending == "time limit" else None
            run = await box.run("sleep 60 & exec sleep 60", time_limit=limit, output_cap=4096)
            assert run.timed_out
    assert not any(directory.exists() for directory in cgroup.directories)


def test_a_subtree_that_cannot_be_made_leaves_nothing(tmp_path: Path) -> None:
    # The second hierarchy's directory is gone: what the first got is removed again.
    (tmp_path / "memory").mkdir()
    plan = CgroupPlan(
        (
            Hierarchy(1, tmp_path / "memory", "/", frozenset({"memory"})),
            Hierarchy(1, tmp_path / "gone", "/", frozenset({"pids"})),
        )
    )
    with pytest.raises(CgroupError) as raised:
        CgroupTree.make(plan, "boxmaker-1-b-x")
    assert raised.value.strerror == f"{tmp_path}/gone/boxmaker-1-b-x: No such file or directory"
    assert list((tmp_path / "memory").iterdir()) == []
