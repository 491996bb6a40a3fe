"""``[notify] command``: tell the owner a call waits, through a command of theirs
(docs/runbook.md#notify).

When a call starts waiting, brokerd runs the command with the pending approval's JSON
on stdin: the object ``bxctl approvals --json`` shows for it, its ``preview`` null (the
file as it is may be secret, and a phone push or a chat bot is another party; the owner
sees the change in ``bxctl approvals``). The command is the owner's, but it must never
cost a call anything: :meth:`Notifier.notify` never waits (a full queue, 64 notices or
8 MiB, drops the notice, logged), at most :data:`MAX_RUNNING` commands run at once, each
is killed with its whole process group after ``[notify] timeout``, and how it ended is
only logged.

Who runs it: the owner. brokerd as an ordinary user runs it as itself (the owner: the
home is always brokerd's own), in the home. brokerd as root (its home is then root's)
runs it as the workspace's owner and group, in ``/``: the person the tools work
for, the same uid the sandbox defaults to, but never ``[runner] sandbox_uid``, which may
be an account made for the sandbox with no desktop to notify. No supplementary groups;
never as root: with a root-owned workspace it is not run at all. The
environment is clean: a fixed PATH, HOME and USER of that uid when known, LANG,
BOXMAKER_HOME (so the command may run ``bxctl approvals`` itself), and the
four variables a desktop notification needs to reach the owner's session
(:data:`PASSED_ON`), taken from brokerd's own environment (``bxctl up`` starts brokerd
from the owner's session). Not in the workspace: the model writes there, and a
relative name would find what it planted (config.toml takes only an absolute command
or a bare name, looked up in the fixed PATH). argv, not a shell line:
the JSON arrives on stdin, so nothing is ever put into a command line; a shell is one
``["sh", "-c", "…"]`` away for whoever wants one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import attrs
import orjson
import trio

from boxmaker.broker.sandbox_plan import SandboxRefused, sandbox_user
from boxmaker.home.config import NotifyConfig

log = logging.getLogger("boxmaker.brokerd.notify")

MAX_RUNNING: Final = 4
"""Notify commands running at once; more wait in the queue."""
MAX_QUEUED: Final = 64
"""Notices waiting for a free slot; one more is dropped (and logged)."""
MAX_QUEUED_BYTES: Final = 8 * 1024 * 1024
"""Their bytes (a write's content is in its JSON: up to 1 MiB each)."""
STDERR_KEPT: Final = 2000
"""The bytes of the command's stderr kept for the log line."""
SAFE_PATH: Final = "/usr/local/bin:/usr/bin:/bin"
PASSED_ON: Final = ("DISPLAY", "WAYLAND_DISPLAY", "DBUS_SESSION_BUS_ADDRESS", "XDG_RUNTIME_DIR")
"""What a desktop notification needs from brokerd's environment."""


@attrs.frozen
class RunAs:
    """Whom the command runs as (uid None: brokerd itself) and where."""

    uid: int | None
    gid: int | None
    cwd: Path


def run_as(home: Path, workspace: Path) -> RunAs | None:
    """brokerd not root: itself, in the home. brokerd root: the workspace's owner, in
    ``/`` (the home is root's 0700), as :func:`~boxmaker.broker.sandbox_plan.sandbox_user`
    picks it without ``sandbox_uid``; None (not run) when the workspace is root's."""
    try:
        user = sandbox_user(workspace, None)
    except SandboxRefused:
        return None
    if user is None:
        return RunAs(None, None, home)
    return RunAs(user.uid, user.gid, Path("/"))


def clean_env(uid: int, environ: Mapping[str, str]) -> dict[str, str]:
    """The command's environment (see the module docstring).

    >>> clean_env(65534, {"DISPLAY": ":0", "SECRET": "x", "LANG": "C.UTF-8"})["DISPLAY"]
    ':0'
    >>> "SECRET" in clean_env(65534, {"SECRET": "x"})
    False
    """
    env = {"PATH": SAFE_PATH}
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        pass
    else:
        env["HOME"], env["USER"] = entry.pw_dir, entry.pw_name
    for name in ("LANG", *PASSED_ON):
        if name in environ:
            env[name] = environ[name]
    return env


class Notifier:
    """Runs the notify command in the background (see the module docstring)."""

    def __init__(self, config: NotifyConfig, home: Path, workspace: Path) -> None:
        self.config = config
        self.home = home
        self.workspace = workspace
        self._send, self._receive = trio.open_memory_channel[bytes](MAX_QUEUED)
        self._who: RunAs | None = None
        self._queued_bytes = 0

    @property
    def enabled(self) -> bool:
        """A command is configured and may run (a waiting call is worth its JSON)."""
        return bool(self.config.command) and self._who is not None

    def notify(self, approval: Mapping[str, Any]) -> None:
        """Queue a notice for ``approval`` (its JSON object); never waits."""
        if not self.enabled:
            return
        payload = orjson.dumps(approval)
        if self._queued_bytes + len(payload) > MAX_QUEUED_BYTES:
            log.warning("notify: the waiting notices hold %d bytes; one dropped", MAX_QUEUED_BYTES)
            return
        try:
            self._send.send_nowait(payload)
        except trio.WouldBlock:
            log.warning("notify: %d notices already wait; one dropped", MAX_QUEUED)
        except trio.ClosedResourceError:
            pass
        else:
            self._queued_bytes += len(payload)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """brokerd's nursery task: :data:`MAX_RUNNING` workers take the notices."""
        if self.config.command:
            who = await trio.to_thread.run_sync(run_as, self.home, self.workspace)
            if who is None:
                log.warning(
                    "[notify] command is not run: brokerd runs as root and the workspace "
                    "is root's; it never runs as root (docs/runbook.md#notify)"
                )
            self._who = who
        async with trio.open_nursery() as workers:
            for _ in range(MAX_RUNNING):
                workers.start_soon(self._worker)
            task_status.started()

    async def _worker(self) -> None:
        async for payload in self._receive.clone():
            self._queued_bytes -= len(payload)
            try:
                await self._run_one(payload)
            except Exception:
                log.exception("notify: the command could not be run")

    async def _run_one(self, payload: bytes) -> None:
        who = self._who
        assert who is not None
        uid = os.geteuid() if who.uid is None else who.uid
        options: dict[str, Any] = {}
        if who.uid is not None:
            options = {"user": who.uid, "group": who.gid, "extra_groups": []}
        argv = list(self.config.command)
        process = await trio.lowlevel.open_process(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=who.cwd,
            env={**clean_env(uid, os.environ), "BOXMAKER_HOME": str(self.home)},
            start_new_session=True,
            **options,
        )
        stderr = bytearray()
        try:
            with trio.move_on_after(self.config.timeout) as timer:
                async with trio.open_nursery() as io:
                    io.start_soon(_feed, process, payload)
                    io.start_soon(_keep_tail, process, stderr)
                    await process.wait()
        finally:
            # Past its time, or brokerd stops: the command and whatever it started go.
            if process.returncode is None:
                _kill_group(process)
                with trio.CancelScope(shield=True):
                    await process.wait()
        if timer.cancelled_caught:
            log.warning(
                "notify: %s took over %g s and was killed", argv[0][:80], self.config.timeout
            )
        elif process.returncode != 0:
            log.warning(
                "notify: %s exited %s: %s",
                argv[0][:80],
                process.returncode,
                bytes(stderr).decode("utf-8", errors="replace").strip()[-STDERR_KEPT:],
            )


async def _feed(process: trio.Process, payload: bytes) -> None:
    stdin = process.stdin
    assert stdin is not None
    try:
        await stdin.send_all(payload)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # a command that does not read its stdin is fine
    finally:
        await stdin.aclose()


async def _keep_tail(process: trio.Process, kept: bytearray) -> None:
    stderr = process.stderr
    assert stderr is not None
    async with stderr:
        while chunk := await stderr.receive_some(65536):
            kept += chunk
            del kept[:-STDERR_KEPT]


def _kill_group(process: trio.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
