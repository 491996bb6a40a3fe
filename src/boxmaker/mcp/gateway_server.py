"""One MCP server running in its sandbox, spoken to with the SDK's ``ClientSession``
(docs/mcp.md, "MCP servers through brokerd").

The SDK's stdio client spawns its server itself; brokerd's server is bwrap, started by
:meth:`~boxmaker.broker.sandbox.Sandbox.start` from trio's own thread (bwrap's
``--die-with-parent`` fires when the *thread* that started it ends). So the pipes are
bridged here to the SDK's memory streams, the way ``mcp/client/stdio.py`` does, with the
bounds a server must not get past:

- a message longer than :data:`MAX_MESSAGE` (the frame reader's cap: nothing longer is
  ever buffered), or more than :data:`MAX_UNASKED` messages in a row that answer no
  request (a flood of notifications or requests), ends the connection;
- its stderr goes to its log file (``bxctl mcp logs``), at most :data:`LOG_CAP` bytes a
  start, never to the model; the rest is read and counted, so the server never blocks;
- ``initialize`` and ``tools/list`` must be done within the server's
  ``startup_timeout_s``; each call has its ``call_timeout_s`` (gateway.py).

Whatever ends the connection (the server exits, breaks a bound, or brokerd stops it), the
sandbox is killed whole (its cgroup, its process group) and every request still waiting
is answered "connection closed" by the SDK, which the gateway turns into a failed result
with :attr:`ServerConnection.failure` as the detail.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import anyio
import attrs
import mcp_types as types
import trio
from mcp.client.session import ClientSession
from mcp.shared.message import SessionMessage

from boxmaker import __version__
from boxmaker.broker.cgroup_plan import RUNBOOK
from boxmaker.broker.cgroups import SandboxBounds
from boxmaker.broker.run_spec import describe_error
from boxmaker.broker.sandbox import Sandbox
from boxmaker.broker.sandbox_plan import Launch, SandboxRefused
from boxmaker.runtime.ndjson import FrameError, FrameReader

if TYPE_CHECKING:
    from boxmaker.broker.server_egress import ServerEgress

log = logging.getLogger("boxmaker.brokerd.mcp")

MAX_MESSAGE: Final = 4 * 1024 * 1024
"""The longest line a server may send: a result of 1 MiB of text, JSON-escaped, fits."""
MAX_UNASKED: Final = 1000
"""Messages in a row that answer no request (notifications, the server's own requests)
before the server counts as flooding brokerd."""
MAX_TOOLS: Final = 1000
"""Tools one server may list (pages included)."""
LOG_CAP: Final = 1024 * 1024
"""Bytes of a server's stderr logged per start."""
LOG_ROTATE: Final = 4 * LOG_CAP
"""A log that has grown past this is moved to ``.1`` (replacing the one there) at a start,
so a server restarted again and again keeps at most about twice this on disk."""
EXIT_GRACE: Final = 1.0
"""Seconds the end of a server's output waits for its exit status, to name it."""
CLIENT_INFO: Final = types.Implementation(name="boxmaker", version=__version__)


class ServerFailed(Exception):
    """The server could not be started or did not finish starting; the message says why
    (the detail of ``mcp_server_failed``)."""


@attrs.define(eq=False)
class ServerConnection:
    """A started server: its session, the tools it listed, and, once it has ended, why."""

    name: str
    sandbox: Sandbox
    way_out: ServerEgress | None = None
    """Its way out through brokerd, open for its life (broker/server_egress.py); None:
    no network at all."""
    one_call: trio.Lock = attrs.Factory(trio.Lock)
    """Held by the call in flight when the server has a way out (gateway.py)."""
    session: ClientSession | None = None
    tools: tuple[types.Tool, ...] = ()
    failure: str | None = None
    """Why the connection ended (None while it runs, or when brokerd stopped it)."""
    exit_status: int | None = None
    outstanding: int = 0
    """Requests sent and not yet answered: a response beyond them answers nothing."""
    ended: trio.Event = attrs.Factory(trio.Event)
    _exited: trio.Event = attrs.Factory(trio.Event)

    def fail(self, why: str) -> None:
        """End the connection; the first reason given is kept."""
        if self.failure is None and not self.ended.is_set():
            self.failure = why
            log.warning("MCP server %s: %s", self.name, why)
        self.ended.set()

    def stop(self) -> None:
        """End the connection without a failure (brokerd stops)."""
        self.ended.set()

    @property
    def running(self) -> bool:
        return not self.ended.is_set()


async def run_server(
    name: str,
    launch: Launch,
    *,
    log_path: Path,
    bounds: SandboxBounds,
    startup_timeout: float,
    way_out: ServerEgress | None = None,
    task_status: trio.TaskStatus[ServerConnection] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Start server ``name`` and serve it until it ends or is stopped. Reports the
    :class:`ServerConnection` once ``tools/list`` has answered; raises
    :class:`ServerFailed` before that. ``way_out``: the one its ``launch`` binds, if
    any. Call in a nursery of trio's own thread."""
    try:
        sandbox = Sandbox.start(launch, bounds=bounds)
    except SandboxRefused as refused:
        raise ServerFailed(str(refused)) from None
    except OSError as exc:
        problem = describe_error(exc)
        raise ServerFailed(f"bubblewrap (bwrap) could not be started: {problem}") from None
    connection = ServerConnection(name, sandbox, way_out)
    started = False
    try:
        async with trio.open_nursery() as pumps:
            read_writer, read_stream = anyio.create_memory_object_stream[
                SessionMessage | Exception
            ](0)
            write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
            pumps.start_soon(_log_stderr, sandbox.stderr, log_path)
            pumps.start_soon(_watch_exit, connection)
            pumps.start_soon(_read_stdout, connection, read_writer)
            pumps.start_soon(_write_stdin, connection, write_reader)
            async with ClientSession(read_stream, write_stream, client_info=CLIENT_INFO) as session:
                connection.session = session
                await _start_session(connection, session, startup_timeout)
                if connection.failure is None:
                    task_status.started(connection)
                    started = True
                    await connection.ended.wait()
            pumps.cancel_scope.cancel()
    finally:
        connection.ended.set()
        await sandbox.close()
    if not started:
        raise ServerFailed(connection.failure or "it ended before listing its tools")


async def _start_session(
    connection: ServerConnection, session: ClientSession, startup_timeout: float
) -> None:
    with trio.move_on_after(startup_timeout) as scope:
        try:
            await session.initialize()
            connection.tools = await _list_tools(session)
        except Exception as exc:
            connection.fail(connection.failure or f"it failed to start: {describe_error(exc)}")
    if scope.cancelled_caught:
        connection.fail(
            f"it did not answer initialize and tools/list within {startup_timeout:g} s "
            "(startup_timeout_s)"
        )


async def _list_tools(session: ClientSession) -> tuple[types.Tool, ...]:
    tools: list[types.Tool] = []
    cursor: str | None = None
    while True:
        params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        tools += page.tools
        if len(tools) > MAX_TOOLS:
            raise ValueError(f"it lists more than {MAX_TOOLS} tools")
        cursor = page.next_cursor
        if not cursor:
            return tuple(tools)


def describe_exit(status: int, oom_kills: int = 0, memory: int = 0) -> str:
    """How a server's bwrap ended, in words: bwrap exits 128 + N when the server was
    killed by signal N; a kill its cgroup's OOM killer made names the limit.

    >>> describe_exit(3), describe_exit(137), describe_exit(-9)
    ('it exited (status 3)', 'it was killed (signal 9)', 'it was killed (signal 9)')
    >>> describe_exit(137, oom_kills=1, memory=256 << 20)  # doctest: +ELLIPSIS
    'it was killed: it exceeded [runner] memory_limit_mib (256 MiB); see docs/runbook...'
    """
    if oom_kills:
        return (
            f"it was killed: it exceeded [runner] memory_limit_mib ({memory >> 20} MiB); "
            f"see {RUNBOOK}"
        )
    if status < 0 or status > 128:
        return f"it was killed (signal {-status if status < 0 else status - 128})"
    return f"it exited (status {status})"


async def _watch_exit(connection: ServerConnection) -> None:
    sandbox = connection.sandbox
    connection.exit_status = await sandbox.wait()
    connection._exited.set()
    oom_kills = 0 if sandbox.cgroup is None else sandbox.cgroup.usage().oom_kills
    memory = sandbox.launch.limits.memory
    connection.fail(describe_exit(connection.exit_status, oom_kills, memory))


async def _read_stdout(
    connection: ServerConnection, deliver: anyio.abc.ObjectSendStream[SessionMessage | Exception]
) -> None:
    reader = FrameReader(connection.sandbox.stdout, max_frame=MAX_MESSAGE)
    unasked = 0
    async with deliver:
        while True:
            try:
                line = await reader.receive_line()
            except FrameError:
                connection.fail(f"it sent a message longer than {MAX_MESSAGE} bytes")
                return
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                line = None
            if line is None:
                with trio.move_on_after(EXIT_GRACE):
                    await connection._exited.wait()
                connection.fail("it closed its output")
                return
            if not line.strip():
                continue
            item = _parse(line)
            answer = isinstance(item, SessionMessage) and isinstance(
                item.message, types.JSONRPCResponse | types.JSONRPCError
            )
            if answer and connection.outstanding > 0:
                connection.outstanding -= 1
                unasked = 0
            else:
                unasked += 1
                if unasked > MAX_UNASKED:
                    connection.fail(
                        f"it sent more than {MAX_UNASKED} messages in a row that answer "
                        "no request (a flood)"
                    )
                    return
            try:
                await deliver.send(item)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                return


def _parse(line: bytes) -> SessionMessage | Exception:
    try:
        message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValueError as exc:
        return exc
    return SessionMessage(message)


async def _write_stdin(
    connection: ServerConnection, outgoing: anyio.abc.ObjectReceiveStream[SessionMessage]
) -> None:
    stdin = connection.sandbox.stdin
    async with outgoing:
        async for item in outgoing:
            if isinstance(item.message, types.JSONRPCRequest):
                connection.outstanding += 1
            text = item.message.model_dump_json(by_alias=True, exclude_unset=True)
            try:
                await stdin.send_all(text.encode() + b"\n")
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                connection.fail("it stopped reading its input")
                return


async def _log_stderr(stream: trio.abc.ReceiveStream, path: Path) -> None:
    """Append the server's stderr to ``path`` (0600, never through a link), at most
    :data:`LOG_CAP` bytes; read the rest and say how much was left out."""
    fd = await trio.to_thread.run_sync(_open_log, path)
    written = dropped = 0
    try:
        async for chunk in stream:
            room = LOG_CAP - written
            if room > 0:
                part = chunk[:room]
                await trio.to_thread.run_sync(os.write, fd, part)
                written += len(part)
            dropped += max(0, len(chunk) - max(room, 0))
    finally:
        with trio.CancelScope(shield=True):
            if dropped:
                note = f"\n[boxmaker: {dropped} more bytes of stderr not logged]\n"
                await trio.to_thread.run_sync(os.write, fd, note.encode())
            os.close(fd)


def _open_log(path: Path) -> int:
    with contextlib.suppress(FileNotFoundError):
        if path.lstat().st_size > LOG_ROTATE:
            path.replace(path.with_name(path.name + ".1"))
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, 0o600)
    os.write(fd, b"[boxmaker: the server starts]\n")
    return fd


def tool_definition(tool: types.Tool) -> dict[str, Any]:
    """The parts of a tool's definition that are pinned, as the server sent them (a key
    it left out stays out)."""
    sent: dict[str, Any] = tool.model_dump(by_alias=True, exclude_unset=True, mode="json")
    keys = ("name", "title", "description", "inputSchema", "outputSchema", "annotations")
    return {key: sent[key] for key in keys if key in sent}
