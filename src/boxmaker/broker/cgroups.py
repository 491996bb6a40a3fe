"""Each sandboxed command in a cgroup of its own (docs/runbook.md#sandbox-limits,
docs/decisions.md "Each sandbox in a cgroup of its own").

The per-process limits of the sandbox's launcher (``ulimit``) bound what one process
maps, not what a command holds: a memfd written and never mapped, files in the
sandbox's tmpfs, or many processes each under the limit. A memory cgroup counts all of
it. So brokerd makes a subtree of its own, ``boxmaker-<pid>-<boot>`` under its own cgroup
in each hierarchy it can write (cgroup_plan.py decides which), and one child of it per
sandbox with ``[runner] memory_limit_mib`` as its limit of memory and swap together, and
``process_limit`` as its limit of tasks.

- :class:`CgroupTree` makes the subtree at start (and removes what an earlier brokerd
  left behind) and a :class:`SandboxCgroup` for each sandbox.
- :class:`SandboxCgroup` is what a sandbox needs: the files its first process writes its
  pid into before anything else runs (:data:`JOINER`), what the kernel counted (OOM
  kills, refused forks, the peak), killing everything in it, and removing it.
- :class:`SandboxBounds` is what brokerd's sandboxes get, and what the owner is told.

No trio here: every step is a few writes to the cgroup file system, done where the
caller is (sandbox.py waits between removal attempts).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
import signal
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Final, Literal

import attrs

from boxmaker.broker.cgroup_plan import (
    RUNBOOK,
    WANTED,
    CgroupPlan,
    Hierarchy,
    HostProbe,
    NoCgroups,
    Probe,
    plan_cgroups,
)

log = logging.getLogger("boxmaker.brokerd.cgroups")

TREE_PREFIX: Final = "boxmaker-"
LEAF: Final = "brokerd"
"""cgroup v2 below the root: the leaf brokerd moves itself into, so that its own cgroup
holds no process and may hand controllers down (the no-internal-processes rule)."""
_TREE_NAME: Final = re.compile(r"boxmaker-(\d+)-[A-Za-z0-9-]+")
JOIN_FAILED_WORDS: Final = "boxmaker: the sandbox could not join its cgroup"
JOINER: Final = (
    # Run as brokerd's user, with the cgroup.procs files, "--", then what to exec (bwrap,
    # behind setpriv when the uid changes). Builtins only: nothing else runs first. The
    # shell exports the PWD it sets (brokerd's directory): unset, so bwrap's
    # environment stays empty.
    "unset PWD OLDPWD; "
    'while [ "$1" != -- ]; do echo $$ >"$1" || '
    f"{{ echo '{JOIN_FAILED_WORDS}' >&2; exit 125; }}; "
    'shift; done; shift; exec "$@"'
)
"""What a sandbox with a cgroup starts as: a shell that writes its own pid into the
sandbox's cgroups, then execs bwrap (the same process: bwrap and all it starts are in
the cgroup from their first instruction)."""
LEFTOVER_S: Final = 1.0
"""Seconds a start waits for what it killed in a dead brokerd's subtree to end."""
SETPRIV_MISSING: Final = (
    "setpriv (util-linux) is not installed: as root, brokerd starts each sandbox in its "
    "cgroup and then as the sandbox's uid through setpriv; install util-linux; "
    f"see {RUNBOOK}"
)


class CgroupError(OSError):
    """A cgroup could not be made or set; the message says which file and why."""


# --- the subtree and each sandbox's cgroup ---------------------------------------------


def _write(path: Path, text: str) -> None:
    """One write, as the cgroup file system wants it; CgroupError naming the file."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
    except OSError as exc:
        raise CgroupError(exc.errno, f"{path}: {exc.strerror}") from None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _counter(text: str, key: str) -> int:
    """The number after ``key`` in a ``key value`` file (memory.events, pids.events)."""
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


def _mkdir(path: Path) -> None:
    try:
        path.mkdir()
    except OSError as exc:
        raise CgroupError(exc.errno, f"{path}: {exc.strerror}") from None


def _rmdir(path: Path) -> OSError | None:
    try:
        path.rmdir()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return exc
    return None


def _children(tree: Path) -> list[Path]:
    with contextlib.suppress(OSError), os.scandir(tree) as entries:
        return [Path(entry.path) for entry in entries if entry.is_dir(follow_symlinks=False)]
    return []


def _listed(directories: Iterable[Path]) -> set[int]:
    """The processes in these cgroups now."""
    found: set[int] = set()
    for directory in directories:
        found |= {int(pid) for pid in _read(directory / "cgroup.procs").split()}
    return found


def _kill_listed(directories: Sequence[Path]) -> None:
    """SIGKILL each process these cgroups list, through a pidfd opened while it is
    listed and used only if it is listed still: a pid reused by a stranger is never
    signalled (the pidfd is then of a process that has ended: the signal goes nowhere)."""
    listed = _listed(directories)
    if not listed:
        return
    pidfds: dict[int, int] = {}
    try:
        for pid in listed:
            with contextlib.suppress(OSError):
                pidfds[pid] = os.pidfd_open(pid)
        listed = _listed(directories)
        for pid, pidfd in pidfds.items():
            if pid in listed:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    finally:
        for pidfd in pidfds.values():
            os.close(pidfd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_leftovers(directory: Path) -> list[str]:
    """Remove the subtrees under ``directory`` that brokerds no longer running left
    behind (a crash, a kill -9, a v2 leaf). A sandbox of a dead brokerd must not run on
    (bwrap's --die-with-parent misses a brokerd killed while bwrap sets up): what is
    left in them is killed first, and waited for LEFTOVER_S at most; what rmdir still
    refuses stays. The names removed."""
    removed: list[str] = []
    for tree in _children(directory):
        match = _TREE_NAME.fullmatch(tree.name)
        if match is None or _alive(int(match[1])):
            continue
        children = _children(tree)
        deadline = time.monotonic() + LEFTOVER_S
        while _listed(children) and time.monotonic() < deadline:
            _kill_listed(children)
            time.sleep(0.01)
        for child in children:
            _rmdir(child)
        if _rmdir(tree) is None:
            removed.append(tree.name)
    return removed


@attrs.frozen
class Usage:
    """What the kernel counted for one sandbox's cgroup."""

    oom_kills: int = 0
    """Processes the cgroup's OOM killer killed: the memory limit was exceeded."""
    forks_refused: int = 0
    """Forks refused at the cgroup's pids.max."""
    memory_peak: int | None = None
    """Bytes at most in use at once (None where the kernel does not say)."""


@attrs.frozen
class SandboxCgroup:
    """One sandbox's cgroup: a directory per hierarchy (one in v2)."""

    version: Literal[1, 2]
    memory: Path
    pids: Path | None
    limit: int
    """Its memory limit, bytes."""

    @property
    def directories(self) -> tuple[Path, ...]:
        return (self.memory,) if self.pids in (None, self.memory) else (self.memory, self.pids)

    @property
    def procs_files(self) -> tuple[str, ...]:
        """Where the sandbox's first process writes its pid, in this order."""
        return tuple(str(directory / "cgroup.procs") for directory in self.directories)

    def usage(self) -> Usage:
        """What the kernel counted; logged (debug) with the cgroup's path."""
        if self.version == 1:
            oom = _counter(_read(self.memory / "memory.oom_control"), "oom_kill")
            peak = _read(self.memory / "memory.max_usage_in_bytes").strip()
        else:
            oom = _counter(_read(self.memory / "memory.events"), "oom_kill")
            peak = _read(self.memory / "memory.peak").strip()
        refused = _counter(_read(self.pids / "pids.events"), "max") if self.pids else 0
        usage = Usage(oom, refused, int(peak) if peak.isdigit() else None)
        log.debug(
            "sandbox cgroup %s: memory peak %s of %d bytes, %d OOM kill(s), %d fork(s) refused",
            self.memory,
            usage.memory_peak,
            self.limit,
            usage.oom_kills,
            usage.forks_refused,
        )
        return usage

    def processes(self) -> set[int]:
        """The processes in it now (in every hierarchy)."""
        return _listed(self.directories)

    def kill(self) -> None:
        """SIGKILL everything in it: ``cgroup.kill`` where the kernel has it, else each
        process listed (:func:`_kill_listed`)."""
        kill_file = self.memory / "cgroup.kill"
        if self.version == 2 and kill_file.exists():
            with contextlib.suppress(CgroupError):
                _write(kill_file, "1")
                return
        _kill_listed(self.directories)

    def remove(self) -> OSError | None:
        """rmdir each directory; the first failure (EBUSY while a process is left)."""
        failures = [_rmdir(directory) for directory in self.directories]
        return next((failure for failure in failures if failure is not None), None)


@attrs.define
class CgroupTree:
    """brokerd's subtree (:meth:`make`), a child of it per sandbox (:meth:`child`)."""

    plan: CgroupPlan
    name: str
    swap: bool
    """Is swap bounded too (v1 ``memory.memsw.limit_in_bytes``, v2 ``memory.swap.max``)?"""
    _made: int = 0

    @classmethod
    def make(cls, plan: CgroupPlan, name: str) -> CgroupTree:
        """Remove earlier boots' leftovers, then make ``name`` in each hierarchy (v2:
        after moving brokerd into a leaf where its cgroup is not the root, and handing
        the controllers down). Raises CgroupError, having undone what it made."""
        made: list[Path] = []
        try:
            for hierarchy in plan.hierarchies:
                for gone in remove_leftovers(hierarchy.own):
                    log.info("removed the cgroup %s an earlier brokerd left", gone)
                tree = hierarchy.own / name
                _mkdir(tree)
                made.append(tree)
                if hierarchy.version == 2:
                    _hand_down(hierarchy, tree, made)
        except BaseException:
            for directory in reversed(made):
                _rmdir(directory)
            raise
        memory = plan.hierarchies[0].own / name
        swap_file = "memory.memsw.limit_in_bytes" if plan.version == 1 else "memory.swap.max"
        return cls(plan, name, (memory / swap_file).exists())

    def describe(self) -> str:
        """What bounds each sandbox, for the owner."""
        memory = "memory+swap" if self.swap else "memory (swap not counted)"
        controllers = {c for hierarchy in self.plan.hierarchies for c in hierarchy.controllers}
        pids = ", pids" if "pids" in controllers else f"; {self.plan.missing}"
        return f"cgroup v{self.plan.version}: {memory}{pids}"

    def child(self, *, memory: int, processes: int) -> SandboxCgroup:
        """A new cgroup for one sandbox: at most ``memory`` bytes of memory (and swap)
        and ``processes`` tasks. Raises CgroupError, having removed what it made."""
        self._made += 1
        name = f"sandbox-{self._made}"
        made: list[Path] = []
        pids: Path | None = None
        try:
            for hierarchy in self.plan.hierarchies:
                directory = hierarchy.own / self.name / name
                try:
                    _mkdir(directory)
                except CgroupError as exc:
                    if exc.errno != errno.ENOENT:
                        raise
                    # The subtree was removed under us (by hand): made again.
                    _mkdir(directory.parent)
                    if hierarchy.version == 2:
                        _enable(directory.parent, hierarchy.controllers)
                    _mkdir(directory)
                made.append(directory)
                _limit(hierarchy, directory, memory, processes)
                if "pids" in hierarchy.controllers:
                    pids = directory
        except BaseException:
            for directory in reversed(made):
                _rmdir(directory)
            raise
        return SandboxCgroup(self.plan.version, made[0], pids, memory)

    def remove(self) -> None:
        """Remove the subtree at brokerd's stop, where nothing is left in it (a v2 leaf
        holding brokerd is removed by the next start)."""
        for hierarchy in self.plan.hierarchies:
            tree = hierarchy.own / self.name
            for child in _children(tree):
                _rmdir(child)
            failure = _rmdir(tree)
            if failure is not None and not (hierarchy.leaf_needed and failure.errno == errno.EBUSY):
                log.warning("the cgroup %s could not be removed: %s", tree, failure.strerror)


def _enable(directory: Path, controllers: Iterable[str]) -> None:
    """v2: hand ``controllers`` down to the children of ``directory``."""
    present = set(_read(directory / "cgroup.subtree_control").split())
    wanted = [c for c in WANTED if c in set(controllers) - present]
    if wanted:
        _write(directory / "cgroup.subtree_control", " ".join(f"+{c}" for c in wanted))


def _hand_down(hierarchy: Hierarchy, tree: Path, made: list[Path]) -> None:
    """v2: give ``tree`` the controllers, so that its children have them. Below the
    root, brokerd's own cgroup must hold no process to hand them down: brokerd moves
    into a leaf of the tree first (and back when that fails)."""
    if hierarchy.leaf_needed:
        leaf = tree / LEAF
        _mkdir(leaf)
        made.append(leaf)
        _write(leaf / "cgroup.procs", str(os.getpid()))
        try:
            _enable(hierarchy.own, hierarchy.controllers)
        except CgroupError as exc:
            with contextlib.suppress(CgroupError):
                _write(hierarchy.own / "cgroup.procs", str(os.getpid()))
            if exc.errno == errno.EBUSY:
                raise CgroupError(
                    exc.errno,
                    f"brokerd's cgroup {hierarchy.path} holds other processes than brokerd, "
                    "so it cannot hand the memory controller down",
                ) from None
            raise
    else:
        _enable(hierarchy.own, hierarchy.controllers)
    _enable(tree, hierarchy.controllers)


def _limit(hierarchy: Hierarchy, directory: Path, memory: int, processes: int) -> None:
    """Set a new sandbox cgroup's limits. Memory and swap together: v1's memsw limit
    (set after the memory one, which it may not be under), v2's swap limit 0."""
    if "memory" in hierarchy.controllers:
        if hierarchy.version == 1:
            _write(directory / "memory.limit_in_bytes", str(memory))
            if (directory / "memory.memsw.limit_in_bytes").exists():
                _write(directory / "memory.memsw.limit_in_bytes", str(memory))
        else:
            _write(directory / "memory.max", str(memory))
            for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
                if (directory / name).exists():
                    _write(directory / name, value)
    if "pids" in hierarchy.controllers:
        _write(directory / "pids.max", str(processes))


def tree_name(boot: str) -> str:
    """The subtree's name: brokerd's pid (so a later start knows whether its maker still
    runs) and boot."""
    return f"{TREE_PREFIX}{os.getpid()}-{boot}"


def find_cgroups(boot: str, *, probe: Probe | None = None) -> CgroupTree | NoCgroups:
    """brokerd's start (blocking): decide from this process's place and the machine's
    mounts, and make the subtree; NoCgroups saying why where nothing can be had."""
    texts: list[str] = []
    for name in ("/proc/self/mountinfo", "/proc/self/cgroup"):
        try:
            texts.append(Path(name).read_text())
        except OSError as exc:
            return NoCgroups(f"{name} cannot be read ({exc.strerror})")
    plan = plan_cgroups(*texts, uid=os.geteuid(), probe=probe or HostProbe())
    if isinstance(plan, NoCgroups):
        return plan
    try:
        return CgroupTree.make(plan, tree_name(boot))
    except CgroupError as exc:
        return NoCgroups(f"cgroup v{plan.version}: the subtree could not be made: {exc.strerror}")


@attrs.frozen
class SandboxBounds:
    """What bounds each sandbox as a whole, besides the per-process limits: a cgroup of
    its own, made in ``cgroups``, or nothing, and why."""

    cgroups: CgroupTree | NoCgroups
    setpriv: str | None = attrs.field(factory=lambda: shutil.which("setpriv"))
    """Where brokerd as root finds setpriv: the sandbox's uid is taken after the cgroup
    is joined, which needs root."""

    @property
    def refusal(self) -> str | None:
        """Why no sandbox can start at all: cgroups in use, and brokerd root without
        setpriv (running without the cgroup would be a bound silently lost)."""
        needed = isinstance(self.cgroups, CgroupTree) and os.geteuid() == 0
        return SETPRIV_MISSING if needed and self.setpriv is None else None

    def describe(self) -> str:
        """For the owner: ``bxctl status``'s sandbox_bounds and brokerd's log. Starts
        with "cgroup" only where each sandbox is bounded as a whole."""
        if self.refusal is not None:
            return f"refused: {self.refusal} ({self.cgroups.describe()})"
        return self.cgroups.describe()

    @property
    def bounded(self) -> bool:
        """Is the sandbox's memory bounded as a whole?"""
        return isinstance(self.cgroups, CgroupTree)

    def cgroup(self, *, memory: int, processes: int) -> SandboxCgroup | None:
        """A new sandbox's cgroup (:meth:`CgroupTree.child`), or None without cgroups."""
        if not isinstance(self.cgroups, CgroupTree):
            return None
        return self.cgroups.child(memory=memory, processes=processes)

    def joined_argv(
        self, cgroup: SandboxCgroup, argv: Sequence[str], user: tuple[int, int] | None
    ) -> list[str]:
        """``argv`` behind :data:`JOINER`: into ``cgroup``, then, for ``user`` (uid,
        gid), that uid and gid with no supplementary groups, as Popen's ``user=`` would
        have set them."""
        become: list[str] = []
        if user is not None:
            if self.setpriv is None:
                raise CgroupError(errno.ENOENT, SETPRIV_MISSING)
            uid, gid = user
            become = [self.setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]
        return ["/bin/sh", "-c", JOINER, "boxmaker-join", *cgroup.procs_files, "--", *become, *argv]


UNBOUNDED: Final = SandboxBounds(NoCgroups("no cgroup was set up (not brokerd)"), None)
