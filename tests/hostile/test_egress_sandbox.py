"""Hostile: a sandboxed command with a way out, and another local user, against the
sandbox's side of egress (broker/sandbox_plan.py, broker/tools/shell.py; docs/egress.md).

A shell call that may use the network gets its egress directory read-only at
/run/boxmaker-egress and socat bridging 127.0.0.1:3128 to the proxy socket in it. The
attacks: the command reaches a service the host has on its loopback, another address,
or a DNS server, around the proxy; it looks a name up itself (the lookup alone can carry
data out); it replaces the proxy socket; another local uid connects to a call's proxy
socket and speaks as that call. Real bwrap, real socat, a stand-in for brokerd's proxy
(tests/harness/egress_standin.py); nothing is sent off this machine (every address tried
from inside is refused by the sandbox's own network namespace before a packet leaves).

And against the sandbox with a way out that brokerd keeps set up ahead
(broker/sandbox_pool.py), with real brokerd: a call with no network grant gets it (and
so a bridge out), or a call gets the directory, and so the proxy socket, of another.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import attrs
import pytest
import trio
from tests.harness.broker import Brokerd, body, call, eventually, records, tool_request
from tests.harness.egress_standin import StandIn, socats_of, stand_in_proxy
from tests.harness.runner import spec_for
from tests.harness.sandbox import AS_ROOT, SANDBOX_UID, sandbox_workspace
from tests.harness.tunnels import configure, grants, network_grant

from boxmaker.broker.run_spec import RunResult
from boxmaker.broker.runner import execute
from boxmaker.broker.state import Broker
from boxmaker.home.paths import Home

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None or shutil.which("socat") is None,
    reason="bubblewrap and socat are not installed",
)
OTHER_UID = SANDBOX_UID - 1
"""Another local user: not the sandbox's uid, not root."""


@pytest.fixture
def ws() -> Iterator[Path]:
    with sandbox_workspace() as workspace:
        yield workspace


@pytest.fixture
async def stand_in() -> AsyncIterator[StandIn]:
    async with stand_in_proxy() as proxy:
        yield proxy


async def run_with(stand_in: StandIn, ws: Path, command: str) -> str:
    spec = attrs.evolve(spec_for("shell", {"command": command}, ws), egress_dir=stand_in.directory)
    with trio.fail_after(20):
        result: RunResult = await execute(spec)
    assert result.ok, result
    return result.content


def _host_address() -> str:
    """This machine's own address on its default route (no packet is sent)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))
        return str(probe.getsockname()[0])
    except OSError:
        return "192.0.2.1"
    finally:
        probe.close()


_REACH = """
import socket, sys
def tcp(family, host, port):
    s = socket.socket(family)
    s.settimeout(3)
    try:
        s.connect((host, port))
        s.sendall(b"CONNECT example.com:443 HTTP/1.1\\r\\nHost: example.com:443\\r\\n\\r\\n")
        return s.recv(100).split(b"\\r\\n")[0].decode()
    except OSError as exc:
        return exc.__class__.__name__
    finally:
        s.close()
def udp(host, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.sendto(b"\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00", (host, port))
        return "sent"
    except OSError as exc:
        return exc.__class__.__name__
host_port, host_ip = int(sys.argv[1]), sys.argv[2]
print("attempt host loopback", tcp(socket.AF_INET, "127.0.0.1", host_port))
print("attempt host address", tcp(socket.AF_INET, host_ip, host_port))
print("attempt ipv6 loopback", tcp(socket.AF_INET6, "::1", host_port))
print("attempt dns", udp("9.9.9.9", 53))
print("attempt proxy", tcp(socket.AF_INET, "127.0.0.1", 3128))
"""


async def test_the_command_reaches_nothing_but_the_proxy(stand_in: StandIn, ws: Path) -> None:
    (ws / "reach.py").write_text(_REACH)
    service = trio.socket.socket()
    await service.bind(("127.0.0.1", 0))
    service.listen(8)
    accepted: list[object] = []

    async def accept() -> None:
        while True:
            accepted.append(await service.accept())

    host_ip = _host_address()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(accept)
        out = await run_with(stand_in, ws, f"python3 reach.py {service.getsockname()[1]} {host_ip}")
        nursery.cancel_scope.cancel()
    service.close()
    assert out.splitlines() == [
        "attempt host loopback ConnectionRefusedError",
        "attempt host address OSError",  # ENETUNREACH: no route out of the namespace
        "attempt ipv6 loopback ConnectionRefusedError",
        "attempt dns OSError",
        "attempt proxy HTTP/1.1 200 Connection established",
    ], out
    assert accepted == []
    # The one connection that got anywhere reached the proxy.
    assert stand_in.request_lines() == [b"CONNECT example.com:443 HTTP/1.1"]


async def test_the_sandbox_has_no_resolver(stand_in: StandIn, ws: Path) -> None:
    command = (
        "ls /etc; "
        "getent hosts example.com; echo getent exit $?; "
        "getent hosts localhost; echo localhost exit $?; "
        "python3 -c 'import socket; socket.getaddrinfo(\"example.com\", 443)' 2>&1 "
        "| tail -n 1"
    )
    out = await run_with(stand_in, ws, command)
    lines = out.splitlines()
    etc = lines[: lines.index("getent exit 2")]
    assert not {"resolv.conf", "hosts", "nsswitch.conf", "host.conf"} & set(etc), etc
    assert "ssl" in etc  # the way out's CA certificates, and nothing to resolve with
    assert lines[-2:] == [
        "localhost exit 2",
        "socket.gaierror: [Errno -3] Temporary failure in name resolution",
    ], out
    # No lookup went through the proxy either.
    assert stand_in.connections == 0


async def test_the_command_cannot_replace_the_proxy_socket(stand_in: StandIn, ws: Path) -> None:
    command = (
        "cd /run/boxmaker-egress && ls && "
        "{ rm -f proxy.sock; mv proxy.sock other.sock; ln -sf /workspace/x proxy.sock; "
        "touch planted; } 2>&1; ls"
    )
    out = await run_with(stand_in, ws, command)
    assert out.splitlines() == [
        "proxy.sock",
        "rm: cannot remove 'proxy.sock': Read-only file system",
        "mv: cannot move 'proxy.sock' to 'other.sock': Read-only file system",
        "ln: failed to create symbolic link 'proxy.sock': Read-only file system",
        "touch: cannot touch 'planted': Read-only file system",
        "proxy.sock",
    ], out
    assert sorted(p.name for p in stand_in.directory.iterdir()) == ["proxy.sock"]


_CONNECT = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
    s.sendall(b"CONNECT pypi.org:443 HTTP/1.1\\r\\nHost: pypi.org:443\\r\\n\\r\\n")
    print(s.recv(100).split(b"\\r\\n")[0].decode())
except OSError as exc:
    print(exc.__class__.__name__)
"""


@pytest.mark.skipif(not AS_ROOT, reason="another local uid: only root can be one")
async def test_another_uid_cannot_connect_to_a_calls_proxy_socket(
    stand_in: StandIn, ws: Path
) -> None:
    def as_uid(uid: int, path: str) -> str:
        return subprocess.run(
            ["/usr/bin/python3", "-I", "-c", _CONNECT, path],
            user=uid,
            group=uid,
            extra_groups=[],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout

    attempts: dict[str, str] = {}

    async def attack() -> None:
        with trio.fail_after(10):
            while not (socats := socats_of(stand_in.directory)):  # noqa: ASYNC110  (/proc)
                await trio.sleep(0.01)
        # The call's socket on the host, and the same socket through the mounts of its
        # running sandbox (the bridge's /proc/PID/root).
        paths = {
            "host": str(stand_in.socket_path),
            "sandbox": f"/proc/{socats[0]}/root/run/boxmaker-egress/proxy.sock",
        }
        for name, path in paths.items():
            attempts[name] = await trio.to_thread.run_sync(as_uid, OTHER_UID, path)
        attempts["own"] = await trio.to_thread.run_sync(as_uid, SANDBOX_UID, paths["host"])
        (ws / "done").touch()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(attack)
        out = await run_with(
            stand_in,
            ws,
            # Until the attack is done (10 s at most): the sandbox is up meanwhile.
            "n=0; while [ ! -e done ] && [ $n -lt 500 ]; do n=$((n+1)); sleep 0.02; done; "
            "echo call ended",
        )
    assert out == "call ended\n"
    assert attempts == {
        "host": "PermissionError\n",
        "sandbox": "PermissionError\n",
        # The same attempt as the sandbox's own uid gets through: the refusal was the uid's.
        "own": "HTTP/1.1 200 Connection established\n",
    }
    assert stand_in.request_lines() == [b"CONNECT pypi.org:443 HTTP/1.1"]


# -- the sandbox with a way out set up ahead, through brokerd ---------------------------

_PROBE = """
import os, socket
print("probe ran")
try:
    socket.create_connection(("127.0.0.1", 3128), timeout=5)
    print("bridge connected")
except OSError as exc:
    print("bridge", type(exc).__name__)
print("socket", os.path.exists("/run/boxmaker-egress/proxy.sock"))
print("directory", os.path.exists("/run/boxmaker-egress"))
"""
_BOTH = """
import os, socket, sys, time
name = sys.argv[1]
open(name + ".ready", "w").close()
deadline = time.monotonic() + 10
while not all(os.path.exists(n + ".ready") for n in ("a", "b")) and time.monotonic() < deadline:
    time.sleep(0.01)
mounts = [line.split() for line in open("/proc/self/mountinfo")]
roots = [fields[3] for fields in mounts if fields[4] == "/run/boxmaker-egress"]
s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
s.sendall(f"CONNECT {name}.test:443 HTTP/1.1\\r\\nHost: {name}.test:443\\r\\n\\r\\n".encode())
print(s.recv(100).split(b"\\r\\n")[0].decode())
print(*os.listdir("/run/boxmaker-egress"), *roots)
"""
NET_COMMANDS = '["python3 both.py *", "true --net"]'
"""What the connect grant lets use the network; any other command gets none."""


async def shell_call(home: Home, command: str, call_id: str | None = None) -> str:
    request = tool_request("shell", {"command": command}, call=call_id)
    with trio.fail_after(60):
        frames = await call(home, request)
    assert frames[-1]["outcome"] == "ok", frames
    return str(frames[-1]["content"])


async def warm_way_out(home: Home, brokerd: Brokerd, ws: Path) -> Broker:
    """brokerd whose grants give ``true --net`` and ``python3 both.py *`` a way out,
    after one such call: it keeps a sandbox with a way out set up ahead."""
    configure(home, ws)
    grants(home, network_grant(["granted.test"], commands=NET_COMMANDS))
    broker = await brokerd.start()
    await shell_call(home, "true --net")
    with trio.fail_after(10):
        await eventually(lambda: broker.sandboxes.warm_network is not None)
    return broker


async def test_a_call_without_a_network_grant_never_gets_the_sandbox_with_a_bridge(
    home: Home, brokerd: Brokerd, ws: Path
) -> None:
    (ws / "probe.py").write_text(_PROBE)
    broker = await warm_way_out(home, brokerd, ws)
    warm = broker.sandboxes.warm_network
    assert warm is not None
    with trio.fail_after(10):  # the bridge a plain call must not get is there, listening
        await eventually(lambda: len(socats_of(warm.directory.path)) == 1)
    out = await shell_call(home, "python3 probe.py")
    assert out.splitlines() == [
        "probe ran",
        "bridge ConnectionRefusedError",
        "socket False",
        "directory False",
    ], out
    # Still waiting, untouched, for a call that has a way out; no CONNECT was made.
    assert broker.sandboxes.warm_network is warm
    assert warm.sandbox.process.poll() is None
    assert [r for r in records(home) if r.get("tool") == "connect"] == []


async def test_a_call_never_gets_another_calls_directory(
    home: Home, brokerd: Brokerd, ws: Path
) -> None:
    (ws / "both.py").write_text(_BOTH)
    broker = await warm_way_out(home, brokerd, ws)
    warm = broker.sandboxes.warm_network
    assert warm is not None
    calls = {"a": "c-00000000000000a1", "b": "c-00000000000000b2"}
    outs: dict[str, str] = {}

    async def run(name: str) -> None:
        outs[name] = await shell_call(home, f"python3 both.py {name}", calls[name])

    # Two calls with a way out at once: one takes the sandbox set up ahead (and its
    # directory), the other makes its own.
    async with trio.open_nursery() as nursery:
        for name in calls:
            nursery.start_soon(run, name)
    roots = {}
    for name, out in outs.items():
        status, listing = out.splitlines()
        # The proxy answered (403: no grant for the host), so the socket was live.
        assert status.startswith("HTTP/1.1 403"), out
        socket_name, root = listing.split()
        assert socket_name == "proxy.sock"
        roots[name] = Path(root).name
    warm_name = warm.directory.path.name
    assert sorted(roots.items()) in (
        [("a", warm_name), ("b", calls["b"])],
        [("a", calls["a"]), ("b", warm_name)],
    ), roots
    # Each CONNECT was its own call's: the directory bound in its sandbox held its
    # own call's socket and no other.
    decisions = [
        body(r) for r in records(home) if r["kind"] == "decision" and r["tool"] == "connect"
    ]
    assert {d["arguments"]["host"]: d["arguments"]["via"] for d in decisions} == {
        "a.test": calls["a"],
        "b.test": calls["b"],
    }
    assert not warm.directory.path.exists()
