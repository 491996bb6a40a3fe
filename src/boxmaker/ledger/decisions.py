"""The ``decision`` records of a ledger, read for replay (``bxctl grants what-if``).

:class:`DecisionReader` takes the ledger's lines as iterating a binary file yields them
(:func:`~boxmaker.ledger.verify.iter_lines`: one pass, streaming, the file is never
held whole) and yields each decision as a :class:`~boxmaker.core.replay.
RecordedDecision`. It does not verify the chain (``bxctl audit verify`` does); a line
that is not a well-formed decision record is counted in ``malformed`` and skipped.

Speed: most lines are not decisions (approvals, results), and a decision's line holds
the word ``decision`` as its kind: a line without that word is passed over unparsed.
The fields are checked by hand on orjson's dict, with the few enum values looked up in
tables, not structured by cattrs (:mod:`boxmaker.ledger.verify` does the same).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator
from typing import Any, Final

import attrs
import orjson

from boxmaker.core.labels import Label, Taint
from boxmaker.core.reasons import Reason
from boxmaker.core.replay import RecordedDecision
from boxmaker.core.vocabulary import VerdictCode

_VERDICTS: Final = {code.value: code for code in VerdictCode}
_REASONS: Final[dict[str | None, Reason | None]] = {None: None} | {r.value: r for r in Reason}
_STATES: Final = {
    (taint.value, untrusted): Label(taint, untrusted)
    for taint in Taint
    for untrusted in (False, True)
}


@attrs.define
class DecisionReader:
    """The decisions among ``lines``, from ``since`` on (the record's time, inclusive)
    and of ``session`` only when given, in ledger order.

    >>> line = (b'{"arguments":{"path":"a"},"at":"2026-01-02T03:04:05.678Z","boot":"b-1",'
    ...         b'"call":"c-1","grant":"r","kind":"decision","prev":"00","reason":null,'
    ...         b'"seq":1,"session":"s-1","taint":"public","tool":"read_file",'
    ...         b'"untrusted":false,"verdict":"run"}\\n')
    >>> reader = DecisionReader([line, b'not json decision\\n'])
    >>> [(d.call, d.verdict.value, d.state.taint.value) for d in reader]
    [('c-1', 'run', 'public')]
    >>> reader.malformed
    1
    """

    lines: Iterable[bytes]
    since: dt.datetime | None = None
    session: str | None = None
    malformed: int = 0
    """Lines that mention a decision but are not a well-formed decision record."""

    def __iter__(self) -> Iterator[RecordedDecision]:
        since, session = self.since, self.session
        for line in self.lines:
            if b"decision" not in line:
                continue
            try:
                fields = orjson.loads(line)
            except orjson.JSONDecodeError:
                self.malformed += 1
                continue
            if type(fields) is not dict:
                self.malformed += 1  # not a record at all
                continue
            if fields.get("kind") != "decision":
                continue
            recorded = _recorded(fields)
            if recorded is None:
                self.malformed += 1
                continue
            if since is not None and recorded.at < since:
                continue
            if session is not None and recorded.session != session:
                continue
            yield recorded


def _recorded(fields: dict[str, Any]) -> RecordedDecision | None:
    """The decision a record's fields say, or None when a field is missing or wrong."""
    try:
        seq, at, call = fields["seq"], fields["at"], fields["call"]
        session, tool, arguments = fields["session"], fields["tool"], fields["arguments"]
        grant, untrusted = fields["grant"], fields["untrusted"]
        if (
            type(seq) is not int
            or type(call) is not str
            or type(session) is not str
            or type(tool) is not str
            or type(arguments) is not dict
            or not (grant is None or type(grant) is str)
            or type(untrusted) is not bool
        ):
            return None
        verdict = _VERDICTS[fields["verdict"]]
        reason = _REASONS[fields["reason"]]
        state = _STATES[(fields["taint"], untrusted)]
        # fromisoformat itself, not clock.parse_utc: its conversion to UTC costs more
        # than the parse, and an aware time compares and orders alike in any zone.
        moment = dt.datetime.fromisoformat(at)
    except (KeyError, TypeError, ValueError):
        return None
    if moment.tzinfo is None:
        return None
    return RecordedDecision(
        seq, moment, call, session, tool, arguments, verdict, reason, grant, state
    )
