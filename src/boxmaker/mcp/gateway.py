"""brokerd's MCP gateway: the owner's MCP servers, each in its own sandbox, their pinned
tools offered as ``mcp.<server>.<tool>`` (docs/mcp.md, "MCP servers through brokerd").

- **On demand.** A server starts at the first call of one of its tools
  (gateway_server.py), and stays up for the next; it is stopped with brokerd.
- **Backoff.** A server that fails to start, or dies, is started again only after a pause
  that doubles with each failure in a row (:data:`BACKOFF_FIRST` to :data:`BACKOFF_MAX`);
  calls meanwhile fail ``mcp_server_failed`` at once, naming the last failure.
- **Pinning.** The catalogue is built from the owner's pins (pins.py) and, once a server
  has listed its tools this boot, from the comparison with them: a changed or unpinned
  tool is offered with its state, so core denies its calls (``tool_changed``,
  ``tool_not_pinned``); a removed one is not offered. At each start the listed tools and
  their hashes are recorded in the ledger (an ``mcp_tools`` record) before any call of
  that start. A call whose decided definition is not the one the server now lists is not
  sent: its result is failed ``tool_changed``.
- **Calls.** ``tools/call`` under the server's ``call_timeout_s``; a call cancelled
  (withdrawn, timed out) is cancelled at the server too (the SDK sends
  ``notifications/cancelled``). A server that dies, breaks a bound or does not answer in
  time fails the call ``mcp_server_failed``; a tool's own error result is ``tool_error``.
  Nothing a server sends reaches brokerd's log or the owner's terminal unescaped.
- **A way out.** A server whose tools a connect grant's ``via`` covers when it starts
  gets brokerd's proxy for its life (broker/server_egress.py); it is then sent one call
  at a time, each connection its sandbox opens is the call in flight's, and a result
  whose tunnels carried a byte is labelled untrusted.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import types as types_
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import attrs
import mcp_types as types
import orjson
import trio

from boxmaker.broker.cgroups import UNBOUNDED, SandboxBounds
from boxmaker.broker.run_spec import RunResult, describe_error
from boxmaker.broker.sandbox_check import RUNBOOK_EGRESS_SOCAT, find_socat
from boxmaker.broker.sandbox_plan import SANDBOX_PATH, Egress, Launch
from boxmaker.core.catalogue import MAX_BYTES
from boxmaker.core.external_tools import (
    ExternalCatalogue,
    ExternalTool,
    ToolState,
    definition_hash,
    mcp_name,
    not_pinned_detail,
)
from boxmaker.core.reasons import Reason
from boxmaker.formats.clock import format_utc, utc_now
from boxmaker.home.config import Config
from boxmaker.home.file_ops import stat_key, write_atomically
from boxmaker.home.mcp_config import McpServerConfig
from boxmaker.home.paths import Home
from boxmaker.ledger.records import Body, McpTools
from boxmaker.mcp.gateway_launch import server_launch
from boxmaker.mcp.gateway_server import (
    ServerConnection,
    ServerFailed,
    run_server,
    tool_definition,
)
from boxmaker.mcp.pins import Pin, PinsError, ToolStatus, compare, read_pins
from boxmaker.runtime.threads import WORKER_THREAD, ToThread

if TYPE_CHECKING:
    from boxmaker.broker.egress import EgressParent
    from boxmaker.broker.server_egress import ServerEgress, ServerWaysOut

log = logging.getLogger("boxmaker.brokerd.mcp")

BACKOFF_FIRST: Final = 1.0
BACKOFF_MAX: Final = 60.0
PINS_POLL_S: Final = 1.0
"""How often brokerd looks whether mcp_pins.json changed (a stat)."""

Recorder = Callable[[Body], Awaitable[bool]]


def backoff(failures: int) -> float:
    """Seconds before a server that failed ``failures`` times in a row starts again.

    >>> [backoff(n) for n in (1, 2, 3, 7, 8, 20)]
    [1.0, 2.0, 4.0, 60.0, 60.0, 60.0]
    """
    return float(min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** min(failures - 1, 16)))


STATES: Final[Mapping[ToolStatus, ToolState]] = {
    ToolStatus.ACCEPTED: ToolState.ACCEPTED,
    ToolStatus.NOT_PINNED: ToolState.NOT_PINNED,
    ToolStatus.CHANGED: ToolState.CHANGED,
}
"""A tool's comparison with its pin, as core decides on it (a removed tool is not offered)."""


def external_tool(
    name: str, config: McpServerConfig, definition: Mapping[str, Any], state: ToolState
) -> ExternalTool:
    """A server's tool as core decides on it: its definition (the pin's when accepted,
    else the one listed), the server's label."""
    annotations = definition.get("annotations")
    hint = isinstance(annotations, dict) and annotations.get("readOnlyHint") is True
    schema = definition.get("inputSchema")
    return ExternalTool(
        name=name,
        description=str(definition.get("description") or ""),
        input_schema=schema if isinstance(schema, dict) else {},
        label=config.result_label,
        definition=definition_hash(definition),
        read_only=hint,
        state=state,
    )


@attrs.define
class _Seen:
    """Passes a server's start on, keeping the connection it reported."""

    task_status: trio.TaskStatus[ServerConnection]
    connection: ServerConnection | None = None

    def started(self, value: ServerConnection) -> None:
        self.connection = value
        self.task_status.started(value)


@attrs.define(eq=False)
class _Server:
    name: str
    config: McpServerConfig
    connection: ServerConnection | None = None
    live: dict[str, dict[str, Any]] | None = None
    """The definitions its last ``tools/list`` of this boot gave (offerable names only)."""
    failures: int = 0
    retry_at: float = -math.inf
    last_failure: str | None = None
    starting: trio.Lock = attrs.Factory(trio.Lock)

    def state(self, now: float) -> str:
        if self.connection is not None and self.connection.running:
            return "running"
        if self.failures and now < self.retry_at:
            return "waiting to restart"
        return "failed" if self.last_failure else "stopped"


@attrs.define(eq=False)
class Gateway:
    """The MCP gateway of one brokerd boot. ``record`` appends a ledger record (False
    when the ledger is stopped)."""

    home: Home
    config: Config
    workspace: Path
    """The workspace's real path (brokerd's, resolved at start)."""
    home_problem: Callable[[Path], str | None]
    record: Recorder
    boot: str
    bounds: SandboxBounds = UNBOUNDED
    environ: Mapping[str, str] = attrs.Factory(lambda: dict(os.environ))
    to_thread: ToThread = WORKER_THREAD
    ways_out: ServerWaysOut | None = None
    """brokerd's servers' ways out (broker/server_egress.py); None: no server has one
    (``bxctl mcp pin``'s own start)."""
    _servers: dict[str, _Server] = attrs.field(init=False)
    _pins: dict[str, dict[str, Pin]] = attrs.Factory(dict)
    _pins_key: object = None
    _catalogue: ExternalCatalogue = attrs.Factory(dict)
    _nursery: trio.Nursery | None = None
    _status_lock: trio.Lock = attrs.Factory(trio.Lock)

    def __attrs_post_init__(self) -> None:
        self._servers = {
            name: _Server(name, server) for name, server in self.config.mcp_servers.items()
        }

    # -- the catalogue ----------------------------------------------------------------

    def catalogue(self) -> ExternalCatalogue:
        """Every tool offered now, by name (non-blocking: replaced whole when the pins
        or a server's tool list change)."""
        return self._catalogue

    def _rebuild(self) -> None:
        catalogue: dict[str, ExternalTool] = {}
        for server in self._servers.values():
            pinned = self._pins.get(server.name, {})
            for tool, status in compare(pinned, server.live).items():
                name = mcp_name(server.name, tool)
                state = STATES.get(status)
                if name is None or state is None:
                    continue
                if status is ToolStatus.ACCEPTED:
                    definition = pinned[tool].definition
                else:
                    definition = (server.live or {})[tool]
                catalogue[name] = external_tool(name, server.config, definition, state)
        self._catalogue = types_.MappingProxyType(catalogue)

    async def reload_pins(self) -> None:
        """Read mcp_pins.json again when it changed. A file that cannot be used keeps
        nothing pinned (every call is denied until it is fixed), and is logged."""
        path = self.home.mcp_pins
        key = await self.to_thread(stat_key, path)
        if key == self._pins_key and self._pins_key is not None:
            return
        self._pins_key = key
        try:
            self._pins = await self.to_thread(read_pins, path)
        except PinsError as exc:
            log.warning("MCP pins: %s", exc)
            self._pins = {}
        self._rebuild()

    # -- the life of the servers ------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled (brokerd stops), then stop every server (their
        sandboxes are killed whole, shielded)."""
        await self.reload_pins()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                while True:
                    await trio.sleep(PINS_POLL_S)
                    await self.reload_pins()
        finally:
            self._nursery = None
            # Every server has stopped: bxctl mcp list must not show one as running.
            with trio.CancelScope(shield=True):
                await self._write_status()

    async def _serve(
        self,
        server: _Server,
        launch: Launch,
        network: bool,
        *,
        task_status: trio.TaskStatus[ServerConnection] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        seen = _Seen(task_status)
        try:
            if network and self.ways_out is not None:
                await self._serve_with_way_out(server, launch, self.ways_out, seen)
            else:
                await self._run(server, launch, None, seen)
        except ServerFailed:
            raise  # before it started: nursery.start hands it to start_server
        except Exception as exc:
            # After the start: a server's trouble must never end brokerd.
            log.exception("MCP server %s: its connection failed", server.name)
            if seen.connection is not None:
                seen.connection.fail(f"its connection failed: {describe_error(exc)}")
        if seen.connection is not None and seen.connection.failure is not None:
            self._failed(server, seen.connection.failure)
        await self._write_status()

    async def _run(
        self, server: _Server, launch: Launch, way_out: ServerEgress | None, seen: _Seen
    ) -> None:
        await run_server(
            server.name,
            launch,
            log_path=self.home.mcp_log(server.name),
            bounds=self.bounds,
            startup_timeout=server.config.startup_timeout_s,
            way_out=way_out,
            task_status=seen,  # type: ignore[arg-type]  # a TaskStatus by its shape
        )

    async def _serve_with_way_out(
        self, server: _Server, launch: Launch, ways_out: ServerWaysOut, seen: _Seen
    ) -> None:
        """The server with its way out, open for its life; raises :class:`ServerFailed`
        when that cannot be (it never runs without the way out its grants give it)."""
        peer = launch.user.uid if launch.user is not None else os.geteuid()
        async with contextlib.AsyncExitStack() as stack:
            try:
                way_out = await stack.enter_async_context(ways_out.open(server.name, peer=peer))
            except OSError as exc:
                why = f"its way out could not be opened: {describe_error(exc)}"
                raise ServerFailed(why) from None
            launched = await self.to_thread(lambda: self._launch(server, way_out.directory))
            if isinstance(launched, str):
                raise ServerFailed(launched)
            await self._run(server, launched, way_out, seen)

    def _launch(self, server: _Server, egress_dir: Path | None = None) -> Launch | str:
        """The server's launch, with its way out at ``egress_dir`` when it has one, or
        why it cannot start. Blocking."""
        egress = None
        if egress_dir is not None:
            socat = find_socat()
            if socat is None:
                return (
                    f"[mcp_servers.{server.name}] a connect grant gives this server a way "
                    "out, and its sandbox reaches brokerd's proxy through socat, which is "
                    f"not installed where the sandbox finds programs ({SANDBOX_PATH}); it "
                    f"never runs without its proxy; see {RUNBOOK_EGRESS_SOCAT}"
                )
            egress = Egress(egress_dir, socat)
        return server_launch(
            server.name,
            server.config,
            workspace=self.workspace,
            runner=self.config.runner,
            home_problem=self.home_problem,
            bounded=self.bounds.bounded and self.bounds.refusal is None,
            environ=self.environ,
            egress=egress,
        )

    async def _needs_way_out(self, server: _Server) -> bool:
        """Whether the grants now give ``server`` a way out: a connect grant's ``via``
        covers one of its tools (those pinned and those it listed this boot)."""
        if self.ways_out is None:
            return False
        names = {*self._pins.get(server.name, {}), *(server.live or {})}
        tools = [name for tool in names if (name := mcp_name(server.name, tool)) is not None]
        return await self.ways_out.needed(tools)

    def _failed(self, server: _Server, why: str) -> None:
        server.failures += 1
        server.last_failure = why
        server.retry_at = trio.current_time() + backoff(server.failures)

    async def start(self, name: str) -> ServerConnection | str:
        """Server ``name``'s running connection, started now if need be (``bxctl mcp
        pin`` lists its tools so), or why there is none."""
        server = self._servers.get(name)
        if server is None:
            return f"no MCP server {name!r} in config.toml"
        return await self.start_server(server)

    async def start_server(self, server: _Server) -> ServerConnection | str:
        """The server's running connection, started now if need be, or why there is
        none (the detail of ``mcp_server_failed``)."""
        async with server.starting:
            connection = server.connection
            if connection is not None and connection.running:
                return connection
            wait = server.retry_at - trio.current_time()
            if wait > 0:
                return f"{server.last_failure}; brokerd starts it again in {math.ceil(wait)} s"
            if self._nursery is None:
                return "brokerd is stopping"
            launch = await self.to_thread(lambda: self._launch(server))
            if isinstance(launch, str):
                self._failed(server, launch)
                await self._write_status()
                return launch
            network = await self._needs_way_out(server)
            try:
                new: ServerConnection = await self._nursery.start(
                    self._serve, server, launch, network
                )
            except ServerFailed as failed:
                self._failed(server, str(failed))
                await self._write_status()
                return str(failed)
            except Exception as exc:
                log.exception("MCP server %s: it could not start", server.name)
                self._failed(server, describe_error(exc))
                return describe_error(exc)
            server.connection = new
            await self._listed(server, new)
            return new if new.running else (new.failure or "it stopped")

    async def _listed(self, server: _Server, connection: ServerConnection) -> None:
        live: dict[str, dict[str, Any]] = {}
        for tool in connection.tools:
            if mcp_name(server.name, tool.name) is not None:
                live[tool.name] = tool_definition(tool)
            else:
                log.warning("MCP server %s: tool %r is never offered", server.name, tool.name)
        server.live = live
        hashes = {name: definition_hash(definition) for name, definition in live.items()}
        if not await self.record(McpTools(boot=self.boot, server=server.name, tools=hashes)):
            connection.fail("the ledger cannot record its tools")
        self._rebuild()
        await self._write_status()

    # -- calls ------------------------------------------------------------------------

    async def call(
        self,
        tool: ExternalTool,
        arguments: Mapping[str, Any],
        *,
        caller: EgressParent | None = None,
    ) -> RunResult:
        """Run ``tool`` (an accepted ``mcp.*`` tool, as decided) with ``arguments`` at its
        server, for the call ``caller`` (whose the server's connections are meanwhile,
        when it has a way out; None: no call's, every one refused). Never raises for the
        server's failure; lets Cancelled through (the server is then told the call is
        cancelled)."""
        label = tool.label
        server = self._servers.get(tool.server or "")
        if server is None:
            detail = f"{tool.name}: no such MCP server in config.toml"
            return RunResult.failure(Reason.MCP_SERVER_FAILED, detail, label)
        started = await self.start_server(server)
        if isinstance(started, str):
            return RunResult.failure(Reason.MCP_SERVER_FAILED, started, label)
        own_name = tool.name.split(".", 2)[2]
        live = (server.live or {}).get(own_name)
        if live is None:
            detail = f"{tool.name}: the server no longer lists it (removed)"
            return RunResult.failure(Reason.MCP_SERVER_FAILED, detail, label)
        if definition_hash(live) != tool.definition:
            detail = not_pinned_detail(tool.name, ToolState.CHANGED)
            return RunResult.failure(Reason.TOOL_CHANGED, detail, label)
        way_out = started.way_out
        if way_out is None:
            return await self._send(server, started, tool, own_name, arguments)
        # One call at a time: a connection is the call in flight's, and there is one.
        async with started.one_call:
            if caller is None:
                return await self._send(server, started, tool, own_name, arguments)
            async with way_out.serving(caller) as egress:
                result = await self._send(server, started, tool, own_name, arguments)
        return attrs.evolve(result, label=egress.output_label(result.label))

    async def _send(
        self,
        server: _Server,
        connection: ServerConnection,
        tool: ExternalTool,
        own_name: str,
        arguments: Mapping[str, Any],
    ) -> RunResult:
        label = tool.label
        session = connection.session
        assert session is not None
        timeout = server.config.call_timeout_s
        result: types.CallToolResult | None = None
        problem = ""
        with trio.move_on_after(timeout) as scope:
            try:
                result = await session.call_tool(own_name, dict(arguments))
            except Exception as exc:
                problem = describe_error(exc)
        if scope.cancelled_caught:
            detail = f"{tool.name}: no answer within {timeout:g} s (call_timeout_s)"
            return RunResult.failure(Reason.MCP_SERVER_FAILED, detail, label)
        if result is None:
            why = connection.failure or problem
            return RunResult.failure(Reason.MCP_SERVER_FAILED, f"{tool.name}: {why}", label)
        server.failures = 0
        text = result_text(result)
        if result.is_error:
            return RunResult.failure(Reason.TOOL_ERROR, text[:2048] or "(no text)", label)
        return RunResult.success(text, label)

    # -- what bxctl mcp list shows ----------------------------------------------------

    def status(self) -> dict[str, Any]:
        now = trio.current_time()
        servers: dict[str, Any] = {}
        for server in self._servers.values():
            tools = None
            if server.live is not None:
                tools = {
                    name: {"definition": definition, "sha256": definition_hash(definition)}
                    for name, definition in server.live.items()
                }
            servers[server.name] = {
                "state": server.state(now),
                "failure": server.last_failure,
                "failures": server.failures,
                "tools": tools,
            }
        return {"boot": self.boot, "at": format_utc(utc_now()), "servers": servers}

    async def _write_status(self) -> None:
        data = orjson.dumps(self.status(), option=orjson.OPT_SORT_KEYS) + b"\n"
        async with self._status_lock:
            try:
                await self.to_thread(write_atomically, self.home.mcp_status, data)
            except OSError as exc:
                log.warning("MCP servers' status: %s: %s", self.home.mcp_status, exc.strerror)


def result_text(result: types.CallToolResult) -> str:
    """What the model is given of a tool's result: its text parts; other parts named;
    the structured content as JSON when there is no text; cut at 1 MiB with a marker."""
    parts: list[str] = []
    for item in result.content:
        if isinstance(item, types.TextContent):
            parts.append(item.text)
        else:
            parts.append(f"[{item.type} content left out]")
    if not parts and result.structured_content is not None:
        parts.append(orjson.dumps(result.structured_content).decode())
    text = "\n".join(parts)
    encoded = text.encode()
    if len(encoded) > MAX_BYTES:
        text = encoded[:MAX_BYTES].decode(errors="ignore") + f"\n[output cut at {MAX_BYTES} bytes]"
    return text
