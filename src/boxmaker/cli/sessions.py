"""``bxctl sessions``: the conversations kept in the home, the last used first, with what
brokerd knows of each session (its taint, trust and calls), so ``bxctl chat --session``
can find one to go on with."""

from __future__ import annotations

import attrs
import trio

from boxmaker.cli.admin_client import DaemonUnreachable, ask_broker
from boxmaker.cli.common import DEFAULT, Common, Exit, fail, print_json
from boxmaker.formats.clock import format_utc, local_time, utc_now
from boxmaker.formats.printable import printable
from boxmaker.home.conversation_list import Conversation, list_conversations
from boxmaker.wire import ErrorFrame, SessionsAnswer, SessionsRequest, SessionView


@attrs.frozen
class SessionRow:
    session: str
    conversation: Conversation | None
    broker: SessionView | None

    def json(self) -> dict[str, object]:
        conversation, broker = self.conversation, self.broker
        return {
            "session": self.session,
            "last_used": None if conversation is None else format_utc(conversation.last_used),
            "first_words": None if conversation is None else conversation.first_words,
            "taint": None if broker is None else broker.taint.value,
            "untrusted": None if broker is None else broker.untrusted,
            "calls": None if broker is None else broker.calls,
        }

    def lines(self) -> str:
        """The session, when it was last used and what brokerd knows; below it, the
        first words said in it."""
        conversation, broker = self.conversation, self.broker
        used = (
            "no conversation kept"
            if conversation is None
            else f"last used {local_time(conversation.last_used, utc_now())}"
        )
        known = (
            ""
            if broker is None
            else f"; taint {broker.taint}, "
            f"{'untrusted' if broker.untrusted else 'trusted'}, {broker.calls} call(s)"
        )
        shown = printable(f"{self.session}  {used}{known}")
        if conversation is not None and conversation.first_words is not None:
            shown += "\n    " + printable(conversation.first_words)
        return shown


def rows(conversations: list[Conversation], views: list[SessionView]) -> list[SessionRow]:
    """One row a session: those with a conversation, the last used first, then those
    only brokerd knows."""
    by_session = {view.session: view for view in views}
    listed = [SessionRow(c.session, c, by_session.pop(c.session, None)) for c in conversations]
    return listed + [SessionRow(view.session, None, view) for view in by_session.values()]


async def sessions(*, common: Common = DEFAULT) -> Exit:
    """The sessions you can go on with (`bxctl chat --session S`): each conversation kept,
    the last used first, with its first words, and what brokerd knows of it (taint,
    trust, calls). With brokerd down, the conversations are still listed."""
    home = common.resolve()
    conversations = await trio.to_thread.run_sync(list_conversations, home)
    problem: str | None = None
    views: list[SessionView] = []
    try:
        answer = await ask_broker(home, SessionsRequest())
    except DaemonUnreachable as exc:
        problem = str(exc)
    else:
        if isinstance(answer, SessionsAnswer):
            views = answer.sessions
        elif isinstance(answer, ErrorFrame):
            problem = printable(f"brokerd: {answer.code}: {answer.detail}")
        else:
            problem = f"brokerd answered {type(answer).__name__}, not sessions"
    listed = rows(conversations, views)
    if common.json:
        print_json([row.json() for row in listed])
    elif not listed:
        print("no sessions")
    else:
        for row in listed:
            print(row.lines())
    if problem is not None:
        return fail(f"{problem} (what brokerd knows of each is not shown)", Exit.UNREACHABLE)
    return Exit.DONE
