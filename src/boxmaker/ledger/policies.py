"""Every distinct grants.toml brokerd decided with, kept beside the ledger
(docs/protocol.md, "Policy records"): ``ledger/policies/<sha256>.toml``, 0600, named by
the SHA-256 of its bytes, so a ``policy`` record's ``sha256`` says which file holds the
grants it speaks of, and anyone can check that the file still holds exactly those bytes.

A kept version is written once, atomically (:func:`boxmaker.home.file_ops.write_atomically`),
before the record that names it, and never rewritten while it is sound. Whatever else
is found under its name is not trusted: a symlink (never followed), a FIFO (never
opened for long: the reads are non-blocking), a directory, a file whose bytes hash to
something else. :func:`keep` replaces such an entry with the right bytes (a rename,
which replaces the entry itself and never writes through a link) and says what it
replaced; :func:`kept_problem` names it for ``bxctl audit verify``
(docs/runbook.md#policy-kept). The directory itself must be a real directory: a
symlink there is refused, not followed.

Blocking I/O: callers in trio run these in a worker thread.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Final

import attrs

from boxmaker.core.grant_text import grant_text
from boxmaker.core.vocabulary import Record
from boxmaker.home.file_ops import OS_FILES, FileOps, fsync_dir, write_atomically
from boxmaker.home.grants_file import MAX_GRANTS_BYTES
from boxmaker.home.regular_file import NotRegularFile, read_regular_file
from boxmaker.ledger.records import Policy

POLICIES_DIR: Final = "policies"
KEPT_MODE: Final = 0o600
DIR_MODE: Final = 0o700
RUNBOOK_KEPT: Final = "docs/runbook.md#policy-kept"
SHA256_DIGITS: Final = frozenset("0123456789abcdef")


class KeptProblem(Exception):
    """A kept version that cannot be used: ``what`` says why, in words for the owner."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


@attrs.frozen
class Kept:
    """What :func:`keep` did: the version's sha, whether it wrote the file, and what
    untrusted entry it replaced (None: nothing was there, or a sound copy was)."""

    sha256: str
    written: bool
    replaced: str | None = None


def is_sha256(text: object) -> bool:
    """A lowercase 64-hex SHA-256 (nothing else can name a kept file: no path tricks).

    >>> is_sha256("a" * 64), is_sha256("../" + "a" * 61), is_sha256(None)
    (True, False, False)
    """
    return isinstance(text, str) and len(text) == 64 and set(text) <= SHA256_DIGITS


def policies_dir(ledger: Path) -> Path:
    """Where the kept versions of the ledger at ``ledger`` are."""
    return ledger.parent / POLICIES_DIR


def kept_path(directory: Path, sha256: str) -> Path:
    if not is_sha256(sha256):
        raise ValueError(f"not a SHA-256: {sha256!r}")
    return directory / f"{sha256}.toml"


def _check_directory(directory: Path) -> None:
    """Raise KeptProblem unless ``directory`` is a real directory (not a symlink)."""
    try:
        mode = os.lstat(directory).st_mode
    except FileNotFoundError:
        raise KeptProblem(f"{directory} does not exist") from None
    except OSError as exc:
        raise KeptProblem(f"{directory} cannot be read ({exc.strerror})") from None
    if stat.S_ISLNK(mode):
        raise KeptProblem(f"{directory} is a symlink, which is not followed")
    if not stat.S_ISDIR(mode):
        raise KeptProblem(f"{directory} is not a directory")


def read_kept(directory: Path, sha256: str) -> bytes:
    """The kept bytes of version ``sha256``, checked: they hash to it.

    Raises KeptProblem: missing, not a regular file, unreadable, or other bytes.
    """
    _check_directory(directory)
    path = kept_path(directory, sha256)
    try:
        data = read_regular_file(path, limit=MAX_GRANTS_BYTES)
    except FileNotFoundError:
        raise KeptProblem(f"{path.name} is missing") from None
    except NotRegularFile as exc:
        raise KeptProblem(f"{path.name} is {exc.strerror}, not trusted") from None
    except OSError as exc:
        raise KeptProblem(f"{path.name} cannot be read ({exc.strerror})") from None
    if len(data) > MAX_GRANTS_BYTES:
        raise KeptProblem(f"{path.name} is larger than any grants.toml brokerd reads")
    found = hashlib.sha256(data).hexdigest()
    if found != sha256:
        raise KeptProblem(f"{path.name} was changed: its bytes hash to {found[:12]}…")
    return data


def kept_problem(directory: Path, sha256: str) -> str | None:
    """Why version ``sha256``'s kept copy cannot be trusted, or None when it is sound."""
    try:
        read_kept(directory, sha256)
    except KeptProblem as problem:
        return problem.what
    return None


def _ensure_directory(directory: Path, files: FileOps) -> None:
    try:
        directory.mkdir(DIR_MODE)
    except FileExistsError:
        _check_directory(directory)
        return
    fsync_dir(directory.parent, files)


def keep(directory: Path, data: bytes, *, files: FileOps = OS_FILES) -> Kept:
    """Keep ``data`` as its version (see the module docstring); durable on return.

    Raises KeptProblem when the directory is not one to use, OSError when the write
    fails.
    """
    sha256 = hashlib.sha256(data).hexdigest()
    _ensure_directory(directory, files)
    try:
        read_kept(directory, sha256)
    except KeptProblem as problem:
        found = problem.what
    else:
        return Kept(sha256, written=False)
    missing = not os.path.lexists(kept_path(directory, sha256))
    write_atomically(kept_path(directory, sha256), data, mode=KEPT_MODE, files=files)
    return Kept(sha256, written=True, replaced=None if missing else found)


@attrs.frozen
class GrantThen:
    """The grant that decided a call, as the grants in force then had it: ``text`` (its
    ``[[grant]]`` table as written), or ``missing``, why it cannot be shown."""

    sha256: str | None
    """The version in force (the last ``policy`` record before the decision)."""
    policy_seq: int | None
    text: str | None = None
    missing: str | None = None


def grant_then(directory: Path, policy: Record[Policy] | None, grant_id: str) -> GrantThen:
    """Read grant ``grant_id`` from the kept version ``policy`` (a ``policy`` record, the
    last before the decision; None when there is none) names. Blocking."""
    if policy is None:
        return GrantThen(None, None, missing="no policy record of its boot before the decision")
    seq, sha = policy.seq, policy.body.sha256
    # Typed is not enough: the name becomes a path, so it must be a SHA-256's hex.
    if sha is None or not is_sha256(sha):
        return GrantThen(None, seq, missing=f"grants.toml could not be read: {policy.body.problem}")
    try:
        data = read_kept(directory, sha)
    except KeptProblem as problem:
        return GrantThen(sha, seq, missing=f"the kept version {problem.what}; see {RUNBOOK_KEPT}")
    try:
        text = grant_text(data.decode("utf-8"), grant_id)
    except UnicodeDecodeError:
        text = None
    if text is None:
        return GrantThen(sha, seq, missing=f"the kept version has no grant {grant_id} to show")
    return GrantThen(sha, seq, text=text)
