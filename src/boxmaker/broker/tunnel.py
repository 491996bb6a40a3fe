"""The run of one ``connect`` call: the way out of a sandbox to one allowed host
(docs/egress.md, docs/decisions.md, "Egress through brokerd").

Once the call is decided ``run`` (an auto grant, or the owner's approval), its run is:

1. the host resolved once, through the broker's resolver seam (``Host.resolve``): a
   name the grants refused never got here, so it is never looked up;
2. every address it resolves to checked against the deciding grant's ``hosts``
   (:func:`boxmaker.core.hosts.address_problem`: loopback, private, link-local and
   other special addresses only where the grant names that address);
3. the checked address dialled (the next one when one does not connect), all within
   :data:`DIAL_S`; until here a failure is the call's ``failed`` answer, which the
   sandbox sees as ``502`` (``504`` for the time limit) and no byte went out;
4. ``200 Connection established``, then the first TLS record read (within
   :data:`HELLO_S`, at most 16 KiB) and its ClientHello's server name required to be
   the CONNECT host (:mod:`boxmaker.core.tls_hello`; an IP-address host may have none);
   anything else closes the tunnel before one byte reached the host;
5. bytes spliced both ways, counted, within the call's byte budget and the idle
   timeout (``[egress]``), in chunks of at most :data:`CHUNK` with back-pressure;
6. at the end, however it came, a ``connection`` record with the figures, then the
   call's ``result`` as for any call.

A plain-HTTP request (only where the grant has ``plain_http``) is forwarded once, in
origin-form with ``Connection: close``, and the answer relayed until the host closes.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

import h11
import trio

from boxmaker.broker.proxy_head import ProxyTarget, established_bytes
from boxmaker.broker.run_spec import describe_error
from boxmaker.broker.tools.host import is_address
from boxmaker.core.call_events import Ran, RunOutcome
from boxmaker.core.catalogue import result_label
from boxmaker.core.hosts import address_problem, host_rules
from boxmaker.core.reasons import Reason
from boxmaker.core.tls_hello import RECORD_HEADER, NotHello, read_hello, record_size
from boxmaker.ledger.records import Connection, ConnectionEnd

if TYPE_CHECKING:
    from boxmaker.broker.egress import CallEgress, EgressParent, TunnelRequester
    from boxmaker.core.decide import Ask, Run
    from boxmaker.core.labels import Label

log = logging.getLogger("boxmaker.brokerd.egress")

DIAL_S: Final = 10.0
"""Seconds to resolve the host and connect to a checked address."""
HELLO_S: Final = 10.0
"""Seconds, after ``200``, for the sandboxed client's first TLS record."""
CHUNK: Final = 262144
"""The most bytes read at once from either side: with ``send_all`` awaited before the
next read, what a tunnel holds is bounded whatever either side sends (two chunks, one a
direction). 256 KiB, not 64: bulk through a tunnel 0.50x -> 0.60x a direct copy
(docs/decisions.md, "The bridge's options")."""
RUNBOOK_EGRESS: Final = "docs/runbook.md#egress"
HOP_BY_HOP: Final = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authorization",
        b"proxy-authenticate",
        b"te",
        b"trailer",
        b"upgrade",
    }
)
"""Headers of a plain-HTTP request that are the proxy hop's, not the host's."""


FINE_ENDS: Final = frozenset(
    {ConnectionEnd.CLOSED, ConnectionEnd.IDLE, ConnectionEnd.CALL_ENDED, ConnectionEnd.STOPPING}
)
"""Ends of a tunnel that ran as it should: its call's result is ``ok``; any other end
is ``failed`` ``tool_error`` with the end in its detail."""


class _Refused(Exception):
    """The run stops before the tunnel opened: the call fails with this reason."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


async def _dial_address(address: str, port: int) -> trio.SocketStream:
    """A TCP connection to ``address`` itself: one socket, no lookup and no racing of
    addresses (trio.open_tcp_stream's), which the run has done already."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = trio.socket.socket(family, socket.SOCK_STREAM)
    try:
        await sock.connect((address, port))
    except BaseException:
        sock.close()
        raise
    return trio.SocketStream(sock)  # with TCP_NODELAY, as trio sets it


class Tunnel:
    """One connection's ``connect`` call, from its run to its record. ``end`` may be
    called from outside (the call's egress closing, the ledger failing): the first end
    given is the one recorded, and it stops whatever the run is doing at once."""

    def __init__(
        self,
        egress: CallEgress,
        requester: TunnelRequester,
        target: ProxyTarget,
        call: str,
        parent: EgressParent,
    ) -> None:
        self.egress = egress
        self.parent = parent
        """The calling call, as it was when this tunnel's request came."""
        self.requester = requester
        self.target = target
        self.call = call
        self.ended: ConnectionEnd | None = None
        self.server_name: str | None = None
        """The ClientHello's server name, once read."""
        self.detail: str | None = None
        self.scope = trio.CancelScope()
        self.bytes_up = 0
        self.bytes_down = 0
        self.last_active = 0.0
        self._directions = 0

    def end(self, ended: ConnectionEnd, detail: str | None = None) -> None:
        if self.ended is None:
            self.ended = ended
            self.detail = detail
        self.scope.cancel()

    # -- the run ---------------------------------------------------------------------

    async def run(self, verdict: Run | Ask, under_way: Callable[[], None]) -> Ran:
        broker = self.egress.broker
        checked = verdict.checked
        label = result_label(checked, broker.config.labels, verdict.grant.label_taint)
        upstream: trio.SocketStream | None = None
        address = ""
        started = trio.current_time()
        try:
            # One scope from the lookup to the last byte: an end from outside stops
            # whichever step is under way.
            with self.scope:
                upstream, address = await self._dial(verdict)
                started = self.last_active = trio.current_time()
                if self.target.scheme == "https":
                    await self._tunnel(upstream, under_way)
                else:
                    await self._forward(upstream, under_way)
                if self.ended is None:
                    self.ended = ConnectionEnd.CLOSED
        except _Refused as refused:
            return self._outcome(label, ok=False, reason=refused.reason, detail=refused.detail)
        finally:
            if upstream is not None:
                with trio.CancelScope(shield=True):
                    await trio.aclose_forcefully(upstream)
        if upstream is None:
            ended = self.ended or ConnectionEnd.CALL_ENDED
            return self._outcome(label, ok=False, detail=f"the tunnel did not open: {ended}")
        return await self._record(label, address, started)

    async def _dial(self, verdict: Run | Ask) -> tuple[trio.SocketStream, str]:
        """The checked address connected to, and the address; :class:`_Refused` when
        the run may not go on."""
        egress = self.egress
        grant = verdict.grant
        destination = verdict.checked.destination
        rules = host_rules(grant.hosts)
        # Fail closed on the run path too: the decision's grant must cover the target.
        if destination is None or not any(rule.allows(destination) for rule in rules):
            raise _Refused(Reason.TOOL_ERROR, f"grant {grant.id} does not cover {self._where}")
        if destination.scheme == "http" and not grant.plain_http:
            raise _Refused(Reason.TOOL_ERROR, f"grant {grant.id} does not allow plain HTTP")
        if not egress.broker.writer.usable:
            self.end(ConnectionEnd.LEDGER_FAILED)
        if self.ended is not None:
            raise _Refused(Reason.TOOL_ERROR, f"the tunnel did not open: {self.ended}")
        with trio.move_on_after(DIAL_S):
            try:
                addresses = await egress.lookups.resolve(destination.host, destination.port)
            except OSError as exc:
                detail = f"{destination.host}: the name does not resolve ({describe_error(exc)})"
                raise _Refused(Reason.TOOL_ERROR, detail) from None
            problem = address_problem(rules, destination, addresses)
            if problem is not None or not addresses:
                problem = problem or f"{destination.host}: the name resolves to no address"
                raise _Refused(Reason.TOOL_ERROR, f"{problem}; see {RUNBOOK_EGRESS}")
            failures: list[str] = []
            for address in addresses:
                try:
                    stream = await _dial_address(address, destination.port)
                except OSError as exc:
                    failures.append(f"{address}: {describe_error(exc)}")
                    continue
                return stream, address
            raise _Refused(Reason.TOOL_ERROR, f"{self._where}: {'; '.join(failures)}"[:500])
        raise _Refused(Reason.TIMEOUT, f"{self._where}: no connection within {DIAL_S:g} s")

    async def _tunnel(self, upstream: trio.SocketStream, under_way: Callable[[], None]) -> None:
        """``200``, the ClientHello checked (its server name kept), then both ways."""
        requester = self.requester
        await requester.established(established_bytes(requester.http))
        first, rest = await self._first_record()
        if first is None:
            return
        hello = read_hello(first)
        if isinstance(hello, NotHello):
            self.end(ConnectionEnd.NOT_TLS, hello.detail)
            return
        name = self.server_name = hello.server_name
        expected = None if is_address(self.target.host) else self.target.host
        if (name.lower() if name is not None else None) != expected:
            shown = "none" if name is None else repr(name[:100])
            self.end(ConnectionEnd.SERVER_NAME_MISMATCH, f"the TLS server name is {shown}")
            return
        await self._send_up(upstream, first + rest)
        under_way()
        await self._splice(upstream, both=True)

    async def _first_record(self) -> tuple[bytes | None, bytes]:
        """The first TLS record the client sent (and what came after it in the same
        reads), or None once the tunnel ended (nothing sent, not TLS, too slow)."""
        buffer = bytearray(self.requester.http.trailing_data[0])
        with trio.move_on_after(HELLO_S):
            if not await self._read_until(buffer, RECORD_HEADER):
                return None, b""
            size = record_size(bytes(buffer[:RECORD_HEADER]))
            if isinstance(size, NotHello):
                self.end(ConnectionEnd.NOT_TLS, size.detail)
                return None, b""
            if not await self._read_until(buffer, size):
                return None, b""
            return bytes(buffer[:size]), bytes(buffer[size:])
        self.end(ConnectionEnd.NOT_TLS, f"no TLS ClientHello within {HELLO_S:g} s")
        return None, b""

    async def _read_until(self, buffer: bytearray, size: int) -> bool:
        """Read from the client into ``buffer`` until it holds ``size`` bytes; False
        (the tunnel ended) when the client closed first."""
        while len(buffer) < size:
            data = await self.requester.stream.receive_some(size - len(buffer))
            if not data:
                ended = ConnectionEnd.CLOSED if not buffer else ConnectionEnd.NOT_TLS
                self.end(ended, "the client closed before its first TLS record's end")
                return False
            buffer += data
        return True

    async def _forward(self, upstream: trio.SocketStream, under_way: Callable[[], None]) -> None:
        """One plain-HTTP request to the host, origin-form, ``Connection: close``; then
        the host's answer relayed until it closes."""
        requester = self.requester
        request = requester.request
        client = h11.Connection(h11.CLIENT)
        headers = [(name, value) for name, value in request.headers if name not in HOP_BY_HOP]
        headers.append((b"connection", b"close"))
        head = h11.Request(method=request.method, target=self.target.path, headers=headers)
        await self._send_up(upstream, client.send(head) or b"")
        http = requester.http
        while True:
            event = http.next_event()
            if event is h11.NEED_DATA:
                data = await requester.stream.receive_some(CHUNK)
                if not data:
                    self.end(ConnectionEnd.CLOSED, "the client closed before its request's end")
                    return
                http.receive_data(data)
            elif isinstance(event, h11.Data):
                await self._send_up(upstream, client.send(event) or b"")
            elif isinstance(event, h11.EndOfMessage):
                await self._send_up(upstream, client.send(event) or b"")
                break
        requester.opened = True
        under_way()
        await self._splice(upstream, both=False)

    # -- both ways -------------------------------------------------------------------

    async def _send_up(self, upstream: trio.SocketStream, data: bytes) -> None:
        granted = self.egress.budget.take(len(data))
        try:
            await upstream.send_all(data[:granted])
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self.end(ConnectionEnd.UPSTREAM_ERROR, describe_error(exc))
            return
        self.bytes_up += granted
        self.last_active = trio.current_time()
        if granted < len(data):
            self.end(ConnectionEnd.BYTE_CAP, self.egress.budget.detail)

    async def _splice(self, upstream: trio.SocketStream, *, both: bool) -> None:
        """Bytes both ways until both sides ended (``both``), or until the host ended
        (a plain-HTTP answer); counted, within the budget and the idle timeout."""
        client = self.requester.stream
        self._directions = 2 if both else 1
        async with trio.open_nursery() as splice:
            splice.start_soon(self._idle, splice.cancel_scope)
            splice.start_soon(self._pump, upstream, client, False, splice.cancel_scope)
            if both:
                splice.start_soon(self._pump, client, upstream, True, splice.cancel_scope)

    async def _pump(
        self,
        source: trio.SocketStream,
        sink: trio.SocketStream,
        up: bool,
        splice: trio.CancelScope,
    ) -> None:
        # Which side failed says how the tunnel ended: the host's side is upstream_error,
        # the sandbox's side a close.
        host_error = ConnectionEnd.UPSTREAM_ERROR
        source_error, sink_error = (
            (ConnectionEnd.CLOSED, host_error) if up else (host_error, ConnectionEnd.CLOSED)
        )
        budget = self.egress.budget
        while True:
            try:
                data = await source.receive_some(CHUNK)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                self.end(source_error, describe_error(exc))
                return
            if not data:
                break
            granted = budget.take(len(data))
            try:
                await sink.send_all(data[:granted] if granted < len(data) else data)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                self.end(sink_error, describe_error(exc))
                return
            if up:
                self.bytes_up += granted
            else:
                self.bytes_down += granted
            self.last_active = trio.current_time()
            if granted < len(data):
                self.end(ConnectionEnd.BYTE_CAP, budget.detail)
                return
        # The other side may be gone already: its own direction then says so.
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            await sink.send_eof()
        self._directions -= 1
        if self._directions == 0:
            splice.cancel()

    async def _idle(self, splice: trio.CancelScope) -> None:
        idle = self.egress.config.idle_timeout_s
        while True:
            deadline = self.last_active + idle
            if trio.current_time() >= deadline:
                self.end(ConnectionEnd.IDLE, f"no byte either way for {idle:g} s")
                splice.cancel()
                return
            await trio.sleep_until(deadline)

    # -- the end ---------------------------------------------------------------------

    async def _record(self, label: Label, address: str, started: float) -> Ran:
        egress = self.egress
        parent = self.parent
        ended = self.ended or ConnectionEnd.CLOSED
        duration_ms = round((trio.current_time() - started) * 1000)
        record = Connection(
            call=self.call,
            via=parent.call,
            session=parent.session,
            host=self.target.host,
            port=self.target.port,
            address=address,
            server_name=self.server_name,
            bytes_up=self.bytes_up,
            bytes_down=self.bytes_down,
            duration_ms=duration_ms,
            ended=ended,
        )
        log.info(
            "tunnel call=%s via=%s %s (%s) ended %s: %d bytes up, %d down, %d ms",
            self.call,
            parent.call,
            self._where,
            address,
            ended,
            self.bytes_up,
            self.bytes_down,
            duration_ms,
        )
        summary = (
            f"{self._where} ({address}): {self.bytes_up} bytes up, {self.bytes_down} down, "
            f"ended {ended}"
        )
        with trio.CancelScope(shield=True):
            recorded = await egress.broker.record(record)
        if not recorded:
            detail = f"{summary}; its connection record could not be written"
            return self._outcome(label, ok=False, detail=detail)
        if ended in FINE_ENDS:
            return self._outcome(label, ok=True, content=summary)
        detail = summary if self.detail is None else f"{summary}: {self.detail}"
        return self._outcome(label, ok=False, detail=f"{detail}; see {RUNBOOK_EGRESS}")

    def _outcome(
        self,
        label: Label,
        *,
        ok: bool,
        content: str = "",
        reason: Reason = Reason.TOOL_ERROR,
        detail: str | None = None,
    ) -> Ran:
        if ok:
            return Ran(RunOutcome(True, None, None, content, label))
        return Ran(RunOutcome(False, reason, detail, "", label))

    @property
    def _where(self) -> str:
        host = self.target.host
        shown = f"[{host}]" if ":" in host else host
        return f"{shown}:{self.target.port}"
