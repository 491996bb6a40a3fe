"""The files ``bxctl init`` writes: config.toml with every key at its default, and an
empty grants.toml (docs/runbook.md#config, docs/runbook.md#grants)."""

from __future__ import annotations

from typing import Final

from boxmaker.core.labels import DEFAULT_SECRET, DEFAULT_UNTRUSTED


def _toml_list(items: tuple[str, ...]) -> str:
    return "[" + ", ".join(f'"{item}"' for item in items) + "]"


FIRST_STEP_HELP: Final = """\
# The first model call of a turn. "auto": the model chooses; "tool": it is asked for a
# tool call; "named": asked so only when your words name a file, a path or a URL
# ('Read the file at path "notes.txt"'), else the model chooses. The built-in model
# calls a tool only when asked for one: "named" suits it. A capable model at [model]
# url does best with "auto".\
"""


def initial_config_text(workspace: str | None = None) -> str:
    """What ``bxctl init`` writes: :func:`default_config_text`, with the one key the
    built-in model needs set (``[loop] first_step = "named"``), and ``workspace`` (a
    TOML string) when given (``bxctl init --workspace``).

    >>> 'first_step = "named"' in initial_config_text().splitlines()
    True
    >>> 'workspace = "/srv/work"' in initial_config_text('"/srv/work"').splitlines()
    True
    """
    text = default_config_text().replace('# first_step = "auto"', 'first_step = "named"')
    if workspace is None:
        return text
    return text.replace('# workspace = "workspace"', f"workspace = {workspace}", 1)


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
# The most tokens one model call may write; a reply that repeats itself is cut sooner.
# max_step_tokens = 512
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

[egress]
# The bounds of each shell call's way out through brokerd, where a connect grant gives
# it one (docs/runbook.md#egress): connections open at once, bytes both ways in all,
# and the seconds a tunnel may go without a byte.
# tunnels_per_call = 16
# bytes_per_call = 4294967296
# idle_timeout_s = 120.0

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
