"""How often each grant decided a call, and when last: one pass over the ledger's lines
(``bxctl grants list``). Pure: lines in, tallies out; the caller streams the file
(:func:`boxmaker.ledger.verify.iter_lines`), so memory follows the number of grants,
not the ledger.

A grant decided a call when the call's ``decision`` record names it in ``grant``
(docs/protocol.md): a run or an ask on it, or a denial it caused (``denied_by_grant``,
``taint_exceeded``, ``untrusted``). The ledger keeps grant ids only, so a grant removed
and written again under the same id shares its tally. Lines that are not decision
records, or not JSON, are passed over (``bxctl audit verify`` is what reports them).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

import attrs
import orjson

DECISION_MARK: Final = b'"kind":"decision"'
"""Every decision line holds these bytes (brokerd writes compact JSON, sorted keys):
lines without them are skipped without being parsed, which is most of the time saved.
A line that holds them is still parsed and its ``kind`` checked, since a model's raw
arguments may spell them too."""


@attrs.define
class GrantUsage:
    """One grant's decisions in the ledger."""

    decisions: int = 0
    verdicts: dict[str, int] = attrs.Factory(dict)
    """Per verdict (run, ask, deny), how many."""
    last_at: str | None = None
    """The last decision's ``at`` (UTC, as recorded)."""
    last_call: str | None = None


@attrs.frozen
class Tally:
    """Usage per grant id, and how many lines were read."""

    usage: dict[str, GrantUsage]
    records: int


def tally_decisions(lines: Iterable[bytes]) -> Tally:
    """Count each grant's decisions in ``lines`` (a ledger's lines, in order).

    >>> line = (b'{"at":"2026-01-01T00:00:00.000Z","call":"c-1","grant":"g",'
    ...         b'"kind":"decision","verdict":"run"}')
    >>> tally = tally_decisions([b'{"kind":"start"}\\n', line + b"\\n", line])
    >>> tally.records, tally.usage["g"].decisions, tally.usage["g"].verdicts
    (3, 2, {'run': 2})
    """
    # The loop is the whole cost of `bxctl grants list` on a large ledger: two dict
    # updates a decision, and each grant's last record kept by reference, not copied.
    counts: dict[tuple[str, str], int] = {}
    last: dict[str, dict[str, Any]] = {}
    records = 0
    for records, line in enumerate(lines, 1):  # noqa: B007 - the count is the last index
        if DECISION_MARK not in line:
            continue
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if type(record) is not dict or record.get("kind") != "decision":
            continue
        grant = record.get("grant")
        if type(grant) is not str:
            continue
        key = (grant, str(record.get("verdict")))
        counts[key] = counts.get(key, 0) + 1
        last[grant] = record
    usage = {grant: GrantUsage() for grant in last}
    for (grant, verdict), count in counts.items():
        usage[grant].decisions += count
        usage[grant].verdicts[verdict] = count
    for grant, record in last.items():
        at, call = record.get("at"), record.get("call")
        usage[grant].last_at = at if isinstance(at, str) else None
        usage[grant].last_call = call if isinstance(call, str) else None
    return Tally(usage, records)
