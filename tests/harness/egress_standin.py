"""A stand-in for brokerd's egress proxy, for the sandbox's side of the way out
(tests/broker/test_sandbox_egress.py, tests/hostile/test_egress_sandbox.py).

It makes a call's egress directory as brokerd does (docs/egress.md): 0700 and, as root,
owned by the sandbox's uid (:data:`~tests.harness.sandbox.SANDBOX_UID`), in a directory
that uid can walk to, with ``proxy.sock`` (0600, the same owner) listening in it. Each
connection's request head is kept; a ``CONNECT`` is answered ``200`` and then echoed,
anything else ``403``. Nothing is decided or forwarded: that is brokerd's part.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Final

import attrs
import trio
from tests.harness.sandbox import AS_ROOT, SANDBOX_UID

from boxmaker.broker.egress_dirs import listen_in

HEAD_CAP: Final = 16384
CONNECTED: Final = b"HTTP/1.1 200 Connection established\r\n\r\n"
REFUSED: Final = b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


@attrs.define
class StandIn:
    directory: Path
    """The call's egress directory (what brokerd puts in ``RunSpec.egress_dir``)."""
    heads: list[bytes] = attrs.Factory(list)
    """Each connection's request head, as received, in order."""
    connections: int = 0

    @property
    def socket_path(self) -> Path:
        return self.directory / "proxy.sock"

    def request_lines(self) -> list[bytes]:
        return [head.split(b"\r\n", 1)[0] for head in self.heads]


async def _read_head(stream: trio.SocketStream) -> bytes | None:
    head = b""
    while b"\r\n\r\n" not in head and len(head) < HEAD_CAP:
        chunk = await stream.receive_some(4096)
        if not chunk:
            return None
        head += chunk
    return head


async def _serve(stand_in: StandIn, stream: trio.SocketStream) -> None:
    stand_in.connections += 1
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        async with stream:
            with trio.fail_after(10):
                head = await _read_head(stream)
            if head is None:
                return
            stand_in.heads.append(head.split(b"\r\n\r\n", 1)[0])
            if not head.startswith(b"CONNECT "):
                await stream.send_all(REFUSED)
                return
            await stream.send_all(CONNECTED + head.split(b"\r\n\r\n", 1)[1])
            async for chunk in stream:
                await stream.send_all(chunk)


@contextlib.asynccontextmanager
async def stand_in_proxy() -> AsyncIterator[StandIn]:
    """A call's egress directory with the stand-in listening on its ``proxy.sock``;
    everything removed afterwards."""
    base = Path(tempfile.mkdtemp(prefix="bx-egress-", dir="/tmp"))
    try:
        os.chmod(base, 0o711)
        directory = base / "c-0123456789abcdef"
        os.mkdir(directory, 0o700)
        stand_in = StandIn(directory)
        sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        await sock.bind(str(stand_in.socket_path))
        sock.listen(16)
        os.chmod(stand_in.socket_path, 0o600)
        if AS_ROOT:
            for path in (directory, stand_in.socket_path):
                os.chown(path, SANDBOX_UID, SANDBOX_UID)
        listener = trio.SocketListener(sock)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                trio.serve_listeners, lambda stream: _serve(stand_in, stream), [listener]
            )
            yield stand_in
            nursery.cancel_scope.cancel()
    finally:
        shutil.rmtree(base, ignore_errors=True)


@contextlib.asynccontextmanager
async def stand_in_at(directory: Path) -> AsyncIterator[StandIn]:
    """The stand-in on a ``proxy.sock`` put into ``directory`` (an empty way out's
    directory, made by broker/egress_dirs.py: the sandbox pool's) the way brokerd's proxy
    puts a call's socket there; the socket removed afterwards, the directory left."""
    stand_in = StandIn(directory)
    sock = listen_in(directory, SANDBOX_UID if AS_ROOT else os.geteuid())
    listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                trio.serve_listeners, lambda stream: _serve(stand_in, stream), [listener]
            )
            yield stand_in
            nursery.cancel_scope.cancel()
    finally:
        stand_in.socket_path.unlink(missing_ok=True)


def alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def socats_of(egress_dir: Path) -> list[int]:
    """socat processes whose mounts show ``egress_dir`` (only this call's sandbox)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            socat = entry.name.isdigit() and (entry / "comm").read_text() == "socat\n"
            if socat and str(egress_dir) in (entry / "mountinfo").read_text():
                found.append(int(entry.name))
        except OSError:
            continue
    return found
