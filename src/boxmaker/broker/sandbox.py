"""The shell tool's sandbox (docs/decisions.md, "The runner and the sandbox"): bubblewrap,
one sandbox per call, and one kept
set up ahead of the next call.

Setting up a sandbox — the namespaces of ``--unshare-all`` (a network namespace above
all), the mounts, a fresh ``/proc`` — costs several times a plain process on a small
machine, and none of it depends on the command. So the command is not on bwrap's command
line: the sandbox starts with a short launcher (:data:`LAUNCHER`) that reads the command
from its stdin, then puts ``/dev/null`` there and execs ``/bin/sh -c COMMAND`` — the
same process, argv and environment a command given on the command line would get. A
sandbox can then be set up before the call that uses it arrives: :class:`SandboxPool`
keeps one ready and starts the next when a call is done.

Every sandbox still serves exactly one call and is torn down after it: nothing runs in a
warm sandbox before its command, and nothing of one call is seen by the next
(docs/decisions.md, "A sandbox set up ahead"). A warm sandbox is used only when it was
started with exactly the argv the call's RunSpec names, and only within
:data:`WARM_MAX_AGE` of its start, so a change on the host (a replaced workspace or
/etc file) reaches the next call soon; otherwise the call sets up its own.

What the command is (docs/runbook.md#sandbox-as-root, #sandbox-limits): never host root
— brokerd as root starts bwrap as an ordinary uid (:func:`sandbox_user`), and
:meth:`Sandbox.start` refuses uid 0 — with no capabilities, under a seccomp filter that
keeps setuid/setgid bits off its files (seccomp.py), with /proc/sys and the other host
knobs under /proc read-only, under the resource limits the launcher sets before it
execs the command, and, where brokerd can have cgroups (cgroups.py), in a cgroup of its
own that bounds the memory and tasks of the whole sandbox: bwrap's first process joins
it before it execs bwrap (:data:`JOINER`), so everything of the sandbox is in it, and
:meth:`Sandbox.close` kills what is left in it and removes it. bwrap starts with an
empty environment and its options in a pipe (``--args``): its /proc entries, readable
as the sandbox's pid 1, show neither brokerd's environment nor host paths. (The
workspace's host path still shows in the sandbox's /proc/self/mountinfo, as the root
of its bind mount.)
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Final

import attrs
import orjson
import trio

from boxmaker.broker.cgroup_plan import RUNBOOK
from boxmaker.broker.cgroups import (
    UNBOUNDED,
    CgroupError,
    CgroupTree,
    SandboxBounds,
    SandboxCgroup,
    Usage,
)
from boxmaker.broker.seccomp import filter_program

log = logging.getLogger("boxmaker.brokerd.sandbox")

STDERR_TAIL: Final = 2048
"""How much of a failed command's stderr becomes the ``tool_error`` detail."""
SANDBOX_PATH: Final = "/usr/local/bin:/usr/bin:/bin"
SANDBOX_ENV: Final[Mapping[str, str]] = {
    "PATH": SANDBOX_PATH,
    "HOME": "/workspace",
    "LANG": "C.UTF-8",
}
SYSTEM_DIRS: Final = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
"""Top-level host dirs shown read-only (or as the same symlink) when the host has them."""
ETC_FILES: Final = ("/etc/ld.so.cache", "/etc/alternatives", "/etc/localtime")
"""The only /etc entries the sandbox sees: the loader's cache, Debian's alternatives
(``/usr/bin/awk`` links through it) and the time zone."""
PROC_COVERED: Final = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus")
"""The host's knobs under /proc, shown read-only over the sandbox's fresh /proc."""
WORKSPACE: Final = "/workspace"
WARM_MAX_AGE: Final = 60.0
"""Seconds a sandbox set up ahead stays usable; an older one is torn down unused."""

LAUNCHER: Final = (
    # Builtins only, so nothing is forked before the command: `read` takes the command
    # line by line, exactly (IFS= keeps blanks, -r keeps backslashes); the runner ends
    # it with one newline, which ${c%?} takes off again.
    'c=; while IFS= read -r line; do c="$c$line\n"; done; exec </dev/null; exec /bin/sh -c "${c%?}"'
)
"""What a sandbox starts with: it waits for its command on stdin, then becomes
``/bin/sh -c COMMAND`` with stdin on /dev/null."""
CGROUP_REMOVE_S: Final = 2.0
"""Seconds :meth:`Sandbox.close` tries to remove the sandbox's cgroup; then it logs."""
NOT_ROOT_DETAIL: Final = "the sandbox never runs as host root (uid 0)"
NOT_ROOT_GROUP_DETAIL: Final = "the sandbox never runs in the host's root group (gid 0)"


@attrs.frozen
class SandboxUser:
    """The host uid and gid bwrap runs as when brokerd is root (no supplementary
    groups): the sandbox is then a user namespace of an ordinary uid."""

    uid: int
    gid: int


LIMITS_FAILED: Final = 125
"""The launcher's exit status when it could not set the limits."""
LIMITS_FAILED_WORDS: Final = "boxmaker: the sandbox limits could not be set"
"""...and the last line of its stderr then."""


@attrs.frozen
class SandboxLimits:
    """Resource limits of every process of a command ([runner] in config.toml), set by
    the launcher's ``ulimit`` before it execs the command: soft and hard both, so the
    command cannot raise them, and nothing has run in the sandbox yet."""

    memory: int
    """Bytes of address space (RLIMIT_AS; ``ulimit -v``, KiB)."""
    processes: int
    """Processes of the sandbox's uid in its user namespace (RLIMIT_NPROC), and, with a
    cgroup, the tasks of the whole sandbox, bwrap's two included (``pids.max``)."""
    file_size: int
    """Bytes of the largest file a command may write (RLIMIT_FSIZE; ``ulimit -f``, in
    POSIX's 512-byte blocks: /bin/sh is always started as ``sh``, so bash is in POSIX
    mode too)."""
    cpu_time: int
    """Seconds of CPU time per process (RLIMIT_CPU)."""

    def ulimit(self) -> str:
        """The shell line that sets them, or exits with :data:`LIMITS_FAILED` (the
        command never runs without them). RLIMIT_NPROC is ``-u`` in bash and busybox,
        ``-p`` in dash. CPU time: the hard limit a second above the soft one, so a
        command over it gets SIGXCPU (which names the limit), and SIGKILL only if it
        ignores that."""
        processes = self.processes
        return (
            f"{{ ulimit -v {self.memory // 1024} && ulimit -f {self.file_size // 512} && "
            f"ulimit -St {self.cpu_time} && ulimit -Ht {self.cpu_time + 1} && "
            f"{{ ulimit -u {processes} 2>/dev/null || ulimit -p {processes}; }}; }} || "
            f"{{ echo '{LIMITS_FAILED_WORDS}' >&2; exit {LIMITS_FAILED}; }}; "
        )


DEFAULT_LIMITS: Final = SandboxLimits(memory=1 << 30, processes=256, file_size=1 << 30, cpu_time=30)


@attrs.frozen
class Launch:
    """Everything a sandbox is started with. A sandbox set up ahead serves a call only
    when its Launch equals the call's: the argv as :func:`sandbox_argv` made it (not
    as bwrap reads it through ``--args``), and the host user."""

    argv: tuple[str, ...]
    """From :func:`sandbox_argv`: bwrap, its options, then ``/bin/sh -c LAUNCHER``."""
    user: SandboxUser | None
    """Whom bwrap runs as; None: brokerd's own uid (never root, see :meth:`Sandbox.start`)."""
    limits: SandboxLimits = DEFAULT_LIMITS
    """The limits the argv's launcher sets (for the details that name them)."""


class SandboxRefused(Exception):
    """The sandbox cannot run safely as things are; the message says why and what to do."""


def sandbox_user(workspace: Path, configured_uid: int | None) -> SandboxUser | None:
    """Whom bwrap runs as (docs/runbook.md#sandbox-as-root). brokerd not root: None, its
    own uid (``[runner] sandbox_uid`` cannot change it). brokerd root: ``sandbox_uid``
    (gid the same number) when set, else the workspace's owner and group (its owner's
    number when the group is root's); a workspace owned by root then raises
    :class:`SandboxRefused` — uid 0 and gid 0 are never used."""
    if os.geteuid() != 0:
        return None
    if configured_uid is not None:
        return SandboxUser(configured_uid, configured_uid)
    try:
        info = workspace.stat()
    except OSError as exc:
        raise SandboxRefused(
            f"cannot inspect the workspace {workspace} ({exc.strerror}); "
            "see docs/runbook.md#sandbox-as-root"
        ) from exc
    if info.st_uid == 0:
        raise SandboxRefused(
            f"brokerd runs as root and the workspace {workspace} belongs to root; "
            f"{NOT_ROOT_DETAIL}: set [runner] sandbox_uid to an ordinary uid that owns "
            "the workspace (or run brokerd as an ordinary user); "
            "see docs/runbook.md#sandbox-as-root"
        )
    return SandboxUser(info.st_uid, info.st_gid or info.st_uid)


@functools.cache
def _system_mounts() -> tuple[str, ...]:
    # The host's layout does not change while brokerd runs: computed once.
    args: list[str] = ["--ro-bind", "/usr", "/usr"]
    for name in SYSTEM_DIRS:
        host = Path("/", name)
        if host.is_symlink():
            args += ["--symlink", str(host.readlink()), str(host)]
        elif host.is_dir():
            args += ["--ro-bind", str(host), str(host)]
    for etc in ETC_FILES:
        if Path(etc).exists():
            args += ["--ro-bind", etc, etc]
    return tuple(args)


def _proc_covers() -> tuple[str, ...]:
    args: list[str] = []
    for path in PROC_COVERED:
        args += ["--ro-bind-try", path, path]
    return tuple(args)


def sandbox_argv(
    bwrap: str, workspace: Path, limits: SandboxLimits = DEFAULT_LIMITS
) -> tuple[str, ...]:
    """The bwrap command line of a shell sandbox on ``workspace``. The same for
    every call in one workspace: the command reaches :data:`LAUNCHER` on stdin, after
    ``limits`` are set. :meth:`Sandbox.start` passes all but the last three arguments
    (``/bin/sh -c`` and the launcher) through ``--args``."""
    env: list[str] = []
    for key, value in SANDBOX_ENV.items():
        env += ["--setenv", key, value]
    return (
        bwrap,
        "--unshare-all",
        # A user namespace of its own, in which the command cannot make another: one
        # would hold every capability over its own network namespace and mounts.
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--clearenv",
        *env,
        *_system_mounts(),
        "--proc",
        "/proc",
        # bwrap covers these itself only where it finds them writable at set-up; here
        # they are read-only whoever runs it.
        *_proc_covers(),
        "--dev",
        "/dev",
        # The in-memory file systems a command can write are no bigger than its memory
        # limit: /dev/shm and /tmp sized, /dev itself (a tmpfs too) read-only.
        "--size",
        str(limits.memory),
        "--tmpfs",
        "/dev/shm",  # noqa: S108  (the sandbox's own, sized tmpfs)
        "--remount-ro",
        "/dev",
        "--size",
        str(limits.memory),
        "--tmpfs",
        "/tmp",  # noqa: S108  (a fresh tmpfs inside the sandbox, not the host's /tmp)
        "--bind",
        str(workspace),
        WORKSPACE,
        # Last, so the mounts above exist: the sandbox's root (and /etc in it) read-only.
        "--remount-ro",
        "/",
        "--chdir",
        WORKSPACE,
        "/bin/sh",
        "-c",
        limits.ulimit() + LAUNCHER,
    )


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


class SandboxPool:
    """Keeps one sandbox set up ahead of the next shell call.

    :meth:`run` is brokerd's task that starts sandboxes (from the trio thread, see
    :meth:`Sandbox.start`) and tears down unused ones. Nothing is set up before the first
    shell call, whose Launch the pool then keeps using; without :meth:`run` every call
    sets up its own sandbox. ``bounds``: each sandbox's cgroup (brokerd's, made at its
    start); :meth:`run` removes its subtree when it ends.
    """

    def __init__(self, bounds: SandboxBounds = UNBOUNDED) -> None:
        self.bounds = bounds
        self._warm: Sandbox | None = None
        self._wanted: Launch | None = None
        self._retired: list[Sandbox] = []
        self._wakeup = trio.Event()

    @property
    def warm(self) -> Sandbox | None:
        """The sandbox waiting for the next call, if any."""
        return self._warm

    @contextlib.asynccontextmanager
    async def sandbox(self, launch: Launch) -> AsyncIterator[Sandbox]:
        """A sandbox for one call with ``launch``: the warm one when it is usable, else
        a new one (OSError when bwrap cannot be started, SandboxRefused when it may not).
        Torn down on the way out."""
        sandbox = self._take(launch) or Sandbox.start(launch, bounds=self.bounds)
        try:
            yield sandbox
        finally:
            await sandbox.close()
            # The next one is set up once this call is done, not while its command runs.
            self._wakeup.set()

    def _take(self, launch: Launch) -> Sandbox | None:
        self._wanted = launch
        warm, self._warm = self._warm, None
        if warm is None:
            return None
        if warm.usable(launch, trio.current_time()):
            return warm
        self._retired.append(warm)
        self._wakeup.set()
        return None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            while True:
                await self._wakeup.wait()
                self._wakeup = trio.Event()
                while self._retired:
                    await self._retired.pop().close()
                if self._wanted is not None and self._warm is None:
                    try:
                        self._warm = Sandbox.start(self._wanted, bounds=self.bounds)
                    except (OSError, SandboxRefused) as exc:
                        # The call that needs it will start its own and report why.
                        log.debug("no sandbox set up ahead: %s", exc)
        finally:
            warm, self._warm = self._warm, None
            for sandbox in ([warm] if warm else []) + self._retired:
                await sandbox.close()
            self._retired.clear()
            if isinstance(self.bounds.cgroups, CgroupTree):
                self.bounds.cgroups.remove()
