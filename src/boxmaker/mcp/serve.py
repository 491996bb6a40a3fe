"""``bxctl mcp serve``: brokerd's tools offered to an MCP client over stdio (docs/mcp.md).

The serve is a client of broker.sock exactly as loopd is (:class:`BrokerPort`): it has
no authority of its own and never opens admin.sock. Each MCP connection is a session of
its own (a fresh session id, so its own taint at brokerd). ``tools/list`` is brokerd's
catalogue (:mod:`boxmaker.mcp.tools`) and the ``permission_prompt`` tool
(:mod:`boxmaker.mcp.permission`); each ``tools/call`` is one ``tool_request``:

- ``ok`` is the tool's output; ``denied``/``failed`` an error result with the reason
  code and detail.
- An ask (a ``pending`` frame) is held open while the owner answers out of band
  (``bxctl approvals``, ``bxctl chat``); when the client gave a ``progressToken``, a
  progress notification says what waits, at once and then each :data:`PROGRESS_S`.
- A client's ``notifications/cancelled``, or its hang-up, cancels the handler: the
  broker.sock connection closes and brokerd records the call withdrawn
  (``requester_gone``), as when loopd hangs up.
- At most :data:`MAX_CALLS` calls of one connection are at brokerd at once; more wait
  here, so one client cannot take brokerd's connections and pending slots from the
  others (tests/hostile/test_mcp_client.py).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
from collections.abc import Mapping
from typing import Any, Final

import mcp_types as types
import trio
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError

from boxmaker import __version__
from boxmaker.core.vocabulary import AnswerOutcome, ErrorCode, Pending, ToolRequest
from boxmaker.formats.clock import format_utc, utc_now
from boxmaker.formats.convert import new_call_id, new_session_id
from boxmaker.loop.broker_port import BrokerPort, OnPending, PortAnswer
from boxmaker.mcp import permission
from boxmaker.mcp.stdio import stdio_wire
from boxmaker.mcp.tools import (
    CatalogueProblem,
    Offered,
    error_text,
    offered_tools,
    text_result,
    tool_result,
)
from boxmaker.runtime.ndjson import MAX_FRAME
from boxmaker.wire import encode_frame

log = logging.getLogger("boxmaker.mcp")

MAX_CALLS: Final = 16
"""Calls of one MCP connection at brokerd at once (docs/decisions.md, "bxctl mcp serve")."""
PROGRESS_S: Final = 5.0
"""Seconds between two progress notifications while a call waits for the owner."""
RUNBOOK_SERVE: Final = "docs/runbook.md#mcp-serve"
INSTRUCTIONS: Final = (
    "boxmaker's tools. brokerd decides every call with its owner's grants: a call may "
    "run at once, wait for the owner's answer, or be denied. A denied or failed call's "
    "text starts with its reason code in parentheses and says what to do."
)

Context = ServerRequestContext[Any, Any]


class McpServe:
    """One MCP connection's view of brokerd: its session and its calls."""

    def __init__(
        self,
        port: BrokerPort,
        *,
        session: str | None = None,
        max_calls: int = MAX_CALLS,
        progress_s: float = PROGRESS_S,
    ) -> None:
        self.port = port
        self.session = session or new_session_id()
        self.limiter = trio.CapacityLimiter(max_calls)
        self.progress_s = progress_s
        self.broker_names: Mapping[str, str] | None = None
        """The client's name -> brokerd's, as last offered (None: not listed yet)."""

    def server(self) -> Server[Any]:
        """The SDK's low-level server with this connection's handlers."""
        return Server(
            "boxmaker",
            version=__version__,
            instructions=INSTRUCTIONS,
            on_list_tools=self.list_tools,
            on_call_tool=self.call_tool,
        )

    async def list_tools(
        self, ctx: Context, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        offered = await self._offered()
        prompt = types.Tool(
            name=permission.PERMISSION_TOOL,
            description=permission.DESCRIPTION,
            input_schema=dict(permission.INPUT_SCHEMA),
        )
        return types.ListToolsResult(tools=[*offered.tools, prompt])

    async def _offered(self) -> Offered:
        """brokerd's catalogue as offered now; the names it maps are kept for the calls."""
        catalogue = await self.port.catalogue()
        if isinstance(catalogue, PortAnswer):
            # No tools to offer: the client shows the error, with what to do.
            raise MCPError(code=types.INTERNAL_ERROR, message=error_text(catalogue))
        try:
            offered = offered_tools(catalogue)
        except CatalogueProblem as problem:
            message = f"brokerd's catalogue cannot be offered ({problem}); see {RUNBOOK_SERVE}"
            raise MCPError(code=types.INTERNAL_ERROR, message=message) from None
        for why in offered.left_out:
            log.warning("not offered: %s; see %s", why, RUNBOOK_SERVE)
        self.broker_names = offered.broker_names
        return offered

    async def broker_name(self, name: str) -> str:
        """brokerd's name for the tool the client calls ``name``. A client may call
        without listing first (its list kept from another time): the catalogue is then
        asked once. A name the catalogue does not offer goes to brokerd as it is, and
        brokerd decides it (``unknown_tool``)."""
        # Only a name with "__" can stand for another (client_name keeps every other).
        if self.broker_names is None and "__" in name:
            with contextlib.suppress(MCPError):
                await self._offered()
        return (self.broker_names or {}).get(name, name)

    async def call_tool(
        self, ctx: Context, params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        arguments = params.arguments or {}
        if params.name == permission.PERMISSION_TOOL:
            return await self._permission_prompt(ctx, arguments)
        tool = await self.broker_name(params.name)
        return tool_result(await self.ask_broker(ctx, tool, arguments))

    async def _permission_prompt(
        self, ctx: Context, arguments: dict[str, Any]
    ) -> types.CallToolResult:
        request = permission.parse_prompt(arguments)
        if isinstance(request, str):
            return text_result(permission.deny(request))
        answer = await self.ask_broker(ctx, request.broker_tool, request.input)
        if answer.outcome is AnswerOutcome.OK:
            return text_result(permission.allow(request))
        return text_result(permission.deny(error_text(answer)))

    async def ask_broker(self, ctx: Context, tool: str, arguments: dict[str, Any]) -> PortAnswer:
        """brokerd's final answer to one call of this session (cancelled with the call)."""
        request = ToolRequest(
            call=new_call_id(), session=self.session, tool=tool, arguments=arguments
        )
        size = len(encode_frame(request)) - 1
        if size > MAX_FRAME:
            # brokerd would refuse it too, but only after reading a mebibyte of it.
            detail = (
                f"the request is {size} bytes; broker.sock takes at most {MAX_FRAME}; "
                f"see {RUNBOOK_SERVE}"
            )
            return PortAnswer(AnswerOutcome.DENIED, reason=ErrorCode.BAD_FRAME, detail=detail)
        token = ctx.meta.get("progress_token") if ctx.meta else None
        async with self.limiter, trio.open_nursery() as nursery:
            on_pending: OnPending | None = None
            if token is not None:
                on_pending = _progress_starter(nursery, ctx, token, self.progress_s)
            # Debug only: the ledger has every call, and a log line costs a tenth of one.
            log.debug("call %s: %s of session %s", request.call, tool, self.session)
            answer = await self.port.call(request, on_pending)
            nursery.cancel_scope.cancel()
        log.debug("call %s: %s %s", request.call, answer.outcome, answer.reason or "")
        return answer


def _progress_starter(
    nursery: trio.Nursery, ctx: Context, token: str | int, every: float
) -> OnPending:
    async def on_pending(frame: Pending) -> None:
        nursery.start_soon(_report_waiting, ctx, token, frame, every)

    return on_pending


async def _report_waiting(ctx: Context, token: str | int, frame: Pending, every: float) -> None:
    """Progress notifications while ``frame``'s call waits for the owner: the seconds
    waited of those it may wait, and what the owner runs to answer."""
    total = max((frame.expires_at - utc_now()) / dt.timedelta(seconds=1), 0.0)
    started = trio.current_time()
    message = (
        f"waiting for the owner: bxctl approve {frame.approval} (grant {frame.grant}); "
        f"expires at {format_utc(frame.expires_at)}"
    )
    related = None if ctx.request_id is None else str(ctx.request_id)
    while True:
        waited = trio.current_time() - started
        await ctx.session.send_progress_notification(
            token, min(waited, total), total, message, related_request_id=related
        )
        await trio.sleep(every)


async def serve_stdio(port: BrokerPort) -> None:
    """Serve one MCP connection on stdin/stdout until the client hangs up."""
    serve = McpServe(port)
    server = serve.server()
    log.info("serving MCP on stdio as session %s", serve.session)
    async with stdio_wire() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())
    log.info("session %s: the client hung up", serve.session)
