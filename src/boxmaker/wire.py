"""Frames on the sockets (spec §6.1, §7), the one cattrs converter, and id formats.

Every JSON or TOML document that enters or leaves boxmaker goes through ``converter``:
frames, config.toml, grants.toml, state files, ledger records.
"""

from __future__ import annotations

import re
import secrets

from cattrs.preconf.orjson import make_converter

converter = make_converter(forbid_extra_keys=True)
"""The one converter (STYLE: cattrs' orjson preconf, extra keys are errors)."""

CALL_ID = re.compile(r"c-[0-9a-f]{16}")
SESSION_ID = re.compile(r"s-[0-9a-f]{12}")
APPROVAL_ID = re.compile(r"a-[0-9a-f]{8}")


def new_call_id() -> str:
    """A fresh call id, ``c-`` + 16 hex (spec §6.1).

    >>> bool(CALL_ID.fullmatch(new_call_id()))
    True
    """
    return "c-" + secrets.token_hex(8)


def new_session_id() -> str:
    """A fresh session id, ``s-`` + 12 hex.

    >>> bool(SESSION_ID.fullmatch(new_session_id()))
    True
    """
    return "s-" + secrets.token_hex(6)


def new_approval_id() -> str:
    """A fresh approval id, ``a-`` + 8 hex.

    >>> bool(APPROVAL_ID.fullmatch(new_approval_id()))
    True
    """
    return "a-" + secrets.token_hex(4)
