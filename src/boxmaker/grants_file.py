"""Reading grants.toml from disk (docs/runbook.md#grants). The parsing itself is pure
(core.grants)."""

from __future__ import annotations

from pathlib import Path

from boxmaker.core.grants import GrantSet, GrantsProblem, parse_grants
from boxmaker.regular_file import NotRegularFile, read_regular_file


def load_grants(path: Path) -> GrantSet | GrantsProblem:
    """The grant set in ``path``, or the one problem that makes it invalid; never raises.

    A missing or unreadable file is a problem too: the owner meant some grants to be
    there, and with none known the only safe answer is to deny (``grants_invalid``). So is
    anything but a regular file (a FIFO, a symlink: see boxmaker.regular_file).
    """
    try:
        data = read_regular_file(path)
    except FileNotFoundError:
        return GrantsProblem(str(path), None, None, "no such file (`bxctl init` creates it)")
    except NotRegularFile as exc:
        return GrantsProblem(str(path), None, None, str(exc.strerror))
    except OSError as exc:
        return GrantsProblem(str(path), None, None, f"cannot read it ({exc.strerror})")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return GrantsProblem(str(path), None, None, "not UTF-8")
    return parse_grants(text, str(path))
