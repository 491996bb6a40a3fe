"""brokerd's shared mutable state: one :class:`Broker` per process.

Everything here is touched only from trio tasks of the one thread, so nothing is
locked: a method that does not await runs to completion. The calls waiting for the
owner, and how each of their entries ends, are :class:`~boxmaker.broker.pending.PendingCalls`
(the broker's ``pending``); each call's own task writes every record of its call, in
the order :mod:`boxmaker.core.call` gives, so no record can be written twice.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeAlias

import attrs
import trio

from boxmaker.broker import runner
from boxmaker.broker.grants_watcher import GrantsWatcher
from boxmaker.broker.home_guard import HomeGuard
from boxmaker.broker.limits import Capacity
from boxmaker.broker.mcp_port import EmptyGateway, McpGateway
from boxmaker.broker.notify import Notifier
from boxmaker.broker.pending import PendingCalls
from boxmaker.broker.run_spec import RunResult, RunSpec
from boxmaker.broker.sandbox_pool import SandboxPool
from boxmaker.broker.session_states import SessionStates
from boxmaker.broker.tools.host import REAL_HOST, Host
from boxmaker.broker.witnesses import NO_CHECKPOINTS_DETAIL, WitnessSender
from boxmaker.core.approvals import ApprovalsTable
from boxmaker.core.labels import Label
from boxmaker.core.state import StateUnreadable
from boxmaker.home import state_files
from boxmaker.home.config import Config
from boxmaker.home.paths import Home
from boxmaker.ledger.records import Body
from boxmaker.ledger.writer import LedgerStopped, LedgerWriter
from boxmaker.runtime.threads import WORKER_THREAD, ToThread


class Executor(Protocol):
    """:func:`boxmaker.broker.runner.execute`'s shape, as brokerd calls it."""

    async def __call__(
        self,
        spec: RunSpec,
        sandboxes: SandboxPool | None = ...,
        *,
        to_thread: ToThread = ...,
    ) -> RunResult: ...


StateRaiser: TypeAlias = Callable[[Path, str, Label], Label | StateUnreadable]
""":func:`boxmaker.home.state_files.raise_state`'s shape."""


@attrs.define(eq=False)
class Broker:
    """What every connection of one brokerd boot shares.

    ``execute``, ``raise_state`` and ``to_thread`` are the real runner, state writer and
    worker thread; a test passes its own to :func:`~boxmaker.broker.serve.serve_broker`
    (a slow run, a state that cannot be raised, work run inline)."""

    home: Home
    config: Config
    writer: LedgerWriter
    boot: str
    version: str
    owner_uid: int
    grants: GrantsWatcher
    guard: HomeGuard
    """Where the workspace really is, and whether it has come to reach the home."""
    execute: Executor = runner.execute
    """Runs a call's RunSpec (runner.py)."""
    raise_state: StateRaiser = state_files.raise_state
    """Raises a session's state file (blocking: through ``to_thread``)."""
    to_thread: ToThread = WORKER_THREAD
    """Where every blocking step of a call runs (:mod:`boxmaker.runtime.threads`)."""
    host: Host = REAL_HOST
    """What brokerd asks of the machine itself: the egress proxy resolves names
    through its ``resolve`` (a test passes its own resolver)."""
    started_at: float = attrs.field(factory=trio.current_time)
    pending: PendingCalls = attrs.Factory(PendingCalls)
    """The calls waiting for the owner, and how each ends (pending.py)."""
    sessions: dict[str, int] = attrs.Factory(dict)
    """Sessions seen this boot, with their number of tool requests (``bxctl sessions``)."""
    calls: set[str] = attrs.Factory(set)
    """Call ids seen this boot; a reused one is refused (see connection.py)."""
    stopping: bool = False
    sandboxes: SandboxPool = attrs.Factory(SandboxPool)
    gateway: McpGateway = attrs.Factory(EmptyGateway)
    """The MCP servers' tools (broker/mcp_port.py): an empty one without ``[mcp_servers]``."""
    witnesses: WitnessSender | None = None
    """The ``[[witness]]`` sender (witnesses.py): None without witnesses, or when no
    checkpoint is signed this boot."""
    """The shell sandbox kept set up ahead of the next call (sandbox_pool.py)."""
    states: SessionStates = attrs.field(init=False)
    """The session states read this boot (:class:`SessionStates`)."""
    capacity: Capacity = attrs.field(init=False)
    """broker.sock's caps and what is used of them (limits.py)."""
    notifier: Notifier = attrs.field(init=False)
    """Runs ``[notify] command`` when a call starts waiting (notify.py)."""
    _stop: trio.Event = attrs.Factory(trio.Event)

    _sessions_dir: Path = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        # Home's paths are properties that join on every use: computed once per boot.
        self._sessions_dir = self.home.sessions_dir
        self.states = SessionStates(self._sessions_dir, to_thread=self.to_thread)
        self.capacity = Capacity.for_config(self.config.broker)
        self.notifier = Notifier(self.config.notify, self.home.root, self.config.workspace)

    @property
    def workspace(self) -> Path:
        """The workspace's real path, resolved and checked once at start: the sandbox
        binds it and the file tools work below it, so a workspace link retargeted later
        can never put the home in reach (:class:`HomeGuard`)."""
        return self.guard.real_workspace

    @property
    def sessions_dir(self) -> Path:
        return self._sessions_dir

    # -- lifecycle --------------------------------------------------------------------

    def request_stop(self) -> None:
        """Begin the clean stop (SIGINT/SIGTERM, or a test; docs/runbook.md)."""
        self._stop.set()

    async def wait_stop_requested(self) -> None:
        await self._stop.wait()

    # -- the ledger -------------------------------------------------------------------

    async def record(self, body: Body) -> bool:
        """Append one record; False when the ledger is stopped — the
        caller then answers ``audit_unavailable``. The writer logs the failure."""
        try:
            await self.writer.append(body)
        except LedgerStopped:
            return False
        return True

    def witness_lagging(self) -> str | None:
        """Why every risky call is denied now (the decision's step 3), or None: only
        with ``[ledger] witness_lag = "deny_risky"`` and a witness that lags. With
        witnesses but no checkpoint signed this boot, none can cosign: they all lag."""
        if self.config.ledger.witness_lag != "deny_risky" or not self.config.witness:
            return None
        if self.witnesses is None:
            return NO_CHECKPOINTS_DETAIL
        return self.witnesses.lagging()

    # -- calls and sessions -----------------------------------------------------------

    def claim_call(self, call: str, session: str) -> bool:
        """Note a tool request; False if its call id was already used in this boot."""
        if call in self.calls:
            return False
        self.calls.add(call)
        self.sessions[session] = self.sessions.get(session, 0) + 1
        return True

    # -- pending entries --------------------------------------------------------------

    @property
    def table(self) -> ApprovalsTable:
        """The pending entries (:class:`PendingCalls` owns them)."""
        return self.pending.table

    @property
    def waiters(self) -> dict[str, object]:
        """The approval ids whose calls still wait or are ending."""
        return dict(self.pending.waiters)

    def withdraw_all(self) -> int:
        """Shutdown: every pending entry ends withdrawn (``broker_stopping``); each
        waiting call records it and answers."""
        self.stopping = True
        return self.pending.withdraw_all()
