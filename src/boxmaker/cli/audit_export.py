"""``bxctl audit export --otlp URL``: the ledger to an OpenTelemetry receiver, such as a
team's Collector (docs/operations.md). It needs the optional extra ``boxmaker[otel]``
(imported only when the command runs, so bxctl works without it)."""

from __future__ import annotations

import signal
import sys
import urllib.parse
from pathlib import Path
from typing import Annotated, Final

import trio
from cyclopts import Parameter

from boxmaker.cli.common import DEFAULT, Common, Exit, fail
from boxmaker.cli.terminal import until_interrupted
from boxmaker.formats.printable import printable

RUNBOOK_EXPORT: Final = "docs/runbook.md#otlp-export"
INSTALL_EXTRA: Final = "pip install 'boxmaker[otel]'"
SDK_MODULES: Final = frozenset({"opentelemetry", "google"})
"""The extra's top-level packages (``opentelemetry-proto`` and protobuf)."""
CURSOR_NAME: Final = "otlp-cursor.json"


def _say(message: str) -> None:
    sys.stderr.write(f"bxctl: {printable(message, lines=True)}\n")
    sys.stderr.flush()


def _url_problem(url: str) -> str | None:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"--otlp takes the receiver's http:// or https:// base URL, not {url!r}"
    if parts.query or parts.fragment:
        return f"--otlp takes a base URL without a query or fragment, not {url!r}"
    return None


async def export(
    *,
    otlp: str,
    capture_content: Annotated[bool, Parameter(negative="")] = False,
    follow: Annotated[bool, Parameter(name=["--follow", "-f"], negative="")] = False,
    cursor: Path | None = None,
    common: Common = DEFAULT,
) -> Exit:
    """Send the ledger to an OpenTelemetry receiver over OTLP/HTTP (docs/operations.md).

    One log record per ledger record and one execute_tool span per call; from where the
    last export to that receiver stopped (the cursor) to the ledger's end. A receiver
    that does not answer is tried again, with backoff, until it does.

    Parameters
    ----------
    otlp
        The receiver's base URL, e.g. http://collector:4318 (sent to /v1/logs and
        /v1/traces).
    capture_content
        Also send each call's arguments (gen_ai.tool.call.arguments). The ledger holds
        no result content (only its SHA-256 and size), so none is sent.
    follow
        Keep sending as the ledger grows, until Ctrl-C or SIGTERM (exit 0; without
        --follow, Ctrl-C stops the export with exit 130). Either way the cursor says
        what the receiver took, and the next run goes on from it.
    cursor
        The cursor file. Default: otlp-cursor.json in the home's state directory.
    """
    if (problem := _url_problem(otlp)) is not None:
        return fail(problem, Exit.USAGE)
    try:
        # The optional extra: imported here, when the command runs; its package first,
        # so its absence is found whatever boxmaker modules were imported before.
        import opentelemetry.proto  # noqa: F401

        from boxmaker.ledger.otlp_export import ExportProblem, Sent, export_ledger, read_cursor
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in SDK_MODULES:
            raise
        return fail(
            f"`bxctl audit export` needs the OpenTelemetry SDK, which is not installed: "
            f"{INSTALL_EXTRA} (see {RUNBOOK_EXPORT})"
        )
    home = common.resolve()
    cursor_path = cursor if cursor is not None else home.state_dir / CURSOR_NAME

    async def run() -> Sent | ExportProblem:
        try:
            return await export_ledger(
                home.audit_log,
                otlp,
                cursor_path,
                capture_content=capture_content,
                follow=follow,
                say=_say,
            )
        except ExportProblem as exc:  # a value: raised here it would come out grouped
            return exc

    # Ctrl-C or a service manager's stop cancels the export, which then waits for the
    # answer to a request in flight and writes the cursor (docs/operations.md).
    sent = await until_interrupted(run, (signal.SIGINT, signal.SIGTERM))
    if isinstance(sent, ExportProblem):
        return fail(str(sent))
    if sent is None:
        try:
            stopped = await trio.to_thread.run_sync(read_cursor, cursor_path)
        except ExportProblem as exc:
            return fail(str(exc))
        through = stopped.seq if stopped is not None else -1
        print(
            f"stopped; the receiver has the ledger through seq {through} (the cursor "
            f"{cursor_path}); the next run goes on from there"
        )
        return Exit.DONE if follow else Exit.INTERRUPTED
    print(
        f"sent {sent.logs} log record(s) and {sent.spans} span(s) to {otlp}; "
        f"the receiver has the ledger through seq {sent.through}"
    )
    return Exit.DONE
