"""``bxctl demo``: the main job for a newcomer (README.md).

A temporary home with one workspace file and one ``ask`` grant for read_file; the
built-in model, brokerd, inferproxy and loopd started; one chat turn that asks the model
to read the file; the approval shown as the owner sees it and approved at the prompt
(``--yes`` approves without asking); the model's reply; ``bxctl audit verify`` on that
ledger. Everything it started is stopped on success, on failure and on Ctrl-C, and the
temporary home removed (``--keep`` keeps it to look at).

The model is tiny (SmolLM2-135M): it writes a proper tool call only with help — loopd's
``first_step = "tool"`` — and a plain request that names the file.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Final

import trio

from boxmaker.cli.admin_client import DaemonUnreachable, ask_broker
from boxmaker.cli.audit import verify
from boxmaker.cli.chat import run_turn
from boxmaker.cli.common import Common, Exit, fail
from boxmaker.cli.daemons import down, up
from boxmaker.cli.owner import approval_block
from boxmaker.clock import utc_now
from boxmaker.home import Home
from boxmaker.ledger.writer import open_ledger
from boxmaker.wire import (
    ApprovalsAnswer,
    ApprovalsRequest,
    Approve,
    LoopEvent,
    Refuse,
    WaitingEvent,
)

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
    home.create()
    home.config_toml.write_text(CONFIG, encoding="utf-8")
    home.grants_toml.write_text(GRANTS, encoding="utf-8")
    home.default_workspace.mkdir(mode=0o700, exist_ok=True)
    (home.default_workspace / "notes.txt").write_text(NOTES, encoding="utf-8")
    open_ledger(home.audit_log)


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
        reply = await trio.to_thread.run_sync(input, "\napprove this call? [y/N] ")
        allowed = reply.strip().lower() in ("y", "yes")
        print()
    if allowed:
        await ask_broker(home, Approve(approval=event.approval, note="approved in bxctl demo"))
    else:
        await ask_broker(home, Refuse(approval=event.approval, reason="the owner said no"))


async def demo(*, yes: bool = False, keep: bool = False) -> Exit:
    """Run the whole stack on the built-in model, once: a temporary home, one file, one
    ask grant; the model asks to read the file, you approve, it answers; then the audit
    ledger is verified. Everything started is stopped again.

    Parameters
    ----------
    yes
        Approve the call without asking.
    keep
        Keep the temporary home afterwards (its ledger, logs and conversation).
    """
    root = Path(tempfile.mkdtemp(prefix="bx-demo-", dir="/tmp"))
    home, common = Home(root), Common(home=str(root))
    print(f"A temporary home: {root}")
    print("  workspace/notes.txt, and one grant: read_file notes.txt, mode ask\n")
    try:
        _prepare(home)
        code = up(common=common)
        if code is not Exit.DONE:
            return code
        print(f"\nyou> {QUESTION}")

        async def on_event(event: LoopEvent) -> None:
            if isinstance(event, WaitingEvent):
                await _owner_decides(home, event, yes=yes)

        try:
            turn = await run_turn(home, QUESTION, None, as_json=False, on_event=on_event)
        except DaemonUnreachable as exc:
            return fail(str(exc), Exit.UNREACHABLE)
        print("\nThe audit ledger (bxctl audit verify):")
        verified = verify(common=common)
        return turn.code if verified is Exit.DONE else verified
    finally:
        print()
        down(common=common)
        if keep:
            print(f"the demo's home is kept: {root} (try: bxctl audit show --home {root})")
        else:
            shutil.rmtree(root, ignore_errors=True)
