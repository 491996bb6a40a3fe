"""MCP both ways (docs/mcp.md). The official SDK (the ``mcp`` extra) is imported only by
the modules of this package that speak MCP; brokerd loads them only when config.toml
declares ``[mcp_servers]``, bxctl only for a command that starts a server."""
