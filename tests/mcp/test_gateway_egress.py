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

import pytest
import trio
from tests.harness.broker import records, running, tool_request
from tests.harness.mcp_egress import Setup, answer, connections, decisions, make_setup, refused
from tests.harness.sandbox import sandbox_workspace

from boxmaker.home.paths import Home

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not all(shutil.which(p) for p in ("bwrap", "socat")), reason="needs bubblewrap and socat"
    ),
]
LIMIT = 60


@pytest.fixture
def workspace() -> Iterator[Path]:
    with sandbox_workspace() as ws:
        yield ws


@pytest.fixture
async def setup(home: Home, workspace: Path, nursery: trio.Nursery, tmp_path: Path) -> Setup:
    return await make_setup(home, workspace, nursery, tmp_path)


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
    assert got["content"].startswith(refused("other.test", setup.server.port) + "; "), got
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
    assert got["content"].startswith(refused("svc.test", setup.server.port) + "; "), got
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
