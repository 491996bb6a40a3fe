"""``bxctl chat``: talk to the agent through loopd's loop.sock (docs/protocol.md).

One turn with ``--say``, else a prompt loop (an empty line or Ctrl-D ends it). Each event
of the turn is shown as it comes: the model's tool calls, a call waiting for the owner
(with the commands that approve or refuse it), each call's outcome, and the reply.
``--json`` prints the events as they come, one JSON object a line.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import Final

import attrs
import orjson
import trio

from boxmaker.cli.common import DEFAULT, Common, Exit, fail
from boxmaker.clock import format_utc
from boxmaker.convert import SESSION_ID
from boxmaker.home import Home
from boxmaker.ndjson import FrameError, FrameReader
from boxmaker.printable import printable
from boxmaker.wire import (
    BadFrame,
    ErrorFrame,
    LoopEvent,
    ModelEvent,
    ReplyEvent,
    Say,
    SessionEvent,
    ToolCallEvent,
    ToolResultEvent,
    WaitingEvent,
    decode_loop_event,
    encode_frame,
)

PROMPT: Final = "you> "


@attrs.frozen
class TurnEnd:
    session: str | None
    code: Exit


def describe(event: LoopEvent) -> str | None:
    """How an event reads to the owner (None: nothing to show), escaped: one line an
    event, but for the model's reply, whose own lines are kept.

    >>> describe(ToolResultEvent(call="c-0123456789abcdef", outcome="denied", reason="no_grant"))
    '  <- denied: no_grant'
    """
    if isinstance(event, SessionEvent):
        return printable(f"session {event.session}")
    if isinstance(event, ModelEvent):
        return None
    if isinstance(event, ToolCallEvent):
        arguments = orjson.dumps(event.arguments, option=orjson.OPT_SORT_KEYS).decode()
        return printable(f"  -> {event.tool} {arguments}")
    if isinstance(event, WaitingEvent):
        return "\n".join(
            printable(line)
            for line in [
                f"  .. waiting for the owner: approval {event.approval} (grant {event.grant}), "
                f"until {format_utc(event.expires_at)}",
                f"     approve: bxctl approve {event.approval}",
                f'     refuse:  bxctl refuse {event.approval} --reason "…"',
            ]
        )
    if isinstance(event, ToolResultEvent):
        return printable(f"  <- {event.outcome}" + (f": {event.reason}" if event.reason else ""))
    if isinstance(event, ReplyEvent):
        return printable(event.text, lines=True)
    return printable(f"error: {event.code}: {event.detail}")


OnEvent = Callable[[LoopEvent], Awaitable[None]]


async def run_turn(
    home: Home, text: str, session: str | None, *, as_json: bool, on_event: OnEvent | None = None
) -> TurnEnd:
    """One ``say`` on loop.sock, its events printed as they come (``on_event`` hears each
    after it is shown; the next is not read until it returns)."""
    try:
        stream = await trio.open_unix_socket(str(home.loop_sock))
    except OSError as exc:
        message = (
            f"loopd is unreachable at {home.loop_sock} ({exc.strerror or exc}); "
            f"start it with `loopd serve --home {home.root}` (or `bxctl up`)"
        )
        return TurnEnd(session, fail(message, Exit.UNREACHABLE))
    code = Exit.FAILED
    async with stream:
        await stream.send_all(encode_frame(Say(session=session, text=text)))
        reader = FrameReader(stream)
        try:
            while (line := await reader.receive_line()) is not None:
                event = decode_loop_event(line)
                if isinstance(event, SessionEvent):
                    session = event.session
                if as_json:
                    sys.stdout.write(line.decode() + "\n")
                elif (shown := describe(event)) is not None:
                    where = sys.stderr if isinstance(event, ErrorFrame) else sys.stdout
                    print(shown, file=where)
                sys.stdout.flush()
                if on_event is not None:
                    await on_event(event)
                if isinstance(event, ReplyEvent):
                    code = Exit.DONE
        except (trio.BrokenResourceError, FrameError, BadFrame) as exc:
            return TurnEnd(session, fail(f"the connection to loopd broke: {exc}"))
    return TurnEnd(session, code)


async def chat(
    *, say: str | None = None, session: str | None = None, common: Common = DEFAULT
) -> Exit:
    """Talk to the agent: one turn with --say, else a prompt loop (an empty line or
    Ctrl-D ends it). Shows each tool call, a call waiting for your approval (with the
    command that approves it), each outcome, and the reply.

    Parameters
    ----------
    say
        Say this, show the turn, and exit (0 once the model replied).
    session
        Go on with this session (s- and 12 hex digits); default: a new one.
    """
    if session is not None and not SESSION_ID.fullmatch(session):
        return fail(f"not a session id: {session!r} (s- and 12 hex digits)", Exit.USAGE)
    if say is not None:
        if not say.strip():
            return fail("--say needs some text", Exit.USAGE)
        return (await run_turn(common.resolve(), say, session, as_json=common.json)).code
    home = common.resolve()
    code = Exit.DONE
    while True:
        try:
            text = await trio.to_thread.run_sync(input, PROMPT)
        except EOFError:
            print()
            return code
        if not text.strip():
            return code
        end = await run_turn(home, text, session, as_json=common.json)
        session, code = end.session, end.code
        if code is Exit.UNREACHABLE:
            return code
