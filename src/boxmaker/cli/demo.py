"""``bxctl demo``: the main job for a newcomer (README.md).

A temporary home with one workspace file and one ``ask`` grant for read_file; the
built-in model, brokerd, inferproxy and loopd started; one chat turn that asks the model
to read the file; the approval shown as the owner sees it and approved at the prompt
(``--yes`` approves without asking); the model's reply; ``bxctl audit verify`` on that
ledger. Everything it started is stopped on success, on failure and on Ctrl-C, and the
temporary home removed (``--keep`` keeps it to look at). ``--home DIR`` uses that home
instead (created when absent) and keeps it: its own notes.txt, grant and config.toml
are written only where those files do not exist yet.

The model is tiny (SmolLM2-135M): it writes a proper tool call only with help — loopd's
``first_step = "tool"`` — and a plain request that names the file.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import tempfile
from pathlib import Path
from typing import Final

import trio

from boxmaker.cli.admin_client import DaemonUnreachable, ask_broker
from boxmaker.cli.audit import verify
from boxmaker.cli.chat import show_turn
from boxmaker.cli.common import Common, Exit, fail
from boxmaker.cli.daemon_processes import DAEMONS, daemon_states, stop
from boxmaker.cli.daemons import up
from boxmaker.cli.owner import approval_block
from boxmaker.cli.terminal import OwnerTerminal, is_interactive
from boxmaker.formats.clock import utc_now
from boxmaker.home.paths import Home, HomeError, resolve_home
from boxmaker.ledger.live_file import open_ledger
from boxmaker.wire import (
    ApprovalsAnswer,
    ApprovalsRequest,
    Approve,
    LoopEvent,
    Refuse,
    WaitingEvent,
)

APPROVE_PROMPT: Final = "approve this call? [y/N] "
ANSWER_LIMIT: Final = 20
NOTES: Final = "Buy milk.\nCall the plumber about the kitchen tap.\n"
QUESTION: Final = 'Read the file at path "notes.txt" and tell me what it says.'
CONFIG: Final = """\
# The demo's home (bxctl demo). No [model] url: the built-in model.
[broker]
pending_timeout = 300.0

[loop]
# The built-in model writes a tool call reliably only when asked for one (README).
first_step = "tool"
max_steps = 4
"""
GRANTS: Final = """\
[[grant]]
id = "read-notes"
tool = "read_file"
mode = "ask"
paths = ["notes.txt"]
note = "the demo's notes: ask me each time"
"""


def _prepare(home: Home) -> None:
    """The demo's files, each written only where there is none: a home given with
    --home keeps what its owner wrote."""
    home.create()
    home.default_workspace.mkdir(mode=0o700, exist_ok=True)
    for path, text in (
        (home.config_toml, CONFIG),
        (home.grants_toml, GRANTS),
        (home.default_workspace / "notes.txt", NOTES),
    ):
        with contextlib.suppress(FileExistsError), path.open("x", encoding="utf-8") as file:
            path.chmod(0o600)
            file.write(text)
    open_ledger(home.audit_log)


async def _answer() -> str:
    """The owner's answer to :data:`APPROVE_PROMPT`. On a terminal the prompt settles
    first (cli/terminal.py): nothing typed while the stack started or the model wrote
    its call answers it; Escape or the terminal's end is no. Elsewhere (a script's
    pipe) the next line."""
    if not is_interactive():
        try:
            return await trio.to_thread.run_sync(input, APPROVE_PROMPT)
        except EOFError:
            return ""
    terminal = OwnerTerminal()
    try:
        with terminal.keys():
            return await terminal.line(APPROVE_PROMPT, limit=ANSWER_LIMIT) or ""
    except EOFError:
        return ""


async def _owner_decides(home: Home, event: WaitingEvent, *, yes: bool) -> None:
    """Show the waiting call as ``bxctl approvals`` does, and approve or refuse it."""
    answer = await ask_broker(home, ApprovalsRequest())
    entries = answer.entries if isinstance(answer, ApprovalsAnswer) else []
    for entry in entries:
        if entry.approval == event.approval:
            print("\nThe owner is asked (what `bxctl approvals` shows):\n")
            print(approval_block(entry, utc_now()))
    if yes:
        print(f"\napproving (--yes): bxctl approve {event.approval}\n")
        allowed = True
    else:
        print()
        reply = await _answer()
        allowed = reply.strip().lower() in ("y", "yes")
        print()
    if allowed:
        await ask_broker(home, Approve(approval=event.approval, note="approved in bxctl demo"))
    else:
        await ask_broker(home, Refuse(approval=event.approval, reason="the owner said no"))


async def demo(*, yes: bool = False, keep: bool = False, home: str | None = None) -> Exit:
    """Run the whole stack on the built-in model, once: a temporary home, one file, one
    ask grant; the model asks to read the file, you approve, it answers; then the audit
    ledger is verified. Everything started is stopped again.

    Parameters
    ----------
    yes
        Approve the call without asking.
    keep
        Keep the temporary home afterwards (its ledger, logs and conversation).
    home
        Use this home instead of a temporary one: created when absent, kept afterwards;
        its existing config.toml, grants.toml and workspace/notes.txt are used as they are.
    """
    if home is None:
        root = Path(tempfile.mkdtemp(prefix="bx-demo-", dir="/tmp"))
        print(f"A temporary home: {root}")
    else:
        root, keep = resolve_home(home).root, True
        print(f"The home: {root}")
    where, common = Home(root), Common(home=str(root))
    print("  workspace/notes.txt, and one grant: read_file notes.txt, mode ask\n")
    # A home of the owner's may have daemons running already: the demo stops only its own.
    running = {name for name, up_now in daemon_states(where).items() if up_now}
    try:
        try:
            _prepare(where)
        except (HomeError, OSError) as exc:
            return fail(f"{root}: cannot prepare the demo's home: {exc}")
        # up waits on the daemons' sockets, blocking: off the trio thread.
        code = await trio.to_thread.run_sync(functools.partial(up, common=common))
        if code is not Exit.DONE:
            return code
        print(f"\nyou> {QUESTION}")

        async def on_event(event: LoopEvent) -> None:
            if isinstance(event, WaitingEvent):
                await _owner_decides(where, event, yes=yes)

        try:
            turn = await show_turn(where, QUESTION, None, as_json=False, on_event=on_event)
        except DaemonUnreachable as exc:
            return fail(str(exc), Exit.UNREACHABLE)
        print("\nThe audit ledger (bxctl audit verify):")
        verified = verify(common=common)
        return turn.code if verified is Exit.DONE else verified
    finally:
        print()
        for daemon in reversed(DAEMONS):
            if daemon.name not in running:
                print(f"{daemon.name}: {stop(daemon, where)}")
        if keep:
            print(f"the demo's home is kept: {root} (try: bxctl audit show --home {root})")
        else:
            shutil.rmtree(root, ignore_errors=True)
