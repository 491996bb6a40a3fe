"""SIGHUP: what of a new config.toml a running daemon takes (docs/runbook.md#reload)."""

from __future__ import annotations

from typing import Any

import attrs

from boxmaker.home.config import Config


@attrs.frozen
class Reload:
    """What a daemon does with a re-read config.toml."""

    config: Config
    """The config it runs with from now on: the new value of each live key that
    changed, the old value of every other key."""
    applied: tuple[str, ...]
    """The changed keys it took, as ``[section] key`` (``workspace`` for the top one)."""
    needs_restart: tuple[str, ...]
    """The changed keys it kept at their old value: only a restart takes them."""


def _key_name(section: str, key: str | None) -> str:
    return section if key is None else f"[{section}] {key}"


def reload_config(
    old: Config, new: Config, *, concern: frozenset[str], live: frozenset[str]
) -> Reload:
    """Merge a re-read config.toml into the one a daemon runs with.

    ``concern`` names the sections (and ``workspace``) the daemon reads: a change
    elsewhere is another daemon's, and not reported here. ``live`` names the keys it
    can take while running, as ``section.key``, or ``section`` for all of a section's.

    >>> from pathlib import Path
    >>> from boxmaker.home.config import parse_config
    >>> from boxmaker.home.paths import Home
    >>> home = Home(Path("/tmp/bx"))
    >>> old = parse_config("", home)
    >>> new = parse_config("[broker]\\npending_timeout = 5\\nmax_pending = 3\\n", home)
    >>> done = reload_config(old, new, concern=frozenset({"broker"}),
    ...                      live=frozenset({"broker.pending_timeout"}))
    >>> done.applied, done.needs_restart
    (('[broker] pending_timeout',), ('[broker] max_pending',))
    >>> done.config.broker.pending_timeout, done.config.broker.max_pending
    (5.0, 10000)
    """
    applied: list[str] = []
    restart: list[str] = []
    sections: dict[str, Any] = {}
    for section in attrs.fields(Config):
        name = section.name
        before, after = getattr(old, name), getattr(new, name)
        if name not in concern or before == after:
            continue
        if not attrs.has(type(before)):
            (applied if name in live else restart).append(_key_name(name, None))
            if name in live:
                sections[name] = after
            continue
        taken: dict[str, Any] = {}
        for field in attrs.fields(type(before)):
            if not field.init or getattr(before, field.name) == getattr(after, field.name):
                continue
            if name in live or f"{name}.{field.name}" in live:
                taken[field.name] = getattr(after, field.name)
                applied.append(_key_name(name, field.name))
            else:
                restart.append(_key_name(name, field.name))
        if taken:
            sections[name] = attrs.evolve(before, **taken)
    return Reload(attrs.evolve(old, **sections), tuple(applied), tuple(restart))
