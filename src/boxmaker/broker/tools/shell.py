"""The ``shell`` tool: one command in a bubblewrap sandbox (docs/protocol.md;
docs/decisions.md, "The runner and the sandbox").

The result: stdout, then stderr after a ``[stderr]`` line when there is any, cut at the
output cap as a whole. Exit status non-zero is ``tool_error`` with the stderr tail.
A sandbox that bwrap could not set up (it never reported the command's exit) is
``sandbox_unavailable``, like a missing bwrap. The sandbox (sandbox_plan.py) sees ``/usr``,
the host's ``/bin``, ``/sbin``, ``/lib*`` (as symlinks when the host's are), and
:data:`~boxmaker.broker.sandbox_plan.ETC_FILES` — no ``/etc/passwd``: host user names stay
out, so ``whoami`` fails inside.
All capabilities are dropped, and the sandbox is never host root: brokerd as root
starts bwrap as ``[runner] sandbox_uid`` or the workspace's owner, and refuses a
root-owned workspace (sandbox_unavailable, docs/runbook.md#sandbox-as-root). A
seccomp filter keeps setuid/setgid bits off every file; /proc/sys and the other
host knobs under /proc are read-only. The ``[runner]`` limits (memory, processes,
file size, CPU time) hold for every process of the command; one that kills it
(SIGXCPU, SIGXFSZ) is named in the ``tool_error`` detail, and a memory or fork
failure's stderr points at its limit (docs/runbook.md#sandbox-limits). Where brokerd
has cgroups, the memory limit (swap included) and the process limit also hold for
the sandbox as a whole; a process its OOM killer killed, or a fork it refused, is
named for certain (the kernel counted it), a kill even when the command exits 0.

A shell call may use a sandbox brokerd set up ahead of it (sandbox_pool.py); each
sandbox serves one call and is torn down after it.

A call that may use the network (its RunSpec's ``egress_dir``, docs/egress.md) gets a
sandbox of its own with a way out (the one set up ahead on its very egress directory, or
a new one; never the plain one): its egress directory, the system's CA
certificates, the proxy variables, and socat bridging 127.0.0.1:3128 inside to brokerd's
proxy socket; still no resolver and no other route. No socat, or a socat that did not
start listening, is ``sandbox_unavailable`` (docs/runbook.md#egress-socat): the command
never runs without its proxy.
"""

from __future__ import annotations

import signal
from typing import Final

from boxmaker.broker.cgroups import Usage
from boxmaker.broker.run_spec import RunResult, RunSpec, describe_error
from boxmaker.broker.sandbox_check import (
    NO_BWRAP_DETAIL,
    NO_SOCAT_DETAIL,
    RUNBOOK_EGRESS_SOCAT,
    RUNBOOK_SANDBOX,
    find_socat,
)
from boxmaker.broker.sandbox_plan import (
    EGRESS_FAILED_WORDS,
    LIMITS_FAILED,
    LIMITS_FAILED_WORDS,
    Launch,
    SandboxLimits,
    SandboxRefused,
)
from boxmaker.broker.sandbox_pool import NetworkPlan, SandboxPool
from boxmaker.core.reasons import Reason

RUNBOOK_SANDBOX_LIMITS: Final = "docs/runbook.md#sandbox-limits"


def _limit_detail(limits: SandboxLimits, returncode: int, stderr: str, usage: Usage) -> str | None:
    """What to say of a command that the sandbox's limits stopped, if they did: what its
    cgroup counted (an OOM kill, a refused fork) and a SIGXCPU or SIGXFSZ death name
    their limit; the per-process memory and process limits only make a call fail, and
    the command's own words are the hint."""
    memory = f"memory_limit_mib ({limits.memory >> 20} MiB)"
    if usage.oom_kills:
        who = "the command" if returncode != 0 else "a process of the command"
        return f"{who} was killed: it exceeded [runner] {memory}"
    killed = {
        signal.SIGXCPU: f"cpu_time_limit ({limits.cpu_time} s)",
        signal.SIGXFSZ: f"file_size_limit_mib ({limits.file_size >> 20} MiB)",
    }
    for number, key in killed.items():
        if returncode in (128 + number, -number):
            return f"the command was killed ({number.name}): it exceeded [runner] {key}"
    processes = f"process_limit ({limits.processes})"
    if usage.forks_refused:
        return f"the command reached [runner] {processes}: a new process was refused"
    hints = {
        memory: (
            "Cannot allocate memory",
            "MemoryError",
            "out of memory",
        ),
        processes: (
            "Cannot fork",
            "can't fork",
            "Resource temporarily unavailable",
        ),
    }
    for key, words in hints.items():
        if any(word in stderr for word in words):
            return f"the command probably reached [runner] {key}"
    return None


async def run_shell(spec: RunSpec, command: str, sandboxes: SandboxPool | None) -> RunResult:
    launch = spec.sandbox
    if not isinstance(launch, Launch):
        detail = launch if isinstance(launch, str) else NO_BWRAP_DETAIL
        return RunResult.failure(Reason.SANDBOX_UNAVAILABLE, detail, spec.label)
    # A pool that is not running only ever sets up a sandbox for the call at hand.
    pool = sandboxes or SandboxPool()
    if spec.egress_dir is None:
        opened = pool.sandbox(launch)
    else:
        socat = find_socat()
        if socat is None:
            return RunResult.failure(Reason.SANDBOX_UNAVAILABLE, NO_SOCAT_DETAIL, spec.label)
        # The sandbox set up ahead on this call's directory, or a new one: never the
        # plain sandbox, never another call's.
        opened = pool.network_sandbox(NetworkPlan(launch, spec.workspace, socat), spec.egress_dir)
    try:
        async with opened as sandbox:
            run = await sandbox.run(command, time_limit=spec.time_limit, output_cap=spec.output_cap)
    except SandboxRefused as refused:
        return RunResult.failure(Reason.SANDBOX_UNAVAILABLE, str(refused), spec.label)
    except OSError as exc:
        problem = describe_error(exc)
        detail = f"bubblewrap (bwrap) could not be started: {problem}; see {RUNBOOK_SANDBOX}"
        return RunResult.failure(Reason.SANDBOX_UNAVAILABLE, detail, spec.label)
    if run.timed_out:
        detail = f"killed after {spec.time_limit:g} s (the time limit)"
        return RunResult.failure(Reason.TIMEOUT, detail, spec.label)
    stderr = run.err.last_words()
    # An OOM kill (of bwrap's pid 1 too, when the victim) is the limit, never the set-up.
    killed = run.usage.oom_kills > 0
    launcher_failed = run.ran and run.returncode == LIMITS_FAILED
    if launcher_failed and stderr.endswith(EGRESS_FAILED_WORDS) and not killed:
        detail = f"the sandbox's way out could not be set up: {stderr}; see {RUNBOOK_EGRESS_SOCAT}"
        return RunResult.failure(Reason.SANDBOX_UNAVAILABLE, detail, spec.label)
    set_up = run.ran and not (launcher_failed and stderr.endswith(LIMITS_FAILED_WORDS))
    if not set_up and not killed:
        detail = f"bubblewrap could not set up the sandbox: {stderr}; see {RUNBOOK_SANDBOX}"
        return RunResult.failure(Reason.SANDBOX_UNAVAILABLE, detail, spec.label)
    if run.returncode != 0 or killed:
        detail = f"exit status {run.returncode}"
        if run.err.total:
            detail += ": " + stderr
        limit = _limit_detail(launch.limits, run.returncode or 0, stderr, run.usage)
        if limit is not None:
            detail = f"{limit} ({detail}); see {RUNBOOK_SANDBOX_LIMITS}"
        return RunResult.failure(Reason.TOOL_ERROR, detail, spec.label)
    return RunResult.success(run.content(spec.output_cap), spec.label)
