"""boxmaker and MCP (docs/mcp.md): ``bxctl mcp serve`` offers brokerd's tools to any MCP
client, a client of broker.sock with no authority of its own, as loopd is.

Only this package and ``boxmaker.cli.mcp`` import the SDK (the optional extra
``boxmaker[mcp]``); the pure core never does.
"""
