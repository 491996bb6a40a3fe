"""Labels and the taint lattice (docs/decisions.md, "Session state").

A label is ``(taint, untrusted)``. A session's state is the join of every label it
has seen, so it only rises.

This module imports no other part of boxmaker but :mod:`boxmaker.core.paths`:
``boxmaker.wire`` imports it.
"""

from __future__ import annotations

import enum

import attrs

from boxmaker.core.paths import Glob, glob_problem


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
    SECRET = "secret"  # noqa: S105 (a taint level, not a password)

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
"""A new session: public and trusted (no state file = a fresh session)."""

UNKNOWN = Label(Taint.SECRET, True)
"""What records carry while a session's state is unreadable: brokerd
cannot know how sensitive the session is (docs/runbook.md#state)."""


DEFAULT_SECRET: tuple[str, ...] = ("**/.env", "**/*.pem", "secrets/**")
DEFAULT_UNTRUSTED: tuple[str, ...] = ("downloads/**",)

HTTP_GET_LABEL = Label(Taint.PUBLIC, True)
"""Anything fetched from the network: public, and untrusted."""

CONNECT_LABEL = Label(Taint.PUBLIC, True)
"""A connection that ran: what came in through it is the internet's (public, untrusted),
so the session is untrusted after it."""

WRITE_FILE_LABEL = Label(Taint.PUBLIC, False)
"""Writing tells the session nothing new (write_file's label is public)."""


def _globs(name: str, patterns: tuple[str, ...]) -> tuple[Glob, ...]:
    for pattern in patterns:
        problem = glob_problem(pattern)
        if problem is not None:
            raise ValueError(f"[labels] {name}: {pattern!r}: {problem}")
    return tuple(Glob.compile(pattern) for pattern in patterns)


@attrs.frozen
class LabelRules:
    """config.toml ``[labels]``: which workspace paths are secret or untrusted.

    A bad glob raises ValueError when the rules are built (config loading reports it).

    >>> rules = LabelRules()
    >>> rules.label_for_path("app/.env")
    Label(taint=<Taint.SECRET: 'secret'>, untrusted=False)
    >>> rules.label_for_path("downloads/page.html")
    Label(taint=<Taint.INTERNAL: 'internal'>, untrusted=True)
    >>> rules.label_for_path("notes.txt")
    Label(taint=<Taint.INTERNAL: 'internal'>, untrusted=False)
    """

    secret: tuple[str, ...] = DEFAULT_SECRET
    untrusted: tuple[str, ...] = DEFAULT_UNTRUSTED
    _secret_globs: tuple[Glob, ...] = attrs.field(init=False, eq=False, repr=False)
    _untrusted_globs: tuple[Glob, ...] = attrs.field(init=False, eq=False, repr=False)

    @_secret_globs.default
    def _compile_secret(self) -> tuple[Glob, ...]:
        return _globs("secret", self.secret)

    @_untrusted_globs.default
    def _compile_untrusted(self) -> tuple[Glob, ...]:
        return _globs("untrusted", self.untrusted)

    def label_for_path(self, path: str) -> Label:
        """The label of a workspace file's content (or listing).

        The two rules are independent: a path under both is secret and untrusted."""
        secret = any(glob.matches(path) for glob in self._secret_globs)
        untrusted = any(glob.matches(path) for glob in self._untrusted_globs)
        return Label(Taint.SECRET if secret else Taint.INTERNAL, untrusted)

    def highest(self) -> Label:
        """The highest label these rules give any path: secret when there is a secret
        rule, untrusted when there is an untrusted one.

        >>> LabelRules().highest()
        Label(taint=<Taint.SECRET: 'secret'>, untrusted=True)
        >>> LabelRules(secret=(), untrusted=()).highest()
        Label(taint=<Taint.INTERNAL: 'internal'>, untrusted=False)
        """
        return Label(Taint.SECRET if self.secret else Taint.INTERNAL, bool(self.untrusted))

    def label_for_opened(self, requested: str, real: str, links: int) -> Label:
        """The label of what a file tool read through ``requested`` (a workspace path)
        when the file it opened is at ``real`` (symlinks resolved) and has ``links``
        names (a regular file's link count; 1 for a directory).

        The higher of the two paths' labels: a link ``notes.txt -> .env`` reads as
        secret. A file with more than one name carries the label of every name, and
        its other names are unknown (finding them means scanning the workspace), so it
        reads as :meth:`highest`: a hard link to a secret file never launders it.

        >>> rules = LabelRules()
        >>> rules.label_for_opened("notes.txt", ".env", 1).taint
        <Taint.SECRET: 'secret'>
        >>> rules.label_for_opened("notes.txt", "notes.txt", 2) == rules.highest()
        True
        """
        label = self.label_for_path(real)
        if real != requested:  # equal without a link on the way, the common case
            label = label.join(self.label_for_path(requested))
        return label.join(self.highest()) if links > 1 else label


def shell_label(label_taint: Taint | None) -> Label:
    """Shell output: internal, raised by the matched grant's ``label_taint`` (never lowered).

    >>> shell_label(None).taint, shell_label(Taint.SECRET).taint
    (<Taint.INTERNAL: 'internal'>, <Taint.SECRET: 'secret'>)
    """
    return Label(max(Taint.INTERNAL, label_taint or Taint.INTERNAL), False)
