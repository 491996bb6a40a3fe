"""boxmaker and MCP, both ways (docs/mcp.md): ``bxctl mcp serve`` offers brokerd's tools
to any MCP client, a client of broker.sock with no authority of its own, as loopd is; and
brokerd's gateway runs the owner's MCP servers, each in its own sandbox, their pinned
tools decided like any other.

Only this package and ``boxmaker.cli.mcp`` import the SDK (the optional extra
``boxmaker[mcp]``); the pure core never does. brokerd loads the gateway only when
config.toml declares ``[mcp_servers]``; bxctl only for a command that starts a server.
"""
