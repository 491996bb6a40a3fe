"""What a verification of the ledger finds (boxmaker.ledger.verify): each problem, the
calls by state, the report, and where a verification resumed from a checkpoint starts
(boxmaker.ledger.fast_start). Pure data."""

from __future__ import annotations

import attrs

from boxmaker.ledger.merkle import Frontier
from boxmaker.ledger.records import CallPhase


@attrs.frozen
class Problem:
    seq: int
    what: str

    def __str__(self) -> str:
        return f"seq {self.seq}: {self.what}"


@attrs.frozen
class CallCounts:
    complete: int = 0
    denied: int = 0
    refused: int = 0
    expired: int = 0
    withdrawn: int = 0
    pending: int = 0
    running: int = 0
    unfinished: int = 0

    @property
    def total(self) -> int:
        return sum(attrs.astuple(self))


@attrs.frozen
class Report:
    problems: tuple[Problem, ...]
    records: int
    head: str | None
    calls: CallCounts
    problems_left_out: int = 0
    """Problems found beyond ``max_problems``, counted but not kept."""
    open_calls: frozenset[str] = frozenset()
    """Calls with a decision but no end yet (pending, running or unfinished): brokerd
    refuses these ids at start, so a reused id can never add a second decision."""
    policies: tuple[tuple[int, str], ...] = ()
    """Each ``policy`` record's seq and the sha256 of the grants it names (the records
    of a file that could not be read name none): the kept versions are checked by
    :func:`~boxmaker.ledger.verify_files.verify_file`."""
    checkpoints: int = 0
    """The ``checkpoint`` records checked (root, note, open calls)."""
    signatures_checked: bool = False
    """Whether their notes' signatures were checked (a ledger key was given)."""
    tiles_checked: int = 0
    """The tree's tiles compared with the lines
    (:func:`~boxmaker.ledger.verify_files.verify_file`)."""
    tiles_sound: bool | None = None
    """Whether every tile compared held what the lines give (None: none compared)."""
    resumed_from: int | None = None
    """The seq of the first line checked when resumed (:class:`ResumePoint`), else None."""
    archived: int = 0
    """Lines before the oldest file present (its segments archived away): not read; the
    verification started at the checkpoint that file begins with."""
    warnings: tuple[str, ...] = ()
    """What is amiss but not a problem (a segment that can be written to)."""

    @property
    def sound(self) -> bool:
        return not self.problems


@attrs.frozen
class ResumePoint:
    """What a verification of the lines from ``next_seq`` on needs of the lines before
    them, as a verified checkpoint record gives it (boxmaker.ledger.fast_start): the
    previous line's hash, the tree over the lines before (its leaves ``0..next_seq-1``),
    the calls then open (the newest boot's with their phases, and those earlier boots
    left open), the newest boot and whether it had stopped, and the ledger's origin."""

    next_seq: int
    prev_hash: str
    tree: Frontier
    open_calls: dict[str, CallPhase]
    unfinished: frozenset[str]
    newest_boot: str | None
    boot_stopped: bool
    origin: str
