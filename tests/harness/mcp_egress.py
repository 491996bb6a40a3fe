"""An MCP server with a way out through brokerd, for the tests of
broker/server_egress.py: the fake server (tests/fakes/mcp_server.py, its ``net`` tools)
as ``[mcp_servers.fake]`` in a sandbox workspace, a TLS echo server on loopback, a
resolver for its names, and readers of what the ledger says of the tunnels."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import trio

from boxmaker.home.paths import Home

from .broker import call, records, tool_request
from .homes import grant, grant_table, write_grants
from .mcp_servers import echo_definition, fake_server, net_definition, pin_all, server_toml
from .tunnels import Certificate, Resolver, TlsEchoServer, configure


@attrs.define
class Setup:
    home: Home
    definition: Path
    cafile: str
    server: TlsEchoServer
    resolver: Resolver

    def grants(self, *via: str, hosts: tuple[str, ...] = ("svc.test", "127.0.0.1")) -> None:
        """Every tool of the fake auto; a connect grant for ``hosts`` at the echo
        server's port (the address they resolve to, loopback, named too) by the tools
        ``via`` (none: no connect grant)."""
        tables = grant("all", "mcp.fake.*", "auto")
        if via:
            port = self.server.port
            quoted = ", ".join(f'"{h}:{port}"' for h in hosts)
            names = ", ".join(f'"{v}"' for v in via)
            tables += grant_table("net", "connect", "auto", hosts=f"[{quoted}]", via=f"[{names}]")
        write_grants(self.home, tables)

    def net(self, tool: str = "net", session: str = "s-0000000000a1", **arguments: Any) -> Any:
        arguments = {"host": "svc.test", "port": self.server.port, "cafile": self.cafile} | (
            arguments
        )
        return tool_request(f"mcp.fake.{tool}", arguments, session=session)


async def make_setup(home: Home, workspace: Path, nursery: trio.Nursery, tmp_path: Path) -> Setup:
    """The fake server as [mcp_servers.fake] (label public), its tools pinned, the echo
    server's CA where the server can read it, a resolver for svc.test and other.test."""
    certificate = Certificate.make()
    server = TlsEchoServer(certificate.server_context(tmp_path))
    await nursery.start(server.serve)
    definition = workspace.parent / "definition" / "echo.txt"
    definition.parent.mkdir()
    cafile = definition.parent / "ca.pem"
    cafile.write_bytes(certificate.cert_pem)
    configure(home, workspace)
    fake = attrs.evolve(fake_server(definition, call_timeout_s=20.0), label="public")
    with home.config_toml.open("a") as config:
        config.write("\n" + server_toml("fake", fake))
    reach = {"type": "object", "properties": {"path": {"type": "string"}}}
    pins = {name: net_definition(name) for name in ("net", "net_b")}
    pins["reach"] = {"name": "reach", "description": "Network and home.", "inputSchema": reach}
    pin_all(home, "fake", {"echo": echo_definition(), **pins})
    resolver = Resolver({"svc.test": ["127.0.0.1"], "other.test": ["127.0.0.1"]})
    return Setup(home, definition, str(cafile), server, resolver)


def decisions(home: Home, tool: str) -> list[dict[str, Any]]:
    return [r for r in records(home) if r["kind"] == "decision" and r["tool"] == tool]


def connections(home: Home) -> list[dict[str, Any]]:
    return [r for r in records(home) if r["kind"] == "connection"]


def refused(host: str, port: int) -> str:
    """What the server's CONNECT got for a host no grant lets its tool reach."""
    return (
        f"refused: HTTP/1.1 403 : boxmaker: CONNECT {host}:{port}: denied no_grant\n"
        f"(no grant allows it)\nno grant allows connect on {host}:{port}\n"
        "see docs/runbook.md#egress"
    )


async def answer(home: Home, request: dict[str, Any]) -> dict[str, Any]:
    frames = await call(home, request)
    assert frames[-1]["outcome"] == "ok", frames
    return frames[-1]
