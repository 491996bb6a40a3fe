"""Labels and the taint lattice (spec §4.3).

A label is ``(taint, untrusted)``. A session's state is the join of every label it
has seen, so it only rises.
"""

from __future__ import annotations

import enum

import attrs


class Taint(enum.StrEnum):
    """``public < internal < secret``.

    >>> Taint.PUBLIC < Taint.INTERNAL < Taint.SECRET
    True
    >>> Taint.INTERNAL > Taint.PUBLIC
    True
    >>> max(Taint.SECRET, Taint.PUBLIC)
    <Taint.SECRET: 'secret'>
    """

    PUBLIC = "public"
    INTERNAL = "internal"
    SECRET = "secret"

    @property
    def rank(self) -> int:
        return _RANK[self]

    # str's own comparisons are alphabetical; the lattice order must win, so all four
    # are defined here (functools.total_ordering would keep str's).
    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Taint):
            return NotImplemented
        return self.rank < other.rank

    def __le__(self, other: object) -> bool:
        if not isinstance(other, Taint):
            return NotImplemented
        return self.rank <= other.rank

    def __gt__(self, other: object) -> bool:
        if not isinstance(other, Taint):
            return NotImplemented
        return self.rank > other.rank

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, Taint):
            return NotImplemented
        return self.rank >= other.rank


_RANK = {Taint.PUBLIC: 0, Taint.INTERNAL: 1, Taint.SECRET: 2}


@attrs.frozen
class Label:
    """What a tool result is, or what a session has seen (the same lattice)."""

    taint: Taint = Taint.PUBLIC
    untrusted: bool = False

    def join(self, other: Label) -> Label:
        """The least label at or above both.

        >>> Label(Taint.INTERNAL, False).join(Label(Taint.PUBLIC, True))
        Label(taint=<Taint.INTERNAL: 'internal'>, untrusted=True)
        """
        return Label(max(self.taint, other.taint), self.untrusted or other.untrusted)

    def dominates(self, other: Label) -> bool:
        """True when ``self`` is at or above ``other`` (joining ``other`` changes nothing)."""
        return self.join(other) == self


FRESH = Label(Taint.PUBLIC, False)
"""A new session: public and trusted (spec §4.3: no file = fresh session)."""

UNKNOWN = Label(Taint.SECRET, True)
"""What records carry while a session's state is unreadable (spec §4.3)."""
