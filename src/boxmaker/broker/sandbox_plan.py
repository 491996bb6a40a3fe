"""What a shell sandbox is started with (docs/decisions.md, "The runner and the sandbox";
docs/runbook.md#sandbox-as-root, #sandbox-limits): bwrap's command line, the host user it
runs as, and the resource limits its launcher sets before the command.

The command is not on bwrap's command line: the sandbox starts with a short launcher
(:data:`LAUNCHER`) that reads the command from its stdin, so the same argv serves every
call in one workspace and a sandbox can be set up before its call arrives
(:mod:`boxmaker.broker.sandbox`, :mod:`boxmaker.broker.sandbox_pool`). The sandbox sees
``/usr``, the host's ``/bin``, ``/sbin``, ``/lib*`` (as symlinks when the host's are) and
:data:`ETC_FILES`; /proc/sys and the other host knobs under /proc read-only; the
workspace at :data:`WORKSPACE`; never host root (:func:`sandbox_user`).
"""

from __future__ import annotations

import functools
import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import attrs

SANDBOX_PATH: Final = "/usr/local/bin:/usr/bin:/bin"
SANDBOX_ENV: Final[Mapping[str, str]] = {
    "PATH": SANDBOX_PATH,
    "HOME": "/workspace",
    "LANG": "C.UTF-8",
}
SYSTEM_DIRS: Final = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
"""Top-level host dirs shown read-only (or as the same symlink) when the host has them."""
ETC_FILES: Final = ("/etc/ld.so.cache", "/etc/alternatives", "/etc/localtime")
"""The only /etc entries the sandbox sees: the loader's cache, Debian's alternatives
(``/usr/bin/awk`` links through it) and the time zone."""
PROC_COVERED: Final = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus")
"""The host's knobs under /proc, shown read-only over the sandbox's fresh /proc."""
WORKSPACE: Final = "/workspace"

_READ_COMMAND: Final = 'c=; while IFS= read -r line; do c="$c$line\n"; done; '
_RUN_COMMAND: Final = 'exec </dev/null; exec /bin/sh -c "${c%?}"'
LAUNCHER: Final = (
    # Builtins only, so nothing is forked before the command: `read` takes the command
    # line by line, exactly (IFS= keeps blanks, -r keeps backslashes); the runner ends
    # it with one newline, which ${c%?} takes off again.
    _READ_COMMAND + _RUN_COMMAND
)
"""What a sandbox starts with: it waits for its command on stdin, then becomes
``/bin/sh -c COMMAND`` with stdin on /dev/null."""
NOT_ROOT_DETAIL: Final = "the sandbox never runs as host root (uid 0)"

EGRESS_MOUNT: Final = "/run/boxmaker-egress"
"""Where a sandbox with a way out sees its call's egress directory (read-only): brokerd's
proxy listens on ``proxy.sock`` in it (docs/egress.md)."""
PROXY_SOCKET: Final = "proxy.sock"
PROXY_PORT: Final = 3128
PROXY_URL: Final = f"http://127.0.0.1:{PROXY_PORT}"
PROXY_ENV: Final[Mapping[str, str]] = {
    # curl, git (libcurl) and python's urllib/requests/httpx (pip's too) read these;
    # curl reads only the lower-case http_proxy, python prefers lower case.
    **dict.fromkeys(
        ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"),
        PROXY_URL,
    ),
    # Empty: every host goes through brokerd, loopback and private names included.
    "NO_PROXY": "",
    "no_proxy": "",
    "npm_config_proxy": PROXY_URL,
    "npm_config_https_proxy": PROXY_URL,
}
"""What a sandbox with a way out adds to :data:`SANDBOX_ENV` (docs/egress.md)."""
TLS_FILES: Final = ("/etc/ssl/certs",)
"""What a sandbox with a way out also sees of /etc, when the host has it: the system's CA
certificates (Debian's links point into /usr/share/ca-certificates, which the sandbox
sees), so TLS clients check the hosts they reach through brokerd as they do on the host.
Not openssl.cnf: curl, python and pip verify the same without it (OpenSSL skips a
missing default configuration)."""
BRIDGE_BUFFER: Final = 262144
"""socat's buffer (``-b``): the most it moves with one read and one write."""
BRIDGE_POLLS: Final = 1000
"""How many times the launcher looks for the bridge's port (2 ms apart: about 3 s in
all, each look and ``sleep`` included) before it gives up."""


@attrs.frozen
class SandboxUser:
    """The host uid and gid bwrap runs as when brokerd is root (no supplementary
    groups): the sandbox is then a user namespace of an ordinary uid."""

    uid: int
    gid: int


LIMITS_FAILED: Final = 125
"""The launcher's exit status when it could not set the limits."""
LIMITS_FAILED_WORDS: Final = "boxmaker: the sandbox limits could not be set"
"""...and the last line of its stderr then."""
EGRESS_FAILED_WORDS: Final = "boxmaker: the sandbox's way out (socat) did not start"
"""The last line of the launcher's stderr when the bridge to brokerd's proxy did not
start listening (it exits :data:`LIMITS_FAILED` then: the command never runs)."""


@attrs.frozen
class SandboxLimits:
    """Resource limits of every process of a command ([runner] in config.toml), set by
    the launcher's ``ulimit`` before it execs the command: soft and hard both, so the
    command cannot raise them, and nothing has run in the sandbox yet."""

    memory: int
    """Bytes of address space (RLIMIT_AS; ``ulimit -v``, KiB)."""
    processes: int
    """Processes of the sandbox's uid in its user namespace (RLIMIT_NPROC), and, with a
    cgroup, the tasks of the whole sandbox, bwrap's two included (``pids.max``)."""
    file_size: int
    """Bytes of the largest file a command may write (RLIMIT_FSIZE; ``ulimit -f``, in
    POSIX's 512-byte blocks: /bin/sh is always started as ``sh``, so bash is in POSIX
    mode too)."""
    cpu_time: int
    """Seconds of CPU time per process (RLIMIT_CPU)."""

    def ulimit(self, *, address_space: bool = True, cpu_time: bool = True) -> str:
        """The shell line that sets them, or exits with :data:`LIMITS_FAILED` (the
        command never runs without them). RLIMIT_NPROC is ``-u`` in bash and busybox,
        ``-p`` in dash. CPU time: the hard limit a second above the soft one, so a
        command over it gets SIGXCPU (which names the limit), and SIGKILL only if it
        ignores that. An MCP server leaves out the address space (its cgroup bounds its
        memory: Node reserves large ranges it never uses) and the CPU time (it lives as
        long as brokerd; each call has a time limit instead)."""
        processes = self.processes
        steps = [f"ulimit -f {self.file_size // 512}"]
        if address_space:
            steps.insert(0, f"ulimit -v {self.memory // 1024}")
        if cpu_time:
            steps += [f"ulimit -St {self.cpu_time}", f"ulimit -Ht {self.cpu_time + 1}"]
        steps.append(f"{{ ulimit -u {processes} 2>/dev/null || ulimit -p {processes}; }}")
        return (
            f"{{ {' && '.join(steps)}; }} || "
            f"{{ echo '{LIMITS_FAILED_WORDS}' >&2; exit {LIMITS_FAILED}; }}; "
        )


DEFAULT_LIMITS: Final = SandboxLimits(memory=1 << 30, processes=256, file_size=1 << 30, cpu_time=30)


@attrs.frozen
class Launch:
    """Everything a sandbox is started with. A sandbox set up ahead serves a call only
    when its Launch equals the call's: the argv as :func:`sandbox_argv` made it (not
    as bwrap reads it through ``--args``), and the host user."""

    argv: tuple[str, ...]
    """From :func:`sandbox_argv`: bwrap, its options, then ``/bin/sh -c LAUNCHER``."""
    user: SandboxUser | None
    """Whom bwrap runs as; None: brokerd's own uid (never root, see :meth:`Sandbox.start`)."""
    limits: SandboxLimits = DEFAULT_LIMITS
    """The limits the argv's launcher sets (for the details that name them)."""


@attrs.frozen
class Egress:
    """A call's way out: its egress directory on the host (brokerd's proxy socket in it)
    and the socat that bridges a loopback port inside the sandbox to that socket."""

    directory: Path
    socat: str


def _bridge_start(socat: str) -> str:
    """The launcher's first step with a way out: socat in the background, listening on
    the sandbox's own loopback; each connection to it becomes one to the proxy socket."""
    # socat listens with a backlog of 5 unless told: more clients at once (pip, npm)
    # would wait for a SYN to be sent again. nodelay: without it the accepted socket
    # holds back small writes (Nagle), 40 ms a request; -b: with socat's 8 KiB buffer
    # a download costs a read and a write each 8 KiB (docs/decisions.md, "The bridge's
    # options").
    listen = f"TCP-LISTEN:{PROXY_PORT},bind=127.0.0.1,reuseaddr,fork,backlog=64,nodelay"
    connect = f"UNIX-CONNECT:{EGRESS_MOUNT}/{PROXY_SOCKET}"
    return (
        f"{shlex.quote(socat)} -b {BRIDGE_BUFFER} {listen} {connect} </dev/null >/dev/null & s=$!; "
    )


_BRIDGE_WAIT: Final = (
    # Builtins but `sleep`: the sandbox's own network namespace has no TCP socket but
    # socat's, and /proc/net/sockstat counts it in use once it listens (cheap to read,
    # unlike /proc/net/tcp, which walks the kernel's tables for each byte dash reads).
    # socat gone (its /proc/PID/stat missing or a zombie's) or BRIDGE_POLLS passed: the
    # call fails, and the command never runs without its proxy.
    "n=0; "
    'until { read -r _; read -r _ _ u _; } </proc/net/sockstat && [ "$u" != 0 ]; do '
    f"if [ $n -ge {BRIDGE_POLLS} ] || "
    '! { read -r _ _ st _ </proc/$s/stat && [ "$st" != Z ]; } 2>/dev/null; then '
    f'echo "{EGRESS_FAILED_WORDS}" >&2; exit {LIMITS_FAILED}; fi; '
    "n=$((n+1)); sleep 0.002; done; "
)


def egress_launch(launch: Launch, workspace: Path, egress: Egress) -> Launch:
    """``launch`` (a shell sandbox on ``workspace``) with ``egress``: the network variant,
    for one call, whose proxy socket is or will be in ``egress.directory``
    (docs/decisions.md, "The runner and the sandbox")."""
    argv = sandbox_argv(launch.argv[0], workspace, launch.limits, egress=egress)
    return attrs.evolve(launch, argv=argv)


class SandboxRefused(Exception):
    """The sandbox cannot run safely as things are; the message says why and what to do."""


def sandbox_user(workspace: Path, configured_uid: int | None) -> SandboxUser | None:
    """Whom bwrap runs as (docs/runbook.md#sandbox-as-root). brokerd not root: None, its
    own uid (``[runner] sandbox_uid`` cannot change it). brokerd root: ``sandbox_uid``
    (gid the same number) when set, else the workspace's owner and group (its owner's
    number when the group is root's); a workspace owned by root then raises
    :class:`SandboxRefused` — uid 0 and gid 0 are never used."""
    if os.geteuid() != 0:
        return None
    if configured_uid is not None:
        return SandboxUser(configured_uid, configured_uid)
    try:
        info = workspace.stat()
    except OSError as exc:
        raise SandboxRefused(
            f"cannot inspect the workspace {workspace} ({exc.strerror}); "
            "see docs/runbook.md#sandbox-as-root"
        ) from exc
    if info.st_uid == 0:
        raise SandboxRefused(
            f"brokerd runs as root and the workspace {workspace} belongs to root; "
            f"{NOT_ROOT_DETAIL}: set [runner] sandbox_uid to an ordinary uid that owns "
            "the workspace (or run brokerd as an ordinary user); "
            "see docs/runbook.md#sandbox-as-root"
        )
    return SandboxUser(info.st_uid, info.st_gid or info.st_uid)


@functools.cache
def _system_mounts() -> tuple[str, ...]:
    # The host's layout does not change while brokerd runs: computed once.
    args: list[str] = ["--ro-bind", "/usr", "/usr"]
    for name in SYSTEM_DIRS:
        host = Path("/", name)
        if host.is_symlink():
            args += ["--symlink", str(host.readlink()), str(host)]
        elif host.is_dir():
            args += ["--ro-bind", str(host), str(host)]
    for etc in ETC_FILES:
        if Path(etc).exists():
            args += ["--ro-bind", etc, etc]
    return tuple(args)


def _proc_covers() -> tuple[str, ...]:
    args: list[str] = []
    for path in PROC_COVERED:
        args += ["--ro-bind-try", path, path]
    return tuple(args)


def sandbox_argv(
    bwrap: str,
    workspace: Path,
    limits: SandboxLimits = DEFAULT_LIMITS,
    *,
    egress: Egress | None = None,
) -> tuple[str, ...]:
    """The bwrap command line of a shell sandbox on ``workspace``. The same for
    every call in one workspace: the command reaches :data:`LAUNCHER` on stdin, after
    ``limits`` are set. :meth:`Sandbox.start` passes all but the last three arguments
    (``/bin/sh -c`` and the launcher) through ``--args``.

    With ``egress`` (a call with a way out): its directory read-only at
    :data:`EGRESS_MOUNT`, :data:`TLS_FILES`, :data:`PROXY_ENV`, and a launcher that
    starts the bridge before it reads the command and execs it only once the bridge
    listens. Still no resolver: names are resolved by brokerd, after its decision."""
    mounts: tuple[str, ...] = ("--bind", str(workspace), WORKSPACE)
    env = SANDBOX_ENV
    script = limits.ulimit() + LAUNCHER
    if egress is not None:
        mounts += _egress_mounts(egress)
        env = {**SANDBOX_ENV, **PROXY_ENV}
        script = (
            limits.ulimit()
            + _bridge_start(egress.socat)
            + _READ_COMMAND
            + _BRIDGE_WAIT
            + _RUN_COMMAND
        )
    return _bwrap_argv(
        bwrap, env=env, mounts=mounts, chdir=WORKSPACE, tmpfs_size=limits.memory, script=script
    )


def _egress_mounts(egress: Egress) -> tuple[str, ...]:
    return ("--ro-bind", str(egress.directory), EGRESS_MOUNT, *_tls_mounts())


@functools.cache
def _tls_mounts() -> tuple[str, ...]:
    args: list[str] = []
    for path in TLS_FILES:
        if Path(path).exists():
            args += ["--ro-bind", path, path]
    return tuple(args)


SERVER_HOME: Final = "/tmp"  # noqa: S108  (the sandbox's own tmpfs)
"""An MCP server's HOME and working directory: the sandbox's own, sized /tmp."""


def server_argv(
    bwrap: str,
    *,
    env: Mapping[str, str],
    mounts: tuple[str, ...],
    limits: SandboxLimits,
    argv: tuple[str, ...],
    address_space: bool,
    egress: Egress | None = None,
) -> tuple[str, ...]:
    """The bwrap command line of an MCP server's sandbox (mcp/gateway_launch.py): the
    shell's sandbox with ``mounts`` in place of the workspace, ``env`` over
    :data:`SANDBOX_ENV`, and the server's own ``argv`` exec'ed once the limits are set
    (stdin and stdout stay the MCP stream). ``address_space``: whether the launcher sets
    RLIMIT_AS (only without a cgroup to bound memory).

    With ``egress`` (a server with a way out, for its whole life): what a shell call's
    sandbox gets (:func:`sandbox_argv`), the proxy variables over the server's own
    ``env``, and the server exec'ed only once the bridge listens."""
    script = limits.ulimit(address_space=address_space, cpu_time=False)
    environment = {**SANDBOX_ENV, "HOME": SERVER_HOME, **env}
    if egress is not None:
        mounts += _egress_mounts(egress)
        environment.update(PROXY_ENV)
        script += _bridge_start(egress.socat) + _BRIDGE_WAIT
    script += "exec " + " ".join(shlex.quote(part) for part in argv)
    return _bwrap_argv(
        bwrap,
        env=environment,
        mounts=mounts,
        chdir=SERVER_HOME,
        tmpfs_size=limits.memory,
        script=script,
    )


def _bwrap_argv(
    bwrap: str,
    *,
    env: Mapping[str, str],
    mounts: tuple[str, ...],
    chdir: str,
    tmpfs_size: int,
    script: str,
) -> tuple[str, ...]:
    setenv: list[str] = []
    for key, value in env.items():
        setenv += ["--setenv", key, value]
    return (
        bwrap,
        "--unshare-all",
        # A user namespace of its own, in which the command cannot make another: one
        # would hold every capability over its own network namespace and mounts.
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--clearenv",
        *setenv,
        *_system_mounts(),
        "--proc",
        "/proc",
        # bwrap covers these itself only where it finds them writable at set-up; here
        # they are read-only whoever runs it.
        *_proc_covers(),
        "--dev",
        "/dev",
        # The in-memory file systems a command can write are no bigger than its memory
        # limit: /dev/shm and /tmp sized, /dev itself (a tmpfs too) read-only.
        "--size",
        str(tmpfs_size),
        "--tmpfs",
        "/dev/shm",  # noqa: S108  (the sandbox's own, sized tmpfs)
        "--remount-ro",
        "/dev",
        "--size",
        str(tmpfs_size),
        "--tmpfs",
        "/tmp",  # noqa: S108  (a fresh tmpfs inside the sandbox, not the host's /tmp)
        *mounts,
        # Last, so the mounts above exist: the sandbox's root (and /etc in it) read-only.
        "--remount-ro",
        "/",
        "--chdir",
        chdir,
        "/bin/sh",
        "-c",
        script,
    )
