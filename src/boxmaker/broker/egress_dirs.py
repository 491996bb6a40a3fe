"""Where a call's proxy socket lives: a directory of its own that its sandbox binds
(docs/egress.md; docs/decisions.md, "Egress through brokerd", "Where the directory is").

Made for one sandbox and removed with it: by brokerd's proxy for a call
(:func:`boxmaker.broker.egress.open_call_egress`), or by the sandbox pool for a sandbox
with a way out set up ahead of its call (:mod:`boxmaker.broker.sandbox_pool`), whose
call's proxy then binds its socket in it. Blocking, all of it (a few syscalls; brokerd
calls it in a worker thread).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import socket
import stat
import tempfile
from pathlib import Path
from typing import Final

import attrs

from boxmaker.runtime.unix_sockets import BACKLOG

EGRESS_DIR: Final = "egress"
"""``run/egress/``: one directory a call with a way out (brokerd not root)."""
ROOT_RUN: Final = Path("/run")
"""Where brokerd as root makes each call's way out (:func:`_egress_root`)."""
PROXY_SOCK: Final = "proxy.sock"


@attrs.frozen
class EgressDirectory:
    """A directory made for one sandbox's way out, and whether its root (its parent) was
    made for it too (then removed with it)."""

    path: Path
    own_root: bool

    def remove(self) -> None:
        """The directory gone, its socket first (and its root when it is its own)."""
        with contextlib.suppress(OSError):
            (self.path / PROXY_SOCK).unlink(missing_ok=True)
            self.path.rmdir()
            if self.own_root:
                self.path.parent.rmdir()


def _egress_root(run_dir: Path, peer: int) -> tuple[Path, bool]:
    """Where a call's directory is made, and whether that place is the call's own (made
    here, removed with it).

    brokerd not root: ``run/egress/`` (the sandbox is brokerd's own uid, which reaches
    the home's ``run/``). brokerd root: the sandbox's bwrap runs as the sandbox's uid and
    must reach the directory it binds, which the owner's 0700 ``run/`` forbids; so the
    call's directory is made in a directory of its own under /run (else the system's
    temporary directory), root's, mode 0711 (passable, not listable), with a random
    name: no other uid can list it, find the call's directory in it, or enter that
    (0700, the sandbox's uid's)."""
    if os.geteuid() != 0 or peer == 0:
        return run_dir / EGRESS_DIR, False
    system_run = ROOT_RUN if os.access(ROOT_RUN, os.W_OK) else None
    base = Path(tempfile.mkdtemp(prefix="boxmaker-egress-", dir=system_run))
    base.chmod(0o711)
    return base, True


def make_egress_directory(run_dir: Path, name: str, peer: int) -> EgressDirectory:
    """``<root>/<name>/`` (:func:`_egress_root`), empty, 0700, ``peer``'s when brokerd is
    root (else brokerd's own, which is then the sandbox's too). ``name``: a call id, or
    another name no one can guess."""
    root, own_root = _egress_root(run_dir, peer)
    if not own_root:
        root.mkdir(mode=0o700, exist_ok=True)
        info = root.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            raise OSError(errno.EPERM, f"{root} is not brokerd's own directory")
    directory = EgressDirectory(root / name, own_root)
    path = directory.path
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)  # left by a brokerd that did not stop cleanly
        path.mkdir(mode=0o700)
        if os.geteuid() == 0 and peer != 0:
            os.chown(path, peer, peer, follow_symlinks=False)
    except BaseException:
        directory.remove()
        raise
    return directory


def listen_in(directory: Path, peer: int) -> socket.socket:
    """``directory/proxy.sock`` listening, 0600, ``peer``'s when brokerd is root. The
    directory must be one :func:`make_egress_directory` made for ``peer`` (checked). As
    root it is root's again while the socket is made: a process of ``peer``'s could
    otherwise swap the new socket for a link that the chmod and chown would follow."""
    owner = peer if os.geteuid() == 0 and peer != 0 else os.geteuid()
    info = directory.lstat()
    if (
        not stat.S_ISDIR(info.st_mode)
        or info.st_uid != owner
        or stat.S_IMODE(info.st_mode) != 0o700
    ):
        raise OSError(errno.EPERM, f"{directory} is not a way out's own directory")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path = directory / PROXY_SOCK
    try:
        if owner != os.geteuid():
            os.chown(directory, 0, 0, follow_symlinks=False)
        sock.bind(str(path))
        path.chmod(0o600)
        if owner != os.geteuid():
            os.chown(path, peer, peer, follow_symlinks=False)
            os.chown(directory, peer, peer, follow_symlinks=False)
        sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
        raise
    return sock
