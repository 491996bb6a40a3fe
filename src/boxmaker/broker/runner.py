"""The runner: what runs for a decided call, and running it (docs/protocol.md).

Nothing runs without a :class:`RunSpec`, and a RunSpec is made only by
:meth:`RunSpec.for_verdict` from a verdict core made (:func:`boxmaker.core.decide.evaluate`),
``run`` or ``ask`` that the owner approved: it carries the grant that matched and the
arguments core checked. :func:`execute` runs it and maps every tool failure to a
:class:`RunResult` with one of the failure reasons of docs/protocol.md; it never raises
for a tool failure and lets ``trio.Cancelled`` through.

Choices made here (docs/decisions.md, "The runner and the sandbox", repeats them):

- Symlinks: the file tools follow a symlink only while it stays inside
  the workspace. The path is resolved (``realpath``), checked to be inside the workspace's real path
  (else ``path_escape``), and then walked segment by segment from a descriptor of the
  workspace root with ``O_NOFOLLOW`` on every segment, so a link swapped in after the
  check (the sandboxed shell shares the workspace) fails instead of being followed. The
  result's label is the join of the requested path's label and the real path's (a link
  ``notes.txt -> .env`` reads as secret).
- Links and a ``paths`` grant: the grant bounds the file actually opened. Once the
  file (or listed directory, or write_file's directory) is open, its real path is read
  from the descriptor (``/proc/self/fd``) and its link count from ``fstat``, and
  :func:`~boxmaker.core.grants.opened_refusal` decides on them before anything is read
  or written through it: a real path outside the grant's ``paths``, or a regular file
  with other names (hard links) without the grant's ``hard_links``, is ``path_escape``.
  The real path is also checked before opening, so a link out of the grant is refused
  the same way whether or not its target exists. A file with other names reads as the
  highest label ``[labels]`` gives (:meth:`~boxmaker.core.labels.LabelRules.label_for_opened`).
- ``read_file``: without ``max_bytes`` a file over 1 MiB is ``too_large``; with it, the
  first ``max_bytes`` bytes are read (the schema says "read at most") and a marker says
  the content was cut. Only regular files are read (a FIFO or device is ``tool_error``).
- ``list_dir``: sorted names, one per line; a directory ends in ``/``, a symlink in
  ``@`` (never followed); a listing over 1 MiB is ``too_large``.
- ``write_file``: the parent directory must exist (else ``not_found``); a symlink at the
  final name is ``path_escape`` and the rename replaces a name, never a link's target. A
  new file gets mode 0o666 less the umask; a replaced file keeps its permission bits.
- ``shell``: stdout, then stderr after a ``[stderr]`` line when there is any, cut at the
  output cap as a whole. Exit status non-zero is ``tool_error`` with the stderr tail.
  A sandbox that bwrap could not set up (it never reported the command's exit) is
  ``sandbox_unavailable``, like a missing bwrap. The sandbox (sandbox.py) sees ``/usr``,
  the host's ``/bin``, ``/sbin``, ``/lib*`` (as symlinks when the host's are), and
  :data:`~boxmaker.broker.sandbox.ETC_FILES` — no ``/etc/passwd``: host user names stay
  out, so ``whoami`` fails inside.
  All capabilities are dropped, and the sandbox is never host root: brokerd as root
  starts bwrap as ``[runner] sandbox_uid`` or the workspace's owner, and refuses a
  root-owned workspace (sandbox_unavailable, docs/runbook.md#sandbox-as-root). A
  seccomp filter keeps setuid/setgid bits off every file; /proc/sys and the other
  host knobs under /proc are read-only. The ``[runner]`` limits (memory, processes,
  file size, CPU time) hold for every process of the command; one that kills it
  (SIGXCPU, SIGXFSZ) is named in the ``tool_error`` detail, and a memory or fork
  failure's stderr points at its limit (docs/runbook.md#sandbox-limits). Where brokerd
  has cgroups, the memory limit (swap included) and the process limit also hold for
  the sandbox as a whole; a process its OOM killer killed, or a fork it refused, is
  named for certain (the kernel counted it), a kill even when the command exits 0.
- ``http_get``: no redirect is followed (a 3xx is ``tool_error`` naming the Location,
  so the next URL goes through decide() again); a status of 400 or more is
  ``tool_error``; the body is capped after content decoding (no zip bombs); proxies and
  .netrc from brokerd's environment are ignored. The host and port are checked against
  the grant's ``hosts`` again right before connecting; then the host is resolved once,
  every address it resolves to is checked (:func:`boxmaker.core.hosts.address_problem`:
  loopback, private, link-local and other special addresses only where the grant names
  them), and the connection goes to a checked address (the next one in the resolver's
  order when one does not connect), with the URL's host in the Host header and as the
  TLS server name: no second lookup, so no DNS rebinding in between.
  A refused address is ``tool_error`` with a detail pointing at the runbook.
- A shell call may use a sandbox brokerd set up ahead of it (sandbox.py); each sandbox
  serves one call and is torn down after it.
- A RunSpec's private token stops accidental construction, not a determined caller
  (``attrs.evolve`` copies it): Python has no private constructors.
- httpx is imported by the first ``http_get``, not at start (~8 MB of resident
  memory brokerd needs only where http_get is granted).
- File tools run in a worker thread and are not timed: a thread cannot be stopped, and
  answering ``timeout`` for a write that then lands would be a lie.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import logging
import math
import os
import secrets
import shutil
import signal
import stat
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Final, TypeAlias

import attrs
import trio

from boxmaker.broker.bwrap_version import bwrap_version_problem
from boxmaker.broker.cgroups import Usage
from boxmaker.broker.nowait import CachedFile, fd_real_path, read_cached_beneath
from boxmaker.broker.sandbox import (
    LIMITS_FAILED,
    LIMITS_FAILED_WORDS,
    SANDBOX_ENV,
    STDERR_TAIL,
    Launch,
    SandboxLimits,
    SandboxPool,
    SandboxRefused,
    sandbox_argv,
    sandbox_user,
)
from boxmaker.broker.workspace_paths import (
    DIR_FLAGS,
    first_missing,
    real_relative,
    split,
)
from boxmaker.core.catalogue import (
    MAX_BYTES,
    CheckedArguments,
    HttpGetArgs,
    ListDirArgs,
    ReadFileArgs,
    ShellArgs,
    ToolName,
    WriteFileArgs,
    result_label,
)
from boxmaker.core.decide import Ask, Run
from boxmaker.core.grants import Grant, opened_refusal
from boxmaker.core.hosts import address_problem, host_rules
from boxmaker.core.labels import Label, LabelRules
from boxmaker.core.paths import ROOT, path_below
from boxmaker.core.reasons import Reason
from boxmaker.home import RunnerConfig
from boxmaker.threads import WORKER_THREAD, ToThread

if TYPE_CHECKING:
    import httpx

log = logging.getLogger("boxmaker.brokerd.runner")

RUNBOOK_SANDBOX: Final = "docs/runbook.md#sandbox"
RUNBOOK_SANDBOX_LIMITS: Final = "docs/runbook.md#sandbox-limits"
RUNBOOK_HTTP_GET: Final = "docs/runbook.md#http-get"
NO_BWRAP_DETAIL: Final = (
    "bubblewrap (bwrap) is not available; the shell tool never runs unsandboxed; "
    "see docs/runbook.md#sandbox"
)
STOPPABLE_TOOLS: Final[frozenset[ToolName]] = frozenset({"shell", "http_get"})
"""The tools whose run brokerd stops when the requester leaves (broker/connection.py):
they can run for long and can be cancelled at any point (the sandbox is killed; the
fetch is closed). The file tools run to their end in a worker thread: short and
bounded (1 MiB), and a write stopped half-way would leave the ledger unsure of it."""
CACHED_READ_MAX: Final = 64 * 1024
"""The largest file read_file reads on the trio thread when all of it is cached: the
copy and decode of a bigger one would hold up every other call."""
HTTP_TIMEOUT: Final = 10.0
"""Seconds for a whole http_get: connect, headers and body."""
# O_NONBLOCK: opening a FIFO planted in the workspace must not hang the worker thread.
_READ_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_TEMP_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK: Final = 65536


@attrs.frozen
class RunResult:
    """How a run ended: ``ok`` with content, or failed with a reason."""

    ok: bool
    reason: Reason | None
    """None when ok; else tool_error, timeout, not_found, too_large, path_escape or
    sandbox_unavailable."""
    detail: str | None
    content: str
    """What the model is given on success; "" on failure."""
    label: Label
    """The result's label; a failure carries the label of what it touched."""

    @classmethod
    def success(cls, content: str, label: Label) -> RunResult:
        return cls(True, None, None, content, label)

    @classmethod
    def failure(cls, reason: Reason, detail: str, label: Label) -> RunResult:
        return cls(False, reason, detail, "", label)


_FOR_VERDICT: Final = object()


def _only_for_verdict(instance: object, attribute: object, value: object) -> None:
    if value is not _FOR_VERDICT:
        raise TypeError("a RunSpec is made only by RunSpec.for_verdict")


@attrs.frozen
class RunSpec:
    """What runs for one decided call; made only by :meth:`for_verdict`."""

    _call: str
    _arguments: CheckedArguments
    _workspace: Path
    _rules: LabelRules
    _label: Label
    _time_limit: float | None
    _output_cap: int
    _sandbox: Launch | str | None
    """shell: how its sandbox starts, or why it cannot (a detail for
    sandbox_unavailable); None for the other tools."""
    _hosts: tuple[str, ...]
    _grant: str | None
    _bounds: Grant
    """The decision's grant: its ``paths`` and ``hard_links`` bound the file opened."""
    _token: object = attrs.field(validator=_only_for_verdict, repr=False)

    @classmethod
    def for_verdict(
        cls,
        verdict: Run | Ask,
        *,
        workspace: Path,
        runner: RunnerConfig,
        labels: LabelRules,
        approved: bool = False,
    ) -> RunSpec:
        """The RunSpec of a ``run`` verdict, or of an ``ask`` one the owner approved,
        built from the verdict alone: it carries the grant that matched and the
        arguments decide() checked, so nothing is looked up or checked a second time.
        Raises ValueError for an ask not approved."""
        if isinstance(verdict, Ask) and not approved:
            raise ValueError(
                f"call {verdict.decision.call}: an ask decision runs only once approved"
            )
        if not isinstance(verdict, Run | Ask):
            raise ValueError(f"call {verdict.decision.call}: only a run or ask verdict runs")  # noqa: TRY004
        call = verdict.decision.call
        return cls._build(call, verdict.checked, verdict.grant, workspace, runner, labels)

    @classmethod
    def _build(
        cls,
        call: str,
        checked: CheckedArguments,
        grant: Grant,
        workspace: Path,
        runner: RunnerConfig,
        labels: LabelRules,
    ) -> RunSpec:
        if grant.tool != checked.tool:
            raise ValueError(f"call {call}: grant {grant.id} is not for {checked.tool}")
        label = result_label(checked, labels, grant.label_taint)
        value = checked.value
        time_limit: float | None = None
        output_cap = MAX_BYTES
        sandbox: Launch | str | None = None
        if isinstance(value, ShellArgs):
            time_limit = runner.shell_timeout
            output_cap = runner.output_cap
            sandbox = _launch(workspace, runner)
        elif isinstance(value, HttpGetArgs):
            time_limit = HTTP_TIMEOUT
        return cls(
            call,
            checked,
            workspace,
            labels,
            label,
            time_limit,
            output_cap,
            sandbox,
            grant.hosts,
            grant.id,
            grant,
            _FOR_VERDICT,
        )

    @property
    def call(self) -> str:
        return self._call

    @property
    def tool(self) -> ToolName:
        return self._arguments.tool

    @property
    def arguments(self) -> CheckedArguments:
        return self._arguments

    @property
    def workspace(self) -> Path:
        return self._workspace

    @property
    def label(self) -> Label:
        """The result's label as decided; a file tool may raise it by the real path."""
        return self._label

    @property
    def time_limit(self) -> float | None:
        """Seconds: shell's RunnerConfig.shell_timeout, http_get's 10; file tools None."""
        return self._time_limit

    @property
    def output_cap(self) -> int:
        """Bytes of output kept: shell's RunnerConfig.output_cap, else 1 MiB."""
        return self._output_cap

    @property
    def sandbox(self) -> Launch | str | None:
        """shell: how its sandbox starts (:class:`~boxmaker.broker.sandbox.Launch`), or
        why it cannot (str). None for the other tools."""
        return self._sandbox

    @property
    def argv(self) -> tuple[str, ...] | None:
        """shell: the bwrap command line (mounts, env and limits included; the sandbox
        adds only its descriptors). None for the other tools, and when it cannot run."""
        return self._sandbox.argv if isinstance(self._sandbox, Launch) else None

    @property
    def env(self) -> Mapping[str, str]:
        """The whole environment of a shell command (``--clearenv``); empty otherwise."""
        return SANDBOX_ENV if self.tool == "shell" else {}

    @property
    def network(self) -> tuple[str, ...]:
        """Hosts the call may reach: the grant's for http_get, none for every other tool."""
        return self._hosts if self.tool == "http_get" else ()

    @property
    def grant(self) -> str | None:
        return self._grant


class _Failed(Exception):
    """Internal: a tool failure with its reason code, raised inside the worker thread."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


async def execute(
    spec: RunSpec,
    sandboxes: SandboxPool | None = None,
    *,
    host: Host | None = None,
    to_thread: ToThread = WORKER_THREAD,
) -> RunResult:
    """Run ``spec``. Never raises for a tool failure; lets Cancelled through.

    ``sandboxes``: brokerd's pool, whose sandbox set up ahead a shell call may use;
    without it a shell call sets up its own. ``host``: what the tools ask of the
    machine (:data:`REAL_HOST` unless a test passes its own). ``to_thread``: where the
    file tools' blocking work runs (brokerd passes its own, :class:`ToThread`)."""
    value = spec.arguments.value
    host = host or REAL_HOST
    try:
        if isinstance(value, ReadFileArgs):
            cached = _read_file_cached(spec, value, host.read_cached)
            if cached is not None:
                return cached
            return await to_thread(_read_file, spec, value, host)
        if isinstance(value, ListDirArgs):
            return await to_thread(_list_dir, spec, value, host)
        if isinstance(value, WriteFileArgs):
            return await to_thread(_write_file, spec, value, host)
        if isinstance(value, ShellArgs):
            return await _shell(spec, value.command, sandboxes)
        return await _http_get(spec, value, host)
    except _Failed as failed:
        return RunResult.failure(failed.reason, failed.detail, spec.label)
    except Exception as exc:
        # Cancelled is not an Exception: it passes. Anything else is the tool's failure.
        log.debug("call %s: %s failed", spec.call, spec.tool, exc_info=True)
        return RunResult.failure(Reason.TOOL_ERROR, _describe(exc), spec.label)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return f"{type(exc).__name__}: {exc}"[:STDERR_TAIL]


# --- the file tools (worker thread) -------------------------------------------------


def _escape(path: str) -> _Failed:
    return _Failed(Reason.PATH_ESCAPE, f"{path}: a symlink leads outside the workspace")


def _real_relative(workspace: Path, path: str) -> tuple[str, str]:
    """(the workspace's real path, ``path``'s real path relative to it), or path_escape."""
    root, relative = real_relative(workspace, path)
    if relative is None:
        raise _escape(path)
    return root, relative


def _walk(root: str, relative: str, path: str) -> int:
    """A descriptor of the directory ``relative`` (real, symlink-free) under ``root``.

    Every segment is opened with O_NOFOLLOW: a symlink swapped in after the realpath
    check (ELOOP) is an escape attempt, not something to follow.
    """
    fd = os.open(root, DIR_FLAGS)
    try:
        for segment in [] if relative == ROOT else relative.split("/"):
            child = _open_at(fd, segment, DIR_FLAGS, path)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_at(dir_fd: int, name: str, flags: int, path: str) -> int:
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        # O_NOFOLLOW meets a symlink as ELOOP, or as ENOTDIR with O_DIRECTORY.
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            with contextlib.suppress(OSError):
                if stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode):
                    raise _escape(path) from None
        raise _os_failure(exc, path) from None


def _opened_relative(
    fd: int, root: str, walked: str, path: str, opened_path: Callable[[int], str | None]
) -> str:
    """The workspace path of what ``fd`` names now (``/proc/self/fd``): the file that
    was opened, whatever happened to the names since the walk. path_escape when it is
    outside the workspace; ``walked`` (the O_NOFOLLOW walk's own path) when the kernel
    cannot tell (a file unlinked since it was opened has no path). ``opened_path`` is
    :func:`~boxmaker.broker.nowait.fd_real_path` (a test's stands for a name moved)."""
    real = opened_path(fd)
    if real is None:
        return walked
    relative = path_below(root, real)
    if relative is None:
        raise _escape(path)
    return relative


def _bound(spec: RunSpec, path: str, real: str, links: int = 1) -> None:
    """path_escape unless the grant covers ``real`` (and, for ``links`` > 1, allows a
    file with other names); see :func:`~boxmaker.core.grants.opened_refusal`."""
    refusal = opened_refusal(spec._bounds, path, real, links)
    if refusal is not None:
        raise _Failed(Reason.PATH_ESCAPE, refusal)


def _join(parent: str, name: str) -> str:
    return name if parent == ROOT else f"{parent}/{name}"


def _exists(dir_fd: int, name: str) -> bool:
    try:
        os.lstat(name, dir_fd=dir_fd)
    except OSError:
        return False
    return True


def _os_failure(exc: OSError, path: str) -> _Failed:
    if exc.errno == errno.ELOOP:
        return _escape(path)
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return _Failed(Reason.NOT_FOUND, f"{path}: no such file or directory")
    return _Failed(Reason.TOOL_ERROR, f"{path}: {exc.strerror or exc}")


def _read_file(spec: RunSpec, args: ReadFileArgs, host: Host) -> RunResult:
    root, real = host.real_relative(spec.workspace, args.path)
    _bound(spec, args.path, real)
    if real == ROOT:
        raise _Failed(Reason.TOOL_ERROR, f"{args.path}: is a directory")
    parent, name = split(real)
    dir_fd = _walk(root, parent, args.path)
    try:
        fd = _open_at(dir_fd, name, _READ_FLAGS, args.path)
    finally:
        os.close(dir_fd)
    try:
        # Decided on the open descriptor, before a byte is read through it.
        info = os.fstat(fd)
        opened = _opened_relative(fd, root, real, args.path, host.opened_path)
        links = info.st_nlink if stat.S_ISREG(info.st_mode) else 1
        _bound(spec, args.path, opened, links)
        label = spec.label.join(spec._rules.label_for_opened(args.path, opened, links))
        if stat.S_ISDIR(info.st_mode):
            raise _Failed(Reason.TOOL_ERROR, f"{args.path}: is a directory")
        if not stat.S_ISREG(info.st_mode):
            raise _Failed(Reason.TOOL_ERROR, f"{args.path}: not a regular file")
        limit = args.max_bytes if args.max_bytes is not None else MAX_BYTES
        # One byte more than the limit tells a file that grew past it since fstat.
        data = _read_up_to(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) <= limit:
        return RunResult.success(data.decode("utf-8", errors="replace"), label)
    if args.max_bytes is None:
        raise _Failed(
            Reason.TOO_LARGE,
            f"{args.path}: over {MAX_BYTES} bytes; pass max_bytes to read the start of it",
        )
    size = max(info.st_size, len(data))
    text = data[:limit].decode("utf-8", errors="replace")
    return RunResult.success(f"{text}\n[file cut at {limit} of {size} bytes]", label)


def _read_file_cached(
    spec: RunSpec, args: ReadFileArgs, read_cached: CachedReader = read_cached_beneath
) -> RunResult | None:
    """read_file on the trio thread, when the kernel can serve it without blocking
    (nowait.py): a small regular file, inside the workspace, all of it cached. None
    sends the call to :func:`_read_file` in a worker thread, which also gives every
    failure its reason. The same content and label as :func:`_read_file` would give."""
    limit = args.max_bytes if args.max_bytes is not None else MAX_BYTES
    cached = read_cached(str(spec.workspace), args.path, min(limit, CACHED_READ_MAX))
    if cached is None:
        return None
    # Decided on the descriptor read (nowait.py): a refusal leaves the data unused.
    _bound(spec, args.path, cached.relative, cached.links)
    label = spec.label.join(spec._rules.label_for_opened(args.path, cached.relative, cached.links))
    return RunResult.success(cached.data.decode("utf-8", errors="replace"), label)


def _read_up_to(fd: int, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = os.read(fd, min(_CHUNK, size - len(data)))
        if not chunk:
            break
        data += chunk
    return bytes(data)


def _list_dir(spec: RunSpec, args: ListDirArgs, host: Host) -> RunResult:
    root, real = host.real_relative(spec.workspace, args.path)
    _bound(spec, args.path, real)
    parent, name = split(real)
    if real == ROOT:
        fd = _walk(root, ROOT, args.path)
    else:
        dir_fd = _walk(root, parent, args.path)
        try:
            fd = _open_at(dir_fd, name, DIR_FLAGS, args.path)
        except _Failed as failed:
            if (failed.reason is Reason.NOT_FOUND) and _exists(dir_fd, name):
                raise _Failed(Reason.TOOL_ERROR, f"{args.path}: not a directory") from None
            raise
        finally:
            os.close(dir_fd)
    try:
        # Decided on the open descriptor, before it is listed.
        opened = _opened_relative(fd, root, real, args.path, host.opened_path)
        _bound(spec, args.path, opened)
        label = spec.label.join(spec._rules.label_for_opened(args.path, opened, 1))
        names = []
        with os.scandir(fd) as entries:
            for entry in entries:
                if entry.is_symlink():
                    names.append(entry.name + "@")
                elif entry.is_dir(follow_symlinks=False):
                    names.append(entry.name + "/")
                else:
                    names.append(entry.name)
    finally:
        os.close(fd)
    content = "\n".join(sorted(names))
    if len(content.encode("utf-8", errors="surrogateescape")) > MAX_BYTES:
        raise _Failed(Reason.TOO_LARGE, f"{args.path}: the listing is over {MAX_BYTES} bytes")
    return RunResult.success(content, label)


def _write_file(spec: RunSpec, args: WriteFileArgs, host: Host) -> RunResult:
    parent_path, name = split(args.path)
    if args.path == ROOT:
        raise _Failed(Reason.TOOL_ERROR, f"{args.path}: is a directory")
    root, real_parent = host.real_relative(spec.workspace, parent_path)
    _bound(spec, args.path, _join(real_parent, name))
    dir_fd = _walk(root, real_parent, args.path)
    try:
        # The target's real path is its directory's (read from the descriptor the
        # rename goes through) and its own name, which is never a symlink: one there is
        # refused below, and one raced in is replaced by the rename, not followed.
        opened_parent = _opened_relative(dir_fd, root, real_parent, args.path, host.opened_path)
        _bound(spec, args.path, _join(opened_parent, name))
        mode: int | None = None
        try:
            info = os.lstat(name, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        else:
            if stat.S_ISLNK(info.st_mode):
                raise _escape(args.path)
            if stat.S_ISDIR(info.st_mode):
                raise _Failed(Reason.TOOL_ERROR, f"{args.path}: is a directory")
            mode = stat.S_IMODE(info.st_mode)
        data = args.content.encode("utf-8", errors="surrogatepass")
        temp = f".{name[:100]}.{secrets.token_hex(8)}.tmp"
        fd = os.open(temp, _TEMP_FLAGS, 0o666, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "wb", buffering=0) as file:
                if mode is not None:
                    os.fchmod(fd, mode)
                view = memoryview(data)
                while view:
                    view = view[file.write(view) or 0 :]
                os.fsync(fd)
            # rename replaces the name itself: a symlink raced in at the final name is
            # replaced, its target is never written.
            os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=dir_fd)
            raise
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return RunResult.success(f"wrote {len(data)} bytes to {args.path}", spec.label)


# --- looking before a write (the owner's preview of its change) ------------------------


@attrs.frozen
class WriteTarget:
    """What a write_file's path leads to now, reached as :func:`_write_file` would
    reach it. ``missing_directory``: the first directory of the path that does not
    exist (the write would fail ``not_found``); ``problem``: why the file cannot be
    looked at (an escape, not a regular file, other names, too large); else ``data``,
    the file's bytes (None: no file there yet), ``opened`` its real workspace path."""

    missing_directory: str | None = None
    problem: str | None = None
    data: bytes | None = None
    opened: str | None = None


def look_before_write(
    workspace: Path, path: str, limit: int, host: Host | None = None
) -> WriteTarget:
    """Blocking (a worker thread). ``limit``: the most bytes to read of an existing file.
    Never follows a symlink out, never opens a FIFO for reading without O_NONBLOCK, reads
    only a regular file with one name. (Before an ask, only whether the directory exists
    matters: :func:`boxmaker.broker.workspace_paths.missing_directory`.)"""
    try:
        return _look(workspace, path, limit, host or REAL_HOST)
    except _Failed as failed:
        return WriteTarget(problem=failed.detail)
    except OSError as exc:
        return WriteTarget(problem=f"{path}: {exc.strerror or exc}")


def _look(workspace: Path, path: str, limit: int, host: Host) -> WriteTarget:
    if path == ROOT:
        raise _Failed(Reason.TOOL_ERROR, f"{path}: is a directory")
    parent_path, name = split(path)
    root, real_parent = host.real_relative(workspace, parent_path)
    missing = first_missing(root, real_parent)
    if missing is not None:
        return WriteTarget(missing_directory=missing)
    dir_fd = _walk(root, real_parent, path)
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return WriteTarget()
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _Failed(
                Reason.PATH_ESCAPE, f"{path}: a symlink (the write replaces the link itself)"
            ) from None
        raise _os_failure(exc, path) from None
    finally:
        os.close(dir_fd)
    try:
        info = os.fstat(fd)
        opened = _opened_relative(fd, root, _join(real_parent, name), path, host.opened_path)
        if stat.S_ISDIR(info.st_mode):
            raise _Failed(Reason.TOOL_ERROR, f"{path}: is a directory")
        if not stat.S_ISREG(info.st_mode):
            raise _Failed(Reason.TOOL_ERROR, f"{path}: not a regular file")
        if info.st_nlink > 1:
            raise _Failed(Reason.TOOL_ERROR, f"{path}: the file has other names (hard links)")
        # One byte more than the limit tells a file that grew past it since fstat.
        data = b"" if info.st_size > limit else _read_up_to(fd, limit + 1)
    finally:
        os.close(fd)
    if info.st_size > limit or len(data) > limit:
        raise _Failed(Reason.TOO_LARGE, f"{path}: over {limit} bytes")
    return WriteTarget(data=data, opened=opened)


# --- shell ---------------------------------------------------------------------------


def _sandbox_limits(runner: RunnerConfig) -> SandboxLimits:
    cpu_time = runner.cpu_time_limit
    return SandboxLimits(
        memory=runner.memory_limit_mib << 20,
        processes=runner.process_limit,
        file_size=runner.file_size_limit_mib << 20,
        cpu_time=cpu_time if cpu_time is not None else math.ceil(runner.shell_timeout),
    )


def _launch(workspace: Path, runner: RunnerConfig) -> Launch | str:
    """The sandbox of a shell call in ``workspace``, or why there can be none."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return NO_BWRAP_DETAIL
    too_old = bwrap_version_problem(bwrap)
    if too_old is not None:
        return f"{too_old}; see {RUNBOOK_SANDBOX}"
    try:
        user = sandbox_user(workspace, runner.sandbox_uid)
    except SandboxRefused as refused:
        return str(refused)
    limits = _sandbox_limits(runner)
    return Launch(sandbox_argv(bwrap, workspace, limits), user, limits)


def _limit_detail(limits: SandboxLimits, returncode: int, stderr: str, usage: Usage) -> str | None:
    """What to say of a command that the sandbox's limits stopped, if they did: what its
    cgroup counted (an OOM kill, a refused fork) and a SIGXCPU or SIGXFSZ death name
    their limit; the per-process memory and process limits only make a call fail, and
    the command's own words are the hint."""
    memory = f"memory_limit_mib ({limits.memory >> 20} MiB)"
    if usage.oom_kills:
        who = "the command" if returncode != 0 else "a process of the command"
        return f"{who} was killed: it exceeded [runner] {memory}"
    killed = {
        signal.SIGXCPU: f"cpu_time_limit ({limits.cpu_time} s)",
        signal.SIGXFSZ: f"file_size_limit_mib ({limits.file_size >> 20} MiB)",
    }
    for number, key in killed.items():
        if returncode in (128 + number, -number):
            return f"the command was killed ({number.name}): it exceeded [runner] {key}"
    processes = f"process_limit ({limits.processes})"
    if usage.forks_refused:
        return f"the command reached [runner] {processes}: a new process was refused"
    hints = {
        memory: (
            "Cannot allocate memory",
            "MemoryError",
            "out of memory",
        ),
        processes: (
            "Cannot fork",
            "can't fork",
            "Resource temporarily unavailable",
        ),
    }
    for key, words in hints.items():
        if any(word in stderr for word in words):
            return f"the command probably reached [runner] {key}"
    return None


async def _shell(spec: RunSpec, command: str, sandboxes: SandboxPool | None) -> RunResult:
    launch = spec.sandbox
    if not isinstance(launch, Launch):
        detail = launch if isinstance(launch, str) else NO_BWRAP_DETAIL
        return RunResult.failure(Reason.SANDBOX_UNAVAILABLE, detail, spec.label)
    try:
        # A pool that is not running only ever sets up a sandbox for the call at hand.
        async with (sandboxes or SandboxPool()).sandbox(launch) as sandbox:
            run = await sandbox.run(command, time_limit=spec.time_limit, output_cap=spec.output_cap)
    except SandboxRefused as refused:
        return RunResult.failure(Reason.SANDBOX_UNAVAILABLE, str(refused), spec.label)
    except OSError as exc:
        detail = f"bubblewrap (bwrap) could not be started: {_describe(exc)}; see {RUNBOOK_SANDBOX}"
        return RunResult.failure(Reason.SANDBOX_UNAVAILABLE, detail, spec.label)
    if run.timed_out:
        detail = f"killed after {spec.time_limit:g} s (the time limit)"
        return RunResult.failure(Reason.TIMEOUT, detail, spec.label)
    stderr = run.err.last_words()
    # An OOM kill (of bwrap's pid 1 too, when the victim) is the limit, never the set-up.
    killed = run.usage.oom_kills > 0
    set_up = run.ran and not (
        run.returncode == LIMITS_FAILED and stderr.endswith(LIMITS_FAILED_WORDS)
    )
    if not set_up and not killed:
        detail = f"bubblewrap could not set up the sandbox: {stderr}; see {RUNBOOK_SANDBOX}"
        return RunResult.failure(Reason.SANDBOX_UNAVAILABLE, detail, spec.label)
    if run.returncode != 0 or killed:
        detail = f"exit status {run.returncode}"
        if run.err.total:
            detail += ": " + stderr
        limit = _limit_detail(launch.limits, run.returncode or 0, stderr, run.usage)
        if limit is not None:
            detail = f"{limit} ({detail}); see {RUNBOOK_SANDBOX_LIMITS}"
        return RunResult.failure(Reason.TOOL_ERROR, detail, spec.label)
    return RunResult.success(run.content(spec.output_cap), spec.label)


# --- http_get ------------------------------------------------------------------------


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


async def resolve_addresses(host: str, port: int) -> list[str]:
    """The IP addresses ``host`` resolves to, in the resolver's order, each once.

    An IP address resolves to itself without a lookup. This is the seam tests replace
    (no test resolves a real name or connects anywhere but 127.0.0.1).
    """
    if _is_address(host):
        return [str(ipaddress.ip_address(host))]
    infos = await trio.socket.getaddrinfo(host, port, type=trio.socket.SOCK_STREAM)
    addresses: list[str] = []
    for _family, _type, _proto, _canonname, sockaddr in infos:
        address = str(sockaddr[0])
        if address not in addresses:
            addresses.append(address)
    return addresses


async def _http_get(spec: RunSpec, args: HttpGetArgs, machine: Host) -> RunResult:
    # Imported on the first http_get, not at start: httpx (with ssl and its transport
    # stack) is ~8 MB of brokerd's resident memory, paid only where http_get is used.
    import httpx

    host = spec.arguments.host
    destination = spec.arguments.destination
    rules = host_rules(spec.network)
    url = httpx.URL(args.url)
    # Fail closed on the run path too: the host and port must be the grant's, and httpx
    # must read the URL's host the way the check did.
    if (
        host is None
        or destination is None
        or not any(rule.allows(destination) for rule in rules)
        or url.host != host
    ):
        detail = f"host {host!r} is not allowed by grant {spec.grant}"
        return RunResult.failure(Reason.TOOL_ERROR, detail, spec.label)
    body = b""
    encoding = "utf-8"
    with trio.move_on_after(machine.http_timeout) as scope:
        try:
            addresses = await machine.resolve(destination.host, destination.port)
        except OSError as exc:
            detail = f"{destination.host}: the name does not resolve ({_describe(exc)})"
            raise _Failed(Reason.TOOL_ERROR, detail) from None
        problem = address_problem(rules, destination, addresses)
        if problem is not None or not addresses:
            problem = problem or f"{destination.host}: the name resolves to no address"
            raise _Failed(Reason.TOOL_ERROR, f"{problem}; see {RUNBOOK_HTTP_GET}")
        # The checked address, never the name again: the URL carries the address, the
        # Host header and the TLS server name (certificate check included) the name.
        headers = {"Host": url.netloc.decode("ascii")}
        extensions = {} if _is_address(host) else {"sni_hostname": url.host}
        try:
            async with httpx.AsyncClient(
                follow_redirects=False, trust_env=False, timeout=machine.http_timeout
            ) as client:
                # In the resolver's order; the next address only when one does not connect
                # (all of them were checked above).
                for index, address in enumerate(addresses):
                    target = url.copy_with(host=address)
                    try:
                        body, encoding = await _fetch(client, target, headers, extensions, args.url)
                        break
                    except httpx.ConnectError:
                        if index == len(addresses) - 1:
                            raise
        except httpx.HTTPError as exc:
            raise _Failed(Reason.TOOL_ERROR, f"{type(exc).__name__}: {exc}"[:500]) from None
    if scope.cancelled_caught:
        detail = f"{args.url}: no complete answer within {machine.http_timeout:g} s"
        return RunResult.failure(Reason.TIMEOUT, detail, spec.label)
    try:
        text = body.decode(encoding, errors="replace")
    except LookupError:
        text = body.decode("utf-8", errors="replace")
    return RunResult.success(text, spec.label)


async def _fetch(
    client: httpx.AsyncClient,
    target: httpx.URL,
    headers: dict[str, str],
    extensions: dict[str, str],
    url: str,
) -> tuple[bytes, str]:
    """GET ``target`` (``url`` with a checked address for its host) once: the body (at
    most 1 MiB) and its encoding, or _Failed for a redirect, an error status or a body
    too large."""
    body = bytearray()
    async with client.stream("GET", target, headers=headers, extensions=extensions) as response:
        if response.is_redirect:
            location = response.headers.get("location", "")[:500]
            detail = (
                f"HTTP {response.status_code}: redirect to {location} "
                "(not followed; ask for that URL)"
            )
            raise _Failed(Reason.TOOL_ERROR, detail)
        if response.status_code >= 400:
            detail = f"HTTP {response.status_code} {response.reason_phrase}"
            raise _Failed(Reason.TOOL_ERROR, detail)
        over = False
        # Stopping by cancellation, not by leaving the loop: the exception then
        # unwinds httpx's chain of async generators instead of abandoning them.
        with trio.CancelScope() as reading:
            async for chunk in response.aiter_bytes():
                if over:
                    continue
                body += chunk
                if len(body) > MAX_BYTES:
                    over = True
                    reading.cancel()
        if over:
            raise _Failed(Reason.TOO_LARGE, f"{url}: over {MAX_BYTES} bytes")
        return bytes(body), response.encoding or "utf-8"


# --- what the tools ask of the machine -------------------------------------------------

CachedReader: TypeAlias = Callable[[str, str, int], CachedFile | None]


@attrs.frozen
class Host:
    """What the tools ask of the machine besides opening files: how a path resolves,
    what an open descriptor names, the cached read, name resolution and http_get's
    time limit. :data:`REAL_HOST` is the machine's; a test passes its own to stand for
    a name swapped at the wrong moment, a resolver, or a shorter limit."""

    real_relative: Callable[[Path, str], tuple[str, str]] = _real_relative
    opened_path: Callable[[int], str | None] = fd_real_path
    read_cached: CachedReader = read_cached_beneath
    resolve: Callable[[str, int], Awaitable[list[str]]] = resolve_addresses
    http_timeout: float = HTTP_TIMEOUT


REAL_HOST: Final = Host()
