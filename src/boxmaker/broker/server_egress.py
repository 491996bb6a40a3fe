"""An MCP server's way out: the shell's proxy (broker/egress.py), for a sandbox that
lives as long as its server and serves one call at a time (docs/mcp.md, "A server's way
out"; docs/decisions.md, "MCP servers through brokerd").

A server gets a way out when, at its start, a connect grant's ``via`` covers one of its
tools (``mcp.<server>.<tool>``, or a family such as ``mcp.fetch.*``): brokerd then opens
one directory with ``proxy.sock`` for the server's whole life (:func:`open_server_egress`),
bound into its sandbox as a shell call's is. Who a connection on it belongs to is
switched with the calls: while the gateway sends one call to the server
(:meth:`ServerEgress.serving`, the gateway lets one call at a time through), each
connection accepted is that call's — its CONNECT a ``connect`` call whose ``via`` is
that call and ``via_tool`` its tool, decided against that call's grants, within that
call's ``[egress]`` bounds — and at the call's end every one of them ends
(``call_ended``) or is withdrawn. A connection accepted while no call is in flight
belongs to no call: its request is answered ``403`` and logged, never decided or
recorded (a ledger decision names its calling call, and there is none), and it stays
refused when a call comes later.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Final

import attrs
import trio

from boxmaker.broker.egress import (
    CLOSE_GRACE_S,
    ByteBudget,
    CallEgress,
    EgressParent,
    accept_each,
)
from boxmaker.broker.egress_dirs import listen_in, make_egress_directory
from boxmaker.core.grants import GrantSet
from boxmaker.core.network import network_grants
from boxmaker.formats.clock import utc_now

if TYPE_CHECKING:
    from boxmaker.broker.state import Broker

log = logging.getLogger("boxmaker.brokerd.egress")

SERVER_DIRECTORY: Final = "mcp-{server}"
"""The name of a server's egress directory (in place of a call's id)."""


@attrs.define(eq=False)
class ServerEgress:
    """A server's way out, open for its life: the call each new connection belongs to
    now (:attr:`current`) and what :meth:`serving` switches."""

    broker: Broker
    server: str
    directory: Path
    peer: int
    nursery: trio.Nursery
    current: CallEgress = attrs.field(init=False)
    """The call in flight's connections, or (its ``parent`` None) those of no call."""

    def __attrs_post_init__(self) -> None:
        self.current = self._no_call()

    def _no_call(self) -> CallEgress:
        config = self.broker.config.egress
        return CallEgress(self.broker, None, self.directory, self.peer, config, ByteBudget(0, 0))

    def admit(self, stream: trio.SocketStream) -> None:
        self.current.admit(self.nursery, stream)

    @contextlib.asynccontextmanager
    async def serving(self, parent: EgressParent) -> AsyncIterator[CallEgress]:
        """While open, each new connection is ``parent``'s call's (its own byte budget
        and tunnel cap, as a shell call's); on exit, connections are nobody's again and
        every one of the call's ends (``call_ended``), its records written. One call at
        a time: the gateway serializes a server's calls. ``[egress]`` is read now, as a
        shell call reads it when its way out opens."""
        config = self.broker.config.egress
        cap = config.bytes_per_call
        egress = CallEgress(
            self.broker, parent, self.directory, self.peer, config, ByteBudget(cap, cap)
        )
        async with egress.watched():
            self.current = egress
            try:
                yield egress
            finally:
                # Before the close: a connection from now on is no call's, not a 503 of
                # the call that is ending.
                self.current = self._no_call()


@contextlib.asynccontextmanager
async def open_server_egress(
    broker: Broker, server: str, *, peer: int
) -> AsyncIterator[ServerEgress]:
    """Server ``server``'s way out, open while the context is: its directory and
    ``proxy.sock`` made as a call's are (``peer``, the sandbox's uid, the only one that
    may connect), no call in flight. On exit whatever is open ends and the directory
    is removed."""
    made = await broker.to_thread(
        make_egress_directory, broker.home.run_dir, SERVER_DIRECTORY.format(server=server), peer
    )
    directory = made.path
    try:
        sock = await broker.to_thread(listen_in, directory, peer)
    except BaseException:
        made.remove()
        raise
    listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
    try:
        async with trio.open_nursery() as nursery:
            way_out = ServerEgress(broker, server, directory, peer, nursery)
            await nursery.start(functools.partial(accept_each, listener, directory, way_out.admit))
            try:
                yield way_out
            finally:
                with trio.move_on_after(CLOSE_GRACE_S, shield=True):
                    await way_out.current.close()
                nursery.cancel_scope.cancel()
    finally:
        made.remove()


@attrs.frozen
class ServerWaysOut:
    """What the MCP gateway asks of brokerd for its servers' ways out."""

    broker: Broker

    async def needed(self, tools: Iterable[str]) -> bool:
        """Whether a server with these tools (``mcp.<server>.<tool>``) gets a way out:
        a connect grant current now could let a tunnel of one of them out."""
        grants = await self.broker.grants.current()
        if not isinstance(grants, GrantSet):
            return False
        now = utc_now()
        return any(network_grants(grants, tool, None, now) for tool in tools)

    def open(
        self, server: str, *, peer: int
    ) -> contextlib.AbstractAsyncContextManager[ServerEgress]:
        return open_server_egress(self.broker, server, peer=peer)
