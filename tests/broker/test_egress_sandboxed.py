"""A real shell sandbox with a way out (bwrap, socat, curl) through brokerd's proxy:
the whole path a sandboxed program's connection takes, as root the way CI runs it
(the call's directory must be reachable by the sandbox's own bwrap: broker/egress.py,
``_egress_root``). Real time; the resolver seam stands for DNS.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from tests.harness.broker import Brokerd, call, eventually, tool_request
from tests.harness.sandbox import sandbox_workspace
from tests.harness.tunnels import (
    Certificate,
    Resolver,
    TlsEchoServer,
    configure,
    connect_calls,
    grants,
    network_grant,
    the_connection,
)
from trio.testing import wait_all_tasks_blocked

from boxmaker.home.paths import Home

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not all(shutil.which(p) for p in ("bwrap", "socat", "curl")),
        reason="needs bubblewrap, socat and curl",
    ),
]


@pytest.fixture
def ws(home: Home) -> Iterator[Path]:
    with sandbox_workspace() as workspace:
        configure(home, workspace)
        yield workspace


async def curl(home: Home, url: str, session: str) -> str:
    command = f"curl -sS --max-time 5 --cacert ca.pem {url}; echo rc=$?"
    with trio.fail_after(60):
        frames = await call(home, tool_request("shell", {"command": command}, session=session))
    assert frames[-1]["outcome"] == "ok", frames
    return str(frames[-1]["content"])


async def test_curl_in_the_sandbox_reaches_an_allowed_host_and_only_that(
    home: Home, brokerd: Brokerd, ws: Path, nursery: trio.Nursery, tmp_path: Path
) -> None:
    certificate = Certificate.make()
    server = TlsEchoServer(certificate.server_context(tmp_path))
    await nursery.start(server.serve)
    (ws / "ca.pem").write_bytes(certificate.cert_pem)
    resolver = Resolver({"svc.test": ["127.0.0.1"], "other.test": ["127.0.0.1"]})
    await brokerd.start(host=resolver.host)
    port = server.port
    grants(home, network_grant([f"svc.test:{port}", f"127.0.0.1:{port}"]))

    allowed = await curl(home, f"https://svc.test:{port}/", "s-0000000000a1")
    # The TLS session was made (the echo server answers curl's request with itself,
    # which curl then calls HTTP/0.9): the host was reached, by its name.
    assert "Received HTTP/0.9 when not allowed" in allowed
    [received] = server.connections
    assert received.server_name == "svc.test"
    connection = the_connection(home)
    assert (connection["host"], connection["server_name"]) == ("svc.test", "svc.test")
    assert connection["bytes_up"] == len(received.data)

    # Another session: the first is untrusted now (it took in what the host sent).
    denied = await curl(home, f"https://other.test:{port}/", "s-0000000000b2")
    assert "CONNECT tunnel failed, response 403" in denied
    assert "rc=56" in denied
    assert len(server.connections) == 1
    assert resolver.lookups == [("svc.test", port)]
    assert len(connect_calls(home)) == 2


async def shell_ok(home: Home, command: str) -> None:
    with trio.fail_after(60):
        frames = await call(home, tool_request("shell", {"command": command}))
    assert frames[-1]["outcome"] == "ok", frames


async def test_grants_without_a_shell_connect_grant_stop_keeping_a_sandbox_with_a_way_out(
    home: Home, brokerd: Brokerd, ws: Path
) -> None:
    grants(home, network_grant(["svc.test"], commands='["true --net"]'))
    broker = await brokerd.start()
    pool = broker.sandboxes
    await shell_ok(home, "true --net")
    with trio.fail_after(10):
        await eventually(lambda: pool.warm_network is not None)
    warm = pool.warm_network
    assert warm is not None
    # A call without a way out, under grants that still give shell calls one: kept.
    await shell_ok(home, "true")
    assert pool.warm_network is warm

    grants(home)  # the shell grant alone: no connect grant names shell any more
    await shell_ok(home, "true")
    assert pool.warm_network is None
    with trio.fail_after(10):  # torn down in the pool's task: the process, then its directory
        await eventually(lambda: warm.sandbox.process.poll() is not None)
        await eventually(lambda: not warm.directory.path.exists())
    # The command that had a way out has none now, and none is set up after it.
    await shell_ok(home, "true --net")
    await wait_all_tasks_blocked()
    assert pool.warm_network is None

    grants(home, network_grant(["svc.test"], mode="ask", commands='["pip *"]'))
    await shell_ok(home, "true")  # the grants are read at a shell call: kept again
    with trio.fail_after(10):
        await eventually(lambda: pool.warm_network is not None)
