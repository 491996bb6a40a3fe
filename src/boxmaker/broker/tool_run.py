"""A decided call's run on broker.sock (docs/decisions.md, "brokerd"): what
:class:`~boxmaker.broker.connection`'s ports do when the machine says *run*.

- a built-in tool runs through brokerd's runner (the sandbox for ``shell``); a tool that
  can run for long runs beside a hang-up watcher, cancelled when its requester leaves;
- a shell call that the grants give a way out (:func:`~boxmaker.core.network.network_grants`)
  runs with its own egress proxy around it (docs/egress.md), opened around the run,
  not inside it, and its output labelled by what came in through its tunnels;
- an external tool: ``claude.*`` runs nothing (the client runs its own tool once
  allowed: the answer is ``ok`` ``"allowed"``), ``mcp.*`` is the gateway's call.

An internal call (a tunnel's ``connect``) runs its connection's own run instead; the
connection's ports pick that before coming here.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable
from typing import Final

import attrs

from boxmaker.broker import egress as egress_proxy
from boxmaker.broker.requester import Requester
from boxmaker.broker.run_spec import RunResult, RunSpec
from boxmaker.broker.runner import STOPPABLE_TOOLS
from boxmaker.broker.sandbox_plan import Launch
from boxmaker.broker.sandbox_pool import keeps_a_way_out
from boxmaker.broker.state import Broker
from boxmaker.core.call import Call
from boxmaker.core.call_events import Ran, RequesterGone, RunOutcome
from boxmaker.core.catalogue import ExternalArgs, ShellArgs
from boxmaker.core.decide import Ask, Run
from boxmaker.core.external_tools import CLAUDE_PREFIX
from boxmaker.core.grants import GrantSet
from boxmaker.core.network import network_grants
from boxmaker.core.reasons import Reason
from boxmaker.formats.clock import utc_now

log = logging.getLogger("boxmaker.brokerd")

CLIENT_TOOL_ALLOWED: Final = "allowed"
"""A ``claude.*`` call's answer content once it may run: the client runs its tool."""


async def run_tool(
    broker: Broker, requester: Requester, call: Call, verdict: Run | Ask, *, approved: bool
) -> Ran | RequesterGone:
    """Run the call ``verdict`` allowed; :class:`RequesterGone` when its requester left
    while it ran (the run was stopped)."""
    if verdict.checked.external is not None:
        return await _run_external(broker, requester, call, verdict)
    spec = RunSpec.for_verdict(
        verdict,
        workspace=broker.workspace,
        runner=broker.config.runner,
        labels=broker.config.labels,
        approved=approved,
    )
    way_out = await _way_out(broker, call, spec)
    if way_out is None:
        return await _run_spec(broker, requester, spec)
    # The way out is opened around the run, not inside it: a run stopped because its
    # requester left must not take the tunnels' records with it (they end call_ended,
    # and are recorded, when the egress closes).
    parent, peer, launch = way_out
    # The sandbox with a way out set up ahead, when one fits: the call's socket is put
    # in its directory, so the command starts at once (sandbox_pool.py).
    ahead = broker.sandboxes.network_directory(launch, spec.workspace)
    async with (
        ahead as directory,
        egress_proxy.open_call_egress(broker, parent, peer=peer, directory=directory) as egress,
    ):
        ran = await _run_spec(broker, requester, attrs.evolve(spec, egress_dir=egress.directory))
    if isinstance(ran, Ran):
        # The model reads what came in through a tunnel in this result: this result is
        # what makes the session untrusted.
        outcome = ran.outcome
        return Ran(attrs.evolve(outcome, label=egress.output_label(outcome.label)))
    return ran


async def _run_spec(broker: Broker, requester: Requester, spec: RunSpec) -> Ran | RequesterGone:
    def run() -> Awaitable[RunResult]:
        return broker.execute(spec, broker.sandboxes, to_thread=broker.to_thread)

    if spec.tool in STOPPABLE_TOOLS:
        finished = await requester.while_here(run)
        if finished is None:
            log.info("call %s: its requester left while it ran; the run was stopped", spec.call)
            return RequesterGone()
        result = finished
    else:
        result = await run()
    return Ran(RunOutcome(result.ok, result.reason, result.detail, result.content, result.label))


async def _way_out(
    broker: Broker, call: Call, spec: RunSpec
) -> tuple[egress_proxy.EgressParent, int, Launch] | None:
    """A shell call's way out, when the grants current now give it one
    (:func:`~boxmaker.core.network.network_grants`): who it is for, the uid that may use
    it (the sandbox's), and the call's plain launch. None: today's sandbox, no network
    at all. Either way the pool hears whether the grants keep a sandbox with a way out
    set up ahead."""
    launch = spec.sandbox
    value = spec.arguments.value
    if not isinstance(launch, Launch) or not isinstance(value, ShellArgs):
        return None  # not a shell call, or one whose sandbox cannot start anyway
    grants = await broker.grants.current()
    if not isinstance(grants, GrantSet):
        broker.sandboxes.keep_network(False)
        return None
    now = utc_now()
    broker.sandboxes.keep_network(keeps_a_way_out(grants, now))
    if not network_grants(grants, spec.tool, value.command, now):
        return None
    parent = egress_proxy.EgressParent(call.call, call.session, spec.tool, value.command)
    return parent, launch.user.uid if launch.user is not None else os.geteuid(), launch


async def _run_external(
    broker: Broker, requester: Requester, call: Call, verdict: Run | Ask
) -> Ran | RequesterGone:
    """An external tool's run: ``claude.*`` runs nothing (the client runs its own tool
    once allowed); ``mcp.*`` is the gateway's call, stopped (cancelled) when the
    requester leaves, as a shell run is."""
    checked = verdict.checked
    tool = checked.external
    assert tool is not None
    assert isinstance(checked.value, ExternalArgs)
    if tool.name.startswith(CLAUDE_PREFIX):
        return Ran(RunOutcome(True, None, None, CLIENT_TOOL_ALLOWED, tool.label))
    arguments = checked.value.arguments
    gateway = broker.gateway
    # Its server's connections meanwhile are this call's (broker/server_egress.py).
    caller = egress_proxy.EgressParent(call.call, call.session, tool.name, None)

    async def run() -> RunResult:
        try:
            return await gateway.call(tool, arguments, caller=caller)
        except Exception as exc:
            # Cancelled is not an Exception: a withdrawn call's cancel passes.
            log.warning("call %s: %s failed in the gateway", verdict.decision.call, tool.name)
            detail = f"{tool.name}: {type(exc).__name__}: {exc}"[:500]
            return RunResult.failure(Reason.MCP_SERVER_FAILED, detail, tool.label)

    finished = await requester.while_here(run)
    if finished is None:
        call_id = verdict.decision.call
        log.info("call %s: its requester left while %s ran; cancelled", call_id, tool.name)
        return RequesterGone()
    ran = finished
    return Ran(RunOutcome(ran.ok, ran.reason, ran.detail, ran.content, ran.label))
