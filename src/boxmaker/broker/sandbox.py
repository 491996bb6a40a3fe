"""The shell tool's sandbox (spec §8): bubblewrap, one sandbox per call, and one kept
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
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Final

import attrs
import orjson
import trio

logger = logging.getLogger("boxmaker.brokerd.sandbox")

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


def sandbox_argv(bwrap: str, workspace: Path) -> tuple[str, ...]:
    """The bwrap command line of a shell sandbox on ``workspace`` (spec §8). The same for
    every call in one workspace: the command reaches :data:`LAUNCHER` on stdin."""
    env: list[str] = []
    for key, value in SANDBOX_ENV.items():
        env += ["--setenv", key, value]
    return (
        bwrap,
        "--unshare-all",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--clearenv",
        *env,
        *_system_mounts(),
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",  # noqa: S108  (a fresh tmpfs inside the sandbox, not the host's /tmp)
        "--bind",
        str(workspace),
        "/workspace",
        # Last, so the mounts above exist: the sandbox's root (and /etc in it) read-only.
        "--remount-ro",
        "/",
        "--chdir",
        "/workspace",
        "/bin/sh",
        "-c",
        LAUNCHER,
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


@attrs.define(eq=False)
class Sandbox:
    """One bwrap process: set up, waiting for its one command, or done."""

    argv: tuple[str, ...]
    process: subprocess.Popen[bytes]
    _command_in: trio.lowlevel.FdStream
    _outputs: tuple[trio.lowlevel.FdStream, trio.lowlevel.FdStream, trio.lowlevel.FdStream]
    """stdout, stderr and bwrap's ``--json-status-fd``."""
    started_at: float

    @classmethod
    def start(cls, argv: tuple[str, ...]) -> Sandbox:
        """Start bwrap with ``argv`` (from :func:`sandbox_argv`). Raises OSError when it
        cannot be started. Call from the trio thread, never a worker thread: bwrap's
        ``--die-with-parent`` is PR_SET_PDEATHSIG, which fires when the *thread* that
        forked it exits, and trio retires idle worker threads after 10 s — every longer
        command would be killed. The trio thread lives as long as brokerd, which is
        exactly whom the sandbox must not outlive."""
        pipes: list[tuple[int, int]] = []
        try:
            pipes += (os.pipe() for _ in range(4))
        except OSError:
            for read_end, write_end in pipes:
                os.close(read_end)
                os.close(write_end)
            raise
        (command_read, command_write), (_, out_write), (_, err_write), (_, status_write) = pipes
        try:
            process = subprocess.Popen(
                [argv[0], "--json-status-fd", str(status_write), *argv[1:]],
                stdin=command_read,
                stdout=out_write,
                stderr=err_write,
                # Its own process group to kill (spec §8). A new group, not a new
                # session: bwrap gives the command its own session (--new-session), and
                # a second setsid here measurably slowed every call.
                process_group=0,
                pass_fds=(status_write,),
            )
        except BaseException:
            for read_end, _ in pipes[1:]:
                os.close(read_end)
            os.close(command_write)
            raise
        finally:
            for fd in (command_read, out_write, err_write, status_write):
                os.close(fd)
        out, err, status = (trio.lowlevel.FdStream(read_end) for read_end, _ in pipes[1:])
        return cls(
            argv,
            process,
            trio.lowlevel.FdStream(command_write),
            (out, err, status),
            trio.current_time(),
        )

    def usable(self, argv: tuple[str, ...], now: float) -> bool:
        """Set up with exactly ``argv``, young enough, and not ended."""
        return (
            self.argv == argv
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
        return ShellRun(
            timed_out=scope.cancelled_caught,
            ran=_command_ran(bytes(status.head)),
            returncode=self.process.returncode,
            out=out,
            err=err,
        )

    async def close(self) -> None:
        """Kill what is left of the sandbox, reap bwrap, close the pipes. Shielded: it
        runs on every way out, cancellation included."""
        with trio.CancelScope(shield=True):
            # bwrap leads its own process group (process_group=0); killing it takes the
            # sandbox's pid 1 with it (--die-with-parent), and the pid namespace dies
            # with that. poll() first: an unreaped pid cannot have been reused.
            if self.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
            await _wait(self.process)
            for stream in (self._command_in, *self._outputs):
                await stream.aclose()


class SandboxPool:
    """Keeps one sandbox set up ahead of the next shell call.

    :meth:`run` is brokerd's task that starts sandboxes (from the trio thread, see
    :meth:`Sandbox.start`) and tears down unused ones. Nothing is set up before the first
    shell call, whose argv the pool then keeps using; without :meth:`run` every call
    sets up its own sandbox.
    """

    def __init__(self) -> None:
        self._warm: Sandbox | None = None
        self._wanted: tuple[str, ...] | None = None
        self._retired: list[Sandbox] = []
        self._wakeup = trio.Event()

    @property
    def warm(self) -> Sandbox | None:
        """The sandbox waiting for the next call, if any."""
        return self._warm

    @contextlib.asynccontextmanager
    async def sandbox(self, argv: tuple[str, ...]) -> AsyncIterator[Sandbox]:
        """A sandbox for one call with ``argv``: the warm one when it is usable, else
        a new one (OSError when bwrap cannot be started). Torn down on the way out."""
        sandbox = self._take(argv) or Sandbox.start(argv)
        try:
            yield sandbox
        finally:
            await sandbox.close()
            # The next one is set up once this call is done, not while its command runs.
            self._wakeup.set()

    def _take(self, argv: tuple[str, ...]) -> Sandbox | None:
        self._wanted = argv
        warm, self._warm = self._warm, None
        if warm is None:
            return None
        if warm.usable(argv, trio.current_time()):
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
                        self._warm = Sandbox.start(self._wanted)
                    except OSError as exc:
                        # The call that needs it will start its own and report why.
                        logger.debug("no sandbox set up ahead: %s", exc)
        finally:
            warm, self._warm = self._warm, None
            for sandbox in ([warm] if warm else []) + self._retired:
                await sandbox.close()
            self._retired.clear()
