"""What-if: recorded decisions decided again against candidate grants (``bxctl grants
what-if``, README.md). Pure: the ledger's decision records (:class:`~boxmaker.core.
vocabulary.Record` of a :class:`~boxmaker.core.vocabulary.Decision`, as the ledger's
reader yields them) and a parsed grant set in, flips out.

A recorded decision is replayed as brokerd decided it: the same :func:`~boxmaker.core.
decide.decide`, on the recorded (checked) arguments, the session's taint and trust as
recorded, and the record's time as ``now`` — so a grant that has expired since, but had
not then, counts as it did then. A *flip* is a call whose verdict would change (run →
ask, ask → deny, deny → run, …).

Only decisions that the grants made are replayed: a run or ask verdict, or a denial
for ``no_grant``, ``denied_by_grant``, ``taint_exceeded`` or ``untrusted``. Every other
denial came before the grants were looked at (``bad_arguments``, ``grants_invalid``,
``state_unreadable``, …) or after (``too_many_pending``, a write_file ask denied
``not_found``): those are counted by reason and skipped, since no grants file could
change them.

Speed (tools/bench_what_if.py): a ledger repeats itself — the same files, the same
commands, sessions at the same few labels — so the outcome is cached. decide()'s answer
depends on the checked arguments, the state and ``now``, and on ``now`` only through
``now >= grant.expires``: every ``now`` between two consecutive expiry times of the
candidate's grants (an *epoch*) decides alike. The cache key is therefore (tool,
arguments, taint, trust, epoch), and a cached answer is exactly what decide() would
say. The checked arguments are cached too (checking costs as much as deciding). Both
caches are cleared when full, so memory stays bounded whatever the ledger holds.
"""

from __future__ import annotations

import bisect
import collections
import datetime as dt
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final, TypeVar

import attrs

from boxmaker.core.catalogue import (
    INTERNAL_TOOLS,
    MAX_BYTES,
    ArgumentProblem,
    CheckedArguments,
    check_arguments,
)
from boxmaker.core.decide import CheckedRequest, Verdict, decide
from boxmaker.core.external_tools import MCP_PREFIX, assumed_catalogue
from boxmaker.core.grants import Grant, GrantSet
from boxmaker.core.labels import Label, Taint
from boxmaker.core.reasons import Reason
from boxmaker.core.vocabulary import Decision, Record, VerdictCode, record_time

GRANT_REASONS: Final[frozenset[Reason | None]] = frozenset(
    {None, Reason.NO_GRANT, Reason.DENIED_BY_GRANT, Reason.TAINT_EXCEEDED, Reason.UNTRUSTED}
)
"""The reasons of decisions the grants made (None: a run or ask verdict)."""

CACHE_ENTRIES: Final = 65536
"""Entries each cache holds before it is cleared (a few tens of MiB at most)."""


_STATES: Final = {
    (taint, untrusted): Label(taint, untrusted) for taint in Taint for untrusted in (False, True)
}
"""The session's state a decision record says, made once, not once a record."""


@attrs.frozen
class Outcome:
    """What the candidate grants decide for a recorded call (its ids are the record's)."""

    verdict: VerdictCode
    reason: Reason | None
    grant: str | None
    detail: str | None


@attrs.frozen
class Flip:
    """A recorded call whose verdict the candidate grants would change."""

    recorded: Record[Decision]
    now: Outcome


@attrs.define
class Replay:
    """Replays recorded decisions against ``grants``, one at a time
    (:meth:`replay`, or :meth:`run` over many), and keeps the tally.

    >>> from boxmaker.core.grant_parse import parse_grants
    >>> grants = parse_grants('[[grant]]\\nid = "ask-read"\\ntool = "read_file"\\nmode = "ask"')
    >>> body = Decision("c-1", "s-1", "read_file", {"path": "a"}, VerdictCode.RUN, None,
    ...                 "read", Taint.PUBLIC, False, "b-1")
    >>> ran = Record(1, "2026-01-01T00:00:00.000Z", "ab", body)
    >>> replay = Replay(grants)
    >>> flip = replay.replay(ran)
    >>> flip.now.verdict, flip.now.grant
    (<VerdictCode.ASK: 'ask'>, 'ask-read')
    >>> replay.replayed, replay.unchanged, replay.flips
    (1, 0, 1)
    """

    grants: GrantSet
    replayed: int = 0
    """Decisions the grants made, decided again."""
    unchanged: int = 0
    flips: int = 0
    not_by_grants: collections.Counter[str] = attrs.field(factory=collections.Counter)
    """Decisions skipped because the grants did not make them, by reason code."""
    unreplayable: int = 0
    """Decisions skipped because their recorded arguments no longer check (a ledger
    written by an older catalogue, or edited by hand)."""
    matched: set[str] = attrs.field(factory=set)
    """Ids of the candidate's grants that covered at least one replayed call."""
    decided: set[str] = attrs.field(factory=set)
    """Ids of the candidate's grants that decided at least one replayed call."""
    _expiries: tuple[dt.datetime, ...] = attrs.field(init=False)
    _unmatched: dict[str, list[Grant]] = attrs.field(init=False)
    _outcomes: dict[tuple[Any, ...], Outcome] = attrs.field(factory=dict, init=False)
    _calls: dict[tuple[Any, ...], _Call | None] = attrs.field(factory=dict, init=False)
    _alone: dict[str | None, GrantSet] = attrs.field(factory=dict, init=False)

    @_expiries.default
    def _sorted_expiries(self) -> tuple[dt.datetime, ...]:
        return tuple(sorted({g.expires for g in self.grants.grants if g.expires is not None}))

    @_unmatched.default
    def _all_unmatched(self) -> dict[str, list[Grant]]:
        unmatched: dict[str, list[Grant]] = {}
        for grant in self.grants.grants:
            unmatched.setdefault(grant.tool, []).append(grant)
        return unmatched

    def run(self, decisions: Iterable[Record[Decision]]) -> Iterator[Flip]:
        """Every flip among ``decisions``, in their order."""
        replay = self.replay
        for recorded in decisions:
            flip = replay(recorded)
            if flip is not None:
                yield flip

    def replay(self, recorded: Record[Decision]) -> Flip | None:
        """Decide ``recorded`` again; the flip when its verdict changes, else None."""
        decision = recorded.body
        if decision.reason not in GRANT_REASONS:
            self.not_by_grants[str(decision.reason)] += 1
            return None
        outcome = self._outcome(decision, record_time(recorded.at))
        if outcome is None:
            self.unreplayable += 1
            return None
        self.replayed += 1
        if outcome.verdict == decision.verdict:
            self.unchanged += 1
            return None
        self.flips += 1
        return Flip(recorded, outcome)

    def never_matched(self) -> tuple[Grant, ...]:
        """The candidate's grants that covered no replayed call, in file order."""
        return tuple(g for g in self.grants.grants if g.id not in self.matched)

    def never_deciding(self) -> tuple[Grant, ...]:
        """The candidate's grants that covered replayed calls but decided none of them
        (a grant above them in precedence always did), in file order."""
        return tuple(
            g for g in self.grants.grants if g.id in self.matched and g.id not in self.decided
        )

    def _outcome(self, decision: Decision, now: dt.datetime) -> Outcome | None:
        """The candidate's outcome for ``decision``, recorded at ``now``; None when its
        arguments do not check."""
        epoch = bisect.bisect_right(self._expiries, now)
        arguments_key = _arguments_key(decision.tool, decision.arguments)
        if arguments_key is None:  # not cacheable: decided afresh, every time
            first = self._first_look(decision, now)
            return None if first is None else first[1]
        key = (arguments_key, epoch, decision.taint, decision.untrusted)
        outcome = self._outcomes.get(key)
        if outcome is not None:
            return outcome
        call_key = (arguments_key, epoch)
        if call_key in self._calls:
            call = self._calls[call_key]
            if call is None:
                return None
            outcome = self._decide(decision, call, now)
        else:
            first = self._first_look(decision, now)
            _bounded(self._calls)[call_key] = None if first is None else first[0]
            if first is None:
                return None
            outcome = first[1]
        _bounded(self._outcomes)[key] = outcome
        return outcome

    def _first_look(self, decision: Decision, now: dt.datetime) -> tuple[_Call, Outcome] | None:
        """Arguments not seen before (in this epoch): check them, note which grants
        cover them, and decide with the whole grant set. Also the grant that precedence
        picks for them, which does not depend on the session's state: later states
        are decided on it alone (:meth:`_decide`)."""
        tool = decision.tool
        if tool.startswith(MCP_PREFIX):
            # A recorded MCP tool is decided as if accepted: what-if asks which grant
            # would decide it, not whether its server still offers it.
            external = assumed_catalogue(tool)
            checked = check_arguments(tool, decision.arguments, external=external)
        elif tool in INTERNAL_TOOLS:
            # A recorded connect was brokerd's own request: it checks as one.
            checked = check_arguments(tool, decision.arguments, internal=True)
        else:
            checked = check_arguments(tool, decision.arguments)
        if isinstance(checked, ArgumentProblem):
            return None
        self._note_matches(checked, now)
        request = CheckedRequest(decision.call, decision.session, checked)
        state = _STATES[decision.taint, decision.untrusted]
        outcome = self._outcome_of(decide(request, self.grants, state, now))
        alone = self._alone.get(outcome.grant)
        if alone is None:
            found = tuple(g for g in self.grants.grants if g.id == outcome.grant)
            alone = self._alone[outcome.grant] = GrantSet(found)
        return _Call(checked, alone), outcome

    def _decide(self, decision: Decision, call: _Call, now: dt.datetime) -> Outcome:
        # Only the picked grant is offered: decide() picks it again (it covers the
        # call, in this epoch) or, with none, says no_grant; the rest of its answer
        # depends on that grant and the state alone, so it is the answer the whole
        # grant set gives, at a fraction of the cost.
        request = CheckedRequest(decision.call, decision.session, call.checked)
        state = _STATES[decision.taint, decision.untrusted]
        return self._outcome_of(decide(request, call.grants, state, now))

    def _outcome_of(self, verdict: Verdict) -> Outcome:
        decision = verdict.decision
        if decision.grant is not None:
            self.decided.add(decision.grant)
        return Outcome(decision.verdict, decision.reason, decision.grant, decision.detail)

    def _note_matches(self, checked: CheckedArguments, now: dt.datetime) -> None:
        """Mark the grants not yet seen to match that cover this call."""
        unmatched = self._unmatched.get(checked.tool)
        if not unmatched:
            return
        still = []
        for grant in unmatched:
            if grant.covers(checked, now):
                self.matched.add(grant.id)
            else:
                still.append(grant)
        self._unmatched[checked.tool] = still


@attrs.frozen
class _Call:
    """Arguments seen before (in this epoch): checked, and the grant set of the one
    grant that decides them (empty: no grant covers them)."""

    checked: CheckedArguments
    grants: GrantSet


_Cache = TypeVar("_Cache", bound=dict[Any, Any])


def _bounded(cache: _Cache) -> _Cache:
    """``cache``, emptied first when full: memory stays bounded whatever the ledger."""
    if len(cache) >= CACHE_ENTRIES:
        cache.clear()
    return cache


def _arguments_key(tool: str, arguments: Mapping[str, Any]) -> tuple[str, Any] | None:
    """A cache key equal for two calls' arguments only when checking them gives the
    same answer and every grant matches them alike; None when there is none.

    Every value must be exactly a str or an int: ``True == 1`` and ``1.0 == 1``, but a
    bool or a float must not share a key with an int (brokerd records neither).
    write_file's ``content`` counts only as fitting: no grant looks at it (grants match
    paths, commands and hosts), and each write's content is new, so keyed whole no
    write would ever be found again. Content of at most a quarter of the cap in
    characters fits whatever they are (UTF-8 is at most 4 bytes a character); longer
    content gets no key and is checked afresh.
    """
    items = []
    for name, value in arguments.items():
        kind = type(value)
        if kind is str:
            if name == "content" and tool == "write_file":
                if len(value) > MAX_BYTES // 4:
                    return None
                value = _FITS
        elif kind is not int:
            return None
        items.append((name, value))
    return (tool, tuple(items))


_FITS: Final = "\x00fits"
"""The key's stand-in for write_file content that fits (no real content is compared
with it: a key holds it only in place of content)."""
