"""config.toml (docs/runbook.md#config).

:func:`load_config` reads config.toml into :class:`Config` through the shared converter:
every key optional, unknown keys and wrong types are a :class:`ConfigError` naming the
file and the key.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any, Final, Literal

import attrs

from boxmaker.core.labels import LabelRules
from boxmaker.formats.convert import InvalidField, converter, format_path, problems
from boxmaker.home.mcp_config import RUNBOOK_MCP_SERVERS, McpServerConfig, check_server_paths
from boxmaker.home.paths import Home
from boxmaker.home.regular_file import NotRegularFile, read_regular_file
from boxmaker.ledger.signed_note import NoteError, SignatureType, parse_vkey


class ConfigError(Exception):
    """config.toml could not be used; each problem names the file and the key."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = tuple(problems)


def _at_least(low: float) -> Any:
    def check(_: Any, attribute: attrs.Attribute[Any], value: float) -> None:
        if value < low:
            raise InvalidField(attribute.name, f"expected at least {low}")

    return check


def _positive(_: Any, attribute: attrs.Attribute[Any], value: float) -> None:
    if value <= 0:
        raise InvalidField(attribute.name, "expected a number above 0")


def _port(_: Any, attribute: attrs.Attribute[Any], value: int) -> None:
    if not 0 <= value <= 65535:
        raise InvalidField(attribute.name, "expected a port, 0 to 65535 (0: none)")


@attrs.frozen(kw_only=True)
class ModelConfig:
    """``[model]``: no url means the built-in model (docs/decisions.md)."""

    url: str | None = None
    name: str = "default"
    max_tokens: int = attrs.field(default=1024, validator=_at_least(1))


MIN_BUFFERED_BYTES: Final = 2 * 1024 * 1024
"""Room for one whole 1 MiB frame (and the chunk that completes it), with margin: the
least ``max_buffered_bytes`` and ``max_pending_bytes`` may be."""


@attrs.frozen(kw_only=True)
class BrokerConfig:
    """``[broker]``. The three caps bound what a flood of broker.sock connections costs
    (docs/runbook.md#too-many-pending, docs/runbook.md#too-many-connections); brokerd
    lowers ``max_connections`` further to what its open-file limit allows."""

    pending_timeout: float = attrs.field(default=300.0, validator=_positive)
    max_pending: int = attrs.field(default=10_000, validator=_at_least(1))
    max_pending_bytes: int = attrs.field(
        default=32 * 1024 * 1024, validator=_at_least(MIN_BUFFERED_BYTES)
    )
    max_connections: int = attrs.field(default=12_000, validator=_at_least(1))
    max_buffered_bytes: int = attrs.field(
        default=32 * 1024 * 1024, validator=_at_least(MIN_BUFFERED_BYTES)
    )


LOOPD_UID_GONE: Final = (
    "[broker] loopd_uid: no longer supported: loopd runs as the owner, the only uid "
    "that can reach broker.sock and infer.sock; remove the key (see "
    "docs/runbook.md#loopd-uid)"
)
"""A loopd under another uid could reach neither socket in the owner's 0700 run/, nor
write its loop.sock, conversations or log in the home; a run/ it could write to would
let it squat the owner's sockets. So the key is refused by name rather than ignored."""


@attrs.frozen(kw_only=True)
class LoopConfig:
    max_steps: int = attrs.field(default=16, validator=_at_least(1))
    reply_timeout: float = attrs.field(default=10.0, validator=_positive)
    max_step_tokens: int = attrs.field(default=512, validator=_at_least(1))
    """The most tokens one model call of a turn may write (inferproxy's ``[model]
    max_tokens`` caps it in turn). A reply that
    reaches it is cut, and the owner is told (docs/decisions.md, "A turn always
    ends")."""
    first_step: Literal["auto", "tool", "named"] = "auto"
    """The first model call of a turn: ``auto`` lets the model choose; ``tool`` asks it
    for a tool call; ``named`` asks so only when the owner's words name something a
    tool works on (a quoted name, a path, a file name, a URL: loop/turn.py,
    :func:`~boxmaker.loop.turn.names_a_target`). ``bxctl init`` writes ``named`` for
    the built-in model, which calls a tool only when asked for one (README.md)."""


@attrs.frozen(kw_only=True)
class ProxyConfig:
    tcp_port: int = attrs.field(default=0, validator=_port)
    token_file: str | None = None
    """A file holding the token the TCP listener requires (relative to the home)."""


@attrs.frozen(kw_only=True)
class RunnerConfig:
    """``[runner]``: the tools' time and output, and the shell sandbox's uid and limits
    (docs/runbook.md#sandbox-as-root, #sandbox-limits)."""

    shell_timeout: float = attrs.field(default=30.0, validator=_positive)
    output_cap: int = attrs.field(default=65536, validator=_at_least(1))
    sandbox_uid: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(_at_least(1))
    )
    """The host uid (and gid) the sandbox runs as when brokerd runs as root; None: the
    workspace's owner. Never 0."""
    memory_limit_mib: int = attrs.field(default=1024, validator=_at_least(1))
    """Address space of each sandboxed process (RLIMIT_AS), MiB; with a cgroup, also the
    memory and swap of the whole sandbox."""
    process_limit: int = attrs.field(default=256, validator=_at_least(1))
    """Processes the sandbox's uid may have in the sandbox (RLIMIT_NPROC); with a
    cgroup, also its tasks in all (pids.max)."""
    file_size_limit_mib: int = attrs.field(default=1024, validator=_at_least(1))
    """The largest file a sandboxed command may write (RLIMIT_FSIZE), MiB."""
    cpu_time_limit: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(_at_least(1))
    )
    """CPU seconds of each sandboxed process (RLIMIT_CPU); None: shell_timeout rounded up."""


GIB: Final = 1 << 30


@attrs.frozen(kw_only=True)
class EgressConfig:
    """``[egress]``: the bounds of each shell call's way out through brokerd's proxy
    (docs/egress.md, docs/runbook.md#egress). Read when the call opens its way out."""

    tunnels_per_call: int = attrs.field(default=16, validator=_at_least(1))
    """Tunnels (and plain-HTTP requests) one call may have open at once; one more is
    answered 503 and never decided."""
    bytes_per_call: int = attrs.field(default=4 * GIB, validator=_at_least(1))
    """Bytes one call's connections may carry in all, both ways; the tunnel that
    reaches it is closed (ended ``byte_cap``), and so is every later one."""
    idle_timeout_s: float = attrs.field(default=120.0, validator=_positive)
    """A tunnel with no byte either way for this long is closed (ended ``idle``)."""


@attrs.frozen(kw_only=True)
class LedgerConfig:
    """``[ledger]``: how often brokerd signs a checkpoint of the ledger's tree
    (docs/protocol.md, "Checkpoints"), and what a lagging witness does
    (docs/protocol.md, "Witnesses"); read at start."""

    checkpoint_every: int = attrs.field(default=1000, validator=_at_least(1))
    """Records written since the last checkpoint that make the next one."""
    checkpoint_seconds: float = attrs.field(default=60.0, validator=_positive)
    """Seconds after a record not yet in a checkpoint that make one (a quiet ledger
    makes none)."""
    witness_lag: Literal["warn", "deny_risky"] = "warn"
    """What a lagging witness does: ``warn`` (brokerd logs it, ``bxctl status`` shows
    it), or ``deny_risky``: as well, every risky call is denied ``witness_lagging``
    while it lags (docs/protocol.md, "Witnesses")."""
    witness_max_lag: int = attrs.field(default=5000, validator=_at_least(1))
    """Records a witness may be behind the newest checkpoint before it counts as
    lagging."""
    segment_records: int = attrs.field(default=1_000_000, validator=_at_least(2))
    """Lines the live file ``ledger/audit.jsonl`` holds at most: when it is full, the
    writer seals it as ``ledger/segments/<first>-<last>.jsonl`` at a checkpoint that
    begins the next live file (docs/protocol.md, "Segments"). At least 2: a file holds
    its leading checkpoint and a record."""


def _argv(_: Any, attribute: attrs.Attribute[Any], value: tuple[str, ...]) -> None:
    if any(not part or "\0" in part for part in value):
        raise InvalidField(attribute.name, "expected a list of non-empty strings (argv)")
    # A relative path would be looked up from the command's working directory.
    if value and "/" in value[0] and not value[0].startswith("/"):
        raise InvalidField(attribute.name, "the program is an absolute path or a bare name")


@attrs.frozen(kw_only=True)
class NotifyConfig:
    """``[notify]``: a command brokerd runs, with the pending approval's JSON on stdin,
    when a call starts waiting for the owner (docs/runbook.md#notify). An argv list, run
    without a shell; empty: none."""

    command: tuple[str, ...] = attrs.field(default=(), validator=_argv)
    timeout: float = attrs.field(default=10.0, validator=_positive)
    """Seconds the command may take; then it (its whole process group) is killed."""


WITNESS_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
RUNBOOK_WITNESS: Final = "docs/runbook.md#witness"


def _witness_name(_: Any, attribute: attrs.Attribute[Any], value: str) -> None:
    if not WITNESS_NAME.fullmatch(value):
        raise InvalidField(
            attribute.name, "expected 1 to 64 letters, digits, '.', '_' or '-' (a file name)"
        )


def _witness_vkey(_: Any, attribute: attrs.Attribute[Any], value: str) -> None:
    try:
        verifier = parse_vkey(value)
    except NoteError as exc:
        raise InvalidField(attribute.name, f"{exc}; see {RUNBOOK_WITNESS}") from None
    if verifier.signature_type is not SignatureType.COSIGNATURE_V1:
        raise InvalidField(
            attribute.name,
            "expected a cosignature (0x04) vkey, as `bxctl witness init` prints; "
            f"see {RUNBOOK_WITNESS}",
        )


def _witness_url(_: Any, attribute: attrs.Attribute[Any], value: str) -> None:
    scheme, sep, rest = value.partition("://")
    if scheme not in ("http", "https") or not sep or not rest or rest.startswith("/"):
        raise InvalidField(attribute.name, "expected an http:// or https:// URL")


@attrs.frozen(kw_only=True)
class WitnessConfig:
    """``[[witness]]``: a C2SP tlog-witness brokerd sends each checkpoint to
    (docs/protocol.md, "Witnesses"). ``name`` is the file its cosignatures are kept
    in (``ledger/tree/cosignatures/<name>``); ``vkey`` its public key; ``url`` its
    submission prefix (``/add-checkpoint`` is added)."""

    name: str = attrs.field(validator=_witness_name)
    vkey: str = attrs.field(validator=_witness_vkey)
    url: str = attrs.field(validator=_witness_url)
    timeout: float = attrs.field(default=10.0, validator=_positive)
    """Seconds one add-checkpoint request may take, connecting included."""


def _unique_witnesses(
    _: Any, attribute: attrs.Attribute[Any], value: tuple[WitnessConfig, ...]
) -> None:
    names = [witness.name for witness in value]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise InvalidField(attribute.name, f"two [[witness]] tables named {', '.join(repeated)}")


@attrs.frozen(kw_only=True)
class Config:
    """config.toml (docs/runbook.md#config). ``workspace`` is absolute: a relative one in
    the file is taken relative to the home."""

    workspace: Path
    model: ModelConfig = attrs.Factory(ModelConfig)
    broker: BrokerConfig = attrs.Factory(BrokerConfig)
    loop: LoopConfig = attrs.Factory(LoopConfig)
    proxy: ProxyConfig = attrs.Factory(ProxyConfig)
    labels: LabelRules = attrs.Factory(LabelRules)
    runner: RunnerConfig = attrs.Factory(RunnerConfig)
    notify: NotifyConfig = attrs.Factory(NotifyConfig)
    egress: EgressConfig = attrs.Factory(EgressConfig)
    ledger: LedgerConfig = attrs.Factory(LedgerConfig)
    witness: tuple[WitnessConfig, ...] = attrs.field(default=(), validator=_unique_witnesses)
    """``[[witness]]``: the witnesses of the ledger's checkpoints (broker/witnesses.py)."""
    mcp_servers: dict[str, McpServerConfig] = attrs.Factory(dict)
    """``[mcp_servers.NAME]``: the MCP servers whose tools go through brokerd
    (home/mcp_config.py)."""

    @classmethod
    def defaults(cls, home: Home) -> Config:
        return cls(workspace=home.default_workspace)


def workspace_problem(home: Home, workspace: Path) -> str | None:
    """Why ``workspace`` may not be used with ``home``, or None (docs/runbook.md#config).

    The workspace is bound read-write into the sandbox: it must not expose the
    ledger, grants, state or sockets, or the model could grant and approve its own
    calls. Checked on the names as written, then on the real paths: a symlink on either
    path (the home, the workspace, a directory above either) can make two names that
    look apart one directory. Every program runs this through :func:`parse_config`, and
    brokerd again while it runs (see boxmaker.broker.home_guard.HomeGuard). Bind mounts are
    not seen: realpath does not cross them.
    """
    root = Path(os.path.normpath(home.root))
    if workspace == root or root.is_relative_to(workspace):
        return "must not be the home or contain it"
    if workspace.is_relative_to(root) and not workspace.is_relative_to(home.default_workspace):
        return "inside the home, only workspace/ may be used"
    real_root = Path(os.path.realpath(root))
    real_workspace = Path(os.path.realpath(workspace))
    # Not realpath(default_workspace): workspace/ itself a link to the home would pass.
    allowed = real_root / home.default_workspace.name
    if real_root.is_relative_to(real_workspace):
        return (
            f"{workspace} is, by its real path {real_workspace}, the home or contains it "
            f"(the home's real path: {real_root})"
        )
    if real_workspace.is_relative_to(real_root) and not real_workspace.is_relative_to(allowed):
        return (
            f"{workspace} is, by its real path {real_workspace}, inside the home "
            f"(real path {real_root}); inside the home, only workspace/ may be used"
        )
    return None


def _describe(file: Path, path: tuple[str | int, ...], message: str) -> str:
    if len(path) >= 3 and path[0] == "mcp_servers":
        where = f"[mcp_servers.{path[1]}] {format_path(path[2:])}"
        return f"{file.name}: {where}: {message}; see {RUNBOOK_MCP_SERVERS}"
    if len(path) >= 3 and path[0] == "witness" and isinstance(path[1], int):
        where = f"[[witness]] number {path[1] + 1}: {format_path(path[2:])}"
        return f"{file.name}: {where}: {message}"
    if len(path) >= 2 and isinstance(path[0], str):
        where = f"[{path[0]}] {format_path(path[1:])}"
    elif path:
        where = format_path(path)
    else:
        where = "(file)"
    # core.labels' validators already say "[labels] key: ..." themselves.
    if len(path) == 1 and message.startswith(f"[{path[0]}] "):
        return f"{file.name}: {message}"
    return f"{file.name}: {where}: {message}"


def parse_config(text: str, home: Home, *, file: Path | None = None) -> Config:
    """Parse config.toml's text. Raises :class:`ConfigError`.

    >>> parse_config("[broker]\\npending_timeout = 'soon'\\n", Home(Path("/tmp/bx")))
    Traceback (most recent call last):
    ...
    boxmaker.home.config.ConfigError: config.toml: [broker] pending_timeout: expected a number
    """
    file = file or home.config_toml
    try:
        raw: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{file.name}: TOML syntax: {exc}"]) from None
    broker = raw.get("broker")
    if isinstance(broker, dict) and "loopd_uid" in broker:
        raise ConfigError([f"{file.name}: {LOOPD_UID_GONE}"])
    workspace = raw.get("workspace")
    if workspace is None:
        raw["workspace"] = str(home.default_workspace)
    elif isinstance(workspace, str) and workspace:
        resolved = home.root / Path(workspace).expanduser()
        raw["workspace"] = os.path.normpath(resolved)
    try:
        config = converter.structure(raw, Config)
    except Exception as exc:
        found = [_describe(file, path, message) for path, message in problems(exc)]
        raise ConfigError(found) from None
    problem = workspace_problem(home, config.workspace)
    if problem is not None:
        raise ConfigError([f"{file.name}: workspace: {problem}"])
    return _with_server_paths(config, home, file)


def _with_server_paths(config: Config, home: Home, file: Path) -> Config:
    servers: dict[str, McpServerConfig] = {}
    found: list[str] = []
    for name, server in config.mcp_servers.items():
        servers[name], problems_here = check_server_paths(
            name,
            server,
            workspace=config.workspace,
            home_problem=lambda path: workspace_problem(home, path),
        )
        found += (f"{file.name}: {problem}" for problem in problems_here)
    if found:
        raise ConfigError(found)
    return attrs.evolve(config, mcp_servers=servers) if servers else config


def load_config(home: Home) -> Config:
    """Read ``config.toml``; a missing file means every default."""
    path = home.config_toml
    try:
        # A FIFO there must not hang every program's start; a symlink is not followed
        # (it could lead out of the private home, into the workspace the model writes).
        data = read_regular_file(path)
    except FileNotFoundError:
        return Config.defaults(home)
    except NotRegularFile as exc:
        raise ConfigError([f"{path.name}: {exc.strerror}"]) from exc
    except OSError as exc:
        raise ConfigError([f"{path.name}: cannot read it ({exc.strerror})"]) from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError([f"{path.name}: not UTF-8"]) from None
    return parse_config(text, home, file=path)
