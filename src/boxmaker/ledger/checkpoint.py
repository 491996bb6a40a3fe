"""A checkpoint: the C2SP tlog-checkpoint note text, byte for byte. Pure.

Three lines, each ending in a newline: the origin (which log), the tree size in decimal
with no leading zeros, the root hash in base64; then optional extension lines, kept as
they are. A ledger's origin is ``boxmaker.local/ledger/<its genesis ledger id>``, and the
ledger key's name is the origin (docs/decisions.md, "Signed checkpoints").

>>> cp = Checkpoint("example.com/behind-the-sofa", 20852163, bytes(32))
>>> print(format_checkpoint(cp), end="")
example.com/behind-the-sofa
20852163
AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=
>>> parse_checkpoint(format_checkpoint(cp)) == cp
True
"""

from __future__ import annotations

import base64
import enum
import re
from typing import Final

import attrs

from boxmaker.ledger.signed_note import decode_base64

__all__ = [
    "ORIGIN_PREFIX",
    "Checkpoint",
    "CheckpointError",
    "CheckpointProblem",
    "format_checkpoint",
    "ledger_origin",
    "parse_checkpoint",
]

HASH_SIZE: Final = 32
MAX_SIZE: Final = 2**63 - 1
"""The largest tree size: a signed 64-bit integer, as the Go reference's."""
ORIGIN_PREFIX: Final = "boxmaker.local/ledger/"
_SIZE: Final = re.compile(r"0|[1-9][0-9]{0,18}")
_LEDGER_ID: Final = re.compile(r"[A-Za-z0-9._-]{1,64}")


class CheckpointProblem(enum.StrEnum):
    """Why a checkpoint's text was refused."""

    NO_FINAL_NEWLINE = "no_final_newline"
    TOO_FEW_LINES = "too_few_lines"
    EMPTY_ORIGIN = "empty_origin"
    BAD_SIZE = "bad_size"
    BAD_ROOT = "bad_root"
    EMPTY_EXTENSION = "empty_extension"


class CheckpointError(ValueError):
    """A checkpoint's text refused; :attr:`reason` says why in one word."""

    def __init__(self, reason: CheckpointProblem, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def _one_line(_instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not value or "\n" in value:
        raise ValueError(f"a checkpoint's {attribute.name} is one non-empty line")


def _extension_lines(_instance: object, _attribute: object, value: tuple[str, ...]) -> None:
    if any(not line or "\n" in line for line in value):
        raise ValueError("each extension is one non-empty line")


def _tree_size(_instance: object, _attribute: object, value: int) -> None:
    if not 0 <= value <= MAX_SIZE:
        raise ValueError(f"a tree size is 0 to 2**63-1, not {value}")


def _root_hash(_instance: object, _attribute: object, value: bytes) -> None:
    if len(value) != HASH_SIZE:
        raise ValueError(f"a root hash is {HASH_SIZE} bytes, not {len(value)}")


@attrs.frozen
class Checkpoint:
    """A tree head: ``origin`` names the log, ``size`` its leaves, ``root`` the RFC 6962
    root hash at that size; ``extensions`` the extra lines (none of ours)."""

    origin: str = attrs.field(validator=_one_line)
    size: int = attrs.field(validator=_tree_size)
    root: bytes = attrs.field(validator=_root_hash)
    extensions: tuple[str, ...] = attrs.field(default=(), validator=_extension_lines)


def ledger_origin(ledger_id: str) -> str:
    """The origin (and the ledger key's name) of the ledger whose genesis record has
    ``ledger_id``.

    >>> ledger_origin("l-0123456789abcdef")
    'boxmaker.local/ledger/l-0123456789abcdef'
    """
    if not _LEDGER_ID.fullmatch(ledger_id):
        raise ValueError(f"not a ledger id: {ledger_id!r}")
    return ORIGIN_PREFIX + ledger_id


def format_checkpoint(checkpoint: Checkpoint) -> str:
    """The note text: origin, size, base64 root, extensions, each line ending in a
    newline."""
    lines = (
        checkpoint.origin,
        str(checkpoint.size),
        base64.b64encode(checkpoint.root).decode("ascii"),
        *checkpoint.extensions,
    )
    return "".join(f"{line}\n" for line in lines)


def parse_checkpoint(text: str) -> Checkpoint:
    """The checkpoint in a note's text (final newline included, no signatures). Strict:
    every line ends in a newline and is non-empty, the size is decimal with no leading
    zeros, the root is canonical base64 of 32 bytes. Raises :class:`CheckpointError`."""
    if not text.endswith("\n"):
        raise CheckpointError(CheckpointProblem.NO_FINAL_NEWLINE, "the last line has no newline")
    lines = text[:-1].split("\n")
    if len(lines) < 3:
        raise CheckpointError(
            CheckpointProblem.TOO_FEW_LINES, f"{len(lines)} lines, not origin, size and root"
        )
    origin, size, root, *extensions = lines
    if not origin:
        raise CheckpointError(CheckpointProblem.EMPTY_ORIGIN, "the origin line is empty")
    if not _SIZE.fullmatch(size) or int(size) > MAX_SIZE:
        raise CheckpointError(
            CheckpointProblem.BAD_SIZE,
            f"the size is not decimal without leading zeros, at most 2**63-1: {size[:40]!r}",
        )
    try:
        root_hash = decode_base64(root)
    except ValueError:
        root_hash = b""
    if len(root_hash) != HASH_SIZE:
        raise CheckpointError(
            CheckpointProblem.BAD_ROOT, f"the root is not base64 of 32 bytes: {root[:60]!r}"
        )
    for number, line in enumerate(extensions, start=4):
        if not line:
            raise CheckpointError(CheckpointProblem.EMPTY_EXTENSION, f"line {number} is empty")
    return Checkpoint(origin, int(size), root_hash, tuple(extensions))
