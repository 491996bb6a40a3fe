"""Whether the shell's sandbox can run here, and with what: bubblewrap on PATH, new enough,
the host user it runs as, and a workspace that user can reach (docs/runbook.md#sandbox,
#sandbox-as-root). Blocking (a few stats; a worker thread in brokerd).

One finding for every place that needs it, so that none can say yes while another says
no: the runner builds a shell call's sandbox from it (:mod:`boxmaker.broker.run_spec`),
the look before a shell ask denies the call before the owner is asked when it says no
(the rule is :func:`boxmaker.core.before_asking.before_asking`), and brokerd's status
shows it (``bxctl status``, ``bxctl up``'s warning). It costs a few stats per call
(docs/decisions.md, "A shell ask that cannot run is denied before asking"): where bwrap
is on PATH is kept while that file is there, ``bwrap --version`` runs once per binary
(:mod:`boxmaker.broker.bwrap_version`), the workspace's real path is resolved once
(:func:`~boxmaker.broker.workspace_paths.real_root`), and the owner and modes are read
again each time, so a chown or chmod of the workspace counts at the next call. It
imports nothing of the runner, so ``bxctl grants test`` takes the same look.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path
from typing import Final

import attrs

from boxmaker.broker.bwrap_version import bwrap_version_problem
from boxmaker.broker.sandbox_plan import SANDBOX_PATH, SandboxRefused, SandboxUser, sandbox_user
from boxmaker.broker.workspace_paths import real_root

RUNBOOK_SANDBOX: Final = "docs/runbook.md#sandbox"
RUNBOOK_SANDBOX_AS_ROOT: Final = "docs/runbook.md#sandbox-as-root"
NO_BWRAP_DETAIL: Final = (
    "bubblewrap (bwrap) is not available; the shell tool never runs unsandboxed; "
    f"see {RUNBOOK_SANDBOX}"
)
RUNBOOK_EGRESS_SOCAT: Final = "docs/runbook.md#egress-socat"
NO_SOCAT_DETAIL: Final = (
    "this call may use the network, and its sandbox reaches brokerd's proxy through "
    "socat, which is not installed where the sandbox finds programs "
    f"({SANDBOX_PATH}); the call never runs without its proxy; see {RUNBOOK_EGRESS_SOCAT}"
)
ACL_XATTR: Final = "system.posix_acl_access"
socat_search_path: str = SANDBOX_PATH
"""Where :func:`find_socat` looks: the sandbox's own PATH, whose directories the sandbox
sees as the host has them (a test points it elsewhere)."""
_found_on_path: dict[str | None, str] = {}


@attrs.frozen
class SandboxHost:
    """What a shell sandbox starts with on this host."""

    bwrap: str
    """The bubblewrap binary on PATH (version checked)."""
    user: SandboxUser | None
    """Whom bwrap runs as; None: brokerd's own uid (brokerd is not root)."""


def find_sandbox(workspace: Path, sandbox_uid: int | None) -> SandboxHost | str:
    """The sandbox of a shell call in ``workspace`` (``[runner] sandbox_uid``), or why
    there can be none: a detail for ``sandbox_unavailable`` that names its runbook
    entry. Blocking."""
    bwrap = _bwrap()
    if bwrap is None:
        return NO_BWRAP_DETAIL
    too_old = bwrap_version_problem(bwrap)
    if too_old is not None:
        return f"{too_old}; see {RUNBOOK_SANDBOX}"
    try:
        user = sandbox_user(workspace, sandbox_uid)
    except SandboxRefused as refused:
        return str(refused)
    if user is not None:
        unreachable = unreachable_by(workspace, user)
        if unreachable is not None:
            return unreachable
    return SandboxHost(bwrap, user)


def _bwrap() -> str | None:
    """bwrap on PATH. Searching PATH costs a stat per directory, so the answer is kept
    per PATH while the file found is still an executable; none found is not kept (an
    install counts at the next call)."""
    path = os.environ.get("PATH")
    found = _found_on_path.get(path)
    if found is not None and os.access(found, os.X_OK):
        return found
    found = shutil.which("bwrap", path=path)
    if found is None:
        _found_on_path.pop(path, None)
    else:
        _found_on_path[path] = found
    return found


def find_socat() -> str | None:
    """The socat a sandbox with a way out bridges with (docs/egress.md): the one its
    launcher would find on the sandbox's PATH, as a host path it sees the same; None
    when there is none."""
    return shutil.which("socat", path=socat_search_path)


def sandbox_problem(workspace: Path, sandbox_uid: int | None) -> str | None:
    """Why the shell's sandbox cannot run in ``workspace``, or None when it can."""
    found = find_sandbox(workspace, sandbox_uid)
    return found if isinstance(found, str) else None


def _searchable(info: os.stat_result, user: SandboxUser) -> bool:
    # The class the kernel checks: owner, else group (the sandbox has no supplementary
    # groups), else other.
    if info.st_uid == user.uid:
        return bool(info.st_mode & stat.S_IXUSR)
    if info.st_gid == user.gid:
        return bool(info.st_mode & stat.S_IXGRP)
    return bool(info.st_mode & stat.S_IXOTH)


def _has_acl(path: str) -> bool:
    try:
        os.getxattr(path, ACL_XATTR, follow_symlinks=False)
    except OSError:
        return False
    return True


def unreachable_by(workspace: Path, user: SandboxUser) -> str | None:
    """Why ``user`` cannot reach ``workspace`` as bwrap, run as that user, must: search
    (x) on every directory from ``/`` down to the workspace's real path, the workspace
    included (bwrap binds it, then changes into it); None when it can. Only the mode
    bits are read: a directory with an access control list is left to bwrap (it may
    allow what the bits do not), as is one that cannot be looked at."""
    real = Path(real_root(workspace))
    for directory in (*reversed(real.parents), real):
        try:
            info = directory.stat()
        except OSError:
            return None
        if _searchable(info, user) or _has_acl(str(directory)):
            continue
        mode = stat.S_IMODE(info.st_mode)
        if directory == real:
            what, fix = "the workspace", f"`bxctl init --workspace {real}` gives it to that uid"
        else:
            what, fix = f"{directory}, above the workspace,", f"`chmod o+x {directory}`"
        return (
            f"the sandbox runs as uid {user.uid} (gid {user.gid}) and cannot reach the "
            f"workspace: {what} is not searchable by it (mode {mode:04o}, owner "
            f"{info.st_uid}, group {info.st_gid}); {fix}, or use another workspace; "
            f"see {RUNBOOK_SANDBOX_AS_ROOT}"
        )
    return None
