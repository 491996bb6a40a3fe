"""``bxctl chat``'s prompt on a terminal: a line editor with the owner's history, and
keys that never end the chat by accident.

The line is edited with blessed's line editor (the library the approval prompts already
use: cli/terminal.py), read in raw mode without a thread: trio waits until stdin is
readable, so the prompt is one more cancellable wait in the chat's trio run
(docs/decisions.md, "The chat's prompt"). In raw mode Ctrl-C and Ctrl-D are keys, not a
signal and an end of input, so the prompt decides what they mean:

- Ctrl-C clears the line; at an empty line it says how to leave, and only a second
  Ctrl-C there (no other key between) leaves the chat. A Ctrl-C meant for a turn that
  has just ended therefore never ends the chat.
- Ctrl-D at an empty line leaves; inside a line it deletes the character under the
  cursor, as in readline.
- Ctrl-L clears the screen; the prompt and its line are drawn again at the top.
- Up and Down walk the history kept in ``state/chat_history`` (home/chat_history.py),
  shared by every chat of the home; Left, Right, Home, End, Ctrl-A/E/K/U/W and the rest
  of readline's usual keys edit.
"""

from __future__ import annotations

import enum
import logging
from typing import Final

import attrs
import trio
from blessed.line_editor import LineEditor, LineHistory

from boxmaker.cli.terminal import OwnerTerminal
from boxmaker.formats.printable import printable
from boxmaker.home.chat_history import MAX_ENTRIES, add_chat_line, read_chat_history
from boxmaker.home.paths import Home
from boxmaker.home.regular_file import NotRegularFile
from boxmaker.wire import MAX_SAY

log = logging.getLogger("boxmaker.bxctl")

PROMPT: Final = "you> "
HOW_TO_LEAVE: Final = "  (Ctrl-C again, or Ctrl-D, leaves the chat)"
KEYS_HELP: Final = (
    "  Ctrl-C ends a turn or clears the line; Ctrl-D (or Ctrl-C twice) at an empty "
    "prompt leaves; Up recalls what you typed before"
)
NO_HISTORY: Final = "  chat history not kept: {path}: {reason}"
REPLACED_HISTORY: Final = "  chat history not read: {path}: {reason}; this chat's lines replace it"


class Leave(enum.Enum):
    """How the owner left the prompt."""

    END_OF_INPUT = "ctrl-d"
    INTERRUPTED = "ctrl-c twice"


def _editor_keys() -> dict[str, object]:
    # Right moves right: the editor's default takes a history suggestion the prompt
    # does not draw.
    return {"KEY_RIGHT": LineEditor._move_right}


@attrs.define
class ChatPrompt:
    """The prompt of one chat, and the history it shares with the home's other chats."""

    terminal: OwnerTerminal
    home: Home
    history: LineHistory
    keeps: bool = True
    """False once the history file could not be read or written: said once, then the
    chat goes on without keeping lines."""

    @classmethod
    async def open(cls, terminal: OwnerTerminal, home: Home) -> ChatPrompt:
        prompt = cls(terminal, home, LineHistory(max_entries=MAX_ENTRIES))
        try:
            entries = await trio.to_thread.run_sync(read_chat_history, home.chat_history)
        except NotRegularFile as exc:
            # A link or a FIFO there is no history of the owner's: replaced, never used.
            print(printable(REPLACED_HISTORY.format(path=home.chat_history, reason=exc.strerror)))
        except OSError as exc:
            prompt._not_kept(exc)
        else:
            prompt.history.entries = entries
        return prompt

    def _not_kept(self, exc: OSError) -> None:
        reason = exc.strerror or str(exc)
        print(printable(NO_HISTORY.format(path=self.home.chat_history, reason=reason)))
        self.keeps = False

    async def keep(self, line: str) -> None:
        """Add ``line`` to the history file (after what other chats added meanwhile)."""
        if not self.keeps:
            return
        try:
            entries = await trio.to_thread.run_sync(add_chat_line, self.home.chat_history, line)
        except OSError as exc:
            self._not_kept(exc)
        else:
            self.history.entries = entries

    async def read(self) -> str | Leave:
        """The owner's next line (Enter), or how they left."""
        terminal = self.terminal
        width = max(terminal.term.width - len(PROMPT) - 1, 10)
        editor = LineEditor(
            history=self.history,
            limit=MAX_SAY,
            max_width=width,
            text_sgr="",
            suggestion_sgr="",
            keymap=_editor_keys(),  # type: ignore[arg-type]
        )
        leaving = False
        with terminal.typing():
            while True:
                terminal.draw_line(PROMPT, editor)
                try:
                    key = await terminal.key()
                except EOFError:
                    terminal.control("\r\n")
                    return Leave.END_OF_INPUT
                if key.name == "KEY_CTRL_L":
                    terminal.clear_screen()
                    continue
                if key.name == "KEY_CTRL_C":
                    if editor.line:
                        editor.clear()
                    elif leaving:
                        terminal.control("\r\n")
                        return Leave.INTERRUPTED
                    else:
                        leaving = True
                        terminal.clear_line()
                        terminal.control(PROMPT + "\r\n" + HOW_TO_LEAVE + "\r\n")
                    continue
                leaving = False
                result = editor.feed_key(key)
                if result.bell:
                    terminal.bell()
                if result.eof:
                    terminal.control("\r\n")
                    return Leave.END_OF_INPUT
                if result.line is not None:
                    terminal.control("\r\n")
                    return result.line
