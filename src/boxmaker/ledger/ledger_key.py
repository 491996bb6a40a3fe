"""The ledger's signing key on disk (docs/runbook.md#ledger-key): created once, never
replaced, read back only when it is the owner's alone.

``keys/ledger.ed25519`` holds the Ed25519 private key as PKCS#8 PEM, mode 0600, in
``keys/`` (0700); ``keys/ledger.vkey`` holds the public verifier key line
(``name+keyid+key``, signed-note's vkey) for whoever checks the checkpoints. The key's
name is the ledger's origin (:func:`boxmaker.ledger.checkpoint.ledger_origin`), so the
vkey is written for an origin while the private key itself names nothing. Blocking
I/O: callers in trio run it in a worker thread.
"""

from __future__ import annotations

import contextlib
import enum
import os
import secrets
import stat
from pathlib import Path
from typing import Final

from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    load_pem_private_key,
)

from boxmaker.home.file_ops import fsync_dir, write_atomically
from boxmaker.home.paths import Home
from boxmaker.home.regular_file import NotRegularFile, open_regular_file, read_regular_file
from boxmaker.ledger.checkpoint import CheckpointError, ledger_origin, parse_checkpoint
from boxmaker.ledger.records import BadRecord, CheckpointRecord, Genesis, decode_line
from boxmaker.ledger.segments import ledger_files
from boxmaker.ledger.signed_note import Ed25519PrivateKey, NoteSigner

RUNBOOK_LEDGER_KEY: Final = "docs/runbook.md#ledger-key"
KEY_MODE: Final = 0o600
VKEY_MODE: Final = 0o644
MAX_KEY_FILE: Final = 16384
"""A PKCS#8 PEM Ed25519 key is 119 bytes; anything this long is not one."""
MAX_GENESIS_LINE: Final = 4096
MAX_CHECKPOINT_LINE: Final = 64 << 20
"""A checkpoint line holds the calls then open: far larger than a genesis line."""


class LedgerKeyProblem(enum.StrEnum):
    """Why the ledger key cannot be used."""

    MISSING = "missing"
    NOT_A_FILE = "not_a_file"
    NOT_OURS = "not_ours"
    LOOSE_MODE = "loose_mode"
    UNREADABLE = "unreadable"


class LedgerKeyError(Exception):
    """The ledger key cannot be used; :attr:`reason` says why, the message names the
    file and docs/runbook.md#ledger-key."""

    def __init__(
        self,
        reason: LedgerKeyProblem,
        path: Path,
        detail: str,
        *,
        what: str = "the ledger key",
        anchor: str = RUNBOOK_LEDGER_KEY,
    ) -> None:
        super().__init__(f"{path}: {what} {detail}; see {anchor}")
        self.reason = reason
        self.path = path


def _key_bytes(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())


def _write_new(path: Path, data: bytes) -> bool:
    """Write ``data`` at ``path`` only if nothing is there: a full temp file, fsynced,
    then hard-linked to the name (which fails on any existing name, a link included, so
    a key is never replaced, not even by a racing create). True when written."""
    temp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temp, flags, KEY_MODE)
    try:
        try:
            os.fchmod(fd, KEY_MODE)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(temp, path, follow_symlinks=False)
        except FileExistsError:
            return False
    finally:
        with contextlib.suppress(OSError):
            temp.unlink()
    fsync_dir(path.parent)
    return True


def create_ledger_key(home: Home, origin: str) -> bool:
    """Make the ledger key if there is none (``keys/`` made 0700 first), and write its
    vkey for ``origin``. An existing key is kept and must load
    (:func:`load_ledger_signer`'s checks). True when a new key was made.

    Raises :class:`LedgerKeyError` for an existing key that cannot be used,
    :class:`~boxmaker.home.paths.HomeError` for a ``keys/`` that is not ours, OSError.
    """
    home.ensure_keys_dir()
    created = create_private_key(home.ledger_key)
    signer = load_ledger_signer(home, origin)
    vkey = (signer.vkey + "\n").encode()
    # The vkey is public and derived from the key: rewritten when it differs (a new
    # origin after a new genesis), never read back to decide anything.
    with contextlib.suppress(FileNotFoundError, NotRegularFile):
        if read_regular_file(home.ledger_vkey, limit=MAX_KEY_FILE) == vkey:
            return created
    write_atomically(home.ledger_vkey, vkey, mode=VKEY_MODE)
    home.ledger_vkey.chmod(VKEY_MODE)
    return created


def _check_keys_dir(home: Home) -> None:
    directory = home.keys_dir
    try:
        info = directory.lstat()
    except FileNotFoundError:
        raise LedgerKeyError(
            LedgerKeyProblem.MISSING, home.ledger_key, "is missing (no keys/ directory)"
        ) from None
    if not stat.S_ISDIR(info.st_mode):
        raise LedgerKeyError(
            LedgerKeyProblem.NOT_A_FILE,
            home.ledger_key,
            f"is not usable: {directory} is not a directory",
        )
    _check_private(home.ledger_key, info, f"directory {directory}", 0o700)


def _check_private(key_path: Path, info: os.stat_result, what: str, mode: int) -> None:
    problem = _private_problem(info, what, mode)
    if problem is not None:
        raise LedgerKeyError(problem[0], key_path, problem[1])


def _private_problem(
    info: os.stat_result, what: str, mode: int
) -> tuple[LedgerKeyProblem, str] | None:
    if info.st_uid != os.getuid():
        return (
            LedgerKeyProblem.NOT_OURS,
            f"is not usable: its {what} is owned by uid {info.st_uid}, "
            f"not by you (uid {os.getuid()})",
        )
    if stat.S_IMODE(info.st_mode) & 0o077:
        return (
            LedgerKeyProblem.LOOSE_MODE,
            f"is not usable: its {what} has mode {stat.S_IMODE(info.st_mode):04o}, "
            f"open to others; it must be {mode:04o}",
        )
    return None


def load_ledger_signer(home: Home, origin: str) -> NoteSigner:
    """The ledger key, as the signer named ``origin``. Refused (:class:`LedgerKeyError`)
    when it is missing, not a regular file (a symlink is not followed), not ours, open
    to group or others (the file or ``keys/``), or not a PKCS#8 PEM Ed25519 key."""
    _check_keys_dir(home)
    return NoteSigner(origin, load_private_key(home.ledger_key))


def create_private_key(path: Path) -> bool:
    """Make a new Ed25519 key at ``path`` (PKCS#8 PEM, 0600) if nothing is there; an
    existing file is never replaced. True when a key was made."""
    return _write_new(path, _key_bytes(Ed25519PrivateKey.generate()))


def load_private_key(
    path: Path, *, what: str = "the ledger key", anchor: str = RUNBOOK_LEDGER_KEY
) -> Ed25519PrivateKey:
    """The Ed25519 key at ``path``, refused (:class:`LedgerKeyError`, naming ``what``
    and ``anchor``) when it is missing, not a regular file (a symlink is not followed),
    not ours, open to group or others, or not a PKCS#8 PEM Ed25519 key."""

    def refused(reason: LedgerKeyProblem, detail: str) -> LedgerKeyError:
        return LedgerKeyError(reason, path, detail, what=what, anchor=anchor)

    try:
        fd = open_regular_file(path)
    except FileNotFoundError:
        raise refused(LedgerKeyProblem.MISSING, "is missing") from None
    except NotRegularFile as exc:
        raise refused(LedgerKeyProblem.NOT_A_FILE, f"is not usable: {exc.strerror}") from None
    except OSError as exc:
        raise refused(LedgerKeyProblem.UNREADABLE, f"cannot be opened ({exc.strerror})") from None
    try:
        problem = _private_problem(os.fstat(fd), "file", KEY_MODE)
        if problem is not None:
            raise refused(*problem)
        data = os.read(fd, MAX_KEY_FILE + 1)
    except OSError as exc:
        raise refused(LedgerKeyProblem.UNREADABLE, f"cannot be read ({exc.strerror})") from None
    finally:
        os.close(fd)
    try:
        key = load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        key = None
    if not isinstance(key, Ed25519PrivateKey):
        raise refused(LedgerKeyProblem.UNREADABLE, "is not an unencrypted PKCS#8 PEM Ed25519 key")
    return key


def read_ledger_origin(audit_log: Path) -> str:
    """The origin of the ledger whose live file is ``audit_log``: from its genesis
    record (line 0, in the oldest file: docs/protocol.md, "Segments"), or, with the
    oldest segments archived away, from the checkpoint the oldest file present begins
    with (its note's origin line; the note's signature is its reader's to check).
    Raises :class:`~boxmaker.ledger.records.BadRecord` when that line is neither,
    OSError, :class:`~boxmaker.ledger.segments.SegmentProblem`."""
    files = ledger_files(audit_log.parent)
    oldest = files.paths()[0]
    limit = MAX_GENESIS_LINE if not files.archived else MAX_CHECKPOINT_LINE
    with oldest.open("rb") as file:
        first = file.readline(limit)
    record = decode_line(first.removesuffix(b"\n"))
    body = record.body
    if isinstance(body, Genesis) and record.seq == 0:
        return ledger_origin(body.ledger)
    if isinstance(body, CheckpointRecord) and record.seq == files.archived > 0:
        try:
            return parse_checkpoint(body.note.split("\n\n", 1)[0] + "\n").origin
        except CheckpointError as exc:
            raise BadRecord(f"{oldest}: its first line's checkpoint note: {exc}") from None
    raise BadRecord(
        f"{oldest}: line {files.archived} is a {body.kind} record, not "
        + ("genesis" if not files.archived else "the checkpoint of the lines archived")
    )
