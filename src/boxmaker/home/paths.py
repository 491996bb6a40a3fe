"""The home directory: every path of the system, and its directories made private.

A :class:`Home` knows every path of the system; :meth:`Home.create` and
:meth:`Home.ensure_run_dir` make its directories private (0700, tightened when looser,
refused when another user owns them).

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
from pathlib import Path
from typing import Final

import attrs

from boxmaker.core.external_tools import SERVER_NAME
from boxmaker.formats.convert import SESSION_ID
from boxmaker.home.defaults import DEFAULT_GRANTS_TEXT, initial_config_text

HOME_ENV: Final = "BOXMAKER_HOME"
DEFAULT_HOME: Final = "~/.local/state/boxmaker"
DIR_MODE: Final = 0o700
FILE_MODE: Final = 0o600
_PROGRAM: Final = re.compile(r"[a-z][a-z0-9-]{0,31}")


class HomeError(Exception):
    """A home directory that cannot be used safely (wrong owner, not a directory, ...)."""


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
    def keys_dir(self) -> Path:
        """``keys/``: the ledger's signing key (0700; never inside the workspace:
        :func:`boxmaker.home.config.workspace_problem`)."""
        return self.root / "keys"

    @property
    def ledger_key(self) -> Path:
        """``keys/ledger.ed25519``: the ledger's Ed25519 private key, PKCS#8 PEM, 0600
        (boxmaker.ledger.ledger_key; docs/runbook.md#ledger-key)."""
        return self.keys_dir / "ledger.ed25519"

    @property
    def ledger_vkey(self) -> Path:
        """``keys/ledger.vkey``: the ledger key's public verifier key, one line, for
        whoever checks the ledger's checkpoints."""
        return self.keys_dir / "ledger.vkey"

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
    def chat_history(self) -> Path:
        """``state/chat_history``: the lines the owner typed at ``bxctl chat``'s prompt."""
        return self.state_dir / "chat_history"

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

    @property
    def mcp_pins(self) -> Path:
        """``state/mcp_pins.json``: the MCP tool definitions the owner accepted
        (``bxctl mcp pin``; mcp/pins.py)."""
        return self.state_dir / "mcp_pins.json"

    @property
    def mcp_status(self) -> Path:
        """``state/mcp_servers.json``: each MCP server as brokerd last saw it
        (``bxctl mcp list``)."""
        return self.state_dir / "mcp_servers.json"

    def mcp_log(self, server: str) -> Path:
        """``logs/mcp-<server>.log``: an MCP server's stderr (``bxctl mcp logs``)."""
        if not SERVER_NAME.fullmatch(server):
            raise ValueError(f"not an MCP server's name: {server!r}")
        return self.logs_dir / f"mcp-{server}.log"

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
            self.keys_dir,
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
        return self._ensure_private_subdir(self.run_dir, os.getuid() if uid is None else uid)

    def ensure_keys_dir(self) -> Path:
        """``keys/`` before the ledger key is written or read: 0700, a looser one
        tightened, one owned by another user (or not a directory) refused."""
        return self._ensure_private_subdir(self.keys_dir, os.getuid())

    def _ensure_private_subdir(self, directory: Path, uid: int) -> Path:
        self.root.parent.mkdir(parents=True, exist_ok=True)
        _ensure_private_dir(self.root, follow_symlinks=True, uid=uid)
        _ensure_private_dir(directory, follow_symlinks=False, uid=uid)
        return directory

    def write_defaults(self, *, workspace: str | None = None) -> list[Path]:
        """Write config.toml and grants.toml, mode 0600, where they do not exist yet
        (``bxctl init``); ``workspace``, a TOML string, is config.toml's workspace.
        Returns the files written; an existing file is never touched."""
        written = []
        for path, text in (
            (self.config_toml, initial_config_text(workspace)),
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
