"""The MCP tool definitions the owner accepted, and how a server's tools compare with
them (docs/mcp.md, "MCP servers through brokerd"; docs/runbook.md#mcp-pin).

``state/mcp_pins.json`` (0600, replaced atomically by ``bxctl mcp pin``) holds, for each
server, each accepted tool's whole definition (name, title, description, input and
output schema, annotations, as the server sent them) and its hash: brokerd offers a
pinned tool before its server has started, from the pin alone, and compares the
definition the server lists at each start with it. :func:`compare` is the rule: a tool
whose hash matches its pin is accepted; one without a pin is not pinned; one whose hash
differs (a changed description, schema or annotation: a "rug pull") is changed; a pinned
tool the server no longer lists is removed. Only an accepted tool is ever called.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import orjson

from boxmaker.core.external_tools import RUNBOOK_MCP_PIN, SERVER_NAME, definition_hash
from boxmaker.home.file_ops import write_atomically
from boxmaker.home.regular_file import NotRegularFile, read_regular_file


class PinsError(Exception):
    """mcp_pins.json cannot be used; the message says why and where to look."""


@attrs.frozen
class Pin:
    """One accepted tool: its definition and that definition's hash."""

    definition: Mapping[str, Any]
    sha256: str

    @classmethod
    def of(cls, definition: Mapping[str, Any]) -> Pin:
        return cls(dict(definition), definition_hash(definition))


Pins = Mapping[str, Mapping[str, Pin]]
"""Server -> tool -> pin."""


class ToolStatus(enum.StrEnum):
    ACCEPTED = "accepted"
    NOT_PINNED = "not pinned"
    CHANGED = "changed"
    REMOVED = "removed"


def compare(
    pinned: Mapping[str, Pin], live: Mapping[str, Mapping[str, Any]] | None
) -> dict[str, ToolStatus]:
    """Each tool's status: ``live`` is the server's definitions by name (None when the
    server has not listed them yet: every pin then stands as accepted).

    >>> pin = Pin.of({"name": "a", "description": "x"})
    >>> compare({"a": pin}, None)
    {'a': <ToolStatus.ACCEPTED: 'accepted'>}
    >>> compare({"a": pin}, {"a": {"name": "a", "description": "y"}, "b": {"name": "b"}})
    {'a': <ToolStatus.CHANGED: 'changed'>, 'b': <ToolStatus.NOT_PINNED: 'not pinned'>}
    >>> compare({"a": pin}, {})
    {'a': <ToolStatus.REMOVED: 'removed'>}
    """
    if live is None:
        return dict.fromkeys(pinned, ToolStatus.ACCEPTED)
    found: dict[str, ToolStatus] = {}
    for name, definition in live.items():
        pin = pinned.get(name)
        if pin is None:
            found[name] = ToolStatus.NOT_PINNED
        elif definition_hash(definition) == pin.sha256:
            found[name] = ToolStatus.ACCEPTED
        else:
            found[name] = ToolStatus.CHANGED
    for name in pinned:
        found.setdefault(name, ToolStatus.REMOVED)
    return found


def _problem(path: Path, what: str) -> PinsError:
    return PinsError(f"{path}: {what}; see {RUNBOOK_MCP_PIN}")


def read_pins(path: Path) -> dict[str, dict[str, Pin]]:
    """The pins file; a missing one is no pins. Raises :class:`PinsError`: a pin whose
    hash is not its definition's is refused, not trusted. Blocking."""
    try:
        data = read_regular_file(path)
    except FileNotFoundError:
        return {}
    except (NotRegularFile, OSError) as exc:
        raise _problem(path, f"cannot read it ({exc.strerror})") from None
    try:
        raw = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise _problem(path, f"not JSON ({exc})") from None
    servers = raw.get("servers") if isinstance(raw, dict) else None
    if not isinstance(servers, dict):
        raise _problem(path, 'expected {"servers": {SERVER: {TOOL: PIN}}}')
    pins: dict[str, dict[str, Pin]] = {}
    for server, tools in servers.items():
        if not SERVER_NAME.fullmatch(server) or not isinstance(tools, dict):
            raise _problem(path, f"{server!r}: not a server's pins")
        pins[server] = {}
        for name, entry in tools.items():
            definition = entry.get("definition") if isinstance(entry, dict) else None
            if not isinstance(definition, dict) or definition.get("name") != name:
                raise _problem(path, f"{server}.{name}: not a tool's definition")
            pin = Pin.of(definition)
            if entry.get("sha256") != pin.sha256:
                raise _problem(path, f"{server}.{name}: its sha256 is not its definition's")
            pins[server][name] = pin
    return pins


def write_pins(path: Path, pins: Pins) -> None:
    """Replace the pins file (0600, atomically). Blocking."""
    servers = {
        server: {
            name: {"definition": dict(pin.definition), "sha256": pin.sha256}
            for name, pin in sorted(tools.items())
        }
        for server, tools in sorted(pins.items())
        if tools
    }
    data = orjson.dumps({"servers": servers}, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
    write_atomically(path, data + b"\n", mode=0o600)
