"""``bxctl approvals --watch`` on a terminal: the pending approvals, kept fresh, and the
owner's decision on the one they choose (↑/↓ or k/j choose, y approves, a approves
always: a grant for exactly this call, no expiry, written once the owner confirms the
grant shown; n asks a reason and refuses, q quits). It runs on the terminal's alternate
screen; what the owner did is printed on leaving, so it stays in the scrollback.

Whenever the approval the keys act on changes — one appears, the chosen one is answered
or ends and the next takes its place, the owner moves — the view settles before it takes
a key (cli/terminal.py): keys typed before are dropped, and so are those of the next
:data:`~boxmaker.cli.terminal.ANSWER_DELAY_S`; the chosen approval is marked ▷ meanwhile,
▶ once keys count.
"""

from __future__ import annotations

import sys
from typing import Final

import attrs
import trio

from boxmaker.cli.admin_client import DaemonUnreachable, answer_waiting_call, ask_broker
from boxmaker.cli.always import confirm_always
from boxmaker.cli.chat import ALWAYS_KEY
from boxmaker.cli.common import Exit, fail
from boxmaker.cli.owner import approval_block, describe_answer
from boxmaker.cli.terminal import REFUSE_HINT, OwnerTerminal, until_interrupted
from boxmaker.formats.clock import utc_now
from boxmaker.formats.printable import printable
from boxmaker.home.paths import Home
from boxmaker.wire import (
    ApprovalsAnswer,
    ApprovalsRequest,
    ApprovalView,
    Approve,
    ErrorFrame,
    Refuse,
)

REFRESH_S: Final = 1.0
LOST: Final = "lost brokerd"
"""The start of the message while brokerd does not answer (the watch asks it again
every :data:`REFRESH_S`)."""
REGAINED: Final = "brokerd answers again"
KEYS_HELP: Final = "↑/↓ or k/j choose · y approve · a always (exact, no expiry) · n refuse · q quit"
REASON_PROMPT: Final = f"refuse, reason ({REFUSE_HINT}): "
NONE_PENDING: Final = "no pending approvals"
CHOSEN: Final = "▶ "
"""The chosen approval's mark once keys act on it."""
SETTLING: Final = "▷ "
"""The chosen approval's mark while the view settles (keys are dropped)."""


@attrs.define
class ApprovalsWatch:
    home: Home
    terminal: OwnerTerminal
    entries: list[ApprovalView] = attrs.Factory(list)
    chosen: str | None = None
    """The chosen approval's id (kept across refreshes while it is listed)."""
    settled_on: str | None = None
    """The approval the view last settled on: keys act on :attr:`chosen` only when it
    is this one."""
    message: str = ""
    done: list[str] = attrs.Factory(list)
    """What the owner did, one line each, printed on leaving."""
    answered: bool = False
    """brokerd answered once: from then on, a brokerd that stops answering (restarted,
    stopped) is waited for, not the end of the watch."""
    lost: bool = False

    async def refresh(self) -> None:
        try:
            answer = await ask_broker(self.home, ApprovalsRequest())
        except DaemonUnreachable as exc:
            if not self.answered:
                raise
            # Its waiting calls ended with it: none is listed, none can be answered.
            self.lost, self.entries, self.chosen = True, [], None
            self.message = printable(f"{LOST}: {exc}; asking again every {REFRESH_S:g} s")
            return
        self.answered = True
        if self.lost:
            self.lost = False
            self.message = REGAINED
        if isinstance(answer, ErrorFrame):
            self.message = printable(f"brokerd: {answer.code}: {answer.detail}")
            return
        if isinstance(answer, ApprovalsAnswer):
            self.entries = answer.entries
        ids = [entry.approval for entry in self.entries]
        if self.chosen not in ids:
            self.chosen = ids[0] if ids else None

    def _index(self) -> int:
        ids = [entry.approval for entry in self.entries]
        return ids.index(self.chosen) if self.chosen in ids else 0

    def move(self, by: int) -> None:
        if self.entries:
            index = min(max(self._index() + by, 0), len(self.entries) - 1)
            self.chosen = self.entries[index].approval

    def draw(self) -> None:
        term = self.terminal
        self.terminal.control(term.term.home + term.term.clear)
        lines = [f"pending approvals ({len(self.entries)})  ·  {KEYS_HELP}", ""]
        if not self.entries:
            lines.append(NONE_PENDING)
        now = utc_now()
        start = self._index() if len(self.entries) * 8 > term.term.height - 4 else 0
        ready = self.settled_on == self.chosen
        for entry in self.entries[start:]:
            mark = "  "
            if entry.approval == self.chosen:
                mark = CHOSEN if ready else SETTLING
            block = approval_block(entry, now).split("\n")
            lines += [mark + block[0], *("  " + line for line in block[1:]), ""]
        message = self.message.split("\n") if self.message else []
        height = max(term.term.height - 2 - len(message), 3)
        print("\n".join(lines[:height] + message))
        sys.stdout.flush()

    async def decide(self, key: str) -> None:
        entry = next((e for e in self.entries if e.approval == self.chosen), None)
        if entry is None:
            return
        request: Approve | Refuse
        if key == "y":
            request = Approve(approval=entry.approval)
        elif key == "a":
            if not await confirm_always(self.terminal, self.home, entry, self._show):
                return
            request = Approve(approval=entry.approval, always=ALWAYS_KEY)
        else:
            reason = await self.terminal.refuse_reason(REASON_PROMPT)
            if reason is None:
                return
            request = Refuse(approval=entry.approval, reason=reason)
        try:
            answer = await answer_waiting_call(self.home, request)
        except DaemonUnreachable as exc:
            self.message = printable(str(exc))
        else:
            self.message = describe_answer(request, answer)
        self.done.append(self.message)
        await self.refresh()

    def _show(self, text: str) -> None:
        """``text`` as the view's message, drawn at once."""
        self.message = text
        self.draw()

    async def run(self) -> None:
        with self.terminal.keys():
            while True:
                await self.refresh()
                if self.settled_on != self.chosen:
                    # Another approval under the keys: what was typed before it was on
                    # the screen, or in the moment after, must not answer it.
                    self.settled_on = None
                    self.draw()
                    await self.terminal.settle()
                    self.settled_on = self.chosen
                    continue
                self.draw()
                key = None
                with trio.move_on_after(REFRESH_S):
                    key = await self.terminal.key()
                if key is None:
                    continue
                name, char = key.name, str(key).lower()
                if char == "q":
                    return
                if name == "KEY_UP" or char == "k":
                    self.move(-1)
                elif name == "KEY_DOWN" or char == "j":
                    self.move(1)
                elif char in {"y", "a", "n"}:
                    await self.decide(char)
                    # Asked again, after an answer or a prompt left: it settles anew.
                    self.settled_on = None


async def watch_approvals(home: Home) -> Exit:
    """The interactive watch; exit 0 at q, 130 at Ctrl-C, 3 when brokerd is unreachable."""
    terminal = OwnerTerminal()
    watch = ApprovalsWatch(home, terminal)
    failure: DaemonUnreachable | None = None

    async def run() -> bool:
        nonlocal failure
        try:
            with terminal.term.fullscreen():
                await watch.run()
        except DaemonUnreachable as exc:
            failure = exc
        return True

    finished = await until_interrupted(run)
    for line in watch.done:
        print(line)
    if failure is not None:
        return fail(str(failure), Exit.UNREACHABLE)
    return Exit.DONE if finished else Exit.INTERRUPTED
