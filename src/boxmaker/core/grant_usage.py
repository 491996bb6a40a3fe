"""How often each grant decided a call, and when last (``bxctl grants list``). Pure: the
ledger's decision records in (as the ledger's reader yields them, streaming:
:meth:`boxmaker.ledger.reader.LedgerReader.decisions`), tallies out, so memory follows
the number of grants, not the ledger.

A grant decided a call when the call's ``decision`` record names it in ``grant``
(docs/protocol.md): a run or an ask on it, or a denial it caused (``denied_by_grant``,
``taint_exceeded``, ``untrusted``). The ledger keeps grant ids only, so a grant removed
and written again under the same id shares its tally. Lines that are not decision
records are the reader's to pass over (``bxctl audit verify`` is what reports them).
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from boxmaker.core.vocabulary import Decision, Record


@attrs.define
class GrantUsage:
    """One grant's decisions in the ledger."""

    decisions: int = 0
    verdicts: dict[str, int] = attrs.Factory(dict)
    """Per verdict (run, ask, deny), how many."""
    last_at: str | None = None
    """The last decision's ``at`` (UTC, as recorded)."""
    last_call: str | None = None


def tally_decisions(decisions: Iterable[Record[Decision]]) -> dict[str, GrantUsage]:
    """Each grant's usage among ``decisions`` (a ledger's, in order), by grant id.

    >>> from boxmaker.core.labels import Taint
    >>> from boxmaker.core.vocabulary import VerdictCode
    >>> body = Decision("c-1", "s-1", "read_file", {}, VerdictCode.RUN, None, "g",
    ...                 Taint.PUBLIC, False, "b-1")
    >>> usage = tally_decisions([Record(1, "2026-01-01T00:00:00.000Z", "ab", body)] * 2)
    >>> usage["g"].decisions, usage["g"].verdicts, usage["g"].last_call
    (2, {'run': 2}, 'c-1')
    """
    # The loop is the whole cost of `bxctl grants list` on a large ledger: one dict
    # update a decision, and each grant's last record kept by reference, not copied.
    counts: dict[tuple[str, str], int] = {}
    last: dict[str, Record[Decision]] = {}
    for record in decisions:
        grant = record.body.grant
        if grant is None:
            continue
        key = (grant, record.body.verdict.value)
        counts[key] = counts.get(key, 0) + 1
        last[grant] = record
    usage = {
        grant: GrantUsage(last_at=record.at, last_call=record.body.call)
        for grant, record in last.items()
    }
    for (grant, verdict), count in counts.items():
        usage[grant].decisions += count
        usage[grant].verdicts[verdict] = count
    return usage
