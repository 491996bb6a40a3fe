"""Workspaces the shell sandbox can use, whoever runs the tests.

brokerd as root runs the sandbox as the workspace's owner, never as root
(docs/runbook.md#sandbox-as-root). As root (CI), a test's workspace therefore belongs to
an ordinary uid, in a directory that uid can walk to (pytest's tmp_path is under a 0700
directory of root's).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import trio

from boxmaker.broker.cgroup_plan import CgroupPlan, HostProbe, plan_cgroups
from boxmaker.home.paths import Home

SANDBOX_UID: Final = 65534
"""The ordinary uid (and gid) that owns a test workspace when the tests run as root."""
AS_ROOT: Final = os.geteuid() == 0


@contextlib.contextmanager
def sandbox_workspace() -> Iterator[Path]:
    """An empty workspace the sandbox can reach and write, removed afterwards. Its
    parent (``ws.parent``) is reachable too: a place for fake programs."""
    base = Path(tempfile.mkdtemp(prefix="bx-ws-", dir="/tmp"))
    try:
        base.chmod(0o711)
        workspace = base / "ws"
        workspace.mkdir()
        if AS_ROOT:
            os.chown(workspace, SANDBOX_UID, SANDBOX_UID)
        yield workspace
    finally:
        shutil.rmtree(base, ignore_errors=True)


def use_sandbox_workspace(home: Home, workspace: Path) -> None:
    """Name ``workspace`` (from :func:`sandbox_workspace`) in ``home``'s config.toml,
    above its tables. As root the home's own workspace is root's, and a shell call there
    is denied ``sandbox_unavailable`` before anyone is asked
    (docs/runbook.md#sandbox-as-root): a test that asks about a shell call needs this."""
    config = home.config_toml.read_text()
    home.config_toml.write_text(f"workspace = {str(workspace)!r}\n{config}")


def processes_with(marker: str) -> list[int]:
    """The host pids whose command line holds ``marker`` (a sandboxed ``sleep 31.4159``
    is seen from the host under its own argv)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(entry.name))
    return found


async def wait_gone(marker: str, within: float = 3.0) -> list[int]:
    """The processes with ``marker`` still there after ``within`` seconds at most (real
    time; empty as soon as they are gone)."""
    with trio.move_on_after(within):
        while processes_with(marker):  # noqa: ASYNC110  (polling /proc: no event to wait on)
            await trio.sleep(0.02)
    return processes_with(marker)


def _cgroups_here() -> bool:
    """Can brokerd, run by these tests, give each sandbox a cgroup of its own here
    (docs/runbook.md#sandbox-limits)? Decided as brokerd decides, without making one."""
    try:
        texts = [Path(name).read_text() for name in ("/proc/self/mountinfo", "/proc/self/cgroup")]
    except OSError:
        return False
    plan = plan_cgroups(*texts, uid=os.geteuid(), probe=HostProbe())
    return isinstance(plan, CgroupPlan) and (not AS_ROOT or shutil.which("setpriv") is not None)


CGROUPS: Final = _cgroups_here()
"""Each sandbox is in a cgroup of its own (as root on a machine with cgroups, as CI is, or
as a user with a subtree delegated to it, as tools/run_as_user.py gives one)."""
