"""brokerd's port to the MCP gateway: what brokerd asks of the MCP servers it fronts.

brokerd holds one :class:`McpGateway` (``Broker.gateway``): :class:`EmptyGateway` when
config.toml declares no ``[mcp_servers]``. brokerd starts its :meth:`~McpGateway.run` in
its nursery and cancels it when it stops; passes :meth:`~McpGateway.catalogue` to every
decision (approve's re-decision too), so core decides on the tools as they are now; and
for a decided ``mcp.*`` call awaits :meth:`~McpGateway.call` under the call's cancel
scope, which a withdrawn call (its requester gone) cancels (broker/connection.py).
Nothing here imports the MCP SDK: brokerd without MCP servers never loads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import trio

from boxmaker.broker.run_spec import RunResult
from boxmaker.core.external_tools import EMPTY_CATALOGUE, ExternalCatalogue, ExternalTool

if TYPE_CHECKING:
    from boxmaker.broker.egress import EgressParent


class McpGateway(Protocol):
    """The MCP servers brokerd fronts (docs/architecture.md)."""

    def catalogue(self) -> ExternalCatalogue:
        """The external tools now, each with its state and definition hash; never
        blocks (the gateway replaces it whole when a server's tools change)."""
        ...

    async def call(
        self,
        tool: ExternalTool,
        arguments: Mapping[str, Any],
        *,
        caller: EgressParent | None = None,
    ) -> RunResult:
        """Run ``tool`` (an accepted ``mcp.*`` tool, as decided) with ``arguments`` (as
        checked): its result, or a failure (``mcp_server_failed``, ``timeout``, ...); never
        raises for the server's failure. Cancelled when the call is withdrawn (the
        gateway then sends the server ``notifications/cancelled``). ``caller``: the
        call (its id, session and tool) that a server's connections meanwhile are
        attributed to, when the server has a way out (broker/server_egress.py)."""
        ...

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled (brokerd stopping), having stopped every server by then;
        ``task_status.started()`` once calls may come."""
        ...


class EmptyGateway:
    """No MCP servers: an empty catalogue, so every ``mcp.*`` call is ``unknown_tool``
    before anything could call it."""

    def catalogue(self) -> ExternalCatalogue:
        return EMPTY_CATALOGUE

    async def call(
        self,
        tool: ExternalTool,
        arguments: Mapping[str, Any],
        *,
        caller: EgressParent | None = None,
    ) -> RunResult:
        raise AssertionError(f"{tool.name}: no MCP server is configured")  # pragma: no cover

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await trio.sleep_forever()
