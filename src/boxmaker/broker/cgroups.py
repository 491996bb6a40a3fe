"""Each sandboxed command in a cgroup of its own (docs/runbook.md#sandbox-limits,
docs/decisions.md "The sandbox's limits").

The per-process limits of the sandbox's launcher (``ulimit``) bound what one process
maps, not what a command holds: a memfd written and never mapped, files in the
sandbox's tmpfs, or many processes each under the limit. A memory cgroup counts all of
it. So brokerd makes a subtree of its own, ``boxmaker-<pid>-<boot>`` under its own cgroup
in each hierarchy it can write, and one child of it per sandbox with ``[runner]
memory_limit_mib`` as its limit of memory and swap together, and ``process_limit`` as
its limit of tasks.

Three parts:

- :func:`plan_cgroups` decides, from /proc/self/mountinfo, /proc/self/cgroup and a
  :class:`Probe` of what exists and is writable, which cgroups can be had and how:
  cgroup v2 (``memory.max``, ``memory.swap.max``, ``pids.max``) where brokerd's own v2
  cgroup carries the memory controller and is writable (as root, or delegated to an
  ordinary user), else the v1 ``memory`` (and ``pids``) hierarchies, else none, with why.
  Pure given the probe, and tested on fixture texts.
- :class:`CgroupTree` makes the subtree at start (and removes an earlier boot's that
  was left behind) and a :class:`SandboxCgroup` for each sandbox.
- :class:`SandboxCgroup` is what a sandbox needs: the files its first process writes its
  pid into before anything else runs (sandbox.py), what the kernel counted (OOM kills,
  refused forks, the peak), killing everything in it, and removing it.

No trio here: every step is a few writes to the cgroup file system, done where the
caller is (sandbox.py waits between removal attempts).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import signal
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final, Literal, Protocol

import attrs

logger = logging.getLogger("boxmaker.brokerd.cgroups")

RUNBOOK: Final = "docs/runbook.md#sandbox-limits"
WANTED: Final = ("memory", "pids")
"""The controllers a sandbox's cgroup uses; memory is the one that must be there."""
TREE_PREFIX: Final = "boxmaker-"
LEAF: Final = "brokerd"
"""cgroup v2 below the root: the leaf brokerd moves itself into, so that its own cgroup
holds no process and may hand controllers down (the no-internal-processes rule)."""
_TREE_NAME: Final = re.compile(r"boxmaker-(\d+)-[A-Za-z0-9-]+")
_OCTAL: Final = re.compile(r"\\([0-7]{3})")


class CgroupError(OSError):
    """A cgroup could not be made or set; the message says which file and why."""


# --- what the machine says -------------------------------------------------------------


@attrs.frozen
class Mount:
    """One cgroup file system mount of /proc/self/mountinfo."""

    point: Path
    root: str
    """The cgroup the mount shows at ``point`` (its path in the hierarchy)."""
    version: Literal[1, 2]
    controllers: frozenset[str]
    """v1: the controllers of the hierarchy (of :data:`WANTED`); v2: empty (they are
    read from ``cgroup.controllers``)."""


def _unescape(field: str) -> str:
    return _OCTAL.sub(lambda match: chr(int(match[1], 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    """The cgroup and cgroup2 mounts of a /proc/self/mountinfo text, in order."""
    mounts: list[Mount] = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 6 or len(tail) < 3:
            continue
        fstype, options = tail[0], tail[2].split(",")
        point, root = Path(_unescape(fields[4])), _unescape(fields[3])
        if fstype == "cgroup2":
            mounts.append(Mount(point, root, 2, frozenset()))
        elif fstype == "cgroup":
            mounts.append(Mount(point, root, 1, frozenset(options) & frozenset(WANTED)))
    return mounts


def parse_self_cgroup(text: str) -> dict[str, str]:
    """/proc/self/cgroup as ``{controller: path}``; the v2 path under the key ``""``."""
    places: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if parts[0] == "0" and not controllers:
            places[""] = path
        for controller in controllers.split(","):
            if controller:
                places[controller] = path
    return places


def _directory(mount: Mount, path: str) -> Path | None:
    """Where cgroup ``path`` of the mount's hierarchy is, if the mount shows it."""
    root = mount.root.rstrip("/")
    if path != root and not path.startswith(root + "/"):
        return None
    relative = path[len(root) :].strip("/")
    if ".." in relative.split("/"):
        return None
    return mount.point / relative if relative else mount.point


class Probe(Protocol):
    """What :func:`plan_cgroups` asks of the machine besides the two texts."""

    def read(self, path: Path) -> str | None:
        """The file's text, or None when it cannot be read."""
        ...

    def exists(self, path: Path) -> bool: ...

    def writable(self, path: Path) -> bool:
        """May brokerd write the file (or make entries in the directory)?"""
        ...


class HostProbe:
    """The machine's answers (:class:`Probe`)."""

    def read(self, path: Path) -> str | None:
        try:
            return path.read_text()
        except (OSError, UnicodeDecodeError):
            return None

    def exists(self, path: Path) -> bool:
        return path.exists()

    def writable(self, path: Path) -> bool:
        return os.access(path, os.W_OK)


# --- which cgroups can be had, and how (pure given the probe) ---------------------------


@attrs.frozen
class Hierarchy:
    """One hierarchy brokerd makes its subtree in."""

    version: Literal[1, 2]
    own: Path
    """The directory of brokerd's own cgroup: the subtree is made in it."""
    path: str
    """brokerd's cgroup as /proc/self/cgroup names it (for messages)."""
    controllers: frozenset[str]
    """Those of :data:`WANTED` the sandbox's cgroup gets here."""
    leaf_needed: bool = False
    """v2 below the root: brokerd moves into a leaf first."""


@attrs.frozen
class CgroupPlan:
    """Where the sandboxes' cgroups are made: one v2 hierarchy, or v1's memory
    hierarchy and (when it can be had) the pids one."""

    hierarchies: tuple[Hierarchy, ...]
    missing: str | None = None
    """What cannot be had (pids), said in the bounds' description."""

    @property
    def version(self) -> Literal[1, 2]:
        return self.hierarchies[0].version


@attrs.frozen
class NoCgroups:
    """No cgroup can be had: why, for the owner (status, the log, ``bxctl up``)."""

    why: str

    def describe(self) -> str:
        return (
            f"none: {self.why}; only the per-process limits (ulimit) hold, not a total "
            f"of memory or processes; see {RUNBOOK}"
        )


def plan_cgroups(
    mountinfo: str, self_cgroup: str, *, uid: int, probe: Probe
) -> CgroupPlan | NoCgroups:
    """Which cgroups brokerd (as ``uid``) can give its sandboxes, and how: cgroup v2
    where brokerd's own v2 cgroup carries the memory controller and may be written,
    else v1's memory hierarchy (and pids where it can be had), else :class:`NoCgroups`
    saying why."""
    mounts = parse_mountinfo(mountinfo)
    places = parse_self_cgroup(self_cgroup)
    v2 = _plan_v2(mounts, places, uid, probe)
    if isinstance(v2, CgroupPlan):
        return v2
    v1 = _plan_v1(mounts, places, uid, probe)
    if isinstance(v1, CgroupPlan):
        return v1
    reasons = [reason for reason in (v2, v1) if reason is not None]
    return NoCgroups("; ".join(reasons) or "no cgroup file system is mounted")


def _not_writable(version: int, what: str, path: str, uid: int) -> str:
    who = "root" if uid == 0 else f"uid {uid}"
    delegated = "" if uid == 0 else " (no subtree delegated to it)"
    return f"cgroup v{version}: brokerd's {what}cgroup {path} is not writable by {who}{delegated}"


def _plan_v2(
    mounts: list[Mount], places: Mapping[str, str], uid: int, probe: Probe
) -> CgroupPlan | str | None:
    """The v2 plan, a reason there is none, or None where v2 carries no memory
    controller at all (a hybrid machine: v1 has it)."""
    path = places.get("")
    if path is None:
        return None
    for mount in mounts:
        own = _directory(mount, path) if mount.version == 2 else None
        if own is None:
            continue
        controllers = frozenset((probe.read(own / "cgroup.controllers") or "").split())
        if "memory" not in controllers:
            # The hierarchy's root carries every controller v1 does not hold.
            root = probe.read(mount.point / "cgroup.controllers") or ""
            if "memory" not in root.split():
                return None
            return f"cgroup v2: brokerd's cgroup {path} does not carry the memory controller"
        needed = (own, own / "cgroup.procs", own / "cgroup.subtree_control")
        if not all(probe.writable(item) for item in needed):
            return _not_writable(2, "", path, uid)
        # Only the hierarchy's root has no cgroup.type, and only it may hold processes
        # while handing controllers down.
        leaf = probe.exists(own / "cgroup.type")
        hierarchy = Hierarchy(2, own, path, controllers & frozenset(WANTED), leaf)
        missing = None if "pids" in controllers else "no pids controller"
        return CgroupPlan((hierarchy,), missing)
    return None


def _plan_v1(
    mounts: list[Mount], places: Mapping[str, str], uid: int, probe: Probe
) -> CgroupPlan | str | None:
    found: dict[str, Hierarchy | str] = {}
    for controller in WANTED:
        path = places.get(controller)
        if path is None:
            continue
        for mount in mounts:
            own = _directory(mount, path) if controller in mount.controllers else None
            if own is None:
                continue
            if probe.writable(own):
                found[controller] = Hierarchy(1, own, path, frozenset({controller}))
            else:
                found[controller] = _not_writable(1, f"{controller} ", path, uid)
            break
    memory, pids = found.get("memory"), found.get("pids")
    if memory is None:
        return None
    if isinstance(memory, str):
        return memory
    if isinstance(pids, Hierarchy):
        return CgroupPlan((memory, pids))
    return CgroupPlan((memory,), "no pids controller" if pids is None else pids)


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


def _remove_children(tree: Path) -> None:
    """rmdir every child cgroup of ``tree`` that can be removed."""
    with contextlib.suppress(OSError), os.scandir(tree) as children:
        for child in children:
            if child.is_dir(follow_symlinks=False):
                _rmdir(Path(child.path))


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
    behind (a crash, a kill -9, a v2 leaf), and only while empty: what rmdir refuses
    stays. The names removed."""
    removed: list[str] = []
    with contextlib.suppress(OSError), os.scandir(directory) as entries:
        for entry in entries:
            match = _TREE_NAME.fullmatch(entry.name)
            if match is None or not entry.is_dir(follow_symlinks=False):
                continue
            if _alive(int(match[1])):
                continue
            tree = Path(entry.path)
            _remove_children(tree)
            if _rmdir(tree) is None:
                removed.append(entry.name)
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
        if self.version == 1:
            oom = _counter(_read(self.memory / "memory.oom_control"), "oom_kill")
            peak = _read(self.memory / "memory.max_usage_in_bytes").strip()
        else:
            oom = _counter(_read(self.memory / "memory.events"), "oom_kill")
            peak = _read(self.memory / "memory.peak").strip()
        refused = _counter(_read(self.pids / "pids.events"), "max") if self.pids else 0
        return Usage(oom, refused, int(peak) if peak.isdigit() else None)

    def processes(self) -> set[int]:
        """The processes in it now (in every hierarchy)."""
        found: set[int] = set()
        for directory in self.directories:
            found |= {int(pid) for pid in _read(directory / "cgroup.procs").split()}
        return found

    def kill(self) -> None:
        """SIGKILL everything in it: ``cgroup.kill`` where the kernel has it, else each
        process listed, through a pidfd opened while it is listed, so a pid reused by
        a stranger is never signalled."""
        kill_file = self.memory / "cgroup.kill"
        if self.version == 2 and kill_file.exists():
            with contextlib.suppress(CgroupError):
                _write(kill_file, "1")
                return
        listed = self.processes()
        if not listed:
            return
        pidfds: dict[int, int] = {}
        try:
            for pid in listed:
                with contextlib.suppress(OSError):
                    pidfds[pid] = os.pidfd_open(pid)
            # Listed after its pidfd was opened: the pidfd is that process, or one that
            # has ended (then the signal goes nowhere).
            listed = self.processes()
            for pid, pidfd in pidfds.items():
                if pid in listed:
                    with contextlib.suppress(OSError):
                        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        finally:
            for pidfd in pidfds.values():
                os.close(pidfd)

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
                    logger.info("removed the cgroup %s an earlier brokerd left", gone)
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
            _remove_children(tree)
            failure = _rmdir(tree)
            if failure is not None and not (hierarchy.leaf_needed and failure.errno == errno.EBUSY):
                logger.warning("the cgroup %s could not be removed: %s", tree, failure.strerror)


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
