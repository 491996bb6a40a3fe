"""Deciding a call now: brokerd's decision and ``bxctl grants test``'s, in one function.

:func:`decide_now` is the whole pipeline, so what bxctl predicts and what brokerd
decides cannot drift apart: with the grants as read now, read the session's state,
evaluate (:func:`boxmaker.core.decide.evaluate`, the decision's steps 2-7 of
docs/architecture.md), and before an ask goes to the owner, look at what it needs on disk
(:mod:`boxmaker.core.before_asking`: a write's directory, a shell call's sandbox). What
it reads comes through :class:`Sources`:
brokerd's (:class:`BrokerSources`: its state cache, its ledger writer, a worker thread
for the look) or bxctl's (the files as they are). The grants are an argument, read by
the caller first, as the order demands (grants, then state): brokerd takes them for the
decision's record (``GrantsWatcher.take``), and bxctl shows their text.

Nothing of the runner or of brokerd's shared state is imported here: ``bxctl`` loads
none of brokerd's run machinery (tests/cli/test_imports.py).
"""

from __future__ import annotations

from collections.abc import Awaitable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from boxmaker.broker.sandbox_check import sandbox_problem
from boxmaker.broker.workspace_paths import missing_directory
from boxmaker.core.before_asking import before_asking, needs_sandbox, path_to_look
from boxmaker.core.decide import Ruling, Verdict, evaluate
from boxmaker.core.external_tools import ExternalCatalogue
from boxmaker.core.grant_parse import GrantsProblem
from boxmaker.core.grants import GrantSet
from boxmaker.core.labels import Label
from boxmaker.core.state import StateUnreadable
from boxmaker.core.vocabulary import ToolRequest
from boxmaker.formats.clock import utc_now

if TYPE_CHECKING:
    from boxmaker.broker.state import Broker


class Sources(Protocol):
    """Where deciding now reads, besides the grants."""

    @property
    def workspace(self) -> Path:
        """The workspace's real path."""
        ...

    def ledger_usable(self) -> bool:
        """Whether a decision can be recorded now (step 2)."""
        ...

    def witness_lagging(self) -> str | None:
        """Why risky calls are denied now (a witness lags and the owner chose
        ``witness_lag = "deny_risky"``), or None (step 3)."""
        ...

    def catalogue(self) -> ExternalCatalogue:
        """The external tools as they are now (brokerd's gateway)."""
        ...

    def state(self, session: str) -> Awaitable[Label | StateUnreadable]:
        """The session's state as its file says now."""
        ...

    def missing_directory(self, path: str) -> Awaitable[str | None]:
        """The look before an ask: the first directory of a write's ``path`` that does
        not exist (:func:`boxmaker.broker.workspace_paths.missing_directory`)."""
        ...

    def sandbox_problem(self) -> Awaitable[str | None]:
        """The look before a shell ask: why the shell's sandbox cannot run in the
        workspace now, or None (:func:`boxmaker.broker.sandbox_check.sandbox_problem`)."""
        ...


async def decide_now(
    request: ToolRequest,
    grants: GrantSet | GrantsProblem,
    sources: Sources,
    *,
    look_before_asking: bool = True,
    asked: Ruling | None = None,
    internal: bool = False,
) -> Verdict:
    """The verdict on ``request`` with ``grants``, the state and the external tools as
    they are now.

    ``look_before_asking``: take the look before an ask (a new call's decision, and
    ``grants test``'s); approve's re-decision, for a call the owner was already asked
    about, takes none, and passes the ask's decision as ``asked`` (an external tool's
    definition must still be the one asked about). ``internal``: brokerd's own request
    (a tunnel's ``connect``: :func:`boxmaker.core.decide.evaluate`)."""
    state = await sources.state(request.session)
    verdict = evaluate(
        request,
        ledger_usable=sources.ledger_usable(),
        witness_lagging=sources.witness_lagging(),
        grants=grants,
        state=state,
        now=utc_now(),
        workspace=str(sources.workspace),
        external=sources.catalogue(),
        asked=asked,
        internal=internal,
    )
    if not look_before_asking:
        return verdict
    path = path_to_look(verdict)
    if path is not None:
        return before_asking(verdict, await sources.missing_directory(path))
    if needs_sandbox(verdict):
        return before_asking(verdict, None, await sources.sandbox_problem())
    return verdict


class BrokerSources:
    """brokerd's sources: the session state cache, the ledger writer's state, and the
    look in a worker thread (:attr:`Broker.to_thread`)."""

    __slots__ = ("broker",)

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    @property
    def workspace(self) -> Path:
        return self.broker.workspace

    def ledger_usable(self) -> bool:
        return self.broker.writer.usable

    def witness_lagging(self) -> str | None:
        return self.broker.witness_lagging()

    def catalogue(self) -> ExternalCatalogue:
        return self.broker.gateway.catalogue()

    def state(self, session: str) -> Awaitable[Label | StateUnreadable]:
        return self.broker.states.read(session)

    def missing_directory(self, path: str) -> Awaitable[str | None]:
        return self.broker.to_thread(missing_directory, self.broker.workspace, path)

    def sandbox_problem(self) -> Awaitable[str | None]:
        broker = self.broker
        return broker.to_thread(sandbox_problem, broker.workspace, broker.config.runner.sandbox_uid)
