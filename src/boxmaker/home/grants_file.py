"""Reading grants.toml from disk (docs/runbook.md#grants), for brokerd and for
``bxctl grants check`` alike. The parsing itself is pure (core.grant_parse)."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Final

import attrs

from boxmaker.core.grant_parse import GrantsProblem, parse_grants
from boxmaker.core.grants import GrantSet
from boxmaker.home.regular_file import NotRegularFile, read_regular_file

MAX_GRANTS_BYTES: Final = 1 << 20
"""grants.toml is read up to 1 MiB (thousands of grants); a larger file is a problem,
never read whole: brokerd keeps every version it decides with (docs/protocol.md)."""

GrantsReader = Callable[[Path], bytes]
"""How grants.toml's bytes are read: :func:`read_grants_bytes`, or a test's."""

read_grants_bytes: GrantsReader = functools.partial(read_regular_file, limit=MAX_GRANTS_BYTES)
"""At most one byte over :data:`MAX_GRANTS_BYTES`, so "too large" is known without
reading more."""


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
    data: bytes | None = None
    """The bytes read (``digest`` is their SHA-256), None when none could be used."""

    @property
    def text(self) -> str | None:
        """The file's text, when it was read and is UTF-8 (``bxctl grants`` shows a
        grant's own lines from it)."""
        if self.data is None:
            return None
        try:
            return self.data.decode("utf-8")
        except UnicodeDecodeError:
            return None


def read_grants(path: Path, read: GrantsReader = read_grants_bytes) -> GrantsRead:
    """The grant set in ``path``, or the one problem that makes it invalid; never raises.

    A missing or unreadable file is a problem too: the owner meant some grants to be
    there, and with none known the only safe answer is to deny (``grants_invalid``). So is
    anything but a regular file (a FIFO, a symlink: see boxmaker.home.regular_file).
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
    if len(data) > MAX_GRANTS_BYTES:
        problem = GrantsProblem(str(path), None, None, f"larger than {MAX_GRANTS_BYTES} bytes")
        return GrantsRead(problem, "too large", cacheable=True)
    digest = hashlib.sha256(data).hexdigest()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        problem = GrantsProblem(str(path), None, None, "not UTF-8")
        return GrantsRead(problem, digest, cacheable=True, data=data)
    return GrantsRead(parse_grants(text, str(path)), digest, cacheable=True, data=data)


def load_grants(path: Path) -> GrantSet | GrantsProblem:
    """What grants.toml says now (:func:`read_grants`' value)."""
    return read_grants(path).value
