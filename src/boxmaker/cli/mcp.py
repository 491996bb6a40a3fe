"""``bxctl mcp``: MCP both ways (docs/mcp.md). The MCP servers whose tools go through
brokerd: ``list``, ``pin``, ``logs``, ``import`` (cli/mcp_servers.py)."""

from __future__ import annotations

from cyclopts import App

from boxmaker.cli.mcp_servers import import_, list_, logs, pin

mcp_app = App(name="mcp", help="MCP: the MCP servers whose tools go through brokerd.")
mcp_app.command(list_, name="list")
mcp_app.command(pin)
mcp_app.command(logs)
mcp_app.command(import_, name="import")
