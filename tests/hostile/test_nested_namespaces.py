"""Hostile: a sandboxed command that reaches for the kernel through a nested user
namespace, the mount API, the keyring, a faked terminal input, or another ABI's entry.

Replayed black-box against the real brokerd (serve() on its real Unix sockets, real
bwrap). Before the fix, ``unshare -Urn`` in the sandbox held every capability in a new
user namespace (CapEff 000001ffffffffff) with its own network namespace: the way in to
most recent local privilege escalations (nf_tables, fs_context). Now bwrap's
``--disable-userns`` makes a nested user namespace fail (ENOSPC), and the seccomp filter
refuses unshare, setns, the mount calls, clone with CLONE_NEWUSER, the keyring, bpf,
perf_event_open, userfaultfd, TIOCSTI and TIOCLINUX (EPERM), and clone3 and the new mount
API (ENOSYS). Raw calls are made by tests/hostile/syscall_probe.py with the host's
/usr/bin/python3 and ctypes, so no tool's own checks stand in between; the same probe
run on the host shows each number is the call it claims to be (its answer there is not
the filter's). (docs/runbook.md#sandbox, docs/threat-model.md)
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import shutil
import stat
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest
import trio
from tests.harness.broker import call, records_of, running, tool_request
from tests.harness.homes import grant, write_config, write_grants
from tests.harness.sandbox import AS_ROOT, SANDBOX_UID, sandbox_workspace

from boxmaker.broker.sandbox import Sandbox
from boxmaker.broker.sandbox_plan import Launch, SandboxUser, sandbox_argv
from boxmaker.home.paths import Home

BWRAP = shutil.which("bwrap")
pytestmark = pytest.mark.skipif(BWRAP is None, reason="needs bubblewrap")
LIMIT = 60.0
"""Real seconds for one test: bwrap runs for real."""
PROBE = Path(__file__).with_name("syscall_probe.py")
PYTHON = "/usr/bin/python3"
NO_PYTHON = f"{PYTHON} is missing in the sandbox: these tests need it (Debian has it)"
MACHINE = platform.machine()
x86_64_only = pytest.mark.skipif(
    MACHINE != "x86_64", reason="the x32 and i386 entries are x86_64's"
)
SETID_CALLS = (
    "chmod",
    "fchmod",
    "fchmodat",
    "fchmodat2",
    "open",
    "openat",
    "creat",
    "mknod",
    "mknodat",
)
ON_AARCH64 = ("fchmod", "fchmodat", "fchmodat2", "openat", "mknodat")
"""aarch64 has only the *at calls (and fchmod)."""
MODE_CHANGERS = ("chmod", "fchmod", "fchmodat", "fchmodat2")
"""Calls that change an existing file's mode (0o644 before); the others create one."""
REFUSED: Final = {
    "mount": "EPERM",
    "umount2": "EPERM",
    "pivot_root": "EPERM",
    "chroot": "EPERM",
    "setns": "EPERM",
    "open_tree": "ENOSYS",
    "move_mount": "ENOSYS",
    "fsopen": "ENOSYS",
    "fsconfig": "ENOSYS",
    "fsmount": "ENOSYS",
    "fspick": "ENOSYS",
    "mount_setattr": "ENOSYS",
    "add_key": "EPERM",
    "request_key": "EPERM",
    "keyctl": "EPERM",
    "bpf": "EPERM",
    "perf_event_open": "EPERM",
    "userfaultfd": "EPERM",
}
"""What the filter answers, for calls the probe makes with arguments the host answers
otherwise (ENOENT for a missing path, EBADF, EINVAL...)."""
NEED_PRIVILEGE = ("mount", "umount2", "pivot_root", "chroot")
"""An ordinary uid gets EPERM for these on the host too: only root's control shows
their numbers."""


@pytest.fixture
def ws(home: Home) -> Iterator[Path]:
    """A workspace an ordinary uid owns (as root), with the probe in it."""
    with sandbox_workspace() as workspace:
        shutil.copy(PROBE, workspace / "probe.py")
        write_config(home, f"workspace = {str(workspace)!r}\n")
        write_grants(home, grant("sh", "shell", "auto"))
        yield workspace


async def shell(home: Home, command: str) -> dict[str, Any]:
    """The answer to one shell call, checked against its result record."""
    with trio.fail_after(LIMIT):
        async with running(home):
            frame = tool_request("shell", {"command": command})
            [answer] = await call(home, frame)
    result = records_of(home, frame["call"])[-1]
    assert (result["kind"], result["status"]) == ("result", answer["outcome"]), result
    return answer


def probe_report(stdout: str) -> dict[str, str]:
    [line] = [line for line in stdout.splitlines() if line.startswith("PROBE-RAN ")]
    report: dict[str, str] = json.loads(line.removeprefix("PROBE-RAN "))
    return report


async def in_sandbox(home: Home, *names: str) -> dict[str, str]:
    """The probe's report for ``names``, run in the sandbox by brokerd."""
    command = (
        f"[ -x {PYTHON} ] || {{ echo '{NO_PYTHON}' >&2; exit 97; }}; "
        f"exec {PYTHON} probe.py {shlex.join(names)}"
    )
    answer = await shell(home, command)
    if NO_PYTHON in answer.get("detail", ""):
        pytest.fail(NO_PYTHON)
    assert answer["outcome"] == "ok", answer
    report = probe_report(answer["content"].split("\n[stderr]\n")[0])
    assert list(report) == list(names)
    return report


async def on_host(where: Path, *names: str) -> dict[str, str]:
    """The probe's report for ``names`` on the host, with no filter: the control. A
    host under a seccomp filter of its own (a container's) proves nothing: skipped."""
    status = Path("/proc/self/status").read_text()  # noqa: ASYNC240  (procfs, no disk)
    if "\nSeccomp:\t0\n" not in status:
        pytest.skip("the tests run under a seccomp filter of their own: no host control")
    done = await trio.run_process(
        [PYTHON, str(PROBE), *names], cwd=where, capture_stdout=True, capture_stderr=True
    )
    return probe_report(done.stdout.decode())


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def no_setid_file_in(ws: Path) -> None:
    for path in ws.rglob("*"):
        info = path.lstat()
        assert not info.st_mode & (stat.S_ISUID | stat.S_ISGID), (path, oct(info.st_mode))


# --- 1. no nested user namespace -------------------------------------------------------


async def test_unshare_makes_no_user_namespace_and_gets_no_capabilities(
    home: Home, ws: Path
) -> None:
    answer = await shell(
        home,
        'command -v unshare; unshare -Ur true; echo "status $?"; '
        'unshare -Urn grep CapEff /proc/self/status; echo "status $?"',
    )
    assert answer["outcome"] == "ok", answer
    stdout, _, stderr = answer["content"].partition("\n[stderr]\n")
    # The tool is there and ran: it printed why it failed, twice.
    assert stdout.splitlines() == ["/usr/bin/unshare", "status 1", "status 1"], stdout
    assert stderr.splitlines() == ["unshare: unshare failed: Operation not permitted"] * 2


async def test_without_the_filter_bwrap_still_refuses_a_nested_user_namespace(ws: Path) -> None:
    # The second layer alone: the real sandbox argv, a filter that allows everything.
    assert BWRAP is not None
    allow_all = struct.pack("=HBBI", 0x06, 0, 0, 0x7FFF0000)
    user = SandboxUser(SANDBOX_UID, SANDBOX_UID) if AS_ROOT else None
    sandbox = Sandbox.start(Launch(sandbox_argv(BWRAP, ws), user), seccomp_filter=lambda: allow_all)
    try:
        run = await sandbox.run(
            'unshare -Ur true; echo "status $?"; grep Seccomp: /proc/self/status',
            time_limit=LIMIT,
            output_cap=4096,
        )
    finally:
        await sandbox.close()
    assert run.ran
    # The allow-all filter is loaded (mode 2), and unshare itself ran and was refused.
    assert bytes(run.out.head).decode().splitlines() == ["status 1", "Seccomp:\t2"]
    assert run.err.last_words() == "unshare: unshare failed: No space left on device"


async def test_clone_with_a_new_user_namespace_is_refused(home: Home, ws: Path) -> None:
    names = (
        "clone",
        "clone NEWUSER",
        "clone NEWUSER|NEWNET",
        "unshare NEWUSER",
        "unshare bad flags",
    )
    assert await in_sandbox(home, *names) == {
        "clone": "ok",  # the control: the same raw clone without CLONE_NEWUSER
        "clone NEWUSER": "EPERM",
        "clone NEWUSER|NEWNET": "EPERM",
        "unshare NEWUSER": "EPERM",
        "unshare bad flags": "EPERM",
    }
    # The numbers are the calls': on the host, the kernel itself answers.
    assert await on_host(ws.parent, "unshare bad flags") == {"unshare bad flags": "EINVAL"}


async def test_clone3_is_not_there(home: Home, ws: Path) -> None:
    assert await in_sandbox(home, "clone3 NEWUSER", "clone3 no args") == {
        "clone3 NEWUSER": "ENOSYS",
        "clone3 no args": "ENOSYS",
    }
    # The host's kernel has clone3: it checks the (missing) arguments.
    assert await on_host(ws.parent, "clone3 no args") == {"clone3 no args": "EINVAL"}


async def test_mount_keyring_and_kernel_interfaces_are_refused(home: Home, ws: Path) -> None:
    assert await in_sandbox(home, *REFUSED) == REFUSED
    host = await on_host(ws.parent, *REFUSED)
    checkable = [name for name in REFUSED if AS_ROOT or name not in NEED_PRIVILEGE]
    same = {name: host[name] for name in checkable if host[name] == REFUSED[name]}
    assert same == {}, f"the host answers these as the filter does: {same}"


# --- 2. no setuid or setgid file, by any call ------------------------------------------


@pytest.mark.parametrize("name", SETID_CALLS)
async def test_no_call_makes_a_setid_file(home: Home, ws: Path, name: str) -> None:
    if MACHINE == "aarch64" and name not in ON_AARCH64:
        pytest.skip(f"aarch64 has no {name}")
    modes = ("4755", "2755", "6755", "755")
    report = await in_sandbox(home, *(f"{name} {mode}" for mode in modes))
    if name == "fchmodat2" and report["fchmodat2 755"] == "ENOSYS":
        pytest.skip("this kernel has no fchmodat2 (Linux 6.6)")
    assert report == {
        f"{name} 4755": "EPERM",
        f"{name} 2755": "EPERM",
        f"{name} 6755": "EPERM",
        f"{name} 755": "ok",  # the control: the same call without the setid bits
    }
    if name in MODE_CHANGERS:
        found = {mode: mode_of(ws / f"{name}-{mode}") for mode in modes}
        assert found == {"4755": 0o644, "2755": 0o644, "6755": 0o644, "755": 0o755}
    else:
        made = sorted(path.name for path in ws.glob(f"{name}-*"))  # noqa: ASYNC240  (run over)
        assert made == [f"{name}-755"]
        assert mode_of(ws / f"{name}-755") == 0o755
    assert (ws / f"{name}-755").stat().st_uid == (SANDBOX_UID if AS_ROOT else os.getuid())
    no_setid_file_in(ws)


@x86_64_only
async def test_the_x32_entry_is_refused(home: Home, ws: Path) -> None:
    names = ("x32 chmod 4755", "x32 getpid")
    assert await in_sandbox(home, *names) == dict.fromkeys(names, "EPERM")
    assert mode_of(ws / "x32-4755") == 0o644
    # Without the filter the kernel answers (ENOSYS where x32 is not built in).
    host = await on_host(ws.parent, "x32 getpid")
    assert host["x32 getpid"] in ("ENOSYS", "ok")


@x86_64_only
async def test_the_i386_entry_is_refused(home: Home, ws: Path) -> None:
    names = ("i386 chmod 4755", "i386 chmod 755", "i386 getpid")
    assert await in_sandbox(home, *names) == dict.fromkeys(names, "EPERM")
    assert mode_of(ws / "i386-4755") == 0o644
    assert mode_of(ws / "i386-755") == 0o644
    # The machine code works: on the host, int 0x80 changes a mode and knows its pid.
    host = await on_host(ws.parent, "i386 chmod 755", "i386 getpid")
    assert host == {"i386 chmod 755": "ok", "i386 getpid": "pid"}
    assert mode_of(ws.parent / "i386-755") == 0o755


async def test_terminal_input_cannot_be_faked(home: Home, ws: Path) -> None:
    names = ("TCGETS", "TIOCSTI", "TIOCSTI high", "TIOCLINUX", "TIOCLINUX high")
    assert await in_sandbox(home, *names) == {
        "TCGETS": "ok",  # the control: a real terminal, and ioctl works on it
        "TIOCSTI": "EPERM",
        "TIOCSTI high": "EPERM",
        "TIOCLINUX": "EPERM",
        "TIOCLINUX high": "EPERM",
    }
    # The kernel reads the request's low 32 bits only: the high ones change nothing.
    host = await on_host(ws.parent, "TIOCSTI", "TIOCSTI high", "TIOCLINUX high")
    assert host["TIOCSTI high"] == host["TIOCSTI"] != "EPERM"
    assert host["TIOCLINUX high"] == "ENOTTY"
