"""The sandbox's side of the way out (broker/sandbox_plan.py, broker/tools/shell.py;
docs/egress.md, docs/decisions.md, "The runner and the sandbox").

Real bwrap and real socat: a shell call with an egress directory reaches a stand-in for
brokerd's proxy (tests/harness/egress_standin.py) through 127.0.0.1:3128 inside its
sandbox, the programs people run find the proxy in their environment, a call without
socat never runs, and the bridge ends with the call. What the sandboxed command cannot
reach is tests/hostile/test_egress_sandbox.py's.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import shutil
import stat
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import attrs
import pytest
import trio
from tests.harness.broker import eventually
from tests.harness.egress_standin import StandIn, alive, socats_of, stand_in_at, stand_in_proxy
from tests.harness.runner import spec_for
from tests.harness.sandbox import AS_ROOT, SANDBOX_UID, sandbox_workspace
from trio.testing import wait_all_tasks_blocked

from boxmaker.broker import sandbox_check
from boxmaker.broker.run_spec import RunResult, RunSpec
from boxmaker.broker.runner import execute
from boxmaker.broker.sandbox import Sandbox
from boxmaker.broker.sandbox_check import NO_SOCAT_DETAIL
from boxmaker.broker.sandbox_plan import (
    EGRESS_MOUNT,
    PROXY_ENV,
    SANDBOX_ENV,
    SANDBOX_PATH,
    Egress,
    Launch,
    SandboxUser,
    egress_launch,
    sandbox_argv,
)
from boxmaker.broker.sandbox_pool import NetworkPlan, SandboxPool, WarmNetwork, keeps_a_way_out
from boxmaker.broker.tools import shell
from boxmaker.core.grant_parse import parse_grants
from boxmaker.core.reasons import Reason

BWRAP = shutil.which("bwrap")
SOCAT = shutil.which("socat")
pytestmark = pytest.mark.skipif(
    BWRAP is None or SOCAT is None, reason="bubblewrap and socat are not installed"
)
PROXY = "http://127.0.0.1:3128"
needs_curl = pytest.mark.skipif(
    shutil.which("curl", path=SANDBOX_PATH) is None, reason="curl is not installed"
)
SANDBOX_PYTHON = shutil.which("python3", path=SANDBOX_PATH)
SANDBOX_PIP = SANDBOX_PYTHON is not None and (
    subprocess.run([SANDBOX_PYTHON, "-c", "import pip._vendor.requests"], check=False).returncode
    == 0
)


@pytest.fixture
def ws() -> Iterator[Path]:
    with sandbox_workspace() as workspace:
        yield workspace


@pytest.fixture
async def stand_in() -> AsyncIterator[StandIn]:
    async with stand_in_proxy() as proxy:
        yield proxy


def network_spec(ws: Path, command: str, egress_dir: Path) -> RunSpec:
    return attrs.evolve(spec_for("shell", {"command": command}, ws), egress_dir=egress_dir)


async def run_with(stand_in: StandIn, ws: Path, command: str) -> RunResult:
    with trio.fail_after(20):
        return await execute(network_spec(ws, command, stand_in.directory))


def ok(result: RunResult) -> str:
    assert result.ok, result
    return result.content


def test_the_network_variant_is_the_sandbox_plus_its_way_out(ws: Path, tmp_path: Path) -> None:
    assert BWRAP is not None
    plain = Launch(sandbox_argv(BWRAP, ws), None)
    network = egress_launch(plain, ws, Egress(tmp_path, "/usr/bin/socat"))
    argv = network.argv
    assert argv[: argv.index("--clearenv") + 1] == plain.argv[: plain.argv.index("--clearenv") + 1]
    mount = argv.index(EGRESS_MOUNT)
    assert argv[mount - 2 : mount + 1] == ("--ro-bind", str(tmp_path), EGRESS_MOUNT)
    assert argv[mount + 1 : mount + 4] == ("--ro-bind", "/etc/ssl/certs", "/etc/ssl/certs")
    assert "--share-net" not in argv
    setenv = {argv[i + 1]: argv[i + 2] for i, arg in enumerate(argv) if arg == "--setenv"}
    assert setenv == {**SANDBOX_ENV, **PROXY_ENV}
    assert {key: value for key, value in PROXY_ENV.items() if value != PROXY} == {
        "NO_PROXY": "",
        "no_proxy": "",
    }
    launcher = argv[-1]
    # nodelay and the 256 KiB buffer: the connect latency and bulk rate the bench
    # measured (docs/decisions.md, "The bridge's options").
    bridge = (
        "/usr/bin/socat -b 262144 TCP-LISTEN:3128,bind=127.0.0.1,reuseaddr,fork,backlog=64,"
        f"nodelay UNIX-CONNECT:{EGRESS_MOUNT}/proxy.sock </dev/null >/dev/null &"
    )
    assert launcher.index(bridge) < launcher.index("read -r line")
    assert launcher.endswith('exec </dev/null; exec /bin/sh -c "${c%?}"')
    assert (network.user, network.limits) == (plain.user, plain.limits)


def test_a_spec_with_a_way_out_names_the_proxy_variables(ws: Path, tmp_path: Path) -> None:
    spec = spec_for("shell", {"command": "true"}, ws)
    assert dict(spec.env) == dict(SANDBOX_ENV)
    assert spec.egress_dir is None
    assert dict(attrs.evolve(spec, egress_dir=tmp_path).env) == {**SANDBOX_ENV, **PROXY_ENV}


@needs_curl
async def test_curl_goes_through_the_proxy_and_sends_the_name(stand_in: StandIn, ws: Path) -> None:
    command = "curl -sS --max-time 5 https://example.com/x; echo curl exit $?"
    out = ok(await run_with(stand_in, ws, command))
    # The stand-in echoes curl's own ClientHello: its TLS fails, after the CONNECT.
    assert "curl exit 35" in out or "curl exit 56" in out, out
    assert stand_in.request_lines() == [b"CONNECT example.com:443 HTTP/1.1"]
    assert b"\r\nHost: example.com:443" in stand_in.heads[0]


async def test_a_tunnel_carries_bytes_both_ways(stand_in: StandIn, ws: Path) -> None:
    script = (
        "import socket; s = socket.create_connection(('127.0.0.1', 3128), 5);"
        "s.sendall(b'CONNECT pypi.org:443 HTTP/1.1\\r\\nHost: pypi.org:443\\r\\n\\r\\n');"
        "print(s.recv(100).split(b'\\r\\n')[0].decode());"
        "s.sendall(b'through the bridge'); print(s.recv(100).decode())"
    )
    out = ok(await run_with(stand_in, ws, f'python3 -c "{script}"'))
    assert out == "HTTP/1.1 200 Connection established\nthrough the bridge\n"
    assert stand_in.request_lines() == [b"CONNECT pypi.org:443 HTTP/1.1"]


# Python takes every *_proxy variable for a scheme: npm's two name schemes no URL has.
PYTHON_PROXIES = [("all", PROXY), ("http", PROXY), ("https", PROXY)]
PYTHON_PROXIES += [("npm_config", PROXY), ("npm_config_https", PROXY)]


async def test_python_reads_the_proxy_from_the_environment(stand_in: StandIn, ws: Path) -> None:
    script = "import urllib.request; print(sorted(urllib.request.getproxies().items()))"
    out = ok(await run_with(stand_in, ws, f'python3 -c "{script}"'))
    assert out == f"{PYTHON_PROXIES}\n"


@pytest.mark.skipif(not SANDBOX_PIP, reason="the sandbox's python3 has no pip")
async def test_pip_reads_the_proxy_from_the_environment(stand_in: StandIn, ws: Path) -> None:
    # pip's requests session trusts the environment: no PIP_PROXY needed.
    script = (
        "from pip._vendor.requests.utils import get_environ_proxies as proxies;"
        "print(sorted(proxies('https://pypi.org/simple/').items()))"
    )
    out = ok(await run_with(stand_in, ws, f'python3 -c "{script}"'))
    assert out == f"{PYTHON_PROXIES}\n"


@needs_curl
async def test_no_name_escapes_the_proxy(stand_in: StandIn, ws: Path) -> None:
    # NO_PROXY is empty: loopback and private names go to brokerd like any other.
    command = (
        "for url in https://localhost:8443/ https://127.0.0.1/ https://10.1.2.3/; do "
        "curl -sS --max-time 5 $url >/dev/null 2>&1; done; echo done"
    )
    assert ok(await run_with(stand_in, ws, command)) == "done\n"
    assert stand_in.request_lines() == [
        b"CONNECT localhost:8443 HTTP/1.1",
        b"CONNECT 127.0.0.1:443 HTTP/1.1",
        b"CONNECT 10.1.2.3:443 HTTP/1.1",
    ]


@needs_curl
async def test_a_command_that_skips_the_proxy_gets_nowhere(stand_in: StandIn, ws: Path) -> None:
    command = (
        "NO_PROXY='*' curl -sS --max-time 5 https://example.com/ 2>&1; echo curl exit $?; "
        "curl -sS --noproxy '*' --max-time 5 https://127.0.0.1:3128/ -o /dev/null 2>&1; "
        "echo direct exit $?"
    )
    out = ok(await run_with(stand_in, ws, command))
    # No resolver: the name is never looked up; the bridge speaks only to the proxy.
    assert "Could not resolve host: example.com" in out
    assert "curl exit 6" in out
    assert stand_in.request_lines() == []


@pytest.mark.skipif(
    not Path("/etc/ssl/certs/ca-certificates.crt").exists(), reason="the host has no CA bundle"
)
async def test_the_tls_clients_find_the_system_certificates(stand_in: StandIn, ws: Path) -> None:
    script = "import ssl; print(ssl.create_default_context().cert_store_stats()['x509_ca'] > 0)"
    command = f'test -s /etc/ssl/certs/ca-certificates.crt && python3 -c "{script}"'
    assert ok(await run_with(stand_in, ws, command)) == "True\n"


async def test_without_socat_the_call_never_runs(
    stand_in: StandIn, ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sandbox_check, "socat_search_path", str(tmp_path))
    result = await run_with(stand_in, ws, "touch ran")
    assert (result.ok, result.reason, result.detail) == (
        False,
        Reason.SANDBOX_UNAVAILABLE,
        NO_SOCAT_DETAIL,
    )
    assert "socat" in NO_SOCAT_DETAIL
    assert NO_SOCAT_DETAIL.endswith("see docs/runbook.md#egress-socat")
    assert not (ws / "ran").exists()
    # The same call with socat found runs: the search path was the only difference.
    monkeypatch.undo()
    assert ok(await run_with(stand_in, ws, "touch ran && echo ran")) == "ran\n"


@pytest.mark.parametrize(
    "program",
    [
        "/usr/bin/false",  # exits at once
        # Runs on whatever its arguments, never listens: the launcher gives up after
        # its bound (about 3 s).
        "/workspace/never-listens",
    ],
)
async def test_a_bridge_that_does_not_listen_fails_the_call(
    stand_in: StandIn, ws: Path, monkeypatch: pytest.MonkeyPatch, program: str
) -> None:
    never_listens = ws / "never-listens"
    never_listens.write_text("#!/bin/sh\nexec sleep 60\n")
    never_listens.chmod(0o755)
    monkeypatch.setattr(shell, "find_socat", lambda: program)
    result = await run_with(stand_in, ws, "touch ran")
    assert (result.ok, result.reason) == (False, Reason.SANDBOX_UNAVAILABLE), result
    assert result.detail == (
        "the sandbox's way out could not be set up: "
        "boxmaker: the sandbox's way out (socat) did not start; "
        "see docs/runbook.md#egress-socat"
    )
    assert not (ws / "ran").exists()


async def test_socat_ends_with_the_call(stand_in: StandIn, ws: Path) -> None:
    seen: list[int] = []

    async def watch() -> None:
        while not seen:
            seen.extend(socats_of(stand_in.directory))
            await trio.sleep(0.01)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch)
        out = ok(await run_with(stand_in, ws, "sleep 0.5; echo slept"))
        nursery.cancel_scope.cancel()
    assert out == "slept\n"
    assert len(seen) == 1, "socat was never seen running in the call's sandbox"
    with trio.fail_after(3):
        while alive(seen[0]):  # noqa: ASYNC110  (no event for a pid's end)
            await trio.sleep(0.01)


async def test_a_call_with_a_way_out_leaves_the_warm_sandbox_alone(
    stand_in: StandIn, ws: Path
) -> None:
    assert BWRAP is not None
    user = SandboxUser(SANDBOX_UID, SANDBOX_UID) if AS_ROOT else None
    plain = Launch(sandbox_argv(BWRAP, ws), user)
    assert SOCAT is not None
    network = egress_launch(plain, ws, Egress(stand_in.directory, SOCAT))
    pool = SandboxPool()
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        async with pool.sandbox(plain) as first:
            await first.run("true", time_limit=10, output_cap=100)
        await wait_all_tasks_blocked()
        warm = pool.warm
        assert warm is not None
        plan = NetworkPlan(plain, ws, SOCAT)
        async with pool.network_sandbox(plan, stand_in.directory) as own:
            assert own.launch == network
            assert own is not warm
            await own.run("true", time_limit=10, output_cap=100)
        await wait_all_tasks_blocked()
        assert pool.warm is warm
        async with pool.sandbox(plain) as next_plain:
            assert next_plain is warm
        nursery.cancel_scope.cancel()


# -- a sandbox with a way out set up ahead ------------------------------------------------

_VIA_BRIDGE = """
import socket
s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
s.sendall(b"CONNECT pypi.org:443 HTTP/1.1\\r\\nHost: pypi.org:443\\r\\n\\r\\n")
print(s.recv(100).split(b"\\r\\n")[0].decode())
"""
CONNECTED = "HTTP/1.1 200 Connection established\n"
needs_python = pytest.mark.skipif(SANDBOX_PYTHON is None, reason="python3 is not installed")


def plain_launch(ws: Path) -> Launch:
    assert BWRAP is not None
    return Launch(
        sandbox_argv(BWRAP, ws), SandboxUser(SANDBOX_UID, SANDBOX_UID) if AS_ROOT else None
    )


def plan_for(ws: Path) -> NetworkPlan:
    assert SOCAT is not None
    return NetworkPlan(plain_launch(ws), ws, SOCAT)


@contextlib.asynccontextmanager
async def running_pool(run_dir: Path) -> AsyncIterator[SandboxPool]:
    pool = SandboxPool(run_dir=run_dir)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        yield pool
        nursery.cancel_scope.cancel()


async def run_in(sandbox: Sandbox, command: str) -> str:
    with trio.fail_after(20):
        run = await sandbox.run(command, time_limit=10, output_cap=4096)
    assert (run.returncode, bytes(run.err.head)) == (0, b""), run
    return bytes(run.out.head).decode()


async def warmed(pool: SandboxPool, stand_in: StandIn, ws: Path) -> WarmNetwork:
    """Keep a sandbox with a way out ahead: one call with a way out (its own sandbox:
    the pool learns its plan from it), then the one set up after it."""
    pool.keep_network(True)
    async with pool.network_directory(plain_launch(ws), ws) as directory:
        assert directory is None  # nothing set up ahead before the first such call
    async with pool.network_sandbox(plan_for(ws), stand_in.directory) as own:
        assert await run_in(own, "python3 via_bridge.py") == CONNECTED
    with trio.fail_after(10):
        await eventually(lambda: pool.warm_network is not None)
    warm = pool.warm_network
    assert warm is not None
    return warm


@needs_python
async def test_a_sandbox_with_a_way_out_set_up_ahead_serves_the_next_call_with_one(
    stand_in: StandIn, ws: Path, tmp_path: Path
) -> None:
    (ws / "via_bridge.py").write_text(_VIA_BRIDGE)
    async with running_pool(tmp_path) as pool:
        warm = await warmed(pool, stand_in, ws)
        path = warm.directory.path
        # An empty directory of its own, only the sandbox's uid's, with socat already
        # listening inside: before any call, so no socket is there yet.
        info = path.stat()
        owner = SANDBOX_UID if AS_ROOT else os.geteuid()
        assert (stat.S_IMODE(info.st_mode), info.st_uid) == (0o700, owner)
        assert list(path.iterdir()) == []
        assert path.name != stand_in.directory.name
        with trio.fail_after(10):
            await eventually(lambda: len(socats_of(path)) == 1)
        async with pool.network_directory(plain_launch(ws), ws) as directory:
            assert directory == path
            assert pool.warm_network is None  # taken: no other call can have it
            # The call's socket appears only now, after socat listened: socat connects
            # to it for each connection it accepts.
            async with (
                stand_in_at(path) as proxy,
                pool.network_sandbox(plan_for(ws), path) as sandbox,
            ):
                assert sandbox is warm.sandbox
                out = await run_in(sandbox, "python3 via_bridge.py; ls /run/boxmaker-egress")
            assert out == CONNECTED + "proxy.sock\n"
            assert proxy.request_lines() == [b"CONNECT pypi.org:443 HTTP/1.1"]
            # One call, then torn down, as every sandbox.
            assert warm.sandbox.process.returncode is not None
        assert not path.exists()
        if AS_ROOT:
            assert not path.parent.exists()  # its /run/boxmaker-egress-XXXX too
        # The next one: another sandbox, another directory.
        with trio.fail_after(10):
            await eventually(lambda: pool.warm_network is not None)
        assert pool.warm_network is not None
        assert pool.warm_network.directory.path != path
        assert pool.warm_network.sandbox is not warm.sandbox


async def test_a_sandbox_with_a_way_out_taken_but_not_run_is_torn_down(
    stand_in: StandIn, ws: Path, tmp_path: Path
) -> None:
    (ws / "via_bridge.py").write_text(_VIA_BRIDGE)
    async with running_pool(tmp_path) as pool:
        warm = await warmed(pool, stand_in, ws)
        async with pool.network_directory(plain_launch(ws), ws) as directory:
            assert directory == warm.directory.path
        # The call never ran (no socat any more, say): its sandbox went with it.
        assert warm.sandbox.process.returncode is not None
        assert not warm.directory.path.exists()


async def test_a_sandbox_with_a_way_out_serves_only_the_launch_it_was_set_up_for(
    stand_in: StandIn, ws: Path, tmp_path: Path
) -> None:
    (ws / "via_bridge.py").write_text(_VIA_BRIDGE)
    async with running_pool(tmp_path) as pool:
        warm = await warmed(pool, stand_in, ws)
        with sandbox_workspace() as other:
            async with pool.network_directory(plain_launch(other), other) as directory:
                assert directory is None
        with trio.fail_after(10):
            await eventually(lambda: warm.sandbox.process.poll() is not None)
        assert not warm.directory.path.exists()


async def test_grants_that_give_no_way_out_stop_keeping_a_sandbox_with_one(
    stand_in: StandIn, ws: Path, tmp_path: Path
) -> None:
    (ws / "via_bridge.py").write_text(_VIA_BRIDGE)
    async with running_pool(tmp_path) as pool:
        warm = await warmed(pool, stand_in, ws)
        pool.keep_network(False)
        assert pool.warm_network is None
        with trio.fail_after(10):
            await eventually(lambda: warm.sandbox.process.poll() is not None)
        assert not warm.directory.path.exists()
        # And none is set up again after a call with a way out, until they give one.
        async with pool.network_sandbox(plan_for(ws), stand_in.directory) as own:
            await run_in(own, "true")
        await wait_all_tasks_blocked()
        assert pool.warm_network is None
        pool.keep_network(True)
        with trio.fail_after(10):
            await eventually(lambda: pool.warm_network is not None)


def test_the_pool_keeps_a_way_out_only_for_a_live_connect_grant_via_shell() -> None:
    now = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)

    def keeps(table: str) -> bool:
        return keeps_a_way_out(parse_grants(table), now)

    base = 'tool = "connect"\nhosts = ["pypi.org"]\n'
    assert keeps(f'[[grant]]\nid = "a"\n{base}mode = "auto"\nvia = ["shell"]\n')
    assert keeps(
        f'[[grant]]\nid = "a"\n{base}mode = "ask"\nvia = ["shell"]\ncommands = ["pip *"]\n'
    )
    assert not keeps(f'[[grant]]\nid = "a"\n{base}mode = "deny"\nvia = ["shell"]\n')
    assert not keeps(f'[[grant]]\nid = "a"\n{base}mode = "auto"\nvia = ["mcp.fetch.*"]\n')
    expired = "expires = 2026-05-01T00:00:00Z\n"
    assert not keeps(f'[[grant]]\nid = "a"\n{base}mode = "auto"\nvia = ["shell"]\n{expired}')
    assert not keeps('[[grant]]\nid = "s"\ntool = "shell"\nmode = "auto"\n')
