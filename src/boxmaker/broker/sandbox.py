"""One shell sandbox (docs/decisions.md, "The runner and the sandbox"): a bubblewrap
process started for one call, waiting for its one command, then torn down.

Setting up a sandbox — the namespaces of ``--unshare-all`` (a network namespace above
all), the mounts, a fresh ``/proc`` — costs several times a plain process on a small
machine, and none of it depends on the command. So the command is not on bwrap's command
line (:func:`~boxmaker.broker.sandbox_plan.sandbox_argv`): the sandbox starts with a
short launcher (:data:`~boxmaker.broker.sandbox_plan.LAUNCHER`) that reads the command
from its stdin, then puts ``/dev/null`` there and execs ``/bin/sh -c COMMAND`` — the
same process, argv and environment a command given on the command line would get. A
sandbox can then be set up before the call that uses it arrives
(:class:`~boxmaker.broker.sandbox_pool.SandboxPool`).

What the command is (docs/runbook.md#sandbox-as-root, #sandbox-limits): never host root
— brokerd as root starts bwrap as an ordinary uid
(:func:`~boxmaker.broker.sandbox_plan.sandbox_user`), and :meth:`Sandbox.start` refuses
uid 0 — with no capabilities, under a seccomp filter that keeps setuid/setgid bits off
its files (seccomp.py), with /proc/sys and the other host knobs under /proc read-only,
under the resource limits the launcher sets before it execs the command, and, where
brokerd can have cgroups (cgroups.py), in a cgroup of its own that bounds the memory and
tasks of the whole sandbox: bwrap's first process joins it before it execs bwrap
(:data:`JOINER`), so everything of the sandbox is in it, and :meth:`Sandbox.close` kills
what is left in it and removes it. bwrap starts with an empty environment and its
options in a pipe (``--args``): its /proc entries, readable as the sandbox's pid 1, show
neither brokerd's environment nor host paths. (The workspace's host path still shows in
the sandbox's /proc/self/mountinfo, as the root of its bind mount.)
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import subprocess
from collections.abc import Callable, Mapping
from typing import Final

import attrs
import orjson
import trio

from boxmaker.broker.cgroup_plan import RUNBOOK
from boxmaker.broker.cgroups import (
    UNBOUNDED,
    CgroupError,
    SandboxBounds,
    SandboxCgroup,
    Usage,
)
from boxmaker.broker.sandbox_plan import NOT_ROOT_DETAIL, Launch, SandboxRefused
from boxmaker.broker.seccomp import filter_program

log = logging.getLogger("boxmaker.brokerd.sandbox")

STDERR_TAIL: Final = 2048
"""How much of a failed command's stderr becomes the ``tool_error`` detail."""
WARM_MAX_AGE: Final = 60.0
"""Seconds a sandbox set up ahead stays usable; an older one is torn down unused."""
CGROUP_REMOVE_S: Final = 2.0
"""Seconds :meth:`Sandbox.close` tries to remove the sandbox's cgroup; then it logs."""
NOT_ROOT_GROUP_DETAIL: Final = "the sandbox never runs in the host's root group (gid 0)"


@attrs.define
class Capture:
    """Keeps the first ``cap`` bytes and the last STDERR_TAIL of a stream, counts all."""

    cap: int
    head: bytearray = attrs.Factory(bytearray)
    tail: bytearray = attrs.Factory(bytearray)
    total: int = 0

    def add(self, chunk: bytes | bytearray) -> None:
        room = self.cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
        self.total += len(chunk)
        self.tail += chunk[-STDERR_TAIL:]
        del self.tail[:-STDERR_TAIL]

    def last_words(self) -> str:
        """The tail, as text for a detail."""
        return bytes(self.tail).decode("utf-8", errors="replace").strip()


@attrs.frozen
class ShellRun:
    """How one command in a sandbox ended."""

    timed_out: bool
    ran: bool
    """Did bwrap report the command's exit? If not, the sandbox was never set up."""
    returncode: int | None
    out: Capture
    err: Capture
    usage: Usage = attrs.field(factory=Usage)
    """What the sandbox's cgroup counted (nothing without one)."""

    def content(self, cap: int) -> str:
        """stdout, then stderr after a ``[stderr]`` line when there is any, cut at ``cap``
        as a whole with a marker."""
        body = bytes(self.out.head)
        if self.err.total:
            body += b"\n[stderr]\n" + bytes(self.err.head)
        cut = self.out.total > cap or self.err.total > cap or len(body) > cap
        text = body[:cap].decode("utf-8", errors="replace")
        return f"{text}\n[output cut at {cap} bytes]" if cut else text


async def _drain(stream: trio.abc.ReceiveStream, capture: Capture) -> None:
    # Read to EOF even past the cap: a writer blocked on a full pipe would never exit.
    async for chunk in stream:
        capture.add(chunk)


async def _wait(process: subprocess.Popen[bytes]) -> int:
    if process.returncode is not None:
        # Reaped already (poll()): its pid may belong to another process by now.
        return process.returncode
    try:
        pidfd = os.pidfd_open(process.pid)
    except OSError:
        # A kernel without pidfd (before 5.3): wait in a thread; forking is not involved.
        return await trio.to_thread.run_sync(process.wait, abandon_on_cancel=True)
    try:
        await trio.lowlevel.wait_readable(pidfd)
    finally:
        os.close(pidfd)
    return process.wait()


def _command_ran(status: bytes) -> bool:
    for line in status.splitlines():
        with contextlib.suppress(orjson.JSONDecodeError):
            report = orjson.loads(line)
            if isinstance(report, dict) and "exit-code" in report:
                return True
    return False


def _launch_args(launch: Launch, fds: Mapping[str, int]) -> bytes:
    """bwrap's options as ``--args`` reads them (NUL-separated): the launch's, after
    the descriptors of this start."""
    options = list(launch.argv[1:-3])
    head = ["--json-status-fd", str(fds["status"]), "--seccomp", str(fds["seccomp"])]
    return b"".join(os.fsencode(arg) + b"\0" for arg in head + options)


def _filled_pipe(data: bytes) -> int:
    """A pipe's read end with ``data`` (at most a pipe's buffer) waiting in it."""
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, data)
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    return read_end


@attrs.define(eq=False)
class Sandbox:
    """One bwrap process: set up, waiting for its one command, or done."""

    launch: Launch
    process: subprocess.Popen[bytes]
    _command_in: trio.lowlevel.FdStream
    _outputs: tuple[trio.lowlevel.FdStream, trio.lowlevel.FdStream, trio.lowlevel.FdStream]
    """stdout, stderr and bwrap's ``--json-status-fd``."""
    started_at: float
    cgroup: SandboxCgroup | None = None
    """Its own cgroup, when brokerd has cgroups (:class:`SandboxBounds`)."""

    @property
    def argv(self) -> tuple[str, ...]:
        return self.launch.argv

    @property
    def stdin(self) -> trio.lowlevel.FdStream:
        """The sandbox's stdin: the launcher's command, or an MCP server's stream."""
        return self._command_in

    @property
    def stdout(self) -> trio.lowlevel.FdStream:
        return self._outputs[0]

    @property
    def stderr(self) -> trio.lowlevel.FdStream:
        return self._outputs[1]

    @property
    def status(self) -> trio.lowlevel.FdStream:
        """bwrap's ``--json-status-fd``: a line with ``exit-code`` once the command ended."""
        return self._outputs[2]

    async def wait(self) -> int:
        """bwrap's exit status, once it has exited."""
        return await _wait(self.process)

    @classmethod
    def start(
        cls,
        launch: Launch,
        *,
        bounds: SandboxBounds = UNBOUNDED,
        seccomp_filter: Callable[[], bytes | None] = filter_program,
    ) -> Sandbox:
        """Start bwrap for ``launch``. Raises OSError when it cannot be started, and
        when it would run as root. Call from the trio thread, never a worker thread:
        bwrap's ``--die-with-parent`` is PR_SET_PDEATHSIG, which fires when the *thread*
        that forked it exits, and trio retires idle worker threads after 10 s — every
        longer command would be killed. The trio thread lives as long as brokerd, which
        is exactly whom the sandbox must not outlive.

        bwrap starts with an empty environment (the sandbox's pid 1 is bwrap's child,
        and its /proc/1/environ is readable inside) and finds its options, host paths
        included, in a pipe (``--args``), so its command line shows none of them. The
        filter is ``seccomp_filter()``: the host architecture's (a test passes another).

        With cgroups (``bounds``), a new cgroup is made with the launch's limits and the
        sandbox starts in it (:data:`JOINER`); as root, the uid changes after joining,
        by setpriv. Raises SandboxRefused when the cgroup cannot be made or setpriv is
        missing: the sandbox never starts without the bound brokerd reports."""
        user = launch.user
        if (user.uid if user is not None else os.geteuid()) == 0:
            raise OSError(errno.EPERM, NOT_ROOT_DETAIL)
        if user is not None and user.gid == 0:
            raise OSError(errno.EPERM, NOT_ROOT_GROUP_DETAIL)
        seccomp = seccomp_filter()
        if seccomp is None:
            raise OSError(
                errno.ENOSYS,
                "no seccomp filter for this architecture (only x86_64 and aarch64)",
            )
        if bounds.refusal is not None:
            raise SandboxRefused(bounds.refusal)
        try:
            cgroup = bounds.cgroup(memory=launch.limits.memory, processes=launch.limits.processes)
        except CgroupError as exc:
            raise SandboxRefused(
                f"the sandbox's cgroup could not be made: {exc.strerror}; see {RUNBOOK}"
            ) from None
        opened: list[int] = []
        pipes: list[tuple[int, int]] = []
        try:
            pipes += (os.pipe() for _ in range(4))
            (command_read, _), (_, out_write), (_, err_write), (_, status_write) = pipes
            if user is not None:
                # brokerd's pipes are root's: the command, another uid, could not
                # reopen its own stdout or stderr (/dev/stdout) otherwise.
                for read_end, _ in pipes[:3]:
                    os.fchown(read_end, user.uid, user.gid)
            opened.append(_filled_pipe(seccomp))
            fds = {"seccomp": opened[0], "status": status_write}
            opened.append(_filled_pipe(_launch_args(launch, fds)))
            argv = [launch.argv[0], "--args", str(opened[1]), *launch.argv[-3:]]
            # With a cgroup the uid changes after joining (setpriv), not in Popen.
            become = user if cgroup is None else None
            if cgroup is not None:
                ids = None if user is None else (user.uid, user.gid)
                argv = bounds.joined_argv(cgroup, argv, ids)
            process = subprocess.Popen(
                argv,
                stdin=command_read,
                stdout=out_write,
                stderr=err_write,
                env={},
                # Its own process group, killed whole on a timeout. A new group, not a new
                # session: bwrap gives the command its own session (--new-session), and
                # a second setsid here measurably slowed every call.
                process_group=0,
                pass_fds=(*opened, status_write),
                user=None if become is None else become.uid,
                group=None if become is None else become.gid,
                extra_groups=None if become is None else [],
            )
        except BaseException:
            for read_end, write_end in pipes:
                os.close(read_end)
                os.close(write_end)
            for fd in opened:
                os.close(fd)
            if cgroup is not None:
                cgroup.remove()
            raise
        for fd in (command_read, out_write, err_write, status_write, *opened):
            os.close(fd)
        out, err, status = (trio.lowlevel.FdStream(read_end) for read_end, _ in pipes[1:4])
        return cls(
            launch,
            process,
            trio.lowlevel.FdStream(pipes[0][1]),
            (out, err, status),
            trio.current_time(),
            cgroup,
        )

    def usable(self, launch: Launch, now: float) -> bool:
        """Started for exactly ``launch``, young enough, and not ended."""
        return (
            self.launch == launch
            and now - self.started_at < WARM_MAX_AGE
            and self.process.poll() is None
        )

    async def run(self, command: str, *, time_limit: float | None, output_cap: int) -> ShellRun:
        """Hand ``command`` to the launcher and collect its output until it exits or
        ``time_limit`` seconds pass (then the whole process group is killed)."""
        out, err, status = Capture(output_cap), Capture(output_cap), Capture(4096)
        limit = time_limit if time_limit is not None else float("inf")
        with trio.move_on_after(limit) as scope:
            async with trio.open_nursery() as nursery:
                for stream, capture in zip(self._outputs, (out, err, status), strict=True):
                    nursery.start_soon(_drain, stream, capture)
                with contextlib.suppress(trio.BrokenResourceError):
                    # A launcher gone already (the sandbox could not be set up) is
                    # reported below by the missing exit status.
                    await self._command_in.send_all(os.fsencode(command) + b"\n")
                await self._command_in.aclose()
            await _wait(self.process)
        # bwrap has exited, and its pid namespace with it: the counts are final.
        usage = Usage() if self.cgroup is None else self.cgroup.usage()
        return ShellRun(
            timed_out=scope.cancelled_caught,
            ran=_command_ran(bytes(status.head)),
            returncode=self.process.returncode,
            out=out,
            err=err,
            usage=usage,
        )

    async def close(self) -> None:
        """Kill what is left of the sandbox, reap bwrap, close the pipes, remove its
        cgroup. Shielded: it runs on every way out, cancellation included."""
        with trio.CancelScope(shield=True):
            if self.cgroup is not None:
                self.cgroup.kill()
            # bwrap leads its own process group (process_group=0); killing it takes the
            # sandbox's pid 1 with it (--die-with-parent), and the pid namespace dies
            # with that. poll() first: an unreaped pid cannot have been reused.
            if self.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
            await _wait(self.process)
            for stream in (self._command_in, *self._outputs):
                await stream.aclose()
            if self.cgroup is not None:
                await _remove_cgroup(self.cgroup)


async def _remove_cgroup(cgroup: SandboxCgroup) -> None:
    """Kill and rmdir until the cgroup is gone (a dying process keeps it busy a moment),
    for CGROUP_REMOVE_S at most; one that stays is logged, never raised."""
    deadline = trio.current_time() + CGROUP_REMOVE_S
    pause = 0.001
    while (failure := cgroup.remove()) is not None:
        if failure.errno != errno.EBUSY or trio.current_time() >= deadline:
            log.warning(
                "the sandbox's cgroup %s could not be removed: %s", cgroup.memory, failure.strerror
            )
            return
        cgroup.kill()
        await trio.sleep(pause)
        pause = min(2 * pause, 0.05)
