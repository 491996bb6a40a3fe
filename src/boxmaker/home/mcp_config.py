"""config.toml's ``[mcp_servers.NAME]`` (docs/mcp.md, "MCP servers through brokerd";
docs/runbook.md#mcp-servers).

The keys of Codex CLI's entries (``command``, ``args``, ``env``), so an owner's existing
entries carry over, and boxmaker's own: ``env_pass`` (names whose values are passed from
brokerd's environment), ``read_only_paths`` and ``writable_paths`` (what the server's
sandbox shows of the host), ``label`` (what its results raise a session's state by) and
the two timeouts. :func:`check_server_paths` places the paths against the home and the
workspace once config.toml is read (home/config.py calls it).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import attrs

from boxmaker.core.external_tools import SERVER_NAME
from boxmaker.core.labels import Label, Taint
from boxmaker.formats.convert import InvalidField

RUNBOOK_MCP_SERVERS: Final = "docs/runbook.md#mcp-servers"
ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
UNTRUSTED: Final = "untrusted"
LABELS: Final[Mapping[str, Label]] = {
    UNTRUSTED: Label(Taint.INTERNAL, True),
    **{taint.value: Label(taint, False) for taint in Taint},
    **{f"{taint.value}+{UNTRUSTED}": Label(taint, True) for taint in Taint},
}
"""``label``'s values. ``untrusted`` alone is internal and untrusted: a server may read
what the workspace holds (internal), and what it answers is not the owner's word."""


def _argv_part(_: Any, attribute: attrs.Attribute[Any], value: str) -> None:
    if not value or "\0" in value:
        raise InvalidField(attribute.name, "expected a non-empty string without NUL")


def _program(_: Any, attribute: attrs.Attribute[Any], value: str) -> None:
    _argv_part(_, attribute, value)
    if "/" in value and not value.startswith("/"):
        raise InvalidField(
            attribute.name,
            "the program is an absolute path or a bare name looked up on the sandbox's PATH",
        )


def _args(_: Any, attribute: attrs.Attribute[Any], value: tuple[str, ...]) -> None:
    if any("\0" in part for part in value):
        raise InvalidField(attribute.name, "an argument holds a NUL")


def _env(_: Any, attribute: attrs.Attribute[Any], value: Mapping[str, str]) -> None:
    for name, text in value.items():
        if not ENV_NAME.fullmatch(name) or "\0" in text:
            raise InvalidField(attribute.name, f"{name!r}: not an environment variable's name")


def _env_names(_: Any, attribute: attrs.Attribute[Any], value: tuple[str, ...]) -> None:
    for name in value:
        if not ENV_NAME.fullmatch(name):
            raise InvalidField(attribute.name, f"{name!r}: not an environment variable's name")


def _paths(_: Any, attribute: attrs.Attribute[Any], value: tuple[str, ...]) -> None:
    for path in value:
        if not path or "\0" in path:
            raise InvalidField(attribute.name, "expected non-empty paths")


def _label(_: Any, attribute: attrs.Attribute[Any], value: str) -> None:
    if value not in LABELS:
        raise InvalidField(attribute.name, f"expected one of {', '.join(LABELS)}")


def _timeout(_: Any, attribute: attrs.Attribute[Any], value: float) -> None:
    if not 0 < value <= 3600:
        raise InvalidField(attribute.name, "expected seconds above 0, at most 3600")


@attrs.frozen(kw_only=True)
class McpServerConfig:
    """One ``[mcp_servers.NAME]`` table. Paths are as written until
    :func:`check_server_paths` makes them absolute."""

    command: str = attrs.field(validator=_program)
    args: tuple[str, ...] = attrs.field(default=(), validator=_args)
    env: Mapping[str, str] = attrs.field(factory=dict, validator=_env)
    """Set in the server's environment as given (after ``env_pass``'s)."""
    env_pass: tuple[str, ...] = attrs.field(default=(), validator=_env_names)
    """Names whose values brokerd passes from its own environment (the owner's) when set."""
    read_only_paths: tuple[str, ...] = attrs.field(default=(), validator=_paths)
    """Shown read-only in the sandbox at their own path: anywhere but the home."""
    writable_paths: tuple[str, ...] = attrs.field(default=(), validator=_paths)
    """Shown writable at their own path: inside the workspace only."""
    label: str = attrs.field(default=UNTRUSTED, validator=_label)
    startup_timeout_s: float = attrs.field(default=30.0, validator=_timeout)
    """Seconds from the start to the end of ``tools/list``."""
    call_timeout_s: float = attrs.field(default=60.0, validator=_timeout)
    """Seconds a ``tools/call`` may take."""

    @property
    def result_label(self) -> Label:
        return LABELS[self.label]


def _placed(workspace: Path, written: str) -> Path:
    return Path(os.path.normpath(workspace / Path(written).expanduser()))


def check_server_paths(
    name: str,
    server: McpServerConfig,
    *,
    workspace: Path,
    home_problem: Any,
) -> tuple[McpServerConfig, list[str]]:
    """``server`` with its paths absolute (a relative one is relative to the workspace),
    and the problems found: a bad name, a writable path outside the workspace, any
    path that is the home or holds it (``home_problem(path)`` says why, as for the
    workspace). The real path is checked again at each start (mcp/gateway_launch.py)."""
    where = f"[mcp_servers.{name}]"
    found: list[str] = []
    if not SERVER_NAME.fullmatch(name):
        found.append(
            f"{where}: the name must match [a-z0-9][a-z0-9_-]{{0,62}} (it becomes the "
            f"tools' names mcp.{name}.TOOL); see {RUNBOOK_MCP_SERVERS}"
        )
    placed: dict[str, tuple[str, ...]] = {}
    for key in ("read_only_paths", "writable_paths"):
        paths = tuple(_placed(workspace, path) for path in getattr(server, key))
        for path in paths:
            problem = home_problem(path)
            if problem is not None:
                found.append(f"{where} {key}: {path}: {problem}; see {RUNBOOK_MCP_SERVERS}")
            elif key == "writable_paths" and not path.is_relative_to(workspace):
                found.append(
                    f"{where} {key}: {path}: outside the workspace {workspace} (a path "
                    f"outside it may only be read: read_only_paths); see {RUNBOOK_MCP_SERVERS}"
                )
        placed[key] = tuple(str(path) for path in paths)
    return attrs.evolve(
        server,
        read_only_paths=placed["read_only_paths"],
        writable_paths=placed["writable_paths"],
    ), found
