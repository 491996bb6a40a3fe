"""Tools brokerd decides but does not implement: an MCP server's (``mcp.<server>.<tool>``)
and an MCP client's own, asked through its permission prompt (``claude.<Name>``). Pure.

The names (docs/protocol.md, "Tool names"):

- ``mcp.<server>.<tool>``: ``<server>`` matches ``[a-z0-9][a-z0-9_-]{0,62}`` and
  ``<tool>`` ``[A-Za-z0-9_-]{1,64}`` (ASCII only: a look-alike letter is another name);
- ``claude.<Name>``: ``<Name>`` matches ``[A-Za-z0-9_-]{1,64}``.

A grant's ``tool`` names one such tool exactly, or a family: ``mcp.<server>.*`` (one
server's), ``mcp.*`` (every server's) or ``claude.*``; nothing else with a dot.

The gateway (brokerd's port, :mod:`boxmaker.broker.mcp_port`) gives core an
:data:`ExternalCatalogue`, replaced whole when a server's tools change: each
:class:`ExternalTool` with its pinned :func:`definition_hash` and its
:class:`ToolState`. An ``mcp.*`` tool that is not in it does not exist for the model.

The arguments of an external tool are a JSON object at most :data:`MAX_ARGUMENT_BYTES`
of canonical JSON (:func:`canonical_json`) and :data:`MAX_NESTING` deep
(:func:`json_problem`), so that no argument makes checking or matching it slow.
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
import types
from collections.abc import Mapping
from typing import Any, Final

import attrs
import jsonschema
import jsonschema.exceptions
import jsonschema.protocols
import jsonschema.validators
import referencing

from boxmaker.core.labels import FRESH, Label, Taint

MCP_PREFIX: Final = "mcp."
CLAUDE_PREFIX: Final = "claude."
SERVER_NAME: Final = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
"""An MCP server's name in config.toml's ``[mcp_servers.NAME]`` and in its tools' names."""
TOOL_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""A server's own tool name, and a client tool's ``<Name>``, as a name can carry them."""
_MCP_NAME: Final = re.compile(r"mcp\.([a-z0-9][a-z0-9_-]{0,62})\.([A-Za-z0-9_-]{1,64})")
_CLAUDE_NAME: Final = re.compile(r"claude\.([A-Za-z0-9_-]{1,64})")
_MCP_FAMILY: Final = re.compile(r"mcp\.([a-z0-9][a-z0-9_-]{0,62})\.\*")
_FAMILIES: Final = frozenset({"mcp.*", "claude.*"})

MAX_ARGUMENT_BYTES: Final = 1024 * 1024
"""The cap on an external tool's arguments, in bytes of canonical JSON (UTF-8)."""
MAX_NESTING: Final = 32
"""How deep an external tool's arguments may nest (the object itself is depth 1)."""

DEFINITION_KEYS: Final = (
    "name",
    "title",
    "description",
    "inputSchema",
    "outputSchema",
    "annotations",
)
"""The keys of an MCP ``tools/list`` entry that make its definition (what is pinned)."""


class ToolState(enum.StrEnum):
    """Where an ``mcp.*`` tool stands with the owner's pins."""

    ACCEPTED = "accepted"
    """Pinned, and its definition is the pinned one."""
    NOT_PINNED = "not_pinned"
    """Offered by its server, never accepted by the owner (new, or renamed)."""
    CHANGED = "changed"
    """Pinned, but its server now describes it differently."""


def _no_remote_registry() -> referencing.Registry[Any]:
    # jsonschema's default registry fetches a remote ``$ref`` over the network (with a
    # DeprecationWarning): a server's schema must never make brokerd connect anywhere.
    return referencing.Registry()


def _compile_schema(schema: Mapping[str, Any]) -> jsonschema.protocols.Validator | str:
    """A validator of ``schema`` (Draft 2020-12 unless its ``$schema`` says otherwise), or
    why the schema itself is invalid."""
    try:
        if not isinstance(schema, Mapping):
            return "it is not a JSON object"
        # Without the default, validator_for takes the latest draft, 2020-12 too: its
        # mutant is equivalent.
        default = jsonschema.validators.Draft202012Validator
        cls = jsonschema.validators.validator_for(schema, default=default)  # pragma: no mutate
        raw = dict(schema)
        cls.check_schema(raw)
        return cls(raw, registry=_no_remote_registry())
    except jsonschema.exceptions.SchemaError as exc:
        return f"{exc.message[:200]}"
    except (RecursionError, ValueError, TypeError, LookupError) as exc:
        return f"{type(exc).__name__}"


@attrs.frozen
class ExternalTool:
    """One external tool as the gateway (or the permission prompt) describes it."""

    name: str
    """``mcp.<server>.<tool>`` or ``claude.<Name>``."""
    description: str
    """As the server gave it (escape it wherever it is shown)."""
    input_schema: Mapping[str, Any]
    """The JSON schema of its arguments (``{}`` for ``claude.*``: any object)."""
    label: Label
    """What its result raises the session's state by."""
    definition: str | None = None
    """SHA-256 (hex) of the canonical definition (:func:`definition_hash`; ``mcp.*``)."""
    read_only: bool = False
    """The server's ``readOnlyHint``: for display ONLY, it never grants anything."""
    state: ToolState = ToolState.ACCEPTED
    _validator: jsonschema.protocols.Validator | str = attrs.field(init=False, eq=False, repr=False)

    # Compiled once, when the catalogue is built, not once a call.
    @_validator.default
    def _compile(self) -> jsonschema.protocols.Validator | str:
        return _compile_schema(self.input_schema)

    @property
    def server(self) -> str | None:
        """The server of an ``mcp.*`` tool, else None.

        >>> ExternalTool("mcp.git.git_log", "", {}, FRESH).server
        'git'
        """
        return server_of(self.name)

    def schema_problem(self, arguments: Mapping[str, Any]) -> str | None:
        """Why ``arguments`` do not fit :attr:`input_schema`, or None.

        >>> tool = ExternalTool("mcp.git.log", "", {"type": "object", "required": ["n"]}, FRESH)
        >>> tool.schema_problem({}), tool.schema_problem({"n": 1})
        ("arguments: 'n' is a required property", None)
        """
        validator = self._validator
        if isinstance(validator, str):
            return f"the tool's input schema is invalid: {validator}"
        try:
            error = jsonschema.exceptions.best_match(validator.iter_errors(arguments))
        except Exception as exc:  # a $ref that does not resolve, a bad regex, deep recursion
            return f"the tool's input schema cannot be applied: {type(exc).__name__}"
        if error is None:
            return None
        where = "".join(f"[{step!r}]" for step in error.absolute_path)
        return f"arguments{where}: {error.message[:300]}"


ExternalCatalogue = Mapping[str, ExternalTool]
"""Name → tool: the external tools brokerd knows now (immutable, replaced whole)."""

EMPTY_CATALOGUE: Final[ExternalCatalogue] = types.MappingProxyType({})
"""No external tools: brokerd without ``[mcp_servers]``."""


def claude_tool(name: str) -> ExternalTool:
    """The tool a client's permission prompt asks about: any JSON object as arguments,
    nothing pinned, and no label (its result never passes brokerd: docs/threat-model.md).

    >>> claude_tool("claude.Bash").label == FRESH
    True
    """
    return ExternalTool(name, "", {}, FRESH)


ASSUMED_LABEL: Final = Label(Taint.PUBLIC, True)
"""What bxctl assumes an ``mcp.*`` tool's result is when it cannot ask the gateway."""


def assumed_catalogue(name: str) -> ExternalCatalogue:
    """bxctl's stand-in for the gateway, which it cannot ask: the one ``mcp.*`` tool
    ``name`` taken as accepted, any JSON object as its arguments, no definition. For
    predictions (``grants test``, what-if, approve-always's confirmation) only: brokerd
    decides on the gateway's own catalogue. Empty for any other name.

    >>> list(assumed_catalogue("mcp.git.log")), dict(assumed_catalogue("mcp.git"))
    (['mcp.git.log'], {})
    """
    if not is_mcp_name(name):
        return EMPTY_CATALOGUE
    return {name: ExternalTool(name, "", {}, ASSUMED_LABEL)}


def canonical_json(value: object) -> str:
    """The one JSON form of ``value``: sorted keys, no spaces, not ASCII-escaped.

    >>> canonical_json({"b": [1, "é"], "a": None})
    '{"a":null,"b":[1,"é"]}'
    """
    # False and None mean alike to json.dumps: mutants of the two flags are equivalent.
    return json.dumps(
        value,
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,  # pragma: no mutate
        allow_nan=False,  # pragma: no mutate
    )


def definition_hash(tool: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the canonical JSON of an MCP ``tools/list`` entry's definition
    (:data:`DEFINITION_KEYS`, as the server sent them, missing keys left out).

    >>> definition_hash({"name": "x", "inputSchema": {}}) == definition_hash(
    ...     {"inputSchema": {}, "name": "x", "_meta": {"ignored": True}})
    True
    >>> definition_hash({"name": "x"}) == definition_hash({"name": "x", "title": None})
    False
    """
    definition = {key: tool[key] for key in DEFINITION_KEYS if key in tool}
    codec = "utf-8"  # pragma: no mutate - "UTF-8" is the same codec
    return hashlib.sha256(canonical_json(definition).encode(codec, "surrogatepass")).hexdigest()


def is_external(name: str) -> bool:
    """Does ``name`` claim to be an external tool (whether or not it is a valid one)?

    >>> is_external("mcp.git.log"), is_external("claude."), is_external("read_file")
    (True, True, False)
    """
    return name.startswith((MCP_PREFIX, CLAUDE_PREFIX))


def is_mcp_name(name: str) -> bool:
    """Is ``name`` a valid ``mcp.<server>.<tool>``?

    >>> is_mcp_name("mcp.git.git_log"), is_mcp_name("mcp.git.*"), is_mcp_name("mcp.Git.x")
    (True, False, False)
    """
    return _MCP_NAME.fullmatch(name) is not None


def is_claude_name(name: str) -> bool:
    """Is ``name`` a valid ``claude.<Name>``?

    >>> is_claude_name("claude.Bash"), is_claude_name("claude."), is_claude_name("claude.*")
    (True, False, False)
    """
    return _CLAUDE_NAME.fullmatch(name) is not None


def mcp_name(server: str, tool: str) -> str | None:
    """The name the model sees for ``server``'s tool ``tool``, or None when either cannot
    be part of a name (the gateway then never offers the tool).

    >>> mcp_name("git", "git_status"), mcp_name("git", "git status"), mcp_name("Git", "x")
    ('mcp.git.git_status', None, None)
    """
    if SERVER_NAME.fullmatch(server) is None or TOOL_NAME.fullmatch(tool) is None:
        return None
    return f"{MCP_PREFIX}{server}.{tool}"


def server_of(name: str) -> str | None:
    """The server of a valid ``mcp.*`` name, else None.

    >>> server_of("mcp.git.git_log"), server_of("claude.Bash"), server_of("mcp.git")
    ('git', None, None)
    """
    found = _MCP_NAME.fullmatch(name)
    return found.group(1) if found else None


def is_tool_pattern(pattern: str) -> bool:
    """Can a grant's ``tool`` say ``pattern`` for external tools: one tool's exact name,
    ``mcp.<server>.*``, ``mcp.*`` or ``claude.*``?

    >>> [is_tool_pattern(p) for p in ("mcp.*", "mcp.git.*", "claude.*", "mcp.git.x")]
    [True, True, True, True]
    >>> [is_tool_pattern(p) for p in ("mcp.git", "mcp.*.x", "claude.B*", "*", "mcp.g*.x")]
    [False, False, False, False, False]
    """
    return (
        pattern in _FAMILIES
        or _MCP_FAMILY.fullmatch(pattern) is not None
        or is_mcp_name(pattern)
        or is_claude_name(pattern)
    )


def tool_patterns(name: str) -> tuple[str, ...]:
    """Every grant ``tool`` that covers the external tool ``name`` (a valid name), most
    exact first; () for any other name.

    >>> tool_patterns("mcp.git.log"), tool_patterns("claude.Bash"), tool_patterns("shell")
    (('mcp.git.log', 'mcp.git.*', 'mcp.*'), ('claude.Bash', 'claude.*'), ())
    """
    found = _MCP_NAME.fullmatch(name)
    if found is not None:
        return (name, f"{MCP_PREFIX}{found.group(1)}.*", "mcp.*")
    if is_claude_name(name):
        return (name, "claude.*")
    return ()


def json_problem(arguments: object) -> str | None:
    """Why ``arguments`` are not an external tool's arguments: a JSON object (string
    keys; strings, numbers, booleans, null, arrays and objects inside) at most
    :data:`MAX_NESTING` deep and :data:`MAX_ARGUMENT_BYTES` of canonical JSON; or None.

    The walk is iterative and stops at the first level too deep, so a value nested
    10,000 deep costs 33 steps down, not a recursion error.

    >>> json_problem({"a": [1, {"b": None}]}) is None
    True
    >>> json_problem([1])
    'arguments must be a JSON object'
    >>> json_problem({"x": float("nan")})
    'arguments are not JSON: Out of range float values are not JSON compliant'
    >>> json_problem({"x": {1: 2}})
    'arguments must be a JSON object (its keys strings)'
    """
    if not isinstance(arguments, Mapping):
        return "arguments must be a JSON object"
    stack: list[tuple[object, int]] = [(arguments, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, Mapping):
            children: Any = value.values()
            if not all(isinstance(key, str) for key in value):
                return "arguments must be a JSON object (its keys strings)"
        elif isinstance(value, list):
            children = value
        elif value is None or isinstance(value, str | int | float):
            continue
        else:
            return f"arguments are not JSON: a {type(value).__name__}"
        if depth > MAX_NESTING:
            return f"arguments nest deeper than {MAX_NESTING} levels"
        stack.extend((child, depth + 1) for child in children)
    try:
        text = canonical_json(arguments)
    except (ValueError, TypeError) as exc:
        return f"arguments are not JSON: {exc}"
    if len(text.encode("utf-8", "surrogatepass")) > MAX_ARGUMENT_BYTES:
        return f"arguments are over {MAX_ARGUMENT_BYTES} bytes of JSON"
    return None


def not_pinned_detail(name: str, state: ToolState) -> str:
    """The detail of ``tool_not_pinned`` / ``tool_changed``: what is wrong and the command
    that shows and accepts it (docs/runbook.md#mcp-pin).

    >>> print(not_pinned_detail("mcp.git.git_log", ToolState.NOT_PINNED))
    mcp.git.git_log is not pinned: run `bxctl mcp pin git git_log`; see docs/runbook.md#mcp-pin
    >>> print(not_pinned_detail("mcp.git.git_log", ToolState.CHANGED)[:60])
    mcp.git.git_log: its definition changed since it was pinned:
    """
    # A valid name holds no other dot: partition and rpartition agree.
    server, _, tool = name[len(MCP_PREFIX) :].partition(".")  # pragma: no mutate
    advice = f"run `bxctl mcp pin {server} {tool}`; see {RUNBOOK_MCP_PIN}"
    if state is ToolState.CHANGED:
        return f"{name}: its definition changed since it was pinned: {advice}"
    return f"{name} is not pinned: {advice}"


RUNBOOK_MCP_PIN: Final = "docs/runbook.md#mcp-pin"
