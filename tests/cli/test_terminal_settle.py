"""The owner's terminal drops keys typed ahead of a prompt (cli/terminal.py): in process,
on a pseudo-terminal of the test's own, with trio's MockClock moved by hand, so the
moment after a prompt appears is measured exactly.

Each key is written to the terminal's other end and waited for until the terminal
holds it (its input queue counts it, or it echoed it), so a key counted as "typed
before" really was in the terminal by then.
"""

from __future__ import annotations

import array
import fcntl
import os
import struct
import sys
import termios
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from boxmaker.cli import demo
from boxmaker.cli.terminal import ANSWER_DELAY_S, STILL_TYPING, OwnerTerminal

HELD_S = 5.0
"""How long a key may take to reach the terminal's input queue (real time)."""


@attrs.define
class Pty:
    """A pseudo-terminal: the owner's keyboard and screen at ``master``, bxctl's end at
    ``slave``."""

    master: int
    slave: int
    shown: bytearray = attrs.Factory(bytearray)
    files: list[Any] = attrs.Factory(list)
    """The files :func:`attached` opened on ``slave``."""

    def queued(self) -> int:
        """Bytes in the terminal's input queue, not yet read."""
        count = array.array("i", [0])
        fcntl.ioctl(self.slave, termios.FIONREAD, count)
        return count[0]

    def type(self, data: bytes) -> None:
        """``data`` typed, once the terminal holds it (non-canonical mode: its queue)."""
        before = self.queued()
        os.write(self.master, data)
        self._until(lambda: self.queued() >= before + len(data))

    def type_echoed(self, data: bytes) -> None:
        """``data`` typed in canonical mode, once the terminal echoed it."""
        os.write(self.master, data)
        self._until(lambda: data in self.screen())

    def screen(self) -> bytes:
        """Everything bxctl's end wrote so far."""
        while True:
            try:
                chunk = os.read(self.master, 4096)
            except BlockingIOError:
                return bytes(self.shown)
            self.shown += chunk

    def _until(self, held: Callable[[], bool]) -> None:
        deadline = time.monotonic() + HELD_S
        while not held():
            assert time.monotonic() < deadline, "the terminal never got the key"
            time.sleep(0.001)


@pytest.fixture
def pty(monkeypatch: pytest.MonkeyPatch) -> Iterator[Pty]:
    """A pseudo-terminal of 120 columns; :func:`attached` makes it bxctl's stdin and
    stdout."""
    master, slave = os.openpty()
    os.set_blocking(master, False)
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    monkeypatch.setenv("TERM", "xterm-256color")
    # blessed asks the terminal for its capabilities and waits 10 s for a reply no one
    # sends on a bare pseudo-terminal; it skips the question for this terminal.
    monkeypatch.setenv("TERM_PROGRAM", "Apple_Terminal")
    try:
        yield (terminal := Pty(master, slave))
    finally:
        for file in terminal.files:
            file.close()
        os.close(master)
        os.close(slave)


def attached(pty: Pty, monkeypatch: pytest.MonkeyPatch) -> OwnerTerminal:
    """``pty`` as bxctl's stdin and stdout, and the owner's terminal on it. In the test
    itself: pytest sets its own sys.stdout again as each phase of a test starts."""
    keyboard = os.fdopen(os.dup(pty.slave), "r", encoding="utf-8")
    screen = os.fdopen(os.dup(pty.slave), "w", encoding="utf-8")
    pty.files += [keyboard, screen]
    for name, value in [
        ("__stdin__", keyboard),
        ("stdin", keyboard),
        ("__stdout__", screen),
        ("stdout", screen),
    ]:
        monkeypatch.setattr(sys, name, value)
    return OwnerTerminal()


async def answer_of(nursery: trio.Nursery, ask: Callable[[], Awaitable[Any]]) -> Callable[[], Any]:
    """``ask()`` started; what it answered (None until it did)."""
    answers: list[Any] = []

    async def run() -> None:
        answers.append(await ask())

    nursery.start_soon(run)
    await trio.testing.wait_all_tasks_blocked()
    return lambda: answers[0] if answers else None


async def moved(clock: trio.testing.MockClock, seconds: float) -> None:
    clock.jump(seconds)
    await trio.testing.wait_all_tasks_blocked()


async def test_a_key_typed_before_the_prompt_never_answers_it(
    pty: Pty, mock_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    terminal = attached(pty, monkeypatch)
    with terminal.keys():
        pty.type(b"y")
        async with trio.open_nursery() as nursery:
            answer = await answer_of(nursery, lambda: terminal.answer_key("approve? "))
            await moved(mock_clock, ANSWER_DELAY_S)
            # y is dropped; the owner is told why the question waits, for one more moment.
            assert answer() is None
            assert pty.queued() == 0
            dropped = pty.screen()
            await moved(mock_clock, ANSWER_DELAY_S)
            asked = pty.screen()
            pty.type(b"n")
    assert answer() == "n"
    assert dropped.endswith(STILL_TYPING.encode())
    assert b"approve? " not in dropped
    assert asked.endswith(b"approve? ")


async def test_a_key_in_the_moment_after_the_prompt_is_dropped_and_one_after_it_counts(
    pty: Pty, mock_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    terminal = attached(pty, monkeypatch)
    with terminal.keys():
        async with trio.open_nursery() as nursery:
            answer = await answer_of(nursery, lambda: terminal.answer_key("approve? "))
            await moved(mock_clock, ANSWER_DELAY_S - 0.001)
            pty.type(b"y")
            await moved(mock_clock, 0.001)
            assert answer() is None
            assert pty.queued() == 0
            await moved(mock_clock, ANSWER_DELAY_S - 0.001)
            not_yet = pty.screen()
            await moved(mock_clock, 0.001)
            asked = pty.screen()
            pty.type(b"n")
    assert answer() == "n"
    # The question appears once no key came for the whole moment, not before.
    assert b"approve? " not in not_yet
    assert asked.endswith(b"approve? ")


async def test_the_question_waits_while_the_owner_goes_on_typing(
    pty: Pty, mock_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    terminal = attached(pty, monkeypatch)
    with terminal.keys():
        async with trio.open_nursery() as nursery:
            answer = await answer_of(nursery, lambda: terminal.answer_key("approve? "))
            # The next request, typed on as the prompt came: "and say yes", a key each
            # 0.3 s, each a moment shorter than ANSWER_DELAY_S after the one before.
            for char in b"and say yes":
                await moved(mock_clock, 0.3)
                pty.type(bytes([char]))
            typing = pty.screen()
            await moved(mock_clock, 0.3)
            assert pty.queued() == 0
            await moved(mock_clock, ANSWER_DELAY_S)
            asked = pty.screen()
            pty.type(b"n")
    assert answer() == "n"
    assert b"approve? " not in typing
    assert asked.endswith(b"approve? ")


async def test_what_blessed_has_already_read_is_dropped(
    pty: Pty, mock_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    terminal = attached(pty, monkeypatch)
    with terminal.keys():
        pty.type(b"yx")
        assert await terminal.key() == "y"
        # x left the terminal's queue with y: it is in blessed's own buffer now.
        assert pty.queued() == 0
        terminal.discard_typed_ahead()
        pty.type(b"z")
        assert await terminal.key() == "z"


async def test_a_character_half_decoded_is_dropped(
    pty: Pty, mock_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    terminal = attached(pty, monkeypatch)
    with terminal.keys():
        # y, then the first byte of "é": blessed's decoder holds it, waiting for the rest.
        pty.type(b"y\xc3")
        assert await terminal.key() == "y"
        assert pty.queued() == 0
        terminal.discard_typed_ahead()
        pty.type(b"z")
        assert await terminal.key() == "z"


async def test_a_half_typed_line_is_dropped(
    pty: Pty, mock_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    terminal = attached(pty, monkeypatch)
    # Before cbreak mode the terminal edits a line (canonical mode): "ab" is not readable
    # yet, but would become so the moment the prompt switches to single keys.
    pty.type_echoed(b"ab")
    terminal.discard_typed_ahead()
    with terminal.keys():
        assert pty.queued() == 0
        pty.type(b"z")
        assert await terminal.key() == "z"


async def test_a_line_typed_ahead_never_becomes_the_answer(
    pty: Pty, mock_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    terminal = attached(pty, monkeypatch)
    with terminal.keys():
        # n and a reason in one go: blessed read them all with the n, and holds the rest.
        pty.type(b"nprivate\r")
        assert await terminal.key() == "n"
        assert pty.queued() == 0
        async with trio.open_nursery() as nursery:
            answer = await answer_of(nursery, lambda: terminal.line("reason: ", limit=50))
            await moved(mock_clock, ANSWER_DELAY_S)
            assert answer() is None
            dropped = pty.screen()
            await moved(mock_clock, ANSWER_DELAY_S)
            pty.type(b"mine\r")
    assert answer() == "mine"
    assert dropped.endswith(STILL_TYPING.encode())


async def test_the_demos_prompt_drops_a_yes_typed_ahead(
    pty: Pty, mock_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    attached(pty, monkeypatch)
    pty.type_echoed(b"y\r")
    async with trio.open_nursery() as nursery:
        answer = await answer_of(nursery, demo._answer)
        await moved(mock_clock, ANSWER_DELAY_S)
        assert answer() is None
        await moved(mock_clock, ANSWER_DELAY_S)
        pty.type(b"n\r")
    assert answer() == "n"
    screen, prompt = pty.screen(), demo.APPROVE_PROMPT.encode()
    # The y typed ahead was echoed before the prompt was drawn; the n was typed at it.
    assert screen.startswith(b"y\r\n")
    assert prompt + b"n" in screen


async def test_a_keyboard_that_is_no_terminal_ends_the_prompt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    read, write = os.pipe()
    with os.fdopen(read, "r") as keyboard, os.fdopen(write, "w"):
        monkeypatch.setattr(sys, "__stdin__", keyboard)
        terminal = OwnerTerminal()
        with pytest.raises(EOFError, match="the terminal cannot be read"):
            terminal.discard_typed_ahead()
