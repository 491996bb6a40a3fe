"""The shell sandbox kept set up ahead of the next call (docs/decisions.md, "A sandbox
set up ahead").

Setting up a sandbox costs several times a plain process on a small machine, and none of
it depends on the command (the launcher reads it from stdin,
:data:`~boxmaker.broker.sandbox_plan.LAUNCHER`): :class:`SandboxPool` keeps one ready and
starts the next when a call is done. Every sandbox still serves exactly one call and is
torn down after it: nothing runs in a warm sandbox before its command, and nothing of one
call is seen by the next. A warm sandbox is used only when it was started with exactly
the argv the call's RunSpec names, and only within
:data:`~boxmaker.broker.sandbox.WARM_MAX_AGE` of its start, so a change on the host (a
replaced workspace or /etc file) reaches the next call soon; otherwise the call sets up
its own.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

import trio

from boxmaker.broker.cgroups import UNBOUNDED, CgroupTree, SandboxBounds
from boxmaker.broker.sandbox import Sandbox
from boxmaker.broker.sandbox_plan import Launch, SandboxRefused

log = logging.getLogger("boxmaker.brokerd.sandbox")


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
    async def sandbox(self, launch: Launch, *, ahead: bool = True) -> AsyncIterator[Sandbox]:
        """A sandbox for one call with ``launch``: the warm one when it is usable, else
        a new one (OSError when bwrap cannot be started, SandboxRefused when it may not).
        Torn down on the way out. ``ahead=False``: always a new one, and the pool's warm
        sandbox and the launch it sets up next are left as they are (a call with a way
        out: its launch names its own egress directory, of no use to another call)."""
        sandbox = (self._take(launch) if ahead else None) or Sandbox.start(
            launch, bounds=self.bounds
        )
        try:
            yield sandbox
        finally:
            await sandbox.close()
            if ahead:
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
