"""The home directory and config.toml (docs/runbook.md#config).

A :class:`Home` knows every path of the system; :meth:`Home.create` and
:meth:`Home.ensure_run_dir` make its directories private (0700, tightened when looser,
refused when another user owns them). :func:`load_config` reads config.toml into
:class:`Config` through the shared converter: every key optional, unknown keys and wrong
types are a :class:`ConfigError` naming the file and the key.

>>> home = Home(Path("/tmp/bx"))
>>> home.broker_sock
PosixPath('/tmp/bx/run/broker.sock')
>>> home.session_state("s-0123456789ab")
PosixPath('/tmp/bx/state/sessions/s-0123456789ab.json')
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import tomllib
from pathlib import Path
from typing import Any, Final, Literal

import attrs

from boxmaker.convert import SESSION_ID, InvalidField, converter, format_path, problems
from boxmaker.core.labels import DEFAULT_SECRET, DEFAULT_UNTRUSTED, LabelRules
from boxmaker.regular_file import NotRegularFile, read_regular_file

HOME_ENV: Final = "BOXMAKER_HOME"
DEFAULT_HOME: Final = "~/.local/state/boxmaker"
DIR_MODE: Final = 0o700
FILE_MODE: Final = 0o600
_PROGRAM: Final = re.compile(r"[a-z][a-z0-9-]{0,31}")


class HomeError(Exception):
    """A home directory that cannot be used safely (wrong owner, not a directory, ...)."""


class ConfigError(Exception):
    """config.toml could not be used; each problem names the file and the key."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = tuple(problems)


def _ensure_private_dir(path: Path, *, follow_symlinks: bool, uid: int) -> None:
    """``path`` exists, is a directory we own, and has mode exactly 0700."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(DIR_MODE)
    try:
        info = path.stat(follow_symlinks=follow_symlinks)
    except OSError as exc:
        raise HomeError(f"{path}: cannot inspect it ({exc.strerror})") from exc
    if not stat.S_ISDIR(info.st_mode):
        what = "a symlink" if stat.S_ISLNK(info.st_mode) else "not a directory"
        raise HomeError(f"{path}: {what}; boxmaker needs a private directory here")
    if info.st_uid != uid:
        raise HomeError(
            f"{path}: owned by uid {info.st_uid}, not by you (uid {uid}); refusing to use it"
        )
    # Exactly 0700, not merely "no group/other bits": mkdir is subject to the umask.
    if stat.S_IMODE(info.st_mode) != DIR_MODE:
        path.chmod(DIR_MODE)


@attrs.frozen
class Home:
    """Every path under ``$BOXMAKER_HOME``. Pure: nothing is touched until :meth:`create`
    or :meth:`ensure_run_dir`."""

    root: Path

    @property
    def config_toml(self) -> Path:
        return self.root / "config.toml"

    @property
    def grants_toml(self) -> Path:
        return self.root / "grants.toml"

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def broker_sock(self) -> Path:
        return self.run_dir / "broker.sock"

    @property
    def admin_sock(self) -> Path:
        return self.run_dir / "admin.sock"

    @property
    def loop_sock(self) -> Path:
        return self.run_dir / "loop.sock"

    @property
    def infer_sock(self) -> Path:
        return self.run_dir / "infer.sock"

    @property
    def ledger_dir(self) -> Path:
        return self.root / "ledger"

    @property
    def audit_log(self) -> Path:
        return self.ledger_dir / "audit.jsonl"

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def sessions_dir(self) -> Path:
        return self.state_dir / "sessions"

    @property
    def conversations_dir(self) -> Path:
        return self.state_dir / "conversations"

    @property
    def logs_dir(self) -> Path:
        return self.root / "logs"

    @property
    def default_workspace(self) -> Path:
        return self.root / "workspace"

    def session_state(self, session: str) -> Path:
        """``state/sessions/<session>.json``. The id is checked, so a name
        from a frame can never leave the directory."""
        return self.sessions_dir / f"{_session(session)}.json"

    def conversation(self, session: str) -> Path:
        """``state/conversations/<session>.jsonl``: loopd's history of a session."""
        return self.conversations_dir / f"{_session(session)}.jsonl"

    @property
    def model_url_file(self) -> Path:
        """``run/model.url``: where the built-in model listens, while it runs."""
        return self.run_dir / "model.url"

    @property
    def model_sock(self) -> Path:
        """``run/model.sock``: the built-in model's llama-server (owner only)."""
        return self.run_dir / "model.sock"

    def pid_file(self, program: str) -> Path:
        return self.run_dir / f"{_program(program)}.pid"

    def log_file(self, program: str) -> Path:
        return self.logs_dir / f"{_program(program)}.log"

    @property
    def directories(self) -> tuple[Path, ...]:
        """Every directory of the home, parents first."""
        return (
            self.root,
            self.run_dir,
            self.ledger_dir,
            self.state_dir,
            self.sessions_dir,
            self.conversations_dir,
            self.logs_dir,
            self.default_workspace,
        )

    def create(self) -> None:
        """Make every directory, mode 0700; tighten looser ones; refuse another user's.

        The root may be a symlink to a directory we own (people move state around);
        the directories inside it may not, so none of them can point elsewhere.
        """
        self.root.parent.mkdir(parents=True, exist_ok=True)
        me = os.getuid()
        for directory in self.directories:
            _ensure_private_dir(directory, follow_symlinks=directory == self.root, uid=me)

    def ensure_run_dir(self, *, uid: int | None = None) -> Path:
        """``run/`` before the sockets are bound (docs/protocol.md): 0700, a looser one
        tightened, one owned by another user (or not a directory) refused. ``uid`` is
        who we are: ours (``os.getuid()``) unless a test says otherwise."""
        me = os.getuid() if uid is None else uid
        self.root.parent.mkdir(parents=True, exist_ok=True)
        _ensure_private_dir(self.root, follow_symlinks=True, uid=me)
        _ensure_private_dir(self.run_dir, follow_symlinks=False, uid=me)
        return self.run_dir

    def write_defaults(self) -> list[Path]:
        """Write config.toml and grants.toml, mode 0600, where they do not exist yet
        (``bxctl init``). Returns the files written; an existing file is never touched."""
        written = []
        for path, text in (
            (self.config_toml, initial_config_text()),
            (self.grants_toml, DEFAULT_GRANTS_TEXT),
        ):
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
            except FileExistsError:
                continue
            with os.fdopen(fd, "w", encoding="utf-8") as file:
                os.fchmod(file.fileno(), FILE_MODE)
                file.write(text)
            written.append(path)
        return written


def _session(session: str) -> str:
    if not SESSION_ID.fullmatch(session):
        raise ValueError("a session id is s- and 12 hex digits")
    return session


def _program(program: str) -> str:
    if not _PROGRAM.fullmatch(program):
        raise ValueError(f"not a program name: {program!r}")
    return program


def resolve_home(arg: str | None = None) -> Home:
    """``--home`` if given, else ``$BOXMAKER_HOME``, else ``~/.local/state/boxmaker``.

    >>> resolve_home("/srv/bx").root
    PosixPath('/srv/bx')
    """
    text = arg or os.environ.get(HOME_ENV) or DEFAULT_HOME
    return Home(Path(text).expanduser().absolute())


# ---------------------------------------------------------------------------------------
# config.toml


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
    brokerd again while it runs (see boxmaker.broker.state.HomeGuard). Bind mounts are
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
    boxmaker.home.ConfigError: config.toml: [broker] pending_timeout: expected a number
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
    return config


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


def _toml_list(items: tuple[str, ...]) -> str:
    return "[" + ", ".join(f'"{item}"' for item in items) + "]"


FIRST_STEP_HELP: Final = """\
# The first model call of a turn. "auto": the model chooses; "tool": it is asked for a
# tool call; "named": asked so only when your words name a file, a path or a URL
# ('Read the file at path "notes.txt"'), else the model chooses. The built-in model
# calls a tool only when asked for one: "named" suits it. A capable model at [model]
# url does best with "auto".\
"""


def initial_config_text() -> str:
    """What ``bxctl init`` writes: :func:`default_config_text`, with the one key the
    built-in model needs set (``[loop] first_step = "named"``).

    >>> 'first_step = "named"' in initial_config_text().splitlines()
    True
    """
    return default_config_text().replace('# first_step = "auto"', 'first_step = "named"')


def default_config_text() -> str:
    """A config.toml with every key, commented out at its default (``bxctl init``).

    >>> "# pending_timeout = 300.0" in default_config_text()
    True
    """
    return f"""\
# boxmaker configuration (docs/runbook.md#config). Every key is optional; the commented
# values are
# the defaults. Durations are seconds (floats allowed). Unknown keys are errors.

# The directory the tools work in (bound read-write into the sandbox).
# Relative paths are relative to the home. Default: <home>/workspace
# workspace = "workspace"

[model]
# The llama-server to use (http(s)://… or unix:///path.sock); no url: the embedded
# model (bxctl up starts it, on run/model.sock).
# url = "http://127.0.0.1:8080"
# name = "default"
# max_tokens = 1024

[broker]
# How long an ask waits for bxctl approve / refuse before it expires.
# pending_timeout = 300.0
# Asks waiting for the owner at once, and the bytes of their requests; one more is
# denied too_many_pending.
# max_pending = 10000
# max_pending_bytes = 33554432
# broker.sock connections at once (lowered to what the open-file limit allows);
# one more is answered `error busy` and closed.
# max_connections = 12000
# Bytes of unfinished frames held across all broker.sock connections.
# max_buffered_bytes = 33554432

[loop]
# max_steps = 16
# reply_timeout = 10.0
{FIRST_STEP_HELP}
# first_step = "auto"

[proxy]
# inferproxy's extra TCP listener on 127.0.0.1; 0: none. Any local user can connect
# to it: set token_file too, and clients must send "Authorization: Bearer <token>".
# tcp_port = 0
# A private file (0600) with the token, one line (openssl rand -hex 32 > proxy.token).
# token_file = "proxy.token"

[labels]
# Workspace paths whose content is secret / untrusted (globs; other files: internal).
# secret = {_toml_list(DEFAULT_SECRET)}
# untrusted = {_toml_list(DEFAULT_UNTRUSTED)}

[runner]
# shell_timeout = 30.0
# output_cap = 65536
# The shell sandbox's limits (docs/runbook.md#sandbox-limits): per process, address space
# and the largest file written (MiB) and CPU seconds; processes of the sandbox in all.
# Where brokerd can have cgroups (bxctl status: sandbox_bounds), memory (with swap) and
# processes also bound the whole sandbox together.
# memory_limit_mib = 1024
# file_size_limit_mib = 1024
# process_limit = 256
# cpu_time_limit (whole seconds): default shell_timeout rounded up.
# sandbox_uid: the host uid (and gid) the sandbox runs as when brokerd runs as root,
# never 0; default the workspace's owner. See docs/runbook.md#sandbox-as-root

[notify]
# A command run (no shell) when a call starts waiting for you, with the pending
# approval's JSON (as `bxctl approvals --json` shows it, without the write preview)
# on stdin; as the home's owner, cwd the home, in a clean environment but DISPLAY,
# WAYLAND_DISPLAY, DBUS_SESSION_BUS_ADDRESS and XDG_RUNTIME_DIR. It never delays or
# denies a call; see docs/runbook.md#notify. For example, a desktop notification:
# command = ["notify-send", "boxmaker", "a call waits: bxctl approvals"]
# timeout = 10.0
"""


DEFAULT_GRANTS_TEXT: Final = """\
# boxmaker grants (docs/runbook.md#grants). With no grant, every tool call is denied (no_grant).
#
# [[grant]]
# id = "read-notes"
# tool = "read_file"
# mode = "ask"
# paths = ["notes/**"]
# note = "why this grant exists"
"""


# ---------------------------------------------------------------------------------------
# SIGHUP: what of a new config.toml a running daemon takes (docs/runbook.md#reload)


@attrs.frozen
class Reload:
    """What a daemon does with a re-read config.toml."""

    config: Config
    """The config it runs with from now on: the new value of each live key that
    changed, the old value of every other key."""
    applied: tuple[str, ...]
    """The changed keys it took, as ``[section] key`` (``workspace`` for the top one)."""
    needs_restart: tuple[str, ...]
    """The changed keys it kept at their old value: only a restart takes them."""


def _key_name(section: str, key: str | None) -> str:
    return section if key is None else f"[{section}] {key}"


def reload_config(
    old: Config, new: Config, *, concern: frozenset[str], live: frozenset[str]
) -> Reload:
    """Merge a re-read config.toml into the one a daemon runs with.

    ``concern`` names the sections (and ``workspace``) the daemon reads: a change
    elsewhere is another daemon's, and not reported here. ``live`` names the keys it
    can take while running, as ``section.key``, or ``section`` for all of a section's.

    >>> home = Home(Path("/tmp/bx"))
    >>> old = parse_config("", home)
    >>> new = parse_config("[broker]\\npending_timeout = 5\\nmax_pending = 3\\n", home)
    >>> done = reload_config(old, new, concern=frozenset({"broker"}),
    ...                      live=frozenset({"broker.pending_timeout"}))
    >>> done.applied, done.needs_restart
    (('[broker] pending_timeout',), ('[broker] max_pending',))
    >>> done.config.broker.pending_timeout, done.config.broker.max_pending
    (5.0, 10000)
    """
    applied: list[str] = []
    restart: list[str] = []
    sections: dict[str, Any] = {}
    for section in attrs.fields(Config):
        name = section.name
        before, after = getattr(old, name), getattr(new, name)
        if name not in concern or before == after:
            continue
        if not attrs.has(type(before)):
            (applied if name in live else restart).append(_key_name(name, None))
            if name in live:
                sections[name] = after
            continue
        taken: dict[str, Any] = {}
        for field in attrs.fields(type(before)):
            if not field.init or getattr(before, field.name) == getattr(after, field.name):
                continue
            if name in live or f"{name}.{field.name}" in live:
                taken[field.name] = getattr(after, field.name)
                applied.append(_key_name(name, field.name))
            else:
                restart.append(_key_name(name, field.name))
        if taken:
            sections[name] = attrs.evolve(before, **taken)
    return Reload(attrs.evolve(old, **sections), tuple(applied), tuple(restart))
