"""Which bubblewrap the shell sandbox runs with (docs/runbook.md#sandbox).

The sandbox's argv (:func:`boxmaker.broker.sandbox_plan.sandbox_argv`) uses
``--disable-userns``, which bubblewrap has from 0.8.0 on: an older bwrap, or one whose
version cannot be read, is refused before anything starts (the shell tool answers
``sandbox_unavailable``; ``bxctl up`` reports it), with a detail that names the version
found and the one needed, rather than left to fail every call with bwrap's own "Unknown
option". The version is read once per binary (docs/decisions.md, "No nested user
namespace"). Its own module: sandbox.py starts sandboxes, this only looks at a binary.
"""

from __future__ import annotations

import functools
import re
import subprocess
from pathlib import Path
from typing import Final

BWRAP_NEEDED: Final = (0, 8, 0)
"""The oldest bubblewrap the sandbox runs with: ``--disable-userns`` came in 0.8.0."""
BWRAP_VERSION_TIMEOUT: Final = 5.0
"""Seconds ``bwrap --version`` may take."""


class _VersionUnread(Exception):
    """``bwrap --version`` did not say a version; the message says what happened."""


@functools.lru_cache(maxsize=8)
def _bwrap_version(bwrap: str, identity: tuple[int, ...]) -> tuple[int, ...]:
    # ``identity`` (the file's stat) only keys the cache: a replaced or upgraded bwrap
    # is read again. A failure raises, and lru_cache keeps no exception: it is tried again.
    try:
        done = subprocess.run(
            [bwrap, "--version"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            env={},
            timeout=BWRAP_VERSION_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise _VersionUnread(str(exc)) from exc
    said = done.stdout.decode("utf-8", "replace").strip()
    found = re.fullmatch(r"bubblewrap (\d+)\.(\d+)(?:\.(\d+))?\S*", said)
    if done.returncode != 0 or found is None:
        lines = (said or done.stderr.decode("utf-8", "replace").strip()).splitlines()
        first = repr(lines[0][:200]) if lines else "nothing"
        raise _VersionUnread(f"`bwrap --version` printed {first}, exit status {done.returncode}")
    return tuple(int(part or 0) for part in found.groups())


def bwrap_version_problem(bwrap: str) -> str | None:
    """Why the bubblewrap at ``bwrap`` cannot run the sandbox :func:`sandbox_argv` makes
    (it is older than :data:`BWRAP_NEEDED`, or its version cannot be read), or None.
    ``bwrap --version`` runs once per binary: the answer is kept by path and stat
    identity, so a call costs one stat."""
    needed = f"{'.'.join(map(str, BWRAP_NEEDED))} or newer (for --disable-userns)"
    try:
        info = Path(bwrap).stat()
        identity = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
        version = _bwrap_version(bwrap, identity)
    except (OSError, _VersionUnread) as exc:
        why = exc.strerror if isinstance(exc, OSError) else str(exc)
        return (
            f"the version of bubblewrap ({bwrap}) cannot be read ({why}); "
            f"the shell sandbox needs {needed}"
        )
    if version >= BWRAP_NEEDED:
        return None
    found = ".".join(map(str, version))
    return f"bubblewrap ({bwrap}) is version {found}; the shell sandbox needs {needed}"
