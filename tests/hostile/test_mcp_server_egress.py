"""An MCP server with a way out, as a party (docs/threat-model.md, "An MCP server"): it
may use the network only for the call in flight, with that call's grants
(broker/server_egress.py). The fake server (tests/fakes/mcp_server.py, ``net``) runs in
its real sandbox; each test shows the attack ran by the server's own words.

- It connects from a thread after its call answered: the CONNECT is refused ``403``
  (no call in flight), logged by brokerd, nothing is decided, resolved or dialled.
- It keeps a tunnel and a second connection opened during a call its grants let out,
  and uses them in a later call of a tool no grant names: the tunnel ended with its call
  (``call_ended``), the connection was shut, and the later call's own CONNECT is denied
  with that call as ``via``.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from tests.harness.broker import running
from tests.harness.mcp_egress import Setup, answer, connections, decisions, make_setup, refused
from tests.harness.sandbox import sandbox_workspace

from boxmaker.broker.egress import NO_CALL_DETAIL
from boxmaker.home.paths import Home

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not all(shutil.which(p) for p in ("bwrap", "socat")), reason="needs bubblewrap and socat"
    ),
]
LIMIT = 60
RUNBOOK = "docs/runbook.md#egress"


@pytest.fixture
def workspace() -> Iterator[Path]:
    with sandbox_workspace() as ws:
        yield ws


@pytest.fixture
async def setup(home: Home, workspace: Path, nursery: trio.Nursery, tmp_path: Path) -> Setup:
    return await make_setup(home, workspace, nursery, tmp_path)


async def _logged(home: Home, words: str) -> str:
    path = home.mcp_log("fake")
    while not path.exists() or words not in path.read_text():  # noqa: ASYNC110
        await trio.sleep(0.05)
    return path.read_text()


async def test_a_connection_after_its_call_answered_gets_nothing_out(
    setup: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    home = setup.home
    setup.grants("mcp.fake.net")
    request = setup.net(action="later", pause=0.5)
    with trio.fail_after(LIMIT):
        async with running(home, host=setup.resolver.host):
            got = await answer(home, request)
            assert got["content"] == "later: scheduled"
            # The server's thread tried, after its call had answered.
            log = await _logged(home, "later: ")
    refusal = f"later: refused: HTTP/1.1 403 : boxmaker: {NO_CALL_DETAIL}\nsee {RUNBOOK}\n"
    assert refusal in log, log
    assert setup.resolver.lookups == []
    assert setup.server.connections == []
    assert decisions(home, "connect") == []
    refusals = [r.getMessage() for r in caplog.records if r.name == "boxmaker.brokerd.egress"]
    assert (
        f"mcp-fake: refused CONNECT svc.test:{setup.server.port}: no call of the server is in "
        "flight"
    ) in refusals, refusals


async def test_a_server_cannot_carry_one_calls_connections_into_another(setup: Setup) -> None:
    home = setup.home
    setup.grants("mcp.fake.net")  # net may reach svc.test; net_b may not
    granted = setup.net(action="hold", session="s-0000000000a1")
    later = setup.net("net_b", action="reuse", session="s-0000000000b2")
    with trio.fail_after(LIMIT):
        async with running(home, host=setup.resolver.host):
            held = await answer(home, granted)
            assert held["content"].startswith("echoed b'ping'"), held
            got = await answer(home, later)
    port = setup.server.port
    held_line, _, rest = got["content"].partition("\nspare: ")
    spare, _, fresh = rest.partition("\nfresh: ")
    # The tunnel of the first call ended with it: the later call finds it closed.
    assert held_line.startswith("held: closed"), got
    # The connection opened in the first call and left unused was shut at its end; or,
    # had socat carried it to the proxy only after that call answered, it is no call's.
    nobodys = f"refused: HTTP/1.1 403 : boxmaker: {NO_CALL_DETAIL}\nsee {RUNBOOK}"
    assert spare in ("no answer (closed after 0 bytes)", nobodys), got
    # The later call's own CONNECT is its own, decided with its tool: denied.
    assert fresh == refused("svc.test", port), got
    [received] = setup.server.connections
    [connection] = connections(home)
    assert (connection["via"], connection["ended"]) == (granted["call"], "call_ended")
    assert connection["bytes_up"] == len(received.data)
    first, second = decisions(home, "connect")
    assert (first["verdict"], first["arguments"]["via"]) == ("run", granted["call"])
    assert (second["verdict"], second["reason"]) == ("deny", "no_grant")
    assert (second["arguments"]["via"], second["arguments"]["via_tool"]) == (
        later["call"],
        "mcp.fake.net_b",
    )
