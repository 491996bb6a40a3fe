"""brokerd's egress proxy (broker/egress.py, broker/tunnel.py; docs/egress.md): a shell
call with a network grant gets a proxy socket of its own, and each CONNECT on it is a
``connect`` call decided, asked, run and recorded like a tool call.

The real brokerd in process, the shell's run replaced by a stand-in that plays the
sandboxed program against the call's socket (as the sandbox's uid: tests/harness/
tunnels.py), a TLS echo server on 127.0.0.1 with a certificate of its own, and the
resolver seam replaced so every lookup is seen. Time is trio's autojump clock.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing
from tests.harness.broker import (
    PENDING_TIMEOUT,
    SESSION,
    Brokerd,
    Client,
    FailingFile,
    admin,
    body,
    call,
    eventually,
    records,
    records_of,
    tool_request,
    waiting_approvals,
)
from tests.harness.homes import grant, write_grants
from tests.harness.sandbox import AS_ROOT
from tests.harness.tunnels import (
    COMMAND,
    RUNBOOK,
    Certificate,
    Resolver,
    ShellStandIn,
    TlsEchoServer,
    at_eof,
    closed,
    connect_calls,
    grants,
    network_grant,
    proxy_connect,
    push,
    run_shell,
    sandbox_connections,
    shell_call,
    the_connection,
    tls_echo,
    with_egress,
)

from boxmaker.broker.connection import UNDER_WAY
from boxmaker.broker.egress_dirs import EGRESS_DIR, ROOT_RUN
from boxmaker.home.paths import Home

pytestmark = pytest.mark.usefixtures("inline_threads")

Clock = trio.testing.MockClock


# -- the main path -----------------------------------------------------------------------


async def test_an_allowed_connect_reaches_the_host_and_every_step_is_recorded(
    home: Home,
    started: Brokerd,
    server: TlsEchoServer,
    certificate: Certificate,
    resolver: Resolver,
    shell: ShellStandIn,
    autojump_clock: Clock,
) -> None:
    port = server.port
    grants(home, network_grant([f"svc.test:{port}", f"127.0.0.1:{port}"]))

    async def program(directory: Path) -> str:
        [stream] = await shell.connect(directory)
        answer = await proxy_connect(stream, "svc.test", port)
        assert answer.status == 200
        await closed(await tls_echo(stream, certificate, "svc.test"), home)
        return "installed"

    shell.program = program
    answer = await run_shell(home)
    assert (answer["outcome"], answer["content"]) == ("ok", "installed")
    [spec] = shell.specs
    assert spec.egress_dir is not None
    assert spec.egress_dir.name == shell_call(home)
    if AS_ROOT:  # a place of its own the sandbox's bwrap can reach, not the home's run/
        assert spec.egress_dir.parent.parent == ROOT_RUN
        assert not spec.egress_dir.parent.exists()
    else:
        assert spec.egress_dir.parent == home.run_dir / EGRESS_DIR
    assert not spec.egress_dir.exists()  # removed with the call
    assert resolver.lookups == [("svc.test", port)]
    [received] = server.connections
    assert received.server_name == "svc.test"
    [connect] = connect_calls(home)
    via = shell_call(home)
    kinds = [r["kind"] for r in records_of(home, connect)]
    assert kinds == ["decision", "connection", "result"]
    decision, connection, result = (body(r) for r in records_of(home, connect))
    assert decision["arguments"] == {
        "host": "svc.test",
        "port": port,
        "scheme": "https",
        "via": via,
        "via_tool": "shell",
        "via_command": COMMAND,
    }
    assert (decision["verdict"], decision["grant"], decision["session"]) == ("run", "net", SESSION)
    duration = connection.pop("duration_ms")
    assert 0 <= duration < 1000
    assert connection == {
        "kind": "connection",
        "call": connect,
        "via": via,
        "session": SESSION,
        "host": "svc.test",
        "port": port,
        "address": "127.0.0.1",
        "server_name": "svc.test",
        "bytes_up": len(received.data),
        "bytes_down": received.sent,
        "ended": "closed",
    }
    assert (result["status"], result["reason"]) == ("ok", None)
    # The tunnel's own result raises nothing; the calling call's output, which may hold
    # what came in, is what the model reads: that result makes the session untrusted.
    assert result["label"] == {"taint": "public", "untrusted": False}
    assert result["untrusted_after"] is False
    shell_result = body(records_of(home, via)[-1])
    assert shell_result["kind"] == "result"
    assert shell_result["label"]["untrusted"] is True
    assert shell_result["untrusted_after"] is True


async def test_an_ip_address_host_needs_no_server_name(
    home: Home,
    started: Brokerd,
    server: TlsEchoServer,
    certificate: Certificate,
    shell: ShellStandIn,
    autojump_clock: Clock,
) -> None:
    port = server.port
    grants(home, network_grant([f"127.0.0.1:{port}"]))

    async def program(directory: Path) -> str:
        [stream] = await shell.connect(directory)
        assert (await proxy_connect(stream, "127.0.0.1", port)).status == 200
        await closed(await tls_echo(stream, certificate, "127.0.0.1"), home)
        return "ok"

    shell.program = program
    assert (await run_shell(home))["outcome"] == "ok"
    connection = the_connection(home)
    assert (connection["server_name"], connection["ended"]) == (None, "closed")
    assert server.connections[0].server_name is None


async def test_a_shell_call_without_a_network_grant_gets_no_way_out(
    home: Home, started: Brokerd, shell: ShellStandIn, autojump_clock: Clock
) -> None:
    grants(home, network_grant(["svc.test"], commands='["git fetch *"]'))
    assert (await run_shell(home))["content"] == "no way out"
    [spec] = shell.specs
    assert spec.egress_dir is None
    assert not (home.run_dir / EGRESS_DIR).exists()


async def test_a_denied_name_is_answered_403_and_never_resolved(
    home: Home,
    started: Brokerd,
    server: TlsEchoServer,
    resolver: Resolver,
    shell: ShellStandIn,
    autojump_clock: Clock,
) -> None:
    grants(home, network_grant([f"127.0.0.1:{server.port}"]))
    answers = []

    async def program(directory: Path) -> str:
        [stream] = await shell.connect(directory)
        answers.append(await proxy_connect(stream, "evil.test", 443))
        assert await at_eof(stream)
        return "refused"

    shell.program = program
    assert (await run_shell(home))["outcome"] == "ok"
    [answer] = answers
    assert answer.status == 403
    assert answer.body.decode() == (
        "boxmaker: CONNECT evil.test:443: denied no_grant\n(no grant allows it)\n"
        "no grant allows connect on evil.test:443\n"
        f"see {RUNBOOK}\n"
    )
    assert resolver.lookups == []
    assert server.connections == []
    [connect] = connect_calls(home)
    [decision] = (body(r) for r in records_of(home, connect))
    assert (decision["verdict"], decision["reason"], decision["grant"]) == (
        "deny",
        "no_grant",
        None,
    )
    # Nothing came in: the calling call's output is labelled as any shell call's.
    shell_result = body(records_of(home, shell_call(home))[-1])
    assert (shell_result["kind"], shell_result["untrusted_after"]) == ("result", False)
    assert shell_result["label"]["untrusted"] is False


async def test_an_ask_holds_the_connect_until_the_owner_approves(
    home: Home,
    started: Brokerd,
    server: TlsEchoServer,
    certificate: Certificate,
    shell: ShellStandIn,
    nursery: trio.Nursery,
    autojump_clock: Clock,
) -> None:
    port = server.port
    grants(home, network_grant([f"127.0.0.1:{port}"], mode="ask"))

    async def program(directory: Path) -> str:
        [stream] = await shell.connect(directory)
        nursery.start_soon(approve_when_asked, home)
        assert (await proxy_connect(stream, "127.0.0.1", port)).status == 200
        await closed(await tls_echo(stream, certificate, "127.0.0.1"), home)
        return "ok"

    shell.program = program
    assert (await run_shell(home))["outcome"] == "ok"
    [connect] = connect_calls(home)
    kinds = [
        (r["kind"], r.get("verdict") or r.get("outcome") or r.get("ended"))
        for r in records_of(home, connect)
    ]
    assert kinds == [
        ("decision", "ask"),
        ("approval", "ask"),  # approved: the re-decision was still ask
        ("connection", "closed"),
        ("result", None),
    ]


async def approve_when_asked(home: Home) -> None:
    [entry] = await waiting_approvals(home, within=10)
    assert entry["tool"] == "connect"
    answer = await admin(home, {"kind": "approve", "approval": entry["approval"]})
    # The owner hears once the tunnel is open, not at its end.
    assert answer["ran"] == {"outcome": "ok", "reason": None, "detail": UNDER_WAY}, answer


async def test_an_ask_refused_while_the_connect_waits_is_answered_403(
    home: Home,
    started: Brokerd,
    server: TlsEchoServer,
    resolver: Resolver,
    shell: ShellStandIn,
    autojump_clock: Clock,
) -> None:
    grants(home, network_grant([f"svc.test:{server.port}"], mode="ask"))
    answers = []

    async def program(directory: Path) -> str:
        [stream] = await shell.connect(directory)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(refuse_when_asked, home)
            answers.append(await proxy_connect(stream, "svc.test", server.port))
        return "refused"

    shell.program = program
    await run_shell(home)
    [answer] = answers
    assert answer.status == 403
    assert answer.body.decode().startswith(
        f"boxmaker: CONNECT svc.test:{server.port}: denied refused\n(the owner refused it)\n"
    )
    assert resolver.lookups == []
    assert server.connections == []
    [connect] = connect_calls(home)
    assert [r["kind"] for r in records_of(home, connect)] == ["decision", "approval"]
    assert records_of(home, connect)[1]["outcome"] == "refused"


async def refuse_when_asked(home: Home) -> None:
    [entry] = await waiting_approvals(home, within=10)
    await admin(home, {"kind": "refuse", "approval": entry["approval"], "reason": "not today"})


async def test_an_ask_left_unanswered_expires_403(
    home: Home, started: Brokerd, server: TlsEchoServer, shell: ShellStandIn, autojump_clock: Clock
) -> None:
    grants(home, network_grant([f"127.0.0.1:{server.port}"], mode="ask"))
    answers = []

    async def program(directory: Path) -> str:
        [stream] = await shell.connect(directory)
        answers.append(await proxy_connect(stream, "127.0.0.1", server.port))
        return "expired"

    shell.program = program
    await run_shell(home)
    [answer] = answers
    assert answer.status == 403
    assert "denied expired" in answer.body.decode()
    assert trio.current_time() >= PENDING_TIMEOUT


# -- the TLS check -----------------------------------------------------------------------


async def test_a_server_name_other_than_the_host_closes_the_tunnel_before_a_byte_went_out(
    home: Home,
    started: Brokerd,
    server: TlsEchoServer,
    certificate: Certificate,
    shell: ShellStandIn,
    autojump_clock: Clock,
) -> None:
    port = server.port
    grants(home, network_grant([f"svc.test:{port}", f"127.0.0.1:{port}"]))

    async def program(directory: Path) -> str:
        [stream] = await shell.connect(directory)
        assert (await proxy_connect(stream, "svc.test", port)).status == 200
        tls = trio.SSLStream(stream, certificate.client_context(), server_hostname="other.test")
        with pytest.raises(trio.BrokenResourceError):
            await tls.do_handshake()
        return "closed"

    shell.program = program
    await run_shell(home)
    [received] = server.connections
    await received.ended.wait()
    assert received.data == b""
    connection = the_connection(home)
    assert (connection["ended"], connection["server_name"]) == (
        "server_name_mismatch",
        "other.test",
    )
    assert (connection["bytes_up"], connection["bytes_down"]) == (0, 0)
    [connect] = connect_calls(home)
    result = body(records_of(home, connect)[-1])
    assert (result["status"], result["reason"]) == ("failed", "tool_error")


async def test_a_relayed_connect_inside_a_tunnel_is_not_tls_and_reaches_nothing(
    home: Home, started: Brokerd, server: TlsEchoServer, shell: ShellStandIn, autojump_clock: Clock
) -> None:
    port = server.port
    grants(home, network_grant([f"127.0.0.1:{port}"]))

    async def program(directory: Path) -> str:
        [stream] = await shell.connect(directory)
        assert (await proxy_connect(stream, "127.0.0.1", port)).status == 200
        await stream.send_all(b"CONNECT evil.test:443 HTTP/1.1\r\nHost: evil.test:443\r\n\r\n")
        assert await at_eof(stream)
        return "closed"

    shell.program = program
    await run_shell(home)
    [received] = server.connections
    await received.ended.wait()
    assert received.data == b""
    connection = the_connection(home)
    assert (connection["ended"], connection["bytes_up"]) == ("not_tls", 0)


# -- bounds ------------------------------------------------------------------------------


async def test_a_connection_over_the_tunnel_cap_is_answered_503_at_once(
    home: Home,
    started: Brokerd,
    ws: Path,
    server: TlsEchoServer,
    certificate: Certificate,
    shell: ShellStandIn,
    autojump_clock: Clock,
) -> None:
    started.broker.config = with_egress(started, tunnels_per_call=2)
    port = server.port
    grants(home, network_grant([f"127.0.0.1:{port}"]))
    seen = []

    async def program(directory: Path) -> str:
        first, second, third = await shell.connect(directory, 3)
        for stream in (first, second):
            assert (await proxy_connect(stream, "127.0.0.1", port)).status == 200
        seen.append(await third.receive_some(4096))
        assert await at_eof(third)
        for stream in (first, second):
            await closed(await tls_echo(stream, certificate, "127.0.0.1"), home)
        return "ok"

    shell.program = program
    await run_shell(home)
    [refusal] = seen
    assert refusal.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
    assert b"[egress] tunnels_per_call" in refusal
    assert len(connect_calls(home)) == 2


async def test_a_calls_connections_to_one_name_look_it_up_once(
    home: Home,
    started: Brokerd,
    server: TlsEchoServer,
    certificate: Certificate,
    resolver: Resolver,
    shell: ShellStandIn,
    autojump_clock: Clock,
) -> None:
    """docs/egress.md: each connection is decided and dialed on its own, the name looked
    up once a call; the next call looks it up again (the grants hold in the untrusted
    session the first call's output makes)."""
    port = server.port
    write_grants(
        home,
        grant("sh", "shell", "auto", if_untrusted="auto")
        + network_grant([f"svc.test:{port}", f"127.0.0.1:{port}"], if_untrusted='"auto"'),
    )

    async def program(directory: Path) -> str:
        for stream in await shell.connect(directory, 3):
            assert (await proxy_connect(stream, "svc.test", port)).status == 200
            await closed(await tls_echo(stream, certificate, "svc.test"), home)
        return "ok"

    shell.program = program
    await run_shell(home)
    assert len(server.connections) == 3
    ends = [body(r) for r in records(home) if r["kind"] == "connection"]
    assert [(end["address"], end["ended"]) for end in ends] == [("127.0.0.1", "closed")] * 3
    assert resolver.lookups == [("svc.test", port)]
    await run_shell(home)
    assert resolver.lookups == [("svc.test", port)] * 2


async def test_the_byte_cap_closes_the_tunnel_that_reaches_it(
    home: Home,
    started: Brokerd,
    server: TlsEchoServer,
    certificate: Certificate,
    shell: ShellStandIn,
    autojump_clock: Clock,
) -> None:
    cap = 48 * 1024
    started.broker.config = with_egress(started, bytes_per_call=cap)
    port = server.port
    grants(home, network_grant([f"127.0.0.1:{port}"], if_untrusted='"auto"'))
    later = []

    async def program(directory: Path) -> str:
        stream, after = await shell.connect(directory, 2)
        assert (await proxy_connect(stream, "127.0.0.1", port)).status == 200
        tls = await tls_echo(stream, certificate, "127.0.0.1")
        with pytest.raises(trio.BrokenResourceError):
            await push(tls, 8 * 16 * 1024)
        await eventually(lambda: any(r["kind"] == "connection" for r in records(home)))
        # Every later CONNECT of the call: the bytes are spent.
        later.append(await proxy_connect(after, "127.0.0.1", port))
        return "capped"

    shell.program = program
    await run_shell(home)
    connection = the_connection(home)
    assert connection["ended"] == "byte_cap"
    assert connection["bytes_up"] + connection["bytes_down"] == cap
    [refused] = later
    assert refused.status == 503
    assert f"reached [egress] bytes_per_call ({cap} bytes)" in refused.body.decode()
    assert len(connect_calls(home)) == 1


async def test_brokerd_stopping_closes_every_tunnel_at_once(
    home: Home,
    started: Brokerd,
    server: TlsEchoServer,
    certificate: Certificate,
    shell: ShellStandIn,
    autojump_clock: Clock,
) -> None:
    port = server.port
    grants(home, network_grant([f"127.0.0.1:{port}"]))
    closed_after = []

    async def program(directory: Path) -> str:
        [stream] = await shell.connect(directory)
        assert (await proxy_connect(stream, "127.0.0.1", port)).status == 200
        tls = await tls_echo(stream, certificate, "127.0.0.1")
        assert started.broker is not None
        asked = trio.current_time()
        started.broker.request_stop()
        with pytest.raises(trio.BrokenResourceError):
            await tls.receive_some(10)
        closed_after.append(trio.current_time() - asked)
        return "cut off"

    shell.program = program
    # The call itself runs on within brokerd's grace, without its way out.
    assert (await run_shell(home))["content"] == "cut off"
    await started.stop()
    assert closed_after == [0]
    assert the_connection(home)["ended"] == "stopping"


async def test_an_idle_tunnel_is_closed(
    home: Home,
    started: Brokerd,
    server: TlsEchoServer,
    certificate: Certificate,
    shell: ShellStandIn,
    autojump_clock: Clock,
) -> None:
    started.broker.config = with_egress(started, idle_timeout_s=7.0)
    port = server.port
    grants(home, network_grant([f"127.0.0.1:{port}"]))
    closed_after = []

    async def program(directory: Path) -> str:
        [stream] = await shell.connect(directory)
        assert (await proxy_connect(stream, "127.0.0.1", port)).status == 200
        tls = await tls_echo(stream, certificate, "127.0.0.1")
        quiet_since = trio.current_time()
        with pytest.raises(trio.BrokenResourceError):
            await tls.receive_some(10)
        closed_after.append(trio.current_time() - quiet_since)
        return "idle"

    shell.program = program
    await run_shell(home)
    assert closed_after == [pytest.approx(7.0, abs=0.01)]
    assert the_connection(home)["ended"] == "idle"


async def test_the_calls_end_closes_its_tunnels_at_once(
    home: Home,
    started: Brokerd,
    server: TlsEchoServer,
    certificate: Certificate,
    shell: ShellStandIn,
    nursery: trio.Nursery,
    autojump_clock: Clock,
) -> None:
    port = server.port
    grants(home, network_grant([f"127.0.0.1:{port}"]))
    left_open: list[trio.SocketStream] = []

    async def program(directory: Path) -> str:
        # Not the stand-in's connect: this connection outlives the program.
        [stream] = await sandbox_connections(directory)
        left_open.append(stream)
        assert (await proxy_connect(stream, "127.0.0.1", port)).status == 200
        await tls_echo(stream, certificate, "127.0.0.1")
        return "left it open"

    shell.program = program
    started_at = trio.current_time()
    assert (await run_shell(home))["content"] == "left it open"
    assert trio.current_time() - started_at < 1
    [stream] = left_open
    try:
        assert await at_eof(stream)
    finally:
        await stream.aclose()
    assert the_connection(home)["ended"] == "call_ended"
    await server.connections[0].ended.wait()


async def test_a_call_stopped_because_its_requester_left_still_records_its_tunnels(
    home: Home,
    started: Brokerd,
    server: TlsEchoServer,
    certificate: Certificate,
    shell: ShellStandIn,
    autojump_clock: Clock,
) -> None:
    port = server.port
    grants(home, network_grant([f"127.0.0.1:{port}"]))
    tunnel_open = trio.Event()

    async def program(directory: Path) -> str:
        [stream] = await shell.connect(directory)
        assert (await proxy_connect(stream, "127.0.0.1", port)).status == 200
        await tls_echo(stream, certificate, "127.0.0.1")
        tunnel_open.set()
        await trio.sleep_forever()
        raise AssertionError("not reached")

    shell.program = program
    client = await Client.open(home.broker_sock)
    await client.send(tool_request("shell", {"command": "pip install attrs"}))
    await tunnel_open.wait()
    await client.aclose()  # Ctrl-C in the chat: the shell's run is stopped
    await eventually(lambda: any(r["kind"] == "result" for r in records_of(home, shell_call(home))))
    [connect] = connect_calls(home)
    kinds = [(r["kind"], r.get("ended") or r.get("status")) for r in records_of(home, connect)]
    assert kinds == [("decision", None), ("connection", "call_ended"), ("result", "ok")]
    assert records_of(home, shell_call(home))[-1]["reason"] == "requester_gone"


async def test_a_ledger_that_fails_mid_tunnel_closes_it(
    home: Home,
    brokerd: Brokerd,
    ws: Path,
    resolver: Resolver,
    shell: ShellStandIn,
    server: TlsEchoServer,
    certificate: Certificate,
    autojump_clock: Clock,
) -> None:
    _, opener = FailingFile.opener(lambda data: b'"tool":"read_file"' in data)
    await brokerd.start(execute=shell, host=resolver.host, open_file=opener)
    port = server.port
    grants(home, network_grant([f"127.0.0.1:{port}"]), grant("notes", "read_file", "auto"))
    broke = []

    async def program(directory: Path) -> str:
        [stream] = await shell.connect(directory)
        assert (await proxy_connect(stream, "127.0.0.1", port)).status == 200
        tls = await tls_echo(stream, certificate, "127.0.0.1")
        # Another call's record fails to be written: the ledger stops, the tunnel closes.
        await call(home, tool_request("read_file", {"path": "notes.txt"}))
        with pytest.raises(trio.BrokenResourceError):
            await tls.receive_some(10)
        broke.append(True)
        return "closed"

    shell.program = program
    await run_shell(home)
    assert broke == [True]
    assert [r["kind"] for r in records(home)].count("connection") == 0
    assert not brokerd.broker.writer.usable  # type: ignore[union-attr]


async def test_two_calls_each_see_only_their_own_socket(
    home: Home, started: Brokerd, shell: ShellStandIn, autojump_clock: Clock
) -> None:
    grants(home, network_grant(["svc.test"]))
    seen: list[Path] = []

    async def program(directory: Path) -> str:
        seen.append(directory)
        return "ok"

    shell.program = program
    async with trio.open_nursery() as calls:
        calls.start_soon(run_shell, home)
        calls.start_soon(run_shell, home)
    first, second = seen
    assert first != second
    assert {p.name for p in seen} == {r["call"] for r in records(home) if r.get("tool") == "shell"}
