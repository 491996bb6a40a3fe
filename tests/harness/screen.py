"""A real terminal for tests: a program run in a tmux pane of its own tmux server, keys
sent as the owner types them, the screen read back as the owner sees it.

Everything is awaited (tmux is run through trio), so a test can drive the terminal
while the stack it talks to runs in the same trio run (tests/harness/stack.py). A test
that is not a trio test reads a shell command's screen with :func:`shell_pane`.
"""

from __future__ import annotations

import contextlib
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Final

import trio

WAIT_S: Final = 30.0
EXITED: Final = "[exit "
"""What the pane shows once the program has ended: ``[exit N]``."""


class Screen:
    def __init__(self, server: str) -> None:
        self.server = server

    async def _tmux(self, *args: str) -> str:
        done = await trio.run_process(
            ["tmux", "-L", self.server, *args], capture_stdout=True, capture_stderr=True
        )
        return done.stdout.decode(errors="replace")

    async def send(self, *keys: str) -> None:
        """Keys as tmux names them (``y``, ``Enter``, ``C-c``, ``Down``)."""
        await self._tmux("send-keys", "-t", "owner", *keys)

    async def type(self, text: str) -> None:
        """``text`` typed literally."""
        await self._tmux("send-keys", "-t", "owner", "-l", text)

    async def text(self) -> str:
        """What the pane shows now, with the lines scrolled off it."""
        return await self._tmux("capture-pane", "-p", "-J", "-S", "-200", "-t", "owner")

    async def visible(self) -> str:
        """What the pane shows now, without the lines scrolled off it."""
        return await self._tmux("capture-pane", "-p", "-J", "-t", "owner")

    async def raw(self) -> str:
        """The pane's content with its escape sequences, as tmux holds them."""
        return await self._tmux("capture-pane", "-p", "-e", "-S", "-200", "-t", "owner")

    async def rang(self) -> bool:
        """Has the program rung the terminal's bell?"""
        return (
            await self._tmux("display-message", "-p", "-t", "owner", "#{window_bell_flag}")
        ).strip() == "1"

    async def title(self) -> str:
        return (await self._tmux("display-message", "-p", "-t", "owner", "#{pane_title}")).strip()

    async def program(self) -> int:
        """The pid of the program the pane runs (the child of its ``sh -c``)."""
        shell = (await self._tmux("display-message", "-p", "-t", "owner", "#{pane_pid}")).strip()
        listed = trio.Path(f"/proc/{shell}/task/{shell}/children")
        with trio.fail_after(WAIT_S):
            while not (children := await listed.read_text()):  # noqa: ASYNC110 - /proc has no event
                await trio.sleep(0.01)
        [pid] = children.split()
        return int(pid)

    async def wait_for(
        self, wanted: str | Callable[[str], bool], timeout: float = WAIT_S, *, poll: float = 0.05
    ) -> str:
        """The screen once it shows ``wanted`` (a text, or a test on the whole screen)."""
        check = wanted if callable(wanted) else (lambda screen: wanted in screen)
        screen = ""
        with trio.move_on_after(timeout):
            while not check(screen := await self.text()):  # noqa: ASYNC110 - tmux has no event
                await trio.sleep(poll)
            return screen
        raise AssertionError(f"the screen never showed {wanted!r}; it shows:\n{screen}")

    async def exit_code(self, timeout: float = WAIT_S) -> int:
        screen = await self.wait_for(EXITED, timeout)
        return int(screen[screen.rindex(EXITED) + len(EXITED) :].split("]")[0])


@asynccontextmanager
async def terminal(argv: list[str], *, cwd: Path | None = None) -> AsyncIterator[Screen]:
    """``argv`` in a fresh 120x40 tmux pane; ``[exit N]`` is shown when it ends. The tmux
    server is killed on the way out."""
    server = f"bx-{uuid.uuid4().hex[:12]}"
    screen = Screen(server)
    # A trap (not an ignore) keeps the shell alive through Ctrl-C and is reset in the
    # program, which gets SIGINT as it would from an interactive shell.
    command = f'trap : INT; {shlex.join(argv)}; echo "{EXITED}$?]"; sleep 600'
    session = ["new-session", "-d", "-s", "owner", "-x", "120", "-y", "40"]
    where = ["-c", str(cwd or Path.cwd())]
    await trio.run_process(
        ["tmux", "-L", server, "-f", "/dev/null", *session, *where, "sh", "-c", command],
        env={"PATH": "/usr/bin:/bin", "TERM": "xterm-256color", "LANG": "C.UTF-8"},
    )
    try:
        yield screen
    finally:
        with trio.CancelScope(shield=True):
            await trio.run_process(["tmux", "-L", server, "kill-server"], check=False)


def bxctl_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "boxmaker.cli.app", *args]


class Pane:
    """A tmux pane read without trio (blocking calls)."""

    def __init__(self, tmux: list[str]) -> None:
        self.tmux = tmux

    def visible(self) -> str:
        """What the pane shows now, without the lines scrolled off it: a program that
        cleared the screen leaves nothing of what was there before."""
        return self._tmux("capture-pane", "-p", "-J")

    def title(self) -> str:
        return self._tmux("display-message", "-p", "#{pane_title}")

    def send(self, *keys: str) -> None:
        """Keys as tmux names them (``y``, ``Enter``, ``C-c``)."""
        self._tmux("send-keys", *keys)

    def wait_for(self, wanted: str, timeout: float = WAIT_S) -> str:
        """The visible screen once it shows ``wanted``."""
        deadline = time.monotonic() + timeout
        while wanted not in (screen := self.visible()):
            assert time.monotonic() < deadline, screen
            time.sleep(0.1)
        return screen

    def _tmux(self, *args: str) -> str:
        return subprocess.run(
            [*self.tmux, *args], capture_output=True, text=True, check=True
        ).stdout


@contextlib.contextmanager
def shell_pane(command: str, *, width: int, height: int) -> Iterator[Pane]:
    """``sh -c COMMAND`` in a fresh ``width`` x ``height`` tmux pane of its own tmux
    server, killed on the way out."""
    tmux = ["tmux", "-L", f"bx-{uuid.uuid4().hex[:12]}", "-f", "/dev/null"]
    size = ["-x", str(width), "-y", str(height)]
    subprocess.run([*tmux, "new-session", "-d", *size, "sh", "-c", command], check=True)
    try:
        yield Pane(tmux)
    finally:
        subprocess.run([*tmux, "kill-server"], check=False)
