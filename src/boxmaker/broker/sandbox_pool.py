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

Where the grants give shell calls a way out (:func:`keeps_a_way_out`), the pool also
keeps one sandbox with a way out set up ahead, once a call with one has run: it binds a
fresh, empty directory of its own (:mod:`boxmaker.broker.egress_dirs`), and its socat
already listens inside. Only a call that brokerd opens a way out for can take it
(:meth:`SandboxPool.network_directory`): the call's proxy socket is then bound in that
directory, and the command starts at once. It too serves one call and is torn down
after it, its directory removed.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import trio

from boxmaker.broker.cgroups import UNBOUNDED, CgroupTree, SandboxBounds
from boxmaker.broker.egress_dirs import EgressDirectory, make_egress_directory
from boxmaker.broker.sandbox import Sandbox
from boxmaker.broker.sandbox_plan import Egress, Launch, SandboxRefused, egress_launch
from boxmaker.core.grants import CONNECT, GrantSet, Mode

log = logging.getLogger("boxmaker.brokerd.sandbox")


def keeps_a_way_out(grants: GrantSet, now: dt.datetime) -> bool:
    """Is a sandbox with a way out worth keeping set up ahead: does some unexpired,
    non-deny connect grant name ``shell`` in its ``via``? Cheaper than the rule a call
    is given its way out by (:func:`~boxmaker.core.network.network_grants`, which also
    matches the grant's ``commands``), and never what decides that: a call takes the
    sandbox only once brokerd opened its way out."""
    return any(
        grant.mode is not Mode.DENY and not grant.expired(now) and grant.serves("shell")
        for grant in grants.for_tool(CONNECT)
    )


@attrs.frozen
class NetworkPlan:
    """What a shell call with a way out is started from, less its directory: its plain
    launch, its workspace, and the socat that bridges."""

    launch: Launch
    workspace: Path
    socat: str

    def launch_for(self, directory: Path) -> Launch:
        return egress_launch(self.launch, self.workspace, Egress(directory, self.socat))

    @property
    def peer(self) -> int:
        """The sandbox's uid: the owner of its directory, the one that may connect."""
        user = self.launch.user
        return user.uid if user is not None else os.geteuid()


@attrs.define(eq=False)
class WarmNetwork:
    """A sandbox with a way out set up ahead, and the directory it binds (empty until a
    call's proxy socket is put in it)."""

    sandbox: Sandbox
    plan: NetworkPlan
    directory: EgressDirectory

    def fits(self, launch: Launch, workspace: Path, now: float) -> bool:
        plan = self.plan
        return (
            plan.launch == launch
            and plan.workspace == workspace
            and self.sandbox.usable(plan.launch_for(self.directory.path), now)
        )

    async def close(self) -> None:
        await self.sandbox.close()
        self.directory.remove()


class SandboxPool:
    """Keeps one sandbox set up ahead of the next shell call.

    :meth:`run` is brokerd's task that starts sandboxes (from the trio thread, see
    :meth:`Sandbox.start`) and tears down unused ones. Nothing is set up before the first
    shell call, whose Launch the pool then keeps using; without :meth:`run` every call
    sets up its own sandbox. ``bounds``: each sandbox's cgroup (brokerd's, made at its
    start); :meth:`run` removes its subtree when it ends.
    """

    def __init__(self, bounds: SandboxBounds = UNBOUNDED, *, run_dir: Path | None = None) -> None:
        self.bounds = bounds
        self.run_dir = run_dir
        """brokerd's ``run/``: where (not root) a sandbox's way out is made. None: no
        sandbox with a way out is set up ahead."""
        self._warm: Sandbox | None = None
        self._wanted: Launch | None = None
        self._retired: list[Sandbox | WarmNetwork] = []
        self._wakeup = trio.Event()
        self._warm_network: WarmNetwork | None = None
        self._network_plan: NetworkPlan | None = None
        self._network_kept = False
        self._reserved: dict[Path, Sandbox] = {}
        """The sandboxes with a way out taken by a call, by their directory, until the
        call's run starts its command in one (:meth:`network_sandbox`)."""

    @property
    def warm(self) -> Sandbox | None:
        """The sandbox waiting for the next call, if any."""
        return self._warm

    @property
    def warm_network(self) -> WarmNetwork | None:
        """The sandbox with a way out waiting for the next call that has one, if any."""
        return self._warm_network

    def keep_network(self, wanted: bool) -> None:
        """Whether to keep a sandbox with a way out set up ahead (:func:`keeps_a_way_out`
        of the grants current at a shell call). No: the one waiting is torn down."""
        if wanted == self._network_kept:
            # Asked at every shell call: the pool wakes only for a change (a wake-up
            # during a call's command would set the next sandboxes up beside it).
            return
        self._network_kept = wanted
        if not wanted and self._warm_network is not None:
            self._retired.append(self._warm_network)
            self._warm_network = None
        self._wakeup.set()

    @contextlib.asynccontextmanager
    async def network_directory(
        self, launch: Launch, workspace: Path
    ) -> AsyncIterator[Path | None]:
        """For a call that brokerd is opening a way out for (``launch``: its plain
        launch): the directory of the sandbox with a way out set up ahead when it fits
        the call, for the call's proxy socket; the sandbox is kept for the call's run
        (:meth:`network_sandbox`, given this directory) and no other. None: none fits;
        the call makes its own. On the way out the sandbox, if the run did not take
        it, is torn down, and the directory removed."""
        warm, self._warm_network = self._warm_network, None
        if warm is None:
            yield None
            return
        if not warm.fits(launch, workspace, trio.current_time()):
            self._retired.append(warm)
            self._wakeup.set()
            yield None
            return
        path = warm.directory.path
        self._reserved[path] = warm.sandbox
        try:
            yield path
        finally:
            unused = self._reserved.pop(path, None)
            if unused is not None:
                await unused.close()
            warm.directory.remove()
            self._wakeup.set()

    @contextlib.asynccontextmanager
    async def network_sandbox(self, plan: NetworkPlan, directory: Path) -> AsyncIterator[Sandbox]:
        """A sandbox with a way out for one call whose proxy socket is in ``directory``:
        the one set up ahead on that very directory (:meth:`network_directory`), else a
        new one. Torn down on the way out; the next one with a way out is then set up
        (from ``plan``) while the grants keep it."""
        self._network_plan = plan
        launch = plan.launch_for(directory)
        reserved = self._reserved.pop(directory, None)
        sandbox = None
        if reserved is not None:
            if reserved.usable(launch, trio.current_time()):
                sandbox = reserved
            else:
                self._retired.append(reserved)
        if sandbox is None:
            sandbox = Sandbox.start(launch, bounds=self.bounds)
        try:
            yield sandbox
        finally:
            await sandbox.close()
            self._wakeup.set()

    @contextlib.asynccontextmanager
    async def sandbox(self, launch: Launch) -> AsyncIterator[Sandbox]:
        """A sandbox for one call with ``launch`` (no way out): the warm one when it is
        usable, else a new one (OSError when bwrap cannot be started, SandboxRefused
        when it may not). Torn down on the way out."""
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
                await self._set_up_network()
        finally:
            warm, self._warm = self._warm, None
            network, self._warm_network = self._warm_network, None
            left = ([warm] if warm else []) + ([network] if network else []) + self._retired
            with trio.CancelScope(shield=True):
                for sandbox in left:
                    await sandbox.close()
            self._retired.clear()
            if isinstance(self.bounds.cgroups, CgroupTree):
                self.bounds.cgroups.remove()

    async def _set_up_network(self) -> None:
        """A sandbox with a way out set up ahead, when the grants keep one, a call with
        a way out has run (its plan), and none waits."""
        plan = self._network_plan
        if not self._network_kept or plan is None or self._warm_network is not None:
            return
        if self.run_dir is None:
            return
        # 64 random bits, as a call id has: no other uid can guess the directory's name.
        name = f"w-{secrets.token_hex(8)}"
        try:
            directory = await trio.to_thread.run_sync(
                make_egress_directory, self.run_dir, name, plan.peer
            )
        except OSError as exc:
            log.warning("no sandbox with a way out set up ahead: %s", exc)
            return
        if not self._network_kept or plan != self._network_plan or self._warm_network:
            directory.remove()  # the grants or the call changed meanwhile
            return
        try:
            sandbox = Sandbox.start(plan.launch_for(directory.path), bounds=self.bounds)
        except (OSError, SandboxRefused) as exc:
            directory.remove()
            log.debug("no sandbox with a way out set up ahead: %s", exc)
            return
        self._warm_network = WarmNetwork(sandbox, plan, directory)
