"""The witness's files: its state (origin → the size and root it last cosigned), its
key, and the logs it serves. Blocking I/O: the server runs it in a worker thread.

The state file is JSON, ``{"format": "boxmaker-witness/1", "logs": {origin: {"size":
n, "root": base64}}}``, replaced atomically (temp, fsync, rename, directory fsync) with
mode 0600, and held under an exclusive lock (``<state>.lock``) while a witness serves
it: two witnesses on one state could each accept a checkpoint the other's state rules
out (docs/runbook.md#witness-state).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Final

import orjson

from boxmaker.home.file_ops import write_atomically
from boxmaker.home.regular_file import NotRegularFile, read_regular_file
from boxmaker.ledger.checkpoint import MAX_SIZE
from boxmaker.ledger.merkle import HASH_SIZE
from boxmaker.ledger.signed_note import NoteError, NoteVerifier, SignatureType, parse_vkey
from boxmaker.ledger.witness_protocol import TreeHead

STATE_FORMAT: Final = "boxmaker-witness/1"
STATE_MODE: Final = 0o600
MAX_STATE: Final = 16 * 1024 * 1024
RUNBOOK_STATE: Final = "docs/runbook.md#witness-state"
RUNBOOK_KEY: Final = "docs/runbook.md#witness-key"


class WitnessSetupError(Exception):
    """The witness cannot start: a state file, a lock, a ``--log`` or a key it cannot
    use. The message names the file or option and the runbook anchor."""


def load_state(path: Path) -> dict[str, TreeHead]:
    """The state at ``path``; none there is a witness that has cosigned nothing yet.
    A file that is not the format is refused, never taken as empty: an emptied state
    would let the witness cosign a fork of a log it already cosigned."""
    try:
        data = read_regular_file(path, limit=MAX_STATE)
    except FileNotFoundError:
        return {}
    except NotRegularFile as exc:
        raise WitnessSetupError(f"{path}: {exc.strerror}; see {RUNBOOK_STATE}") from None
    except OSError as exc:
        raise WitnessSetupError(
            f"{path}: cannot read ({exc.strerror}); see {RUNBOOK_STATE}"
        ) from None
    try:
        return _parse_state(data)
    except (ValueError, TypeError, KeyError) as exc:
        raise WitnessSetupError(
            f"{path}: not a witness state file ({exc}); see {RUNBOOK_STATE}"
        ) from None


def _parse_state(data: bytes) -> dict[str, TreeHead]:
    if len(data) > MAX_STATE:
        raise ValueError(f"over {MAX_STATE} bytes")
    document = orjson.loads(data)
    if not isinstance(document, dict) or document.get("format") != STATE_FORMAT:
        raise ValueError(f'no "format": "{STATE_FORMAT}"')
    logs = document["logs"]
    if not isinstance(logs, dict):
        raise TypeError('"logs" is not an object')
    heads: dict[str, TreeHead] = {}
    for origin, head in logs.items():
        size, root = head["size"], base64.b64decode(head["root"], validate=True)
        if type(size) is not int or not 0 <= size <= MAX_SIZE or len(root) != HASH_SIZE:
            raise ValueError(f"origin {origin[:100]!r}: a bad size or root")
        heads[origin] = TreeHead(size, root)
    return heads


def format_state(heads: Mapping[str, TreeHead]) -> bytes:
    logs = {
        origin: {"size": head.size, "root": base64.b64encode(head.root).decode("ascii")}
        for origin, head in sorted(heads.items())
    }
    return orjson.dumps({"format": STATE_FORMAT, "logs": logs}, option=orjson.OPT_INDENT_2)


def save_state(path: Path, heads: Mapping[str, TreeHead]) -> None:
    """Replace the state durably: when this returns, a crash keeps ``heads``."""
    write_atomically(path, format_state(heads), mode=STATE_MODE)


@contextlib.contextmanager
def state_lock(path: Path) -> Iterator[None]:
    """Hold ``<state>.lock`` exclusively, or refuse: another witness serves the state."""
    lock = path.with_name(path.name + ".lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, STATE_MODE)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise WitnessSetupError(
                f"{path}: another witness is serving this state (its lock {lock} is held); "
                f"see {RUNBOOK_STATE}"
            ) from None
        yield
    finally:
        os.close(fd)


def parse_log_option(text: str) -> tuple[str, NoteVerifier]:
    """``ORIGIN=VKEY`` (the log's origin line and its Ed25519 signed-note vkey)."""
    origin, equals, vkey = text.partition("=")
    if not equals or not origin or not origin.isprintable():
        raise WitnessSetupError(f"--log {text[:200]!r}: expected ORIGIN=VKEY; see {RUNBOOK_KEY}")
    try:
        verifier = parse_vkey(vkey)
    except NoteError as exc:
        raise WitnessSetupError(f"--log {origin}: {exc}; see {RUNBOOK_KEY}") from None
    if verifier.signature_type is not SignatureType.ED25519:
        raise WitnessSetupError(
            f"--log {origin}: the vkey is not an Ed25519 (0x01) note key; see {RUNBOOK_KEY}"
        )
    return origin, verifier


def log_keys(options: list[str]) -> dict[str, list[NoteVerifier]]:
    """The logs served: each origin with the keys trusted for it (several ``--log`` of
    one origin: several keys, as a key change needs for a while)."""
    logs: dict[str, list[NoteVerifier]] = {}
    for option in options:
        origin, verifier = parse_log_option(option)
        keys = logs.setdefault(origin, [])
        if any((k.name, k.key_id) == (verifier.name, verifier.key_id) for k in keys):
            raise WitnessSetupError(f"--log {origin}: the same key twice; see {RUNBOOK_KEY}")
        keys.append(verifier)
    if not logs:
        raise WitnessSetupError(
            f"no --log ORIGIN=VKEY: the witness serves no log; see {RUNBOOK_KEY}"
        )
    return logs
