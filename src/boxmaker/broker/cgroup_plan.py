"""Which cgroups brokerd can give each sandbox, and how (docs/runbook.md#sandbox-limits,
docs/decisions.md "Each sandbox in a cgroup of its own").

:func:`plan_cgroups` decides from /proc/self/mountinfo, /proc/self/cgroup and a
:class:`Probe` of what exists and is writable: cgroup v2 (``memory.max``,
``memory.swap.max``, ``pids.max``) where brokerd's own v2 cgroup carries the memory
controller and is writable (as root, or delegated to an ordinary user), else the v1
``memory`` (and ``pids``) hierarchies, else none, saying why. Pure given the probe, and
tested on fixture texts; cgroups.py makes what it plans.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Final, Literal, Protocol

import attrs

RUNBOOK: Final = "docs/runbook.md#sandbox-limits"
WANTED: Final = ("memory", "pids")
"""The controllers a sandbox's cgroup uses; memory is the one that must be there."""
_OCTAL: Final = re.compile(r"\\([0-7]{3})")


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
