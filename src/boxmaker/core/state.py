"""The session state file's format (docs/decisions.md, "Session state"). Pure: bytes in, values out.

``{"v": 1, "taint": "public", "untrusted": false}`` — exactly these keys, these types.
"""

from __future__ import annotations

from typing import Final

import attrs
import orjson

from boxmaker.core.labels import Label, Taint

STATE_VERSION: Final = 1
RUNBOOK_STATE: Final = "docs/runbook.md#state"
_KEYS: Final = frozenset({"v", "taint", "untrusted"})


@attrs.frozen
class StateUnreadable:
    """Why a session's state cannot be known (a ``state_unreadable`` denial)."""

    detail: str


def parse_state(data: bytes) -> Label | StateUnreadable:
    """The label a state file holds, or why it is unreadable; never raises.

    >>> parse_state(b'{"v": 1, "taint": "internal", "untrusted": true}')
    Label(taint=<Taint.INTERNAL: 'internal'>, untrusted=True)
    >>> parse_state(b'{"v": 2, "taint": "internal", "untrusted": true}')
    StateUnreadable(detail='unknown version 2 (expected 1)')
    >>> parse_state(b'{"v": 1, "taint": "top", "untrusted": false}')
    StateUnreadable(detail="unknown taint 'top'")
    """
    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        return StateUnreadable(f"bad JSON: {exc}")
    if not isinstance(document, dict):
        return StateUnreadable("expected a JSON object")
    if document.keys() != _KEYS:
        found = ", ".join(sorted(document))
        return StateUnreadable(f"expected the keys taint, untrusted, v; found: {found[:200]}")
    version = document["v"]
    # bool is an int in Python; JSON's true is not a version.
    if type(version) is not int or version != STATE_VERSION:
        return StateUnreadable(f"unknown version {str(version)[:40]} (expected {STATE_VERSION})")
    taint = document["taint"]
    if not isinstance(taint, str) or taint not in Taint.__members__.values():
        return StateUnreadable(f"unknown taint {str(taint)[:40]!r}")
    untrusted = document["untrusted"]
    if not isinstance(untrusted, bool):
        return StateUnreadable("untrusted must be true or false")
    return Label(Taint(taint), untrusted)


def encode_state(label: Label) -> bytes:
    """The bytes of a state file (with a final newline).

    >>> encode_state(Label(Taint.SECRET, False))
    b'{"v":1,"taint":"secret","untrusted":false}\\n'
    >>> parse_state(encode_state(Label(Taint.SECRET, True)))
    Label(taint=<Taint.SECRET: 'secret'>, untrusted=True)
    """
    document = {"v": STATE_VERSION, "taint": label.taint.value, "untrusted": label.untrusted}
    return orjson.dumps(document, option=orjson.OPT_APPEND_NEWLINE)
