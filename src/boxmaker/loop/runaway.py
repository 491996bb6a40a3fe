"""The repetition guard: a streamed reply whose tail repeats is cut (docs/decisions.md,
"A turn always ends").

A small model, once it starts repeating a tag or a phrase, goes on until the step's
``max_tokens``: minutes of the owner's time for nothing. :class:`RepetitionGuard` is fed
the reply's text as it streams and fires as soon as some unit of at most
:data:`MAX_UNIT` characters has followed itself for :func:`span_needed` characters. The
reply is then kept up to the end of the unit's first occurrence: the text before the
loop, and the unit once.

The rule looks at characters only, one at a time, so where a reply is cut depends on its
text alone, never on how the stream split it into pieces. Pure: no I/O.
"""

from __future__ import annotations

from typing import Final

import attrs

MAX_UNIT: Final = 200
"""The longest unit that counts as repeating (a sentence or two): a loop of a longer
unit is left to the step's ``max_tokens``."""
MIN_REPEATS: Final = 4
"""A unit is a loop once it stands four times in a row."""
MIN_SPAN: Final = 120
"""... and the run is at least this many characters: a row of 80 dashes in a table, or
``ha ha ha ha``, is not a loop."""


def span_needed(unit: int) -> int:
    """How many characters a run of a ``unit``-character unit must reach to be a loop.

    >>> span_needed(1), span_needed(8), span_needed(30), span_needed(MAX_UNIT)
    (120, 120, 120, 800)
    """
    return max(MIN_REPEATS * unit, MIN_SPAN)


@attrs.frozen
class Cut:
    """Where a reply was cut: ``keep`` characters are kept (the text before the loop and
    its unit once); ``unit`` is the repeated text."""

    keep: int
    unit: str


@attrs.define
class RepetitionGuard:
    """Fed a reply piece by piece; :meth:`feed` returns the :class:`Cut` once its tail
    repeats, and after that the same cut again.

    ``runs[p - 1]`` is how many characters in a row, ending at the last one, equal the
    character ``p`` before them: the tail of ``runs[p - 1] + p`` characters then repeats
    a ``p``-character unit. Each character costs :data:`MAX_UNIT` steps.

    >>> guard = RepetitionGuard()
    >>> guard.feed("The grants file is invalid.\\n") is None
    True
    >>> cut = guard.feed("<error>\\n" * 20)
    >>> cut
    Cut(keep=35, unit='\\n<error>')
    >>> guard.text[: cut.keep]
    'The grants file is invalid.\\n<error>'
    """

    text: str = ""
    """Everything fed (the cut fires on a character; what came after it is kept too)."""
    runs: list[int] = attrs.Factory(lambda: [0] * MAX_UNIT)
    cut: Cut | None = None

    def feed(self, piece: str) -> Cut | None:
        if self.cut is not None:
            return self.cut
        first = len(self.text)
        text = self.text = self.text + piece
        runs = self.runs
        for index in range(first, len(text)):
            char = text[index]
            fired = 0
            for unit in range(1, min(MAX_UNIT, index) + 1):
                run = runs[unit - 1] + 1 if text[index - unit] == char else 0
                runs[unit - 1] = run
                if not fired and run + unit >= span_needed(unit):
                    fired = unit
            if fired:
                start = index + 1 - (runs[fired - 1] + fired)
                self.cut = Cut(keep=start + fired, unit=text[start : start + fired])
                return self.cut
        return None


def find_cut(text: str) -> Cut | None:
    """Where the guard cuts ``text`` fed whole (the same as fed in any pieces).

    >>> find_cut("ha ha ha ha, that was funny.") is None
    True
    >>> find_cut("I cannot. " * 20)
    Cut(keep=10, unit='I cannot. ')
    """
    return RepetitionGuard().feed(text)
