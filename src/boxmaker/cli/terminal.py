"""The owner's terminal for bxctl's interactive screens (the approval prompt of ``bxctl
chat``, ``bxctl approvals --watch``): keys in, the few cursor controls out.

Keys are read through blessed (a well-kept terminal library: terminfo, key sequences,
cbreak mode, a line editor) without a thread: trio waits until stdin is readable, then
blessed decodes what is there without blocking. So every wait for a key can be
cancelled at once, as when a call waiting for the owner is answered from another
terminal while its prompt is up.

Keys typed before a question was on the screen never answer it (docs/threat-model.md,
the owner's terminal): every prompt is drawn through :meth:`OwnerTerminal.settle`. What
is asked (the call) appears first; once no key has come for :data:`ANSWER_DELAY_S`,
everything typed until then — the terminal's input queue and what blessed has already
read — is dropped, and only then is the question shown and a key taken.

Only bxctl's own controls go to the terminal raw (the bell, "clear to the end of the
line", the cursor's column); every text is still written through ``printable``.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import signal
import sys
import termios
from collections.abc import Awaitable, Callable, Iterator
from typing import Final, TextIO, TypeVar

import blessed
import trio
from blessed.keyboard import Keystroke
from blessed.line_editor import LineEditor

from boxmaker.formats.printable import PrintableStream, printable
from boxmaker.wire import MAX_REFUSE_REASON

ESC_DELAY_S: Final = 0.05
"""How long a lone Escape waits for the rest of a key sequence (an arrow key's)."""
SILENT_READS: Final = 200
"""Readable but no key this many times running: the terminal has gone (stdin at its end)."""
ANSWER_DELAY_S: Final = 0.5
"""A prompt's question appears once no key has come for this long since the prompt was
drawn, and every key until then is dropped unread: nobody reads a call and decides on it
faster, so such a key was typed before its question could be read (docs/decisions.md)."""
STILL_TYPING: Final = "  .. keys typed before the question are dropped; it comes once they stop"
REFUSED_WITHOUT_REASON: Final = "the owner refused this call"
"""The reason of a refusal whose reason line was left empty: what the model is told."""
REFUSE_HINT: Final = f"Enter alone refuses: {REFUSED_WITHOUT_REASON}; Esc goes back"

T = TypeVar("T")


async def until_interrupted(
    work: Callable[[], Awaitable[T]], signals: tuple[signal.Signals, ...] = (signal.SIGINT,)
) -> T | None:
    """``work``'s result, or None when Ctrl-C (SIGINT; or one of ``signals``) came first
    and cancelled it: what ``work`` shields from a cancel still runs to its end."""
    result: T | None = None
    with trio.open_signal_receiver(*signals) as interrupts:
        async with trio.open_nursery() as nursery:

            async def stop_on_interrupt() -> None:
                async for _ in interrupts:
                    nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(stop_on_interrupt)
            result = await work()
            nursery.cancel_scope.cancel()
    return result


def is_interactive() -> bool:
    """Both ends are a terminal: the owner is there to press keys and see the screen."""
    return sys.stdin.isatty() and sys.stdout.isatty()


def _raw_stdout() -> TextIO:
    stream = sys.stdout
    return stream.stream if isinstance(stream, PrintableStream) else stream


class OwnerTerminal:
    """The terminal bxctl runs on (only where :func:`is_interactive`)."""

    def __init__(self) -> None:
        self.out = _raw_stdout()
        self.term = blessed.Terminal(stream=self.out)
        # blessed reads keys from the process's own stdin (when its stdout is the stream).
        self.keyboard = sys.__stdin__.fileno() if sys.__stdin__ is not None else 0

    def control(self, sequence: str) -> None:
        """Write bxctl's own control sequence, raw (never text from outside)."""
        sys.stdout.flush()
        self.out.write(sequence)
        self.out.flush()

    def bell(self) -> None:
        self.control("\a")

    def clear_line(self) -> None:
        """Back to the start of the line, emptied."""
        self.control("\r" + self.term.clear_eol)

    def status(self, text: str) -> None:
        """``text`` on the current line, in place of what was there (no newline)."""
        self.clear_line()
        sys.stdout.write(printable(text)[: max(self.term.width - 1, 10)])
        sys.stdout.flush()

    @contextlib.contextmanager
    def keys(self) -> Iterator[None]:
        """cbreak mode: keys come one by one, unechoed; Ctrl-C still sends SIGINT."""
        with self.term.cbreak():
            yield

    async def key(self) -> Keystroke:
        """The next key (inside :meth:`keys`). Raises EOFError when stdin has ended."""
        silent = 0
        while True:
            key = self.term.inkey(timeout=0, esc_delay=ESC_DELAY_S)
            if key:
                return key
            await trio.lowlevel.wait_readable(self.keyboard)
            key = self.term.inkey(timeout=0, esc_delay=ESC_DELAY_S)
            if key:
                return key
            # Readable, yet no key: half a sequence (the rest is coming), or the end.
            silent += 1
            if silent >= SILENT_READS:
                raise EOFError
            await trio.sleep(0.005)

    def discard_typed_ahead(self) -> bool:
        """Drop every key typed and not yet taken: the terminal's input queue (the kernel's,
        a half-typed line too) and what blessed has read but not returned (the rest of its
        last read, a character half decoded). True when a key was dropped (a half-typed
        line is not counted: in cbreak mode, where prompts settle, there is none).
        Raises EOFError when the terminal has gone."""
        try:
            queued = array.array("i", [0])
            fcntl.ioctl(self.keyboard, termios.FIONREAD, queued)
            termios.tcflush(self.keyboard, termios.TCIFLUSH)
        except (OSError, termios.error) as exc:
            raise EOFError(f"the terminal cannot be read: {exc}") from exc
        # flushinp() empties blessed's own buffer and reads what came in meanwhile.
        held = self.term.flushinp()
        decoder = getattr(self.term, "_keyboard_decoder", None)
        if decoder is not None:
            decoder.reset()
        return queued[0] > 0 or bool(held)

    async def settle(self) -> None:
        """What a prompt asks has just been drawn: once no key has come for
        :data:`ANSWER_DELAY_S` (trio's clock), everything typed until then — before the
        prompt, in the moment after it appeared, or while the owner went on typing — is
        dropped. The caller shows its question after this; only keys from then on
        answer it."""
        while True:
            await trio.sleep(ANSWER_DELAY_S)
            if not self.discard_typed_ahead():
                return
            self.status(STILL_TYPING)

    async def answer_key(self, question: str) -> Keystroke:
        """The owner's key in answer to ``question`` (inside :meth:`keys`): the status line
        empty while the prompt settles (:meth:`settle`), then ``question`` on it, then
        the next key."""
        self.clear_line()
        await self.settle()
        self.status(question)
        return await self.key()

    def draw_line(self, prompt: str, editor: LineEditor) -> None:
        """``prompt`` and ``editor``'s line on the current line, the cursor where the
        editor has it."""
        shown = editor.display
        self.clear_line()
        sys.stdout.write(printable(prompt + shown.text))
        sys.stdout.flush()
        # blessed types move_x as taking a str; it takes the column.
        self.control(self.term.move_x(len(prompt) + shown.cursor))  # type: ignore[arg-type]

    def clear_screen(self) -> None:
        """The screen emptied, the cursor at its top left (Ctrl-L)."""
        self.control(self.term.home + self.term.clear)

    @contextlib.contextmanager
    def typing(self) -> Iterator[None]:
        """raw mode: every key comes as typed, Ctrl-C and Ctrl-D among them (no signal,
        no end of input), unechoed; output is not translated either, so a line written
        inside ends with ``\r\n``."""
        with self.term.raw():
            yield

    async def line(self, prompt: str, *, limit: int) -> str | None:
        """A line the owner types after ``prompt`` (inside :meth:`keys`), with readline's
        usual editing keys; None when they press Escape. Only printable characters
        can be typed, and only once ``prompt`` is shown: it appears when the prompt has
        settled (:meth:`settle`), so nothing typed ahead becomes the line."""
        self.clear_line()
        await self.settle()
        width = max(self.term.width - len(prompt) - 1, 10)
        editor = LineEditor(limit=limit, max_width=width, text_sgr="", suggestion_sgr="")
        while True:
            self.draw_line(prompt, editor)
            key = await self.key()
            if key.name == "KEY_ESCAPE":
                return None
            result = editor.feed_key(key)
            if result.bell:
                self.bell()
            if result.line is not None:
                self.control("\r\n")
                return result.line

    async def refuse_reason(self, prompt: str) -> str | None:
        """The reason the owner refuses with (inside :meth:`keys`), asked with ``prompt``
        (:data:`REFUSE_HINT` at its end): Enter alone is :data:`REFUSED_WITHOUT_REASON`;
        None when they press Escape (back to the question)."""
        reason = await self.line(prompt, limit=MAX_REFUSE_REASON)
        if reason is None:
            return None
        return reason if reason.strip() else REFUSED_WITHOUT_REASON
