"""Reading grants.toml from disk (docs/runbook.md#grants), for brokerd and for
``bxctl grants check`` alike. The parsing itself is pure (core.grants)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import attrs

from boxmaker.core.grants import GrantSet, GrantsProblem, parse_grants
from boxmaker.regular_file import NotRegularFile, read_regular_file

GrantsReader = Callable[[Path], bytes]
"""How grants.toml's bytes are read: :func:`read_regular_file`, or a test's."""


@attrs.frozen
class GrantsRead:
    """One read of grants.toml: what it says, and what brokerd may cache of it."""

    value: GrantSet | GrantsProblem
    digest: str
    """Tells one content from another, so each broken content is logged once."""
    cacheable: bool
    """False when the bytes could not be read: a transient error (EMFILE, EIO) must not
    stay the answer until the file's stat moves, which it never does for such an error.
    What was read (valid or not) and a missing file are kept until the stat moves."""
    text: str | None = None
    """The file's text, when it was read and is UTF-8 (``bxctl grants`` shows a grant's
    own lines from it)."""


def read_grants(path: Path, read: GrantsReader = read_regular_file) -> GrantsRead:
    """The grant set in ``path``, or the one problem that makes it invalid; never raises.

    A missing or unreadable file is a problem too: the owner meant some grants to be
    there, and with none known the only safe answer is to deny (``grants_invalid``). So is
    anything but a regular file (a FIFO, a symlink: see boxmaker.regular_file).
    """
    try:
        data = read(path)
    except FileNotFoundError:
        problem = GrantsProblem(str(path), None, None, "no such file (`bxctl init` creates it)")
        return GrantsRead(problem, "missing", cacheable=True)
    except NotRegularFile as exc:
        problem = GrantsProblem(str(path), None, None, str(exc.strerror))
        return GrantsRead(problem, "not regular", cacheable=False)
    except OSError as exc:
        problem = GrantsProblem(str(path), None, None, f"cannot read it ({exc.strerror})")
        return GrantsRead(problem, f"unreadable {exc.errno}", cacheable=False)
    digest = hashlib.sha256(data).hexdigest()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return GrantsRead(GrantsProblem(str(path), None, None, "not UTF-8"), digest, True)
    return GrantsRead(parse_grants(text, str(path)), digest, cacheable=True, text=text)


def load_grants(path: Path) -> GrantSet | GrantsProblem:
    """What grants.toml says now (:func:`read_grants`' value)."""
    return read_grants(path).value
