"""The tool catalogue: argument shapes, the served JSON schemas, and checking.

The JSON schema served to the model by the ``catalogue`` frame is the schema that
:func:`check_arguments` enforces (step 4 of docs/architecture.md's pipeline), then the few
rules a schema cannot say:
paths normalize inside the workspace, ``content`` is at most 1 MiB of UTF-8, a URL is
plain http(s) with one exact host (:func:`~boxmaker.core.hosts.url_host_problem`) and a
port from 1, a path at most 4,096 bytes (255 a segment) and a command at
most 64 KiB, so that no argument makes matching it against the grants slow.

Checking applies the served schema itself, by jsonschema
(:class:`~boxmaker.core.argument_schema.ArgumentSchema`), so the model is never told one
shape and held to another; the shared converter then builds the attrs value.
"""

from __future__ import annotations

import copy
import re
import urllib.parse
from collections.abc import Mapping
from typing import Any, Final, Literal

import attrs

from boxmaker.core.argument_schema import ArgumentSchema
from boxmaker.core.external_tools import (
    EMPTY_CATALOGUE,
    MCP_PREFIX,
    ExternalCatalogue,
    ExternalTool,
    ToolState,
    canonical_json,
    claude_tool,
    is_claude_name,
    is_mcp_name,
    json_problem,
    not_pinned_detail,
)
from boxmaker.core.hosts import DEFAULT_PORTS, Destination, canonical_host, url_host_problem
from boxmaker.core.labels import (
    CONNECT_LABEL,
    HTTP_GET_LABEL,
    WRITE_FILE_LABEL,
    Label,
    LabelRules,
    Taint,
    shell_label,
)
from boxmaker.core.paths import PathProblem, match_form, normalize_path
from boxmaker.core.reasons import Reason
from boxmaker.formats.convert import CALL_ID, converter

MAX_BYTES: Final = 1024 * 1024
"""The cap on ``read_file``'s ``max_bytes``, ``write_file``'s ``content`` and http_get."""
MAX_COMMAND_BYTES: Final = 64 * 1024
"""The cap on ``shell``'s ``command``, in bytes of UTF-8. Every shell grant's patterns
scan the whole command (fnmatch's regexes are linear, but a 1 MiB frame times many
grants is still work on brokerd's one thread), and the sandbox execs ``sh -c COMMAND``,
whose one argument Linux caps at 128 KiB anyway."""

ToolName = Literal["read_file", "list_dir", "write_file", "shell", "http_get"]
TOOL_NAMES: Final[tuple[ToolName, ...]] = (
    "read_file",
    "list_dir",
    "write_file",
    "shell",
    "http_get",
)
_TOOL_LOOKUP: Final[Mapping[str, ToolName]] = {name: name for name in TOOL_NAMES}
INTERNAL_TOOLS: Final[tuple[str, ...]] = ("connect",)
"""Tools brokerd's own machinery calls and the model can never name: ``connect``, one
tunnel out of a call's sandbox (docs/decisions.md, "Network"). :func:`check_arguments`
knows them only when told ``internal=True``; the catalogue never lists them."""
GRANT_TOOLS: Final[tuple[str, ...]] = (*TOOL_NAMES, *INTERNAL_TOOLS)
"""Every built-in tool a grant's ``tool`` may name."""
FILE_TOOLS: Final[frozenset[str]] = frozenset({"read_file", "list_dir", "write_file"})
READ_ONLY_TOOLS: Final[frozenset[str]] = frozenset({"read_file", "list_dir"})
"""The built-in tools that only read the workspace: they change nothing and send nothing
out. Every other tool, ``mcp.*`` and ``claude.*`` included, is risky (core/decide.py)."""


@attrs.frozen
class ReadFileArgs:
    path: str
    max_bytes: int | None = None


@attrs.frozen
class ListDirArgs:
    path: str


@attrs.frozen
class WriteFileArgs:
    path: str
    content: str


@attrs.frozen
class ShellArgs:
    command: str


@attrs.frozen
class HttpGetArgs:
    url: str


@attrs.frozen
class ConnectArgs:
    """One tunnel out of a call's sandbox (``connect``, an internal tool): where to, and
    which call asks for it. ``scheme`` is "https" for a CONNECT (a ``hosts`` entry
    without a port means 443), "http" for a plain-HTTP request (80)."""

    host: str
    """Lower-cased; an IP address in its standard spelling."""
    port: int
    via: str
    """The calling call's id."""
    via_tool: str
    via_command: str | None = None
    """The calling shell call's command line."""
    scheme: str = "https"


@attrs.frozen
class ExternalArgs:
    """An external tool's arguments, as given (never normalized: the server reads them)."""

    arguments: Mapping[str, Any]


ToolArgs = (
    ReadFileArgs
    | ListDirArgs
    | WriteFileArgs
    | ShellArgs
    | HttpGetArgs
    | ConnectArgs
    | ExternalArgs
)

_ARG_CLASSES: Final[Mapping[str, type[ToolArgs]]] = {
    "read_file": ReadFileArgs,
    "list_dir": ListDirArgs,
    "write_file": WriteFileArgs,
    "shell": ShellArgs,
    "http_get": HttpGetArgs,
}

_PATH = {"type": "string", "description": "A path relative to the workspace root."}

TOOL_SCHEMAS: Final[Mapping[str, Mapping[str, Any]]] = {
    "read_file": {
        "name": "read_file",
        "description": "Read a text file of the workspace.",
        "parameters": {
            "type": "object",
            "properties": {
                "path": _PATH,
                "max_bytes": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": MAX_BYTES,
                    "description": "Read at most this many bytes (default and cap: 1 MiB).",
                },
            },
            "required": ["path"],
            "additionalProperties": False,
        },
    },
    "list_dir": {
        "name": "list_dir",
        "description": "List the entries of a directory of the workspace.",
        "parameters": {
            "type": "object",
            "properties": {"path": _PATH},
            "required": ["path"],
            "additionalProperties": False,
        },
    },
    "write_file": {
        "name": "write_file",
        "description": "Write a text file of the workspace (replaces it atomically).",
        "parameters": {
            "type": "object",
            "properties": {
                "path": _PATH,
                "content": {"type": "string", "description": "At most 1 MiB of UTF-8."},
            },
            "required": ["path", "content"],
            "additionalProperties": False,
        },
    },
    "shell": {
        "name": "shell",
        "description": (
            "Run a shell command in a sandbox, with the workspace as the working "
            "directory and no network."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "command": {"type": "string", "minLength": 1, "description": "The command line."}
            },
            "required": ["command"],
            "additionalProperties": False,
        },
    },
    "http_get": {
        "name": "http_get",
        "description": "Fetch an http(s) URL (at most 1 MiB, 10 s).",
        "parameters": {
            "type": "object",
            "properties": {"url": {"type": "string", "description": "An http or https URL."}},
            "required": ["url"],
            "additionalProperties": False,
        },
    },
}
"""Per tool: name, description and the JSON schema of its parameters."""

CONNECT_PARAMETERS: Final[Mapping[str, Any]] = {
    "type": "object",
    "properties": {
        "host": {"type": "string", "minLength": 1},
        "port": {"type": "integer", "minimum": 1, "maximum": 65535},
        "via": {"type": "string"},
        "via_tool": {"type": "string"},
        "via_command": {"type": "string"},
        "scheme": {"type": "string"},
    },
    "required": ["host", "port", "via", "via_tool"],
    "additionalProperties": False,
}
"""``connect``'s arguments, checked as the model tools' are; never served to the model."""

_ARGUMENT_SCHEMAS: Final[Mapping[str, ArgumentSchema]] = {
    "connect": ArgumentSchema(CONNECT_PARAMETERS),
    **{tool: ArgumentSchema(schema["parameters"]) for tool, schema in TOOL_SCHEMAS.items()},
}


def catalogue_tools() -> list[dict[str, Any]]:
    """The ``tools`` of the catalogue frame, in OpenAI's tool format (a fresh copy).

    >>> [tool["function"]["name"] for tool in catalogue_tools()]
    ['read_file', 'list_dir', 'write_file', 'shell', 'http_get']
    """
    return [
        {"type": "function", "function": copy.deepcopy(dict(TOOL_SCHEMAS[name]))}
        for name in TOOL_NAMES
    ]


def external_catalogue_tools(external: ExternalCatalogue) -> list[dict[str, Any]]:
    """The catalogue frame's entries for the accepted ``mcp.*`` tools of ``external``, by
    name (OpenAI's tool format: the name the model calls, the server's description, its
    input schema as the parameters; a fresh copy). Tools not accepted are not offered.

    >>> from boxmaker.core.labels import FRESH
    >>> tool = ExternalTool("mcp.git.log", "Show the log.", {"type": "object"}, FRESH)
    >>> external_catalogue_tools({"mcp.git.log": tool})[0]["function"]
    {'name': 'mcp.git.log', 'description': 'Show the log.', 'parameters': {'type': 'object'}}
    >>> external_catalogue_tools({"mcp.git.log": attrs.evolve(tool, state=ToolState.CHANGED)})
    []
    """
    return [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": tool.description,
                "parameters": copy.deepcopy(dict(tool.input_schema)),
            },
        }
        for name, tool in sorted(external.items())
        if tool.state is ToolState.ACCEPTED and name.startswith(MCP_PREFIX) and tool.name == name
    ]


@attrs.frozen
class ArgumentProblem:
    """Why a request's tool or arguments are refused (``unknown_tool``, ``bad_arguments``)."""

    reason: Reason
    detail: str


@attrs.frozen
class CheckedArguments:
    """Arguments that fit their tool's schema, with paths normalized (core.paths).

    An external tool's (``mcp.*``, ``claude.*``) carry the tool as the catalogue described
    it when they were checked (``external``), so its definition hash is the one decided on.
    """

    tool: str
    value: ToolArgs
    external: ExternalTool | None = None
    paths: tuple[str, ...] = attrs.field(init=False, eq=False, repr=False)
    """Every workspace path the call touches."""
    command: str | None = attrs.field(init=False, eq=False, repr=False)
    host: str | None = attrs.field(init=False, eq=False, repr=False)
    """The lower-cased host of an http_get URL."""
    destination: Destination | None = attrs.field(init=False, eq=False, repr=False)
    """Scheme, host and port of an http_get URL, as ``hosts`` entries match them."""
    match_paths: tuple[str, ...] = attrs.field(init=False, eq=False, repr=False)
    """``paths`` in the form globs match (:func:`boxmaker.core.paths.match_form`)."""

    # Computed once here, not per grant tried: decide() tries many grants per call.
    @paths.default
    def _paths(self) -> tuple[str, ...]:
        if isinstance(self.value, ReadFileArgs | ListDirArgs | WriteFileArgs):
            return (self.value.path,)
        return ()

    @command.default
    def _command(self) -> str | None:
        # A connect's is its calling shell command's: shell grants' ``commands`` match it.
        if isinstance(self.value, ConnectArgs):
            return self.value.via_command
        return self.value.command if isinstance(self.value, ShellArgs) else None

    @host.default
    def _host(self) -> str | None:
        if isinstance(self.value, HttpGetArgs):
            return urllib.parse.urlsplit(self.value.url).hostname
        if isinstance(self.value, ConnectArgs):
            return self.value.host
        return None

    @destination.default
    def _destination(self) -> Destination | None:
        if isinstance(self.value, HttpGetArgs):
            return Destination.of_url(self.value.url)
        if isinstance(self.value, ConnectArgs):
            value = self.value
            return Destination(value.scheme, value.host, value.port)
        return None

    @match_paths.default
    def _match_paths(self) -> tuple[str, ...]:
        return tuple(match_form(path) for path in self.paths)

    @property
    def definition(self) -> str | None:
        """An ``mcp.*`` tool's definition hash as decided on; None for any other tool."""
        external = self.external
        return None if external is None else external.definition

    def subject(self) -> str:
        """What the call is about, for details: the path, the command, the host, or an
        external tool's arguments (canonical JSON); a connect's ``host:port``
        (``http://host:port`` for plain HTTP)."""
        if isinstance(self.value, ConnectArgs):
            return connect_target(self.value)
        if self.paths:
            return self.paths[0]
        text = self.command
        if text is None and isinstance(self.value, ExternalArgs):
            text = canonical_json(self.value.arguments)
        if text is not None:
            return text if len(text) <= 200 else text[:200] + "…"
        return self.host or ""

    def to_json(self) -> dict[str, Any]:
        """The checked arguments as recorded and run (unset optionals left out)."""
        if isinstance(self.value, ExternalArgs):
            return dict(self.value.arguments)
        raw: dict[str, Any] = converter.unstructure(self.value)
        return {key: value for key, value in raw.items() if value is not None}


def connect_target(value: ConnectArgs) -> str:
    """Where a connect goes, as the owner reads it: ``host:port``, an IPv6 address in
    brackets, ``http://`` before it for plain HTTP.

    >>> connect_target(ConnectArgs("::1", 8443, "c-0000000000000001", "shell"))
    '[::1]:8443'
    >>> connect_target(ConnectArgs("a.org", 80, "c-0000000000000001", "shell", scheme="http"))
    'http://a.org:80'
    """
    host = f"[{value.host}]" if ":" in value.host else value.host
    prefix = "http://" if value.scheme == "http" else ""
    return f"{prefix}{host}:{value.port}"


_NOT_URL_CHARACTER: Final = re.compile(r"[^!-\[\]-~]")
"""Anything but printable ASCII without the space and the backslash (one regex: a
character loop over a 1 MiB URL held brokerd's thread for 0.17 s)."""


def _url_problem(url: str) -> str | None:
    # Refuse what two URL parsers might read differently, so the host checked against the
    # grant is the host the runner connects to.
    if _NOT_URL_CHARACTER.search(url):
        return "argument 'url' must be printable ASCII without spaces or backslashes"
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname
        parts.port  # noqa: B018  (a bad port raises here)
    except ValueError:
        return "argument 'url' is not a valid URL"
    if parts.scheme not in ("http", "https"):
        return "argument 'url' must be an http or https URL"
    if "@" in parts.netloc:
        return "argument 'url' must not carry a user or password"
    if not host:
        return "argument 'url' has no host"
    # Only one exact host: a grant names it, and an exact approve-always writes it as is
    # (a '*.suffix' written there would allow every subdomain).
    problem = url_host_problem(host, bracketed=parts.netloc.startswith("["))
    if problem is not None:
        return (
            f"argument 'url': the host {host[:100]!r} is not a host name or IP address: {problem}"
        )
    if parts.port == 0:
        return "argument 'url' has port 0 (a port is 1 to 65535)"
    return None


def _check_external(
    tool: str, raw_arguments: object, external: ExternalCatalogue
) -> CheckedArguments | ArgumentProblem:
    """:func:`check_arguments` for a tool that is not built in: a ``claude.<Name>``, or an
    ``mcp.*`` tool of the catalogue that the owner accepted as it is now."""
    if tool.startswith(MCP_PREFIX):
        found = external.get(tool)
        # The catalogue's key and the tool's own name must agree: a catalogue built wrong
        # must not let one name run another tool.
        if found is None or found.name != tool:
            return ArgumentProblem(Reason.UNKNOWN_TOOL, f"unknown tool {tool[:100]!r}")
        if found.state is not ToolState.ACCEPTED:
            changed = found.state is ToolState.CHANGED
            reason = Reason.TOOL_CHANGED if changed else Reason.TOOL_NOT_PINNED
            return ArgumentProblem(reason, not_pinned_detail(tool, found.state))
    elif is_claude_name(tool):
        found = claude_tool(tool)
    else:
        return ArgumentProblem(Reason.UNKNOWN_TOOL, f"unknown tool {tool[:100]!r}")
    problem = json_problem(raw_arguments)
    if problem is None:
        assert isinstance(raw_arguments, Mapping)
        problem = found.schema_problem(raw_arguments)
    if problem is not None:
        return ArgumentProblem(Reason.BAD_ARGUMENTS, problem)
    assert isinstance(raw_arguments, Mapping)
    return CheckedArguments(tool, ExternalArgs(raw_arguments), found)


def _connect_problem(arguments: dict[str, Any]) -> str | None:
    """What the schema cannot say of a connect's arguments; normalizes ``host`` in place
    (lower-cased, an IPv6 address in its standard spelling)."""
    host: str = arguments["host"].lower()
    bracketed = ":" in host
    problem = url_host_problem(host, bracketed=bracketed)
    if problem is not None:
        return f"argument 'host': {host[:100]!r} is not a host name or IP address: {problem}"
    arguments["host"] = canonical_host(host)
    if not CALL_ID.fullmatch(arguments["via"]):
        return "argument 'via' must be a call id (c- and 16 hex digits)"
    via_tool = arguments["via_tool"]
    if via_tool not in _TOOL_LOOKUP and not is_mcp_name(via_tool) and not is_claude_name(via_tool):
        return f"argument 'via_tool': {via_tool[:100]!r} is not a tool's name"
    command = arguments.get("via_command")
    if command is not None and via_tool != "shell":
        return "argument 'via_command' is a shell call's command only"
    if command is not None and "\x00" in command:
        return "argument 'via_command' contains a NUL byte"
    if command is not None and len(command.encode("utf-8", "surrogatepass")) > MAX_COMMAND_BYTES:
        return f"argument 'via_command' is longer than {MAX_COMMAND_BYTES} bytes"
    if arguments.get("scheme", "https") not in DEFAULT_PORTS:
        return "argument 'scheme' must be http or https"
    return None


def _check_connect(raw_arguments: Mapping[str, Any]) -> CheckedArguments | ArgumentProblem:
    problem = _ARGUMENT_SCHEMAS["connect"].problem(raw_arguments)
    arguments = dict(raw_arguments)
    if problem is None:
        problem = _connect_problem(arguments)
    if problem is not None:
        return ArgumentProblem(Reason.BAD_ARGUMENTS, problem)
    return CheckedArguments("connect", converter.structure(arguments, ConnectArgs))


def check_arguments(
    tool: str,
    raw_arguments: object,
    *,
    workspace: str | None = None,
    external: ExternalCatalogue = EMPTY_CATALOGUE,
    internal: bool = False,
) -> CheckedArguments | ArgumentProblem:
    """Check a request's tool and arguments (the pipeline's step 4); never raises.

    ``workspace`` (the absolute workspace root) lets an absolute path inside it through.
    ``external`` is the gateway's catalogue now: an ``mcp.*`` tool must be in it and
    accepted (else ``unknown_tool``, ``tool_not_pinned``, ``tool_changed``); a
    ``claude.<Name>`` takes any JSON object (:mod:`boxmaker.core.external_tools`).
    ``internal``: the request comes from brokerd's own machinery, never from a socket
    a model, loopd or a client can write to; only then are :data:`INTERNAL_TOOLS` known
    (``connect`` is otherwise ``unknown_tool`` like any name not in the catalogue).

    >>> check_arguments("read_file", {"path": "./notes.txt"}).to_json()
    {'path': 'notes.txt'}
    >>> check_arguments("rm_rf", {})
    ArgumentProblem(reason=<Reason.UNKNOWN_TOOL: 'unknown_tool'>, detail="unknown tool 'rm_rf'")
    >>> check_arguments("read_file", {"path": "../x"}).detail
    "argument 'path': '..' leaves the workspace"
    >>> check_arguments("read_file", {"path": 5}).detail
    "argument 'path' must be a string"
    """
    name = _TOOL_LOOKUP.get(tool)
    if name is None and not (internal and tool in INTERNAL_TOOLS):
        return _check_external(tool, raw_arguments, external)
    if not isinstance(raw_arguments, Mapping) or not all(isinstance(k, str) for k in raw_arguments):
        return ArgumentProblem(Reason.BAD_ARGUMENTS, "arguments must be a JSON object")
    if name is None:
        return _check_connect(raw_arguments)
    problem = _ARGUMENT_SCHEMAS[tool].problem(raw_arguments)
    if problem is not None:
        return ArgumentProblem(Reason.BAD_ARGUMENTS, problem)
    arguments = dict(raw_arguments)
    if "path" in arguments:
        path = normalize_path(arguments["path"], workspace)
        if isinstance(path, PathProblem):
            return ArgumentProblem(Reason.BAD_ARGUMENTS, f"argument 'path': {path.message}")
        arguments["path"] = path
    if (
        tool == "write_file"
        and len(arguments["content"].encode("utf-8", "surrogatepass")) > MAX_BYTES
    ):
        return ArgumentProblem(Reason.BAD_ARGUMENTS, "argument 'content' is over 1 MiB")
    if tool == "shell" and "\x00" in arguments["command"]:
        return ArgumentProblem(Reason.BAD_ARGUMENTS, "argument 'command' contains a NUL byte")
    if (
        tool == "shell"
        and len(arguments["command"].encode("utf-8", "surrogatepass")) > MAX_COMMAND_BYTES
    ):
        detail = f"argument 'command' is longer than {MAX_COMMAND_BYTES} bytes"
        return ArgumentProblem(Reason.BAD_ARGUMENTS, detail)
    if tool == "http_get":
        problem = _url_problem(arguments["url"])
        if problem is not None:
            return ArgumentProblem(Reason.BAD_ARGUMENTS, problem)
    return CheckedArguments(name, converter.structure(arguments, _ARG_CLASSES[name]))


def result_label(
    arguments: CheckedArguments, rules: LabelRules, label_taint: Taint | None
) -> Label:
    """The label of a successful call's result (each tool's label; a
    file's from the ``[labels]`` rules).

    ``label_taint`` is the matched grant's (only shell grants have one). An external
    tool's is its own: an ``mcp.*`` server's configured label, none for ``claude.*``.

    >>> url = check_arguments("http_get", {"url": "https://a.example/"})
    >>> result_label(url, LabelRules(), None)
    Label(taint=<Taint.PUBLIC: 'public'>, untrusted=True)
    >>> result_label(check_arguments("read_file", {"path": "x/.env"}), LabelRules(), None).taint
    <Taint.SECRET: 'secret'>
    """
    value = arguments.value
    if arguments.external is not None:
        return arguments.external.label
    if isinstance(value, ReadFileArgs | ListDirArgs):
        return rules.label_for_path(value.path)
    if isinstance(value, WriteFileArgs):
        return WRITE_FILE_LABEL
    if isinstance(value, ShellArgs):
        return shell_label(label_taint)
    if isinstance(value, ConnectArgs):
        return CONNECT_LABEL
    return HTTP_GET_LABEL
