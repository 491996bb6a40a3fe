"""The workspace must never reach the home (docs/runbook.md#config): brokerd's check
while it runs."""

from __future__ import annotations

import logging
from pathlib import Path

import trio

from boxmaker.core.grant_parse import GrantsProblem
from boxmaker.home.config import workspace_problem
from boxmaker.home.paths import Home
from boxmaker.runtime.daemon import CONFIG_ANCHOR
from boxmaker.runtime.threads import WORKER_THREAD, ToThread

log = logging.getLogger("boxmaker.brokerd")


class HomeGuard:
    """brokerd's check, while it runs, that the workspace does not reach the home.

    config.toml was checked at start (:func:`boxmaker.home.config.workspace_problem`, on real
    paths); links can change afterwards. The sandbox and the file tools use the
    workspace's real path resolved once at start (``real_workspace``), so a workspace
    link retargeted later changes nothing for them; but the home can still be moved
    into it, or the link pointed at a directory that holds the home. :meth:`look` runs
    the same check again, on the configured workspace and on the real path in use; the
    first problem is kept for good (:attr:`refusal`), every call from then on is denied
    ``grants_invalid``, and serve stops brokerd with exit 2, as a refused start.
    """

    def __init__(
        self,
        home: Home,
        workspace: Path,
        real_workspace: Path,
        *,
        to_thread: ToThread = WORKER_THREAD,
    ) -> None:
        self.home = home
        self.workspace = workspace
        self.real_workspace = real_workspace
        self._to_thread = to_thread
        self.refusal: str | None = None
        self.refused = trio.Event()

    def problem(self) -> str | None:
        """Blocking (realpath): in a worker thread, or before trio serves anything."""
        return workspace_problem(self.home, self.workspace) or workspace_problem(
            self.home, self.real_workspace
        )

    async def look(self) -> bool:
        """Check again (at each grants re-read, each watcher tick, SIGHUP); True when
        the home is refused, now or before."""
        if self.refusal is None:
            problem = await self._to_thread(self.problem, abandon_on_cancel=True)
            if problem is not None and self.refusal is None:
                self.refusal = problem
                log.error(
                    "config.toml: workspace: %s; every call is denied and brokerd stops; see %s",
                    problem,
                    CONFIG_ANCHOR,
                )
                self.refused.set()
        return self.refusal is not None

    def refused_grants(self, path: Path) -> GrantsProblem:
        return GrantsProblem(
            str(path),
            None,
            None,
            f"not used while the workspace reaches the home: {self.refusal}",
        )
