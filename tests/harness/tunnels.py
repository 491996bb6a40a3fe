"""What the egress proxy's tests need around brokerd: connections to a call's proxy
socket made by the sandbox's uid (as a sandboxed program's are), a client that speaks
HTTP to the proxy with h11, a TLS echo server on loopback with a certificate of its own
that records every byte it received, a plain-HTTP server that records each request, a
resolver that records each lookup, and a stand-in for the shell's run that plays a
sandboxed program against the call's egress directory.

As root (CI) the sandbox runs as :data:`~tests.harness.sandbox.SANDBOX_UID`, the only
uid brokerd lets connect to a call's socket: the connections are made by a short child
process of that uid, handed over through ``/proc/self/fd`` (the call's directory is
reached through a descriptor opened here, so the home's 0700 ``run/`` is no obstacle)
and passed back to the test with SCM_RIGHTS; the peer credentials stay the child's.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import socket
import ssl
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final

import attrs
import h11
import trio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from boxmaker.broker.run_spec import RunResult, RunSpec
from boxmaker.broker.tools.host import Host, is_address
from boxmaker.home.paths import Home

from .broker import PENDING_TIMEOUT, Brokerd, body, call, eventually, records, tool_request
from .homes import grant, grant_table, write_config, write_grants
from .sandbox import AS_ROOT, SANDBOX_UID

NAMES: Final = ("svc.test", "other.test")
"""The names the test server's certificate holds, with 127.0.0.1."""

_CONNECT_AS: Final = """
import socket, sys
dirfd, channel, count = (int(a) for a in sys.argv[1:4])
made = []
for _ in range(count):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(f"/proc/self/fd/{dirfd}/proxy.sock")
    made.append(s)
socket.send_fds(socket.socket(fileno=channel), [b"fds"], [s.fileno() for s in made])
"""


def connect_as(directory: Path, uid: int, count: int = 1) -> list[trio.SocketStream]:
    """``count`` connections to ``directory``/proxy.sock made by ``uid`` (a child
    process of that uid; blocking for its few milliseconds, on purpose: a mock clock
    must not jump while it runs)."""
    ours, theirs = socket.socketpair()
    dirfd = os.open(directory, os.O_PATH | os.O_DIRECTORY)
    try:
        subprocess.run(
            [
                "/usr/bin/python3",
                "-I",
                "-S",
                "-c",
                _CONNECT_AS,
                str(dirfd),
                str(theirs.fileno()),
                str(count),
            ],
            pass_fds=(dirfd, theirs.fileno()),
            user=uid,
            group=uid,
            extra_groups=[],
            check=True,
            timeout=20,
            capture_output=True,
        )
        _, fds, _, _ = socket.recv_fds(ours, 16, count)
    finally:
        os.close(dirfd)
        ours.close()
        theirs.close()
    return [
        trio.SocketStream(trio.socket.from_stdlib_socket(socket.socket(fileno=fd))) for fd in fds
    ]


async def sandbox_connections(directory: Path, count: int = 1) -> list[trio.SocketStream]:
    """``count`` connections to the call's proxy socket, as its sandbox makes them."""
    if AS_ROOT:
        return connect_as(directory, SANDBOX_UID, count)
    return [await trio.open_unix_socket(str(directory / "proxy.sock")) for _ in range(count)]


# -- speaking to the proxy ------------------------------------------------------------


@attrs.define
class ProxyAnswer:
    status: int
    body: bytes
    headers: dict[bytes, bytes]


async def receive_answer(stream: trio.abc.ReceiveStream, http: h11.Connection) -> ProxyAnswer:
    """The proxy's answer to the request ``http`` sent (its body read only when the
    answer is not a tunnel's ``200``)."""
    response: h11.Response | None = None
    body = bytearray()
    while True:
        event = http.next_event()
        if event is h11.NEED_DATA:
            data = await stream.receive_some(65536)
            http.receive_data(data)
            continue
        if isinstance(event, h11.Response):
            response = event
            if event.status_code == 200 and http.our_state is h11.SWITCHED_PROTOCOL:
                break
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
            break
    assert response is not None
    return ProxyAnswer(response.status_code, bytes(body), dict(response.headers))


async def proxy_connect(stream: trio.SocketStream, host: str, port: int) -> ProxyAnswer:
    """``CONNECT host:port`` and the proxy's answer."""
    http = h11.Connection(h11.CLIENT)
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    request = h11.Request(method="CONNECT", target=authority, headers=[("host", authority)])
    await stream.send_all(http.send(request) or b"")
    await stream.send_all(http.send(h11.EndOfMessage()) or b"")
    return await receive_answer(stream, http)


async def proxy_get(
    stream: trio.SocketStream, url: str, host: str, extra: list[tuple[str, str]] | None = None
) -> ProxyAnswer:
    """A plain-HTTP ``GET url`` (absolute-form) with ``Host: host``, and the answer."""
    http = h11.Connection(h11.CLIENT)
    headers = [("host", host), *(extra or [])]
    await stream.send_all(http.send(h11.Request(method="GET", target=url, headers=headers)) or b"")
    await stream.send_all(http.send(h11.EndOfMessage()) or b"")
    return await receive_answer(stream, http)


async def at_eof(stream: trio.abc.ReceiveStream) -> bool:
    """True once the other side ended the stream (or reset it) with nothing more sent."""
    try:
        return await stream.receive_some(65536) == b""
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return True


# -- the host's side -------------------------------------------------------------------


@attrs.define
class Certificate:
    cert_pem: bytes
    key_pem: bytes

    @classmethod
    def make(cls) -> Certificate:
        """A self-signed certificate for :data:`NAMES` and 127.0.0.1."""
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "boxmaker test")])
        now = dt.datetime.now(dt.UTC)
        alt = [x509.DNSName(n) for n in NAMES] + [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256())
        )
        return cls(
            cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
        )

    def server_context(self, directory: Path) -> Callable[[], ssl.SSLContext]:
        """A maker of server contexts (one a connection, so each has its own SNI
        callback)."""
        cert, key = directory / "cert.pem", directory / "key.pem"
        cert.write_bytes(self.cert_pem)
        key.write_bytes(self.key_pem)

        def make() -> ssl.SSLContext:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(cert, key)
            return context

        return make

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cadata=self.cert_pem.decode())


@attrs.define(eq=False)
class Received:
    """One connection the server accepted: every byte it received, as received."""

    data: bytearray = attrs.Factory(bytearray)
    sent: int = 0
    server_name: str | None = None
    ended: trio.Event = attrs.Factory(trio.Event)


@attrs.define(eq=False)
class _Recording(trio.abc.Stream):
    """A TCP stream that keeps what it received and counts what it sent."""

    inner: trio.SocketStream
    log: Received

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        data = await self.inner.receive_some(max_bytes)
        self.log.data += data
        return data

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(data)
        self.log.sent += len(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.inner.send_eof()

    async def aclose(self) -> None:
        await self.inner.aclose()


@attrs.define(eq=False)
class TlsEchoServer:
    """A TLS server on 127.0.0.1 that echoes what it gets; it records each connection's
    raw bytes and the server name its client asked for."""

    contexts: Callable[[], ssl.SSLContext]
    port: int = 0
    connections: list[Received] = attrs.Factory(list)

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        await trio.serve_listeners(self._handle, listeners, task_status=task_status)

    async def _handle(self, stream: trio.SocketStream) -> None:
        received = Received()
        self.connections.append(received)
        context = self.contexts()

        def remember(_obj: object, name: str | None, _context: object) -> None:
            received.server_name = name

        context.sni_callback = remember
        tls = trio.SSLStream(_Recording(stream, received), context, server_side=True)
        try:
            while data := await tls.receive_some(65536):
                await tls.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            received.ended.set()
            await trio.aclose_forcefully(tls)


@attrs.define(eq=False)
class PlainServer:
    """A plain-HTTP server on 127.0.0.1: each request's head as received, answered
    ``hello``."""

    port: int = 0
    requests: list[h11.Request] = attrs.Factory(list)
    raw: list[bytes] = attrs.Factory(list)

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        await trio.serve_listeners(self._handle, listeners, task_status=task_status)

    async def _handle(self, stream: trio.SocketStream) -> None:
        http = h11.Connection(h11.SERVER)
        raw = bytearray()
        try:
            while True:
                event = http.next_event()
                if event is h11.NEED_DATA:
                    data = await stream.receive_some(65536)
                    raw += data
                    http.receive_data(data)
                elif isinstance(event, h11.Request):
                    self.requests.append(event)
                elif isinstance(event, h11.EndOfMessage):
                    break
            self.raw.append(bytes(raw))
            headers = [("content-length", "5"), ("connection", "close")]
            await stream.send_all(http.send(h11.Response(status_code=200, headers=headers)) or b"")
            await stream.send_all(http.send(h11.Data(data=b"hello")) or b"")
            await stream.send_all(http.send(h11.EndOfMessage()) or b"")
        finally:
            await trio.aclose_forcefully(stream)


@attrs.define
class Resolver:
    """The resolver seam: what each name resolves to, and every lookup made."""

    answers: dict[str, list[str]] = attrs.Factory(dict)
    lookups: list[tuple[str, int]] = attrs.Factory(list)

    @property
    def host(self) -> Host:
        return Host(resolve=self)

    async def __call__(self, host: str, port: int) -> list[str]:
        self.lookups.append((host, port))
        if is_address(host):
            return [host]
        if host not in self.answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return self.answers[host]


Program = Callable[[Path], Awaitable[str]]
"""A sandboxed program's stand-in: given the call's egress directory, what it printed."""


@attrs.define
class ShellStandIn:
    """brokerd's ``execute`` for these tests: a shell call runs ``program`` against its
    egress directory instead of a sandbox (the sandbox's own side is tested in
    tests/broker/test_sandbox_egress.py); every spec run is kept."""

    program: Program | None = None
    specs: list[RunSpec] = attrs.Factory(list)
    opened: list[trio.SocketStream] = attrs.Factory(list)

    async def connect(self, directory: Path, count: int = 1) -> list[trio.SocketStream]:
        """:func:`sandbox_connections`, closed when the program ends (as a sandbox's
        processes are killed at its end)."""
        streams = await sandbox_connections(directory, count)
        self.opened += streams
        return streams

    async def __call__(self, spec: RunSpec, sandboxes: Any = None, **_: Any) -> RunResult:
        self.specs.append(spec)
        if spec.egress_dir is None or self.program is None:
            return RunResult.success("no way out", spec.label)
        try:
            return RunResult.success(await self.program(spec.egress_dir), spec.label)
        finally:
            for stream in self.opened:
                await trio.aclose_forcefully(stream)


# -- a shell call with a way out, and its records --------------------------------------

COMMAND: Final = "pip install attrs"
RUNBOOK: Final = "docs/runbook.md#egress"


def configure(home: Home, workspace: Path, egress: str = "") -> None:
    write_config(
        home,
        f"workspace = {str(workspace)!r}\n[broker]\npending_timeout = {PENDING_TIMEOUT}\n"
        f"[egress]\n{egress}\n",
    )


def network_grant(hosts: list[str], mode: str = "auto", gid: str = "net", **extra: str) -> str:
    quoted = ", ".join(f'"{h}"' for h in hosts)
    return grant_table(gid, "connect", mode, hosts=f"[{quoted}]", via='["shell"]', **extra)


def grants(home: Home, *tables: str) -> None:
    write_grants(home, grant("sh", "shell", "auto") + "".join(tables))


async def run_shell(home: Home) -> dict[str, Any]:
    """One shell call on broker.sock; its final frame."""
    frames = await call(home, tool_request("shell", {"command": COMMAND}))
    return frames[-1]


def connect_calls(home: Home) -> list[str]:
    return [r["call"] for r in records(home) if r["kind"] == "decision" and r["tool"] == "connect"]


def shell_call(home: Home) -> str:
    return next(
        r["call"] for r in records(home) if r["kind"] == "decision" and r["tool"] == "shell"
    )


async def closed(tls: trio.SSLStream[Any], home: Home) -> None:
    """Close the TLS session (and so the tunnel) and wait for its record, as a program
    that ends after its download does."""
    await tls.aclose()
    await eventually(lambda: any(r["kind"] == "connection" for r in records(home)))


def the_connection(home: Home) -> dict[str, Any]:
    [found] = [body(r) for r in records(home) if r["kind"] == "connection"]
    return found


async def tls_echo(
    stream: trio.abc.Stream, certificate: Certificate, name: str
) -> trio.SSLStream[Any]:
    """A TLS session through the tunnel to ``name``, one ``ping`` echoed."""
    tls = trio.SSLStream(stream, certificate.client_context(), server_hostname=name)
    await tls.do_handshake()
    await tls.send_all(b"ping")
    got = b""
    while len(got) < 4:
        got += await tls.receive_some(4 - len(got))
    assert got == b"ping"
    return tls


def with_egress(brokerd: Brokerd, **changes: Any) -> Any:
    """The broker's config with ``[egress]`` changed (as a SIGHUP re-read applies it)."""
    assert brokerd.broker is not None
    config = brokerd.broker.config
    return attrs.evolve(config, egress=attrs.evolve(config.egress, **changes))


async def push(tls: trio.SSLStream[Any], size: int) -> None:
    """Send ``size`` bytes through the echo, 16 KiB at a time, reading each back."""
    chunk = 16 * 1024
    for _ in range(size // chunk):
        await tls.send_all(bytes(chunk))
        got = 0
        while got < chunk:
            got += len(await tls.receive_some(chunk))
