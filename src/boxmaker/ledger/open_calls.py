"""The calls open at a point of the ledger, as a checkpoint record states them
(docs/protocol.md, "Checkpoints"). Pure: fed the bodies the writer writes, in order.

A call is open from its ``run`` or ``ask`` decision until its result, or until an
approval that ends it without a run; the phase is ``asked`` (no approval yet),
``running`` (decided ``run``) or ``approved`` (an approval let it run). The calls of
the writer's own boot are kept with their phase; those of earlier boots, and the
boot's own once its ``stop`` is written, are ``unfinished``: no brokerd is left to end
them (as ``bxctl audit verify`` counts them).

>>> calls = OpenCalls("b-1", unfinished=["c-0"])
>>> calls.phases, calls.unfinished
({}, ['c-0'])
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from boxmaker.ledger.records import (
    Approval,
    ApprovalOutcome,
    Body,
    CallPhase,
    Decision,
    Result,
    Stop,
    VerdictCode,
)

__all__ = ["OpenCalls"]

_OPENED: Final = {VerdictCode.RUN: CallPhase.RUNNING, VerdictCode.ASK: CallPhase.ASKED}
_RUNS_AFTER_APPROVAL: Final = frozenset({ApprovalOutcome.ASK, ApprovalOutcome.ALLOWED})


class OpenCalls:
    """The open calls after every body given to :meth:`track`, for the boot ``boot``;
    ``unfinished`` seeds the calls earlier boots left open (brokerd's start finds them)."""

    def __init__(self, boot: str, *, unfinished: Iterable[str] = ()) -> None:
        self.boot = boot
        self._phases: dict[str, CallPhase] = {}
        self._unfinished = set(unfinished)

    @property
    def phases(self) -> dict[str, CallPhase]:
        """The boot's open calls and their phases (a copy)."""
        return dict(self._phases)

    @property
    def unfinished(self) -> list[str]:
        """The calls no brokerd will end, sorted."""
        return sorted(self._unfinished)

    def track(self, body: Body) -> None:
        """Follow one body written to the ledger."""
        if isinstance(body, Decision):
            phase = _OPENED.get(body.verdict)
            if phase is None:
                return
            if body.boot == self.boot:
                self._phases[body.call] = phase
            else:
                self._unfinished.add(body.call)
        elif isinstance(body, Approval):
            if body.call in self._phases and body.outcome in _RUNS_AFTER_APPROVAL:
                self._phases[body.call] = CallPhase.APPROVED
            elif body.outcome not in _RUNS_AFTER_APPROVAL:
                self._end(body.call)
        elif isinstance(body, Result):
            self._end(body.call)
        elif isinstance(body, Stop) and body.boot == self.boot:
            self._unfinished.update(self._phases)
            self._phases.clear()

    def _end(self, call: str) -> None:
        self._phases.pop(call, None)
        self._unfinished.discard(call)
