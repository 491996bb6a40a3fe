"""``bxctl mcp``: boxmaker and MCP, both ways (docs/mcp.md).

``bxctl mcp serve`` is what an MCP client starts (``claude mcp add boxmaker -- bxctl mcp
serve``): it speaks MCP on stdin/stdout and asks brokerd about every call on broker.sock,
as loopd does. It needs the optional extra ``boxmaker[mcp]`` (the SDK is imported only
when the command runs, so bxctl works without it).

``bxctl mcp list``, ``pin``, ``logs`` and ``import`` are the other way: the MCP servers
whose tools go through brokerd (cli/mcp_servers.py).
"""

from __future__ import annotations

from typing import Final

from cyclopts import App

from boxmaker.cli.common import DEFAULT, Common, Exit, fail
from boxmaker.cli.mcp_servers import import_, list_, logs, pin
from boxmaker.home.config import ConfigError, load_config
from boxmaker.loop.broker_port import BrokerPort
from boxmaker.runtime.daemon import setup_logging

RUNBOOK_EXTRA: Final = "docs/runbook.md#mcp-extra"
INSTALL_EXTRA: Final = "pip install 'boxmaker[mcp]'"
SDK_MODULES: Final = frozenset({"mcp", "mcp_types"})

mcp_app = App(
    name="mcp",
    help="MCP both ways: boxmaker's tools for MCP clients, and the MCP servers whose "
    "tools go through brokerd (docs/mcp.md).",
)
mcp_app.command(list_, name="list")
mcp_app.command(pin)
mcp_app.command(logs)
mcp_app.command(import_, name="import")


@mcp_app.command
async def serve(*, common: Common = DEFAULT) -> Exit:
    """Serve brokerd's tools to an MCP client on stdin/stdout (the client starts this).

    Every call is a request to brokerd, decided by your grants, asked of you where a
    grant says ask (answer with `bxctl approvals`), and recorded. Logs go to stderr.
    """
    try:
        from boxmaker.mcp.serve import serve_stdio  # the optional extra: imported here
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in SDK_MODULES:
            raise
        return fail(
            f"`bxctl mcp serve` needs the MCP SDK, which is not installed: "
            f"{INSTALL_EXTRA} (see {RUNBOOK_EXTRA})"
        )
    home = common.resolve()
    try:
        config = load_config(home)
    except ConfigError as exc:
        return fail(f"{exc}; see docs/runbook.md#config")
    setup_logging("mcp")
    port = BrokerPort(home.broker_sock, reply_timeout=config.loop.reply_timeout)
    # The wire is fds 0 and 1 themselves (mcp/stdio.py), never sys.stdout: bxctl's
    # printable filter there would garble it, and a stray print goes to stderr meanwhile.
    await serve_stdio(port)
    return Exit.DONE
