"""``bxctl mcp import FILE``: MCP server entries from another agent's configuration into
config.toml's ``[mcp_servers]`` (docs/mcp.md, "MCP servers through brokerd").

Two sources: a Claude Code or Claude Desktop JSON file (``{"mcpServers": {NAME: {command,
args, env}}}``: ``.mcp.json``, ``claude_desktop_config.json``) and a Codex CLI
config.toml (``[mcp_servers.NAME]``). Only servers run over stdio can run in a sandbox: an
entry with a ``url`` is left out, and said so. Codex's ``startup_timeout_sec`` (or
``_ms``) and ``tool_timeout_sec`` become ``startup_timeout_s`` and ``call_timeout_s``; a
disabled entry is left out; any other key is dropped, and said so. The entries are written
with tomlkit, so config.toml keeps its comments and layout, and the new text must pass
:func:`~boxmaker.home.config.parse_config` before it replaces the file (atomically, 0600).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import attrs
import orjson
import tomlkit
import tomlkit.exceptions

from boxmaker.core.external_tools import SERVER_NAME
from boxmaker.home.config import ConfigError, parse_config
from boxmaker.home.file_ops import write_atomically
from boxmaker.home.mcp_config import RUNBOOK_MCP_SERVERS
from boxmaker.home.paths import Home
from boxmaker.home.regular_file import NotRegularFile, read_regular_file

KEPT_KEYS: Final = ("command", "args", "env")
CODEX_TIMEOUTS: Final = {
    "startup_timeout_sec": "startup_timeout_s",
    "tool_timeout_sec": "call_timeout_s",
}
IGNORED_KEYS: Final = frozenset({"type", "enabled", "startup_timeout_ms"})


class McpImportError(Exception):
    """The file cannot be imported; the message says why."""


@attrs.frozen
class Imported:
    """What a file gave: the entries to write, by name, and what was left out, in words."""

    entries: dict[str, dict[str, Any]]
    notes: tuple[str, ...]


def server_name(name: str) -> str | None:
    """A name as config.toml takes it: lower case, other characters as ``-``.

    >>> server_name("GitHub Server"), server_name("git"), server_name("---")
    ('github-server', 'git', None)
    """
    lowered = re.sub(r"[^a-z0-9_-]+", "-", name.lower()).strip("-_")
    return lowered if SERVER_NAME.fullmatch(lowered) else None


def _entry(name: str, raw: Mapping[str, Any], notes: list[str]) -> dict[str, Any] | None:
    if "url" in raw or raw.get("type") in ("http", "sse", "streamable-http"):
        notes.append(f"{name}: left out: only a server run over stdio can run in a sandbox")
        return None
    if raw.get("enabled") is False:
        notes.append(f"{name}: left out: disabled")
        return None
    if not isinstance(raw.get("command"), str):
        notes.append(f"{name}: left out: no command")
        return None
    entry: dict[str, Any] = {key: raw[key] for key in KEPT_KEYS if key in raw}
    for codex, ours in CODEX_TIMEOUTS.items():
        if codex in raw:
            entry[ours] = raw[codex]
    if "startup_timeout_ms" in raw and "startup_timeout_s" not in entry:
        entry["startup_timeout_s"] = raw["startup_timeout_ms"] / 1000
    dropped = sorted(set(raw) - set(KEPT_KEYS) - set(CODEX_TIMEOUTS) - IGNORED_KEYS)
    if dropped:
        notes.append(f"{name}: dropped {', '.join(dropped)} (boxmaker has no such key)")
    return entry


def read_servers(path: Path) -> Imported:
    """The stdio servers of a Claude JSON file or a Codex TOML file. Raises
    :class:`McpImportError`. Blocking."""
    try:
        data = read_regular_file(path)
        text = data.decode("utf-8")
    except (NotRegularFile, OSError) as exc:
        raise McpImportError(f"{path}: cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise McpImportError(f"{path}: not UTF-8") from None
    raw: Any
    try:
        raw = orjson.loads(text)
        servers = raw.get("mcpServers") if isinstance(raw, dict) else None
        where = '"mcpServers"'
    except orjson.JSONDecodeError:
        try:
            raw = tomllib.loads(text)
        except tomllib.TOMLDecodeError:
            raise McpImportError(f"{path}: neither JSON nor TOML") from None
        servers = raw.get("mcp_servers")
        where = "[mcp_servers]"
    if not isinstance(servers, dict):
        raise McpImportError(f"{path}: no {where} object of servers in it")
    entries: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    for given, entry in servers.items():
        name = server_name(str(given))
        if name is None or not isinstance(entry, dict):
            notes.append(f"{given!r}: left out: not a server's name or entry")
            continue
        if name != given:
            notes.append(f"{given!r}: imported as {name}")
        made = _entry(name, entry, notes)
        if made is not None:
            entries[name] = made
    return Imported(entries, tuple(notes))


def add_servers(home: Home, entries: Mapping[str, Mapping[str, Any]], *, replace: bool) -> None:
    """Write ``entries`` into config.toml's ``[mcp_servers]``. An existing name is
    refused unless ``replace``. Raises :class:`McpImportError` (with the config's own
    problems when the result would not load). Blocking."""
    path = home.config_toml
    try:
        text = read_regular_file(path).decode("utf-8")
    except FileNotFoundError:
        text = ""
    except (NotRegularFile, OSError) as exc:
        raise McpImportError(f"{path}: cannot read it ({exc.strerror})") from None
    try:
        document = tomlkit.parse(text)
    except tomlkit.exceptions.TOMLKitError as exc:
        raise McpImportError(f"{path}: TOML syntax: {exc}") from None
    servers = document.get("mcp_servers")
    if servers is None:
        servers = tomlkit.table(is_super_table=True)
        document["mcp_servers"] = servers
    taken = sorted(name for name in entries if name in servers)
    if taken and not replace:
        raise McpImportError(
            f"config.toml already has [mcp_servers] {', '.join(taken)}: "
            "give --replace to overwrite them"
        )
    for name, entry in entries.items():
        table = tomlkit.table()
        for key, value in entry.items():
            table[key] = value
        servers[name] = table
    new = tomlkit.dumps(document)
    try:
        parse_config(new, home)
    except ConfigError as exc:
        lines = "\n".join(exc.problems)
        raise McpImportError(
            f"the entries would not load:\n{lines}\nsee {RUNBOOK_MCP_SERVERS}"
        ) from None
    write_atomically(path, new.encode(), mode=0o600)
