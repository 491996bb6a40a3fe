"""The runner: a decided call's RunSpec run by its tool (docs/protocol.md).

:func:`execute` runs a :class:`~boxmaker.broker.run_spec.RunSpec` (made only from a
verdict core made, or an ask the owner approved) and maps every tool failure to a
:class:`~boxmaker.broker.run_spec.RunResult` with one of the failure reasons of
docs/protocol.md; it never raises for a tool failure and lets ``trio.Cancelled``
through. Each tool is a module of broker/tools/, whose docstring says the choices made
for it (docs/decisions.md, "The runner and the sandbox", repeats them): files.py
(read_file, list_dir, write_file), shell.py, http_get.py.
"""

from __future__ import annotations

import logging
from typing import Final

from boxmaker.broker.run_spec import RunResult, RunSpec, ToolFailed, describe_error
from boxmaker.broker.sandbox_pool import SandboxPool
from boxmaker.broker.tools.files import list_dir, read_file, read_file_cached, write_file
from boxmaker.broker.tools.host import REAL_HOST, Host
from boxmaker.broker.tools.http_get import http_get
from boxmaker.broker.tools.shell import run_shell
from boxmaker.core.catalogue import (
    HttpGetArgs,
    ListDirArgs,
    ReadFileArgs,
    ShellArgs,
    ToolName,
    WriteFileArgs,
)
from boxmaker.core.reasons import Reason
from boxmaker.runtime.threads import WORKER_THREAD, ToThread

log = logging.getLogger("boxmaker.brokerd.runner")

STOPPABLE_TOOLS: Final[frozenset[ToolName]] = frozenset({"shell", "http_get"})
"""The tools whose run brokerd stops when the requester leaves (broker/connection.py):
they can run for long and can be cancelled at any point (the sandbox is killed; the
fetch is closed). The file tools run to their end in a worker thread: short and
bounded (1 MiB), and a write stopped half-way would leave the ledger unsure of it."""


async def execute(
    spec: RunSpec,
    sandboxes: SandboxPool | None = None,
    *,
    host: Host | None = None,
    to_thread: ToThread = WORKER_THREAD,
) -> RunResult:
    """Run ``spec``. Never raises for a tool failure; lets Cancelled through.

    ``sandboxes``: brokerd's pool, whose sandbox set up ahead a shell call may use;
    without it a shell call sets up its own. ``host``: what the tools ask of the
    machine (:data:`REAL_HOST` unless a test passes its own). ``to_thread``: where the
    file tools' blocking work runs (brokerd passes its own, :class:`ToThread`)."""
    value = spec.arguments.value
    host = host or REAL_HOST
    try:
        if isinstance(value, ReadFileArgs):
            cached = read_file_cached(spec, value, host.read_cached)
            if cached is not None:
                return cached
            return await to_thread(read_file, spec, value, host)
        if isinstance(value, ListDirArgs):
            return await to_thread(list_dir, spec, value, host)
        if isinstance(value, WriteFileArgs):
            return await to_thread(write_file, spec, value, host)
        if isinstance(value, ShellArgs):
            return await run_shell(spec, value.command, sandboxes)
        assert isinstance(value, HttpGetArgs), "an external tool has no RunSpec"
        return await http_get(spec, value, host)
    except ToolFailed as failed:
        return RunResult.failure(failed.reason, failed.detail, spec.label)
    except Exception as exc:
        # Cancelled is not an Exception: it passes. Anything else is the tool's failure.
        log.debug("call %s: %s failed", spec.call, spec.tool, exc_info=True)
        return RunResult.failure(Reason.TOOL_ERROR, describe_error(exc), spec.label)
