"""``bxctl chat``: talk to the agent through loopd's loop.sock (docs/protocol.md).

One turn with ``--say``, else a prompt loop (on a terminal: cli/chat_prompt.py). Each event
of the turn is shown as it comes: the model's tool calls, each call's outcome with its
detail and the head of its output, how long each step took, and the reply as the model
writes it. On a terminal, the model's progress (step, seconds, tokens) stays on one
line while it works, and a call waiting for the owner rings the bell, shows the approval
and asks for the decision right there; elsewhere it prints the commands that approve or
refuse it. ``--json`` prints the events as they come, one JSON object a line.

Ctrl-C ends the turn for real: chat closes its loop.sock connection, so loopd drops the
model request and brokerd withdraws a call waiting for the owner. ``--say`` then exits
130; the prompt loop comes back to its prompt (where Ctrl-C clears the line, and a
second one at an empty prompt ends chat, exit 130).
"""

from __future__ import annotations

import datetime as dt
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Final, assert_never

import attrs
import orjson
import trio

from boxmaker.cli.admin_client import DaemonUnreachable, answer_waiting_call, ask_broker
from boxmaker.cli.always import confirm_always
from boxmaker.cli.chat_prompt import KEYS_HELP, PROMPT, ChatPrompt, Leave
from boxmaker.cli.common import DEFAULT, Common, Exit, fail
from boxmaker.cli.owner import approval_block, describe_answer
from boxmaker.cli.terminal import REFUSE_HINT, OwnerTerminal, is_interactive, until_interrupted
from boxmaker.formats.clock import local_time, utc_now
from boxmaker.formats.convert import SESSION_ID, new_session_id
from boxmaker.formats.printable import printable
from boxmaker.home.paths import Home
from boxmaker.runtime.ndjson import FrameError, FrameReader
from boxmaker.wire import (
    Always,
    ApprovalsAnswer,
    ApprovalsRequest,
    ApprovalView,
    Approve,
    BadFrame,
    ErrorFrame,
    LoopEvent,
    ModelDoneEvent,
    ModelEvent,
    OutputHead,
    ProgressEvent,
    Refuse,
    ReplyDeltaEvent,
    ReplyEvent,
    Say,
    SessionEvent,
    ToolCallEvent,
    ToolResultEvent,
    WaitingEvent,
    decode_loop_event,
    encode_frame,
)

APPROVE_PROMPT: Final = "approve? [y]es / [a]lways (exact, no expiry) / [n]o (with a reason) "
REASON_PROMPT: Final = f"reason ({REFUSE_HINT}): "
ALWAYS_KEY: Final = Always()
"""What ``a`` at an approval prompt asks for, once confirmed (cli/always.py): a grant for
exactly this call, no expiry of its own."""
INTERRUPTED: Final = (
    "interrupted: the turn is ended (loopd drops the model request; "
    "a call waiting for you is withdrawn)"
)
NO_END: Final = (
    "loopd ended the turn without a reply or an error: it stopped or failed "
    "(`bxctl status`; its log: {log})"
)


@attrs.frozen
class TurnEnd:
    session: str | None
    code: Exit


def _seconds(ms: int) -> str:
    """
    >>> _seconds(1234), _seconds(40)
    ('1.2 s', '0.0 s')
    """
    return f"{ms / 1000:.1f} s"


def _head(head: OutputHead | None, mark: str) -> list[str]:
    if head is None:
        return []
    lines = [f"     {mark} {line}" for line in head.lines]
    if head.total_lines > len(head.lines):
        lines.append(f"     {mark} … {head.total_lines} lines in all")
    return lines


def describe_result(event: ToolResultEvent) -> str:
    """A call's outcome: its reason, exit status and time, then its detail and the head
    of its output (``|`` stdout, ``!`` stderr), every line escaped.

    >>> print(describe_result(ToolResultEvent(
    ...     call="c-0123456789abcdef", outcome="failed", reason="tool_error",
    ...     detail="exit status 2: no such file", exit_code=2, elapsed_ms=310)))
      <- failed: tool_error, exit 2 (0.3 s)
         exit status 2: no such file
    """
    head = f"  <- {event.outcome}" + (f": {event.reason}" if event.reason else "")
    if event.exit_code is not None:
        head += f", exit {event.exit_code}"
    if event.elapsed_ms is not None:
        head += f" ({_seconds(event.elapsed_ms)})"
    lines = [head]
    if event.detail:
        lines += [f"     {line}" for line in event.detail.split("\n")]
    lines += _head(event.output, "|") + _head(event.stderr, "!")
    return "\n".join(printable(line) for line in lines)


def describe(event: LoopEvent) -> str | None:
    """How an event reads to the owner (None: nothing to show), escaped: one line an
    event, but for a call's outcome (its detail and output) and the model's reply,
    whose own lines are kept. Streamed text and progress are shown by :class:`TurnScreen`.

    >>> describe(ToolResultEvent(call="c-0123456789abcdef", outcome="denied", reason="no_grant"))
    '  <- denied: no_grant'
    """
    match event:
        case SessionEvent():
            return printable(f"session {event.session}")
        case ModelEvent() | ProgressEvent() | ReplyDeltaEvent():
            return None
        case ModelDoneEvent():
            tokens = "" if event.tokens is None else f", {event.tokens} tokens"
            done = f"  [step {event.step}: {_seconds(event.elapsed_ms)}{tokens}]"
            return done if event.cut is None else f"{done}\n  [cut: {event.cut_words()}]"
        case ToolCallEvent():
            arguments = orjson.dumps(event.arguments, option=orjson.OPT_SORT_KEYS).decode()
            return printable(f"  -> {event.tool} {arguments}")
        case WaitingEvent():
            return "\n".join(
                printable(line)
                for line in [
                    f"  .. waiting for the owner: approval {event.approval} "
                    f"(grant {event.grant}), until {local_time(event.expires_at, utc_now())}",
                    f"     approve: bxctl approve {event.approval}",
                    f'     refuse:  bxctl refuse {event.approval} --reason "…"',
                ]
            )
        case ToolResultEvent():
            return describe_result(event)
        case ReplyEvent():
            return printable(event.text, lines=True)
        case ErrorFrame():
            return printable(f"error: {event.code}: {event.detail}")
        case _:
            assert_never(event)


@attrs.define
class TurnScreen:
    """The turn in text, as the events come. The model's text is written as it streams;
    its ``reply`` then only ends the line (or is written whole if nothing streamed). A
    step's timing is shown after its text. On a terminal, progress is one line
    rewritten in place until something else is shown."""

    terminal: OwnerTerminal | None
    prompts: bool = False
    """An :class:`ApprovalPrompt` shows each waiting call (so this does not)."""
    streamed: list[str] = attrs.Factory(list)
    line_open: bool = False
    status_up: bool = False
    footer: str | None = None

    def _settle(self) -> None:
        """The cursor at the start of an empty line, the progress line gone."""
        if self.status_up and self.terminal is not None:
            self.terminal.clear_line()
            self.status_up = False
        if self.line_open:
            print()
            self.line_open = False

    def _footer(self) -> None:
        if self.footer is not None:
            print(self.footer)
            self.footer = None

    def show(self, event: LoopEvent) -> None:
        if isinstance(event, ProgressEvent):
            if self.terminal is not None and not self.streamed:
                self.terminal.status(
                    f"  .. step {event.step}: {event.elapsed_ms // 1000} s, {event.tokens} tokens"
                )
                self.status_up = True
            return
        if isinstance(event, ReplyDeltaEvent):
            if self.status_up and self.terminal is not None:
                self.terminal.clear_line()
                self.status_up = False
            self.streamed.append(event.text)
            sys.stdout.write(printable(event.text, lines=True))
            sys.stdout.flush()
            self.line_open = not "".join(self.streamed).endswith("\n")
            return
        if isinstance(event, ModelEvent):
            self._settle()
            self.streamed = []
            return
        if isinstance(event, ModelDoneEvent):
            self.footer = describe(event)
            return
        self._settle()
        if isinstance(event, ReplyEvent):
            if "".join(self.streamed) != event.text:
                print(describe(event))
            self._footer()
            return
        self._footer()
        if isinstance(event, WaitingEvent) and self.prompts:
            return  # the approval prompt shows it, whole
        shown = describe(event)
        if shown is not None:
            print(shown, file=sys.stderr if isinstance(event, ErrorFrame) else sys.stdout)

    def end(self) -> None:
        self._settle()
        self._footer()
        sys.stdout.flush()


@attrs.define
class ApprovalPrompt:
    """The decision on one waiting call, asked on the terminal: the bell, the approval
    as ``bxctl approvals`` shows it, then — once the prompt has settled, so no key typed
    ahead answers it (cli/terminal.py) — y (approve), a (approve always, once the owner
    confirmed the grant shown: cli/always.py) or n and a reason (refuse), sent on
    brokerd's admin.sock. While the owner has not decided, :meth:`close` takes the
    prompt away (the call ended otherwise: answered from another terminal, expired,
    withdrawn); once they have, it waits for brokerd's answer to be shown."""

    home: Home
    waiting: WaitingEvent
    terminal: OwnerTerminal
    _asking: trio.CancelScope = attrs.Factory(trio.CancelScope)
    _decided: bool = False
    _done: trio.Event = attrs.Factory(trio.Event)

    async def run(self) -> None:
        try:
            decision = None
            with self._asking:
                decision = await self._ask()
            if decision is not None:
                await self._send(decision)
        finally:
            self._done.set()

    async def close(self) -> None:
        if not self._decided:
            self._asking.cancel()
        await self._done.wait()

    async def _entry(self) -> ApprovalView | None:
        """brokerd's view of the waiting call (None when it cannot be had)."""
        try:
            answer = await ask_broker(self.home, ApprovalsRequest())
        except DaemonUnreachable:
            answer = None
        if isinstance(answer, ApprovalsAnswer):
            for entry in answer.entries:
                if entry.approval == self.waiting.approval:
                    return entry
        return None

    def _show(self, text: str) -> None:
        """``text`` below the approval, in place of the question (or what Escape left)."""
        self.terminal.clear_line()
        print(text)

    async def _ask(self) -> Approve | Refuse | None:
        self.terminal.bell()
        entry = await self._entry()
        print((describe(self.waiting) or "") if entry is None else approval_block(entry, utc_now()))
        approval = self.waiting.approval
        try:
            with self.terminal.keys():
                while True:
                    # Each time the question is asked anew it settles first: a key typed
                    # ahead (of the call, or of the question after a wrong answer) is dropped.
                    key = (await self.terminal.answer_key(APPROVE_PROMPT)).lower()
                    if key == "y":
                        self._decided = True
                        return Approve(approval=approval)
                    if key == "a" and await confirm_always(
                        self.terminal, self.home, entry, self._show
                    ):
                        self._decided = True
                        return Approve(approval=approval, always=ALWAYS_KEY)
                    if key == "n":
                        reason = await self.terminal.refuse_reason(REASON_PROMPT)
                        if reason is not None:
                            self._decided = True
                            return Refuse(approval=approval, reason=reason)
        except EOFError:
            return None
        finally:
            self.terminal.clear_line()

    async def _send(self, decision: Approve | Refuse) -> None:
        try:
            answer = await answer_waiting_call(self.home, decision)
        except DaemonUnreachable as exc:
            print(printable(f"  !! {exc}"))
            return
        print("  " + describe_answer(decision, answer))


OnEvent = Callable[[LoopEvent], Awaitable[None]]


async def show_turn(
    home: Home, text: str, session: str | None, *, as_json: bool, on_event: OnEvent | None = None
) -> TurnEnd:
    """One ``say`` on loop.sock, its events shown as they come. On a terminal a waiting
    call is put to the owner (:class:`ApprovalPrompt`), unless the caller hears the events
    itself: ``on_event`` hears each after it is shown, and the next is not read until it
    returns (``bxctl demo`` decides so). Ctrl-C ends the turn: exit 130."""
    try:
        stream = await trio.open_unix_socket(str(home.loop_sock))
    except OSError as exc:
        message = (
            f"loopd is unreachable at {home.loop_sock} ({exc.strerror or exc}); "
            f"start the daemons with `bxctl up --home {home.root}`"
        )
        return TurnEnd(session, fail(message, Exit.UNREACHABLE))
    terminal = OwnerTerminal() if not as_json and is_interactive() else None
    asks = terminal is not None and on_event is None
    screen = TurnScreen(terminal, prompts=asks)
    current = session

    async def events() -> Exit:
        nonlocal current
        prompt: ApprovalPrompt | None = None
        code: Exit | None = None
        async with trio.open_nursery() as prompts:
            await stream.send_all(encode_frame(Say(session=session, text=text)))
            reader = FrameReader(stream)
            try:
                while (line := await reader.receive_line()) is not None:
                    event = decode_loop_event(line)
                    if prompt is not None:
                        await prompt.close()
                        prompt = None
                    if isinstance(event, SessionEvent):
                        current = event.session
                    if as_json:
                        sys.stdout.write(line.decode() + "\n")
                        sys.stdout.flush()
                    else:
                        screen.show(event)
                    if on_event is not None:
                        await on_event(event)
                    if isinstance(event, WaitingEvent) and asks and terminal is not None:
                        prompt = ApprovalPrompt(home, event, terminal)
                        prompts.start_soon(prompt.run)
                    if isinstance(event, ReplyEvent):
                        code = Exit.DONE
                    elif isinstance(event, ErrorFrame):
                        code = Exit.FAILED
            except (trio.BrokenResourceError, FrameError, BadFrame) as exc:
                screen.end()
                return fail(f"the connection to loopd broke: {exc}")
            finally:
                if prompt is not None:
                    await prompt.close()
        screen.end()
        return fail(NO_END.format(log=home.log_file("loopd"))) if code is None else code

    async with stream:
        code = await until_interrupted(events)
    if code is None:
        screen.end()
        return TurnEnd(current, fail(INTERRUPTED, Exit.INTERRUPTED))
    return TurnEnd(current, code)


async def _read_line() -> str:
    """The next line of a chat whose input is no terminal ("" at its end, which ends
    chat as an empty line does)."""
    try:
        return await trio.to_thread.run_sync(input, PROMPT, abandon_on_cancel=True)
    except EOFError:
        print()
        return ""


async def _piped_chat(home: Home, session: str | None, *, as_json: bool) -> Exit:
    """The prompt loop without a terminal: a line a turn, until an empty line or the end."""
    code = Exit.DONE
    while True:
        text = await until_interrupted(_read_line)
        if text is None:
            print()
            return Exit.INTERRUPTED
        if not text.strip():
            return code
        end = await show_turn(home, text, session, as_json=as_json)
        session, code = end.session, end.code
        if code is Exit.UNREACHABLE:
            return code


def _session_line(home: Home, session: str) -> str:
    """The session at the chat's start: new, or when it was last used."""
    try:
        used = home.conversation(session).stat().st_mtime
    except OSError:
        return f"session {session} (new)"
    last = dt.datetime.fromtimestamp(used, dt.UTC)
    return f"session {session} (going on; last used {local_time(last, utc_now())})"


def resume_line(session: str) -> str:
    """
    >>> resume_line("s-0123456789ab")
    'session s-0123456789ab: go on with it: bxctl chat --session s-0123456789ab'
    """
    return f"session {session}: go on with it: bxctl chat --session {session}"


async def _terminal_chat(home: Home, session: str | None) -> Exit:
    """The prompt loop on a terminal (cli/chat_prompt.py): the session named at the start
    and at the end, each line a turn, until the owner leaves."""
    session = session or new_session_id()
    print(printable(_session_line(home, session)))
    print(KEYS_HELP)
    prompt = await ChatPrompt.open(OwnerTerminal(), home)
    code = Exit.DONE
    # A Ctrl-C between the prompt and the turn (neither is listening) is dropped here,
    # not turned into KeyboardInterrupt.
    with trio.open_signal_receiver(signal.SIGINT):
        while True:
            entered = await prompt.read()
            if entered is Leave.INTERRUPTED:
                code = Exit.INTERRUPTED
            if isinstance(entered, Leave):
                break
            if not entered.strip():
                continue
            await prompt.keep(entered)
            end = await show_turn(home, entered, session, as_json=False)
            session, code = end.session or session, end.code
            if code is Exit.UNREACHABLE:
                break
    if home.conversation(session).exists():
        print(printable(resume_line(session)))
    return code


async def chat(
    *, say: str | None = None, session: str | None = None, common: Common = DEFAULT
) -> Exit:
    """Talk to the agent: one turn with --say, else a prompt loop. Shows each tool call,
    its outcome (the detail, the head of the output, the time taken) and the reply as it
    is written. On a terminal a call waiting for your approval rings the bell and asks
    you right there (y; a, then the word always to confirm the grant it writes; or n and
    a reason); keys typed before the question appears are dropped. `bxctl approve` from
    another terminal works as well. Ctrl-C ends the turn (the waiting call is
    withdrawn): --say exits 130, the prompt loop asks again.

    The prompt on a terminal edits the line (arrows, Home/End, Ctrl-A/E/K/U/W), recalls
    what you typed in earlier chats (Up/Down), clears the screen (Ctrl-L); Ctrl-C clears
    the line, and Ctrl-D, or Ctrl-C twice, at an empty prompt leaves. The session is
    named at the start and at the end; `bxctl sessions` lists past ones. Without a
    terminal, a line a turn until an empty line or the end of input.

    Parameters
    ----------
    say
        Say this, show the turn, and exit (0 once the model replied).
    session
        Go on with this session (s- and 12 hex digits; `bxctl sessions` lists them);
        default: a new one.
    """
    if session is not None and not SESSION_ID.fullmatch(session):
        return fail(f"not a session id: {session!r} (s- and 12 hex digits)", Exit.USAGE)
    if say is not None:
        if not say.strip():
            return fail("--say needs some text", Exit.USAGE)
        return (await show_turn(common.resolve(), say, session, as_json=common.json)).code
    home = common.resolve()
    if common.json or not is_interactive():
        return await _piped_chat(home, session, as_json=common.json)
    return await _terminal_chat(home, session)
