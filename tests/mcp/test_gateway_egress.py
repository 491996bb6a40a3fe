"""An MCP server's way out through brokerd (broker/server_egress.py): the real brokerd,
the fake server in its real sandbox (bwrap, socat), and a TLS server on loopback the
grants name. The server opens its own CONNECTs through ``https_proxy``
(tests/fakes/mcp_server.py, ``net``); the resolver seam stands for DNS.

- a host a grant names for the tool is reached, recorded with the MCP call as ``via``,
  and the call's result is labelled untrusted;
- a host no grant names is refused ``403`` and never looked up;
- a tool that the grant's ``via`` does not name gets no tunnel, though the server has
  its way out (another of its tools is named);
- two calls at once are sent one after the other, each tunnel attributed to its call;
- a server no connect grant names has no network at all.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from tests.harness.broker import call, records, running, tool_request
from tests.harness.homes import grant, grant_table, write_grants
from tests.harness.mcp_servers import (
    echo_definition,
    fake_server,
    net_definition,
    pin_all,
    server_toml,
)
from tests.harness.sandbox import sandbox_workspace
from tests.harness.tunnels import Certificate, Resolver, TlsEchoServer, configure

from boxmaker.home.paths import Home

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not all(shutil.which(p) for p in ("bwrap", "socat")), reason="needs bubblewrap and socat"
    ),
]
LIMIT = 60


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


@pytest.fixture
def workspace() -> Iterator[Path]:
    with sandbox_workspace() as ws:
        yield ws


@pytest.fixture
async def setup(home: Home, workspace: Path, nursery: trio.Nursery, tmp_path: Path) -> Setup:
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
        "see docs/runbook.md#egress; "
    )


async def answer(home: Home, request: dict[str, Any]) -> dict[str, Any]:
    frames = await call(home, request)
    assert frames[-1]["outcome"] == "ok", frames
    return frames[-1]


async def test_an_allowed_host_is_reached_and_recorded_with_the_mcp_call_as_via(
    setup: Setup,
) -> None:
    home = setup.home
    setup.grants("mcp.fake.net")
    request = setup.net()
    with trio.fail_after(LIMIT):
        async with running(home, host=setup.resolver.host):
            got = await answer(home, request)
    assert got["content"].startswith("echoed b'ping'; at most 1 at once; proxy http://127.0.0"), got
    [received] = setup.server.connections
    assert received.server_name == "svc.test"
    assert setup.resolver.lookups == [("svc.test", setup.server.port)]
    [connect] = decisions(home, "connect")
    assert connect["verdict"] == "run"
    assert connect["arguments"] == {
        "host": "svc.test",
        "port": setup.server.port,
        "scheme": "https",
        "via": request["call"],
        "via_tool": "mcp.fake.net",
    }
    [connection] = connections(home)
    assert (connection["call"], connection["via"], connection["session"]) == (
        connect["call"],
        request["call"],
        request["session"],
    )
    assert (connection["server_name"], connection["bytes_up"]) == ("svc.test", len(received.data))
    [result] = [r for r in records(home) if r["kind"] == "result" and r["call"] == request["call"]]
    # The server's label is public; what came through the tunnel makes it untrusted.
    assert result["label"] == {"taint": "public", "untrusted": True}


async def test_a_host_not_granted_is_refused_and_never_resolved(setup: Setup) -> None:
    home = setup.home
    setup.grants("mcp.fake.net")
    request = setup.net(host="other.test")
    with trio.fail_after(LIMIT):
        async with running(home, host=setup.resolver.host):
            got = await answer(home, request)
    assert got["content"].startswith(refused("other.test", setup.server.port)), got
    assert setup.resolver.lookups == []
    assert setup.server.connections == []
    [connect] = decisions(home, "connect")
    assert (connect["verdict"], connect["reason"]) == ("deny", "no_grant")
    assert (connect["arguments"]["via"], connect["arguments"]["via_tool"]) == (
        request["call"],
        "mcp.fake.net",
    )
    assert connections(home) == []


async def test_a_tool_not_named_by_via_gets_no_tunnel(setup: Setup) -> None:
    home = setup.home
    setup.grants("mcp.fake.net")  # the server has its way out, for net only
    request = setup.net("net_b")
    with trio.fail_after(LIMIT):
        async with running(home, host=setup.resolver.host):
            got = await answer(home, request)
    assert got["content"].startswith(refused("svc.test", setup.server.port)), got
    assert setup.resolver.lookups == []
    assert setup.server.connections == []
    [connect] = decisions(home, "connect")
    assert (connect["verdict"], connect["reason"]) == ("deny", "no_grant")
    assert connect["arguments"]["via_tool"] == "mcp.fake.net_b"
    assert connect["arguments"]["via"] == request["call"]


async def test_two_calls_are_sent_one_at_a_time_each_tunnel_its_calls(setup: Setup) -> None:
    home = setup.home
    setup.grants("mcp.fake.*")
    first = setup.net(session="s-0000000000a1", pause=1.0)
    second = setup.net(session="s-0000000000b2", pause=1.0)
    got: dict[str, dict[str, Any]] = {}

    async def send(request: dict[str, Any]) -> None:
        got[request["call"]] = await answer(home, request)

    with trio.fail_after(LIMIT):
        async with running(home, host=setup.resolver.host), trio.open_nursery() as both:
            both.start_soon(send, first)
            both.start_soon(send, second)
    for request in (first, second):
        # Each tool call held its tunnel for a second: never two at once in the server.
        assert "at most 1 at once" in got[request["call"]]["content"], got
    assert len(setup.server.connections) == 2
    by_via = {c["via"]: c for c in connections(home)}
    assert set(by_via) == {first["call"], second["call"]}
    for request in (first, second):
        assert by_via[request["call"]]["session"] == request["session"]
    # One after the other: the first tunnel ended before the second was asked for.
    kinds = [(r["kind"], r.get("via") or r.get("arguments", {}).get("via")) for r in records(home)]
    ends = [i for i, (kind, _) in enumerate(kinds) if kind == "connection"]
    asks = [i for i, (kind, via) in enumerate(kinds) if kind == "decision" and via]
    assert ends[0] < asks[1], kinds


async def test_a_server_no_connect_grant_names_has_no_network_at_all(setup: Setup) -> None:
    home = setup.home
    setup.grants()
    request = setup.net()
    with trio.fail_after(LIMIT):
        async with running(home, host=setup.resolver.host):
            got = await answer(home, request)
            reach = await answer(home, tool_request("mcp.fake.reach", {"path": "/run"}))
    assert got["content"].startswith("proxy: [Errno 111] Connection refused"), got
    assert got["content"].endswith("proxy None"), got
    assert "network: [Errno 101] Network is unreachable" in reach["content"], reach
    assert not (home.run_dir / "egress").exists()
    assert decisions(home, "connect") == []
