"""A call's way out: brokerd's proxy on a Unix socket of the call's own (docs/egress.md,
docs/decisions.md, "Egress through brokerd").

For a shell call that the grants current at its run give a way out
(:func:`boxmaker.core.network.network_grants`), brokerd opens :func:`open_call_egress`
around the run: a directory of the call's own (0700) holding ``proxy.sock`` (0600),
which the sandbox binds inside itself (broker/sandbox_plan.py): ``run/egress/<call>/``,
or, when brokerd is root, ``/run/boxmaker-egress-<random>/<call>/``, both the sandbox's
uid's (its bwrap must reach what it binds: :mod:`boxmaker.broker.egress_dirs`). A
connection on it is that call's and no other's: the socket is bound into one sandbox
only, and only the sandbox's uid may connect (the peer check; the directory's mode
already keeps every other uid out).

Each connection is one request: its head read with h11 (:mod:`boxmaker.broker.proxy_head`),
then ``CONNECT host:port`` (or a plain ``http://`` request) becomes a ``connect`` call of
its own, decided, asked, run and recorded by the very handler of broker.sock's calls
(:func:`boxmaker.broker.connection.handle_broker_connection`) with this module's
opening: the name is decided before anything is looked up, an ask holds the CONNECT
while the owner answers, and the run is the tunnel (:mod:`boxmaker.broker.tunnel`).
The requester of that call is the connection (:class:`TunnelRequester`): a denial is
answered ``403``, a run that could not open ``502`` (``504`` for its time limit), each
with a body naming the outcome, the reason code, the detail and docs/runbook.md#egress;
a ``pending`` frame sends nothing (the CONNECT just waits).

Bounds (``[egress]``): at most ``tunnels_per_call`` connections open at once (one more
is answered ``503`` at once, unread), ``bytes_per_call`` in all both ways, an idle
timeout per tunnel. Closing the egress (the call ended, or brokerd stops) ends every
tunnel at once and withdraws every CONNECT still waiting; a failed ledger write
anywhere ends every tunnel too (ended ``ledger_failed``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Final

import attrs
import h11
import trio

from boxmaker.broker import connection
from boxmaker.broker.accept import ACCEPT_CAPACITY_ERRNOS, ACCEPT_RETRY_S
from boxmaker.broker.egress_dirs import (
    PROXY_SOCK,
    EgressDirectory,
    listen_in,
    make_egress_directory,
)
from boxmaker.broker.lookups import CallLookups
from boxmaker.broker.proxy_head import (
    HEAD_S,
    HeadRefused,
    ProxyHead,
    ProxyTarget,
    answer_bytes,
    new_http,
    proxy_target,
    read_head,
)
from boxmaker.broker.requester import SEND_S, Requester
from boxmaker.broker.tunnel import RUNBOOK_EGRESS, Tunnel
from boxmaker.core.labels import THROUGH_NETWORK_LABEL, Label
from boxmaker.core.network import connect_request
from boxmaker.core.reasons import Reason, reason_words
from boxmaker.core.vocabulary import Answer, AnswerOutcome, ErrorFrame
from boxmaker.formats.convert import new_call_id
from boxmaker.ledger.records import ConnectionEnd
from boxmaker.runtime.unix_sockets import peer_uid

if TYPE_CHECKING:
    from boxmaker.broker.state import Broker
    from boxmaker.home.config import EgressConfig
    from boxmaker.wire import CatalogueAnswer, Frame

log = logging.getLogger("boxmaker.brokerd.egress")

CLOSE_GRACE_S: Final = 5.0
"""Seconds the tunnels of a call that ended have to write their records."""
TOO_MANY: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
)
"""The answer to a connection over the call's cap, sent at once and unread (no request
was read, so h11 has none to answer)."""
NO_CALL_DETAIL: Final = (
    "no call of this MCP server is in flight: a connection is opened only for the call "
    "that caused it"
)
"""The ``403`` of a CONNECT to an MCP server's way out between its calls
(broker/server_egress.py)."""


@attrs.frozen
class EgressParent:
    """The call a way out belongs to: every connection through it is attributed to it
    (the ``connect`` call's ``via``) and decided with its tool and command."""

    call: str
    session: str
    tool: str
    command: str | None


@attrs.define
class ByteBudget:
    """What one call's connections may still carry, both ways, in bytes."""

    cap: int
    left: int

    def take(self, size: int) -> int:
        """The part of ``size`` bytes still allowed (taken from what is left)."""
        granted = min(size, self.left)
        self.left -= granted
        return granted

    @property
    def spent(self) -> bool:
        return self.left <= 0

    @property
    def used(self) -> bool:
        """Did any byte pass, either way?"""
        return self.left < self.cap

    @property
    def detail(self) -> str:
        return f"the call's connections reached [egress] bytes_per_call ({self.cap} bytes)"


class TunnelRequester(Requester):
    """A proxy connection as the requester of its ``connect`` call. Its frames are
    HTTP answers (:meth:`final`); a pending frame sends nothing; it reads no
    ``client_answer`` (any byte it sends before its answer means it left)."""

    __slots__ = ("http", "opened", "request", "target")

    HEARS_CLIENT_ANSWERS = False

    def __init__(
        self,
        stream: trio.SocketStream,
        http: h11.Connection,
        request: h11.Request,
        target: ProxyTarget,
    ) -> None:
        super().__init__(stream)
        self.http = http
        self.request = request
        self.target = target
        self.opened = False
        """The ``200`` was sent (or a plain request forwarded): the call's answer then
        sends nothing."""

    async def established(self, data: bytes) -> None:
        self.opened = True
        await self._send_bytes(data)

    async def send(self, frame: Frame) -> None:
        if isinstance(frame, Answer | ErrorFrame):
            await self.final(frame)
        # A pending frame: nothing. The CONNECT waits for the owner's answer.

    async def final(self, answer: Answer | ErrorFrame | CatalogueAnswer) -> None:
        if self.opened:
            return
        self.opened = True
        status, text = self.refusal(answer)
        await self._send_bytes(answer_bytes(self.http, status, text))

    def refusal(self, answer: Answer | ErrorFrame | CatalogueAnswer) -> tuple[int, str]:
        """The HTTP status and text of a call's answer that opened nothing."""
        target = self.target
        what = f"CONNECT {target.host}:{target.port}"
        if target.scheme == "http":
            what = f"{self.request.method.decode('ascii', 'replace')} http://{target.host}"
        if isinstance(answer, Answer):
            reason = answer.reason
            words = reason_words(reason)
            lines = [f"boxmaker: {what}: {answer.outcome} {reason}"]
            if words is not None:
                lines.append(f"({words})")
            if answer.detail:
                lines.append(answer.detail)
            lines.append(f"see {RUNBOOK_EGRESS}")
            if answer.outcome == AnswerOutcome.DENIED:
                status = 403
            elif reason == Reason.TIMEOUT:
                status = 504
            else:
                status = 502
            return status, "\n".join(lines) + "\n"
        detail = getattr(answer, "detail", "")
        return 500, f"boxmaker: {what}: error {detail}\nsee {RUNBOOK_EGRESS}\n"

    async def _send_bytes(self, data: bytes) -> None:
        with trio.move_on_after(SEND_S):
            await self.stream.send_all(data)


@attrs.define(eq=False)
class CallEgress:
    """One call's way out, open: its directory and what its connections share."""

    broker: Broker
    parent: EgressParent | None
    """None: an MCP server's way out between its calls (broker/server_egress.py): every
    request on it is refused ``403``, logged and not recorded (no call made it)."""
    directory: Path
    """The call's own directory (:mod:`~boxmaker.broker.egress_dirs`): the sandbox binds it;
    ``proxy.sock`` is in it."""
    peer: int
    """The only uid that may connect: the sandbox's."""
    config: EgressConfig
    budget: ByteBudget
    open: dict[trio.SocketStream, Tunnel | None] = attrs.Factory(dict)
    """Each connection open, with its tunnel once its request became a call."""
    closing: ConnectionEnd | None = None
    none_open: trio.Event = attrs.Factory(trio.Event)
    lookups: CallLookups = attrs.field(init=False)
    """The call's lookups (:mod:`~boxmaker.broker.lookups`): one a name, not one a
    connection."""

    @lookups.default
    def _lookups(self) -> CallLookups:
        return CallLookups(self.broker.host.resolve)

    @property
    def socket_path(self) -> Path:
        return self.directory / PROXY_SOCK

    def output_label(self, label: Label) -> Label:
        """The label of the call's output, ``label`` as its tool gives it: untrusted
        when any of its tunnels carried a byte (what came in may be in what the model
        reads; the tunnels' own results raise nothing)."""
        return label.join(THROUGH_NETWORK_LABEL) if self.budget.used else label

    @property
    def who(self) -> str:
        """Whose connections these are, for the log."""
        if self.parent is None:
            return f"{self.directory.name} (no call in flight)"
        return f"call {self.parent.call}"

    # -- connections -------------------------------------------------------------------

    async def serve(
        self,
        listener: trio.SocketListener,
        nursery: trio.Nursery,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        admit = functools.partial(self.admit, nursery)
        await accept_each(listener, self.socket_path, admit, task_status=task_status)

    def admit(self, nursery: trio.Nursery, stream: trio.SocketStream) -> None:
        """A connection just accepted: handled in ``nursery``, or refused at once."""
        if len(self.open) >= self.config.tunnels_per_call or self.closing is not None:
            self._refuse_at_once(stream)
            return
        self.open[stream] = None
        self.none_open = trio.Event()
        nursery.start_soon(self._handle, stream)

    def _refuse_at_once(self, stream: trio.SocketStream) -> None:
        cap = self.config.tunnels_per_call
        log.warning("%s: a connection over [egress] tunnels_per_call (%d)", self.who, cap)
        text = (
            f"boxmaker: this call already has {cap} connections open "
            f"([egress] tunnels_per_call); see {RUNBOOK_EGRESS}\n"
        ).encode()
        sock = stream.socket
        with contextlib.suppress(OSError):
            raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, fileno=sock.fileno())
            try:
                raw.send(TOO_MANY % (len(text), text), socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
            finally:
                raw.detach()
        sock.close()

    async def _handle(self, stream: trio.SocketStream) -> None:
        try:
            await connection.handle_broker_connection(self.broker, stream, self._opening)
        finally:
            del self.open[stream]
            if not self.open:
                self.none_open.set()
            await trio.aclose_forcefully(stream)

    async def _opening(
        self, broker: Broker, stream: trio.SocketStream
    ) -> connection.OpenedCall | None:
        """The proxy's opening of a call: the peer checked, the head read, the target
        understood; then the ``connect`` call's request."""
        http = new_http()
        uid = peer_uid(stream)
        if uid != self.peer:
            who = "an unknown uid" if uid is None else f"uid {uid}"
            log.warning(
                "%s: refused a peer with %s (only uid %d)", self.socket_path, who, self.peer
            )
            return None
        head: ProxyHead | HeadRefused | None = None
        with trio.move_on_after(HEAD_S) as timer:
            head = await read_head(stream, http)
        if timer.cancelled_caught:
            log.info("%s: no request head within %g s", self.who, HEAD_S)
            return None
        if head is None:
            return None
        if isinstance(head, HeadRefused):
            await self._answer(stream, http, head)
            return None
        target = proxy_target(head.request)
        if isinstance(target, HeadRefused):
            await self._answer(stream, http, target)
            return None
        parent = self.parent
        if parent is None:
            log.warning(
                "%s: refused %s %s:%d: no call of the server is in flight",
                self.directory.name,
                head.request.method.decode("ascii", "replace"),
                target.host,
                target.port,
            )
            await self._answer(stream, http, HeadRefused(403, NO_CALL_DETAIL))
            return None
        if self.closing is not None or self.budget.spent:
            why = (
                self.budget.detail if self.budget.spent else f"the call has ended ({self.closing})"
            )
            await self._answer(stream, http, HeadRefused(503, why))
            return None
        request = connect_request(
            call=new_call_id(),
            session=parent.session,
            via=parent.call,
            via_tool=parent.tool,
            via_command=parent.command,
            host=target.host,
            port=target.port,
            scheme=target.scheme,
        )
        requester = TunnelRequester(stream, http, head.request, target)
        requester.request_bytes = head.size
        tunnel = Tunnel(self, requester, target, request.call, parent)
        self.open[stream] = tunnel
        return connection.OpenedCall(requester, request, run=tunnel.run, internal=True)

    @staticmethod
    async def _answer(
        stream: trio.SocketStream, http: h11.Connection, refused: HeadRefused
    ) -> None:
        log.info("egress: refused a request: %s %s", refused.status, refused.detail)
        text = f"boxmaker: {refused.detail}\nsee {RUNBOOK_EGRESS}\n"
        data = answer_bytes(http, refused.status, text)
        with trio.move_on_after(SEND_S), contextlib.suppress(trio.BrokenResourceError):
            await stream.send_all(data)

    # -- the end ---------------------------------------------------------------------

    def end_all(self, ended: ConnectionEnd) -> None:
        """Every tunnel ends now with ``ended``."""
        for tunnel in self.open.values():
            if tunnel is not None:
                tunnel.end(ended)

    async def watch_stop(self) -> None:
        """brokerd is stopping: every tunnel ends now (``stopping``), while the running
        calls' grace lets the records be written, and no new one opens."""
        await self.broker.wait_stop_requested()
        self.closing = self.closing or ConnectionEnd.STOPPING
        self.end_all(ConnectionEnd.STOPPING)

    async def watch_ledger(self) -> None:
        await self.broker.writer.broken.wait()
        log.error("%s: the ledger failed; every tunnel of the call is closed", self.who)
        self.end_all(ConnectionEnd.LEDGER_FAILED)

    async def close(self) -> None:
        """The call is over: every tunnel ends at once, every CONNECT still waiting is
        withdrawn (its socket's reading side shut: the wait sees its requester gone),
        and the records are written."""
        if self.closing is None:
            self.closing = (
                ConnectionEnd.STOPPING if self.broker.stopping else ConnectionEnd.CALL_ENDED
            )
        self.end_all(self.closing)
        for stream in self.open:
            with contextlib.suppress(OSError):
                stream.socket.shutdown(socket.SHUT_RD)
        if self.open:
            await self.none_open.wait()

    @contextlib.asynccontextmanager
    async def watched(self) -> AsyncIterator[None]:
        """While open, every tunnel ends when the ledger fails or brokerd stops; on exit
        the call is over (:meth:`close`, within :data:`CLOSE_GRACE_S`, even when the exit
        is a cancellation)."""
        async with trio.open_nursery() as watchers:
            watchers.start_soon(self.watch_ledger)
            watchers.start_soon(self.watch_stop)
            try:
                yield
            finally:
                with trio.move_on_after(CLOSE_GRACE_S, shield=True):
                    await self.close()
                watchers.cancel_scope.cancel()


async def accept_each(
    listener: trio.SocketListener,
    path: Path,
    admit: Callable[[trio.SocketStream], None],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Accept on ``listener`` (``path``'s) until cancelled, giving each connection to
    ``admit``; a shortage of descriptors or memory is logged and waited out."""
    async with listener:
        task_status.started()
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno not in ACCEPT_CAPACITY_ERRNOS:
                    raise
                log.error("%s: accept failed (%s); retrying", path, exc)  # noqa: TRY400
                await trio.sleep(ACCEPT_RETRY_S)
                continue
            admit(stream)


@contextlib.asynccontextmanager
async def open_call_egress(
    broker: Broker, parent: EgressParent, *, peer: int, directory: Path | None = None
) -> AsyncIterator[CallEgress]:
    """The way out of ``parent``'s call, open while the context is: ``peer`` is the
    sandbox's uid, the only one that may connect, and (brokerd root) the owner of the
    directory and its socket. ``directory``: one made for ``peer`` by
    :func:`~boxmaker.broker.egress_dirs.make_egress_directory` already (the sandbox pool's,
    bound in a sandbox set up ahead), where the socket is put and from where it is
    removed at the end, the directory left to its maker; None: the call's own, made here
    and removed at the end. On exit every tunnel ends (``call_ended``, or ``stopping``),
    their records are written (within :data:`CLOSE_GRACE_S`, even when the exit is a
    cancellation), and the socket is gone."""
    config = broker.config.egress
    made: EgressDirectory | None = None
    if directory is None:
        made = await broker.to_thread(make_egress_directory, broker.home.run_dir, parent.call, peer)
        directory = made.path
    try:
        sock = await broker.to_thread(listen_in, directory, peer)
    except BaseException:
        if made is not None:
            made.remove()
        raise
    listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
    budget = ByteBudget(config.bytes_per_call, config.bytes_per_call)
    egress = CallEgress(broker, parent, directory, peer, config, budget)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(egress.serve, listener, nursery)
            try:
                async with egress.watched():
                    yield egress
            finally:
                nursery.cancel_scope.cancel()
    finally:
        if made is not None:
            made.remove()
        else:
            with contextlib.suppress(OSError):
                (directory / PROXY_SOCK).unlink(missing_ok=True)
