"""``bxctl grants what-if CANDIDATE.toml``: every recorded decision decided again against
a candidate grants file, and the calls whose verdict would change, grouped by grant
(the one that decided then → the candidate's that would decide now); and the
candidate's grants that would never have matched a recorded call.

The replay itself is :class:`boxmaker.core.replay.Replay` (the broker's own decide(), at
each record's time); this module reads the candidate and the ledger and prints. The
ledger is read streaming, by the ledger reader's fast path (:meth:`boxmaker.ledger.
reader.LedgerReader.decisions`); the candidate as brokerd reads grants.toml: a regular
file only, never through a link at its own name, never a FIFO that would block, and at
most :data:`MAX_CANDIDATE_BYTES`.
What the ledger and the candidate say (the model's arguments, ids) is shown through
``printable``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import gc
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Final

import attrs
import orjson

from boxmaker.cli.common import DEFAULT, Common, Exit, fail, print_json
from boxmaker.core.durations import parse_duration
from boxmaker.core.grant_parse import GrantsProblem, all_problems, parse_grants, parse_toml
from boxmaker.core.grants import Grant, GrantSet
from boxmaker.core.replay import Flip, Replay
from boxmaker.core.vocabulary import record_time
from boxmaker.formats.clock import format_utc, utc_now
from boxmaker.formats.printable import printable
from boxmaker.home.regular_file import read_regular_file
from boxmaker.ledger.reader import LedgerReader
from boxmaker.ledger.segments import SegmentProblem, ledger_files, ledger_lines

MAX_CANDIDATE_BYTES: Final = 1024 * 1024
"""A grants file is a few KiB; a larger candidate is refused rather than parsed."""
DEFAULT_LIMIT: Final = 20


def parse_since(text: str, now: dt.datetime) -> dt.datetime:
    """``--since``: a time (ISO 8601; without an offset, the owner's local time; a
    date alone is its midnight) or a duration back from ``now`` (``90m``, ``2h``,
    ``7d``, ``1w``). Raises ValueError.

    >>> now = dt.datetime(2026, 1, 2, 12, 0, tzinfo=dt.UTC)
    >>> parse_since("2h", now).isoformat()
    '2026-01-02T10:00:00+00:00'
    >>> parse_since("2026-01-01T00:00:00Z", now).isoformat()
    '2026-01-01T00:00:00+00:00'
    >>> parse_since("yesterday", now)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: --since takes a time (...) or a duration back from now (...), not 'yesterday'
    """
    try:
        return now - parse_duration(text)
    except ValueError:
        pass
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            "--since takes a time (2026-01-02T14:00:00Z, 2026-01-02) or a duration back "
            f"from now (90m, 2h, 7d), not {text!r}"
        ) from None
    # Without an offset it is the owner's local time, as every time bxctl shows.
    return moment.astimezone(dt.UTC)


class CandidateUnreadable(Exception):
    """The candidate file could not be read: why, in words."""


def read_candidate(path: Path) -> str:
    """The candidate's text. Raises :class:`CandidateUnreadable`."""
    try:
        data = read_regular_file(path, limit=MAX_CANDIDATE_BYTES)
    except OSError as exc:
        raise CandidateUnreadable(f"{path}: {exc.strerror or exc}") from None
    if len(data) > MAX_CANDIDATE_BYTES:
        raise CandidateUnreadable(f"{path}: over {MAX_CANDIDATE_BYTES} bytes, not a grants file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise CandidateUnreadable(f"{path}: not UTF-8") from None


def candidate_problems(text: str, file: str) -> list[GrantsProblem]:
    """Every problem of a candidate that does not parse, as ``bxctl grants check``
    finds them (none when it parses)."""
    document = parse_toml(text, file)
    if isinstance(document, GrantsProblem):
        return [document]
    checked = all_problems(document, file)
    return [] if isinstance(checked, GrantSet) else list(checked)


@attrs.define
class Group:
    """The flips of one (grant then, grant now) pair: the first ``limit`` kept."""

    then: str | None
    now: str | None
    count: int = 0
    flips: list[Flip] = attrs.field(factory=list)


def group_flips(flips: Iterable[Flip], limit: int) -> list[Group]:
    """Flips grouped by (grant then, grant now), the largest group first (then the
    one whose first flip is oldest); each keeps at most ``limit`` flips (0: all)."""
    groups: dict[tuple[str | None, str | None], Group] = {}
    for flip in flips:
        key = (flip.recorded.body.grant, flip.now.grant)
        group = groups.get(key)
        if group is None:
            group = groups[key] = Group(*key)
        group.count += 1
        if not limit or len(group.flips) < limit:
            group.flips.append(flip)
    return sorted(groups.values(), key=lambda g: (-g.count, g.flips[0].recorded.seq))


def _flip_json(flip: Flip) -> dict[str, Any]:
    recorded, then, now = flip.recorded, flip.recorded.body, flip.now
    return {
        "seq": recorded.seq,
        "at": format_utc(record_time(recorded.at)),
        "call": then.call,
        "session": then.session,
        "tool": then.tool,
        "arguments": then.arguments,
        "taint": then.taint,
        "untrusted": then.untrusted,
        "then": {"verdict": then.verdict, "reason": then.reason, "grant": then.grant},
        "now": {
            "verdict": now.verdict,
            "reason": now.reason,
            "grant": now.grant,
            "detail": now.detail,
        },
    }


def _grant_json(grant: Grant) -> dict[str, Any]:
    return {"id": grant.id, "tool": grant.tool, "mode": grant.mode}


def _grant_words(grant_id: str | None) -> str:
    return "no grant" if grant_id is None else grant_id


def _count(count: int, thing: str) -> str:
    """ "1 call", "2 calls"."""
    return f"{count} {thing}" if count == 1 else f"{count} {thing}s"


def _verdict_words(verdict: str, reason: str | None) -> str:
    """ "run", "deny (taint_exceeded)"."""
    return verdict if reason is None else f"{verdict} ({reason})"


def _flip_line(flip: Flip) -> str:
    then, now = flip.recorded.body, flip.now
    change = f"{_verdict_words(then.verdict, then.reason)} → "
    change += _verdict_words(now.verdict, now.reason)
    when = record_time(flip.recorded.at).astimezone().strftime("%Y-%m-%d %H:%M:%S")
    arguments = orjson.dumps(then.arguments, option=orjson.OPT_SORT_KEYS).decode()
    return printable(f"  {change}  {when}  {then.call}  {then.session}  {then.tool} {arguments}")


def _skipped_lines(replay: Replay, malformed: int) -> list[str]:
    lines = []
    not_by_grants = sum(replay.not_by_grants.values())
    if not_by_grants:
        reasons = ", ".join(f"{r} {n}" for r, n in sorted(replay.not_by_grants.items()))
        lines.append(f"skipped {_count(not_by_grants, 'decision')} not made by grants ({reasons})")
    if replay.unreplayable:
        lines.append(f"skipped {replay.unreplayable} decisions whose arguments no longer check")
    if malformed:
        lines.append(
            f"skipped {_count(malformed, 'malformed ledger line')} (bxctl audit verify says more)"
        )
    return lines


def _print_text(header: str, replay: Replay, groups: list[Group], malformed: int) -> None:
    lines = [header]
    lines.append(
        f"replayed {_count(replay.replayed, 'decision')}: {replay.flips} would change, "
        f"{replay.unchanged} would not"
    )
    lines += _skipped_lines(replay, malformed)
    for group in groups:
        lines.append("")
        then, now = _grant_words(group.then), _grant_words(group.now)
        lines.append(printable(f"{then} → {now}: {_count(group.count, 'call')}"))
        lines += [_flip_line(flip) for flip in group.flips]
        if group.count > len(group.flips):
            more = group.count - len(group.flips)
            lines.append(f"  … and {more} more (--limit 0 shows them all)")
    never = replay.never_matched()
    if never:
        lines.append("")
        lines.append("candidate grants that would never have matched a recorded call:")
        lines += [printable(f"  {g.id}: {g.tool} {g.mode}") for g in never]
    shadowed = replay.never_deciding()
    if shadowed:
        lines.append("")
        lines.append("candidate grants that matched calls but never decided one (a grant")
        lines.append("above them in precedence always did):")
        lines += [printable(f"  {g.id}: {g.tool} {g.mode}") for g in shadowed]
    print("\n".join(lines))


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off for the replay: it makes no cycles, and the
    collector's passes over the caches' many objects cost a fifth of the time
    (tools/bench_what_if.py). Everything is still freed by reference counting."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def what_if(
    candidate: Path,
    /,
    *,
    since: str | None = None,
    session: str | None = None,
    fail_on_change: bool = False,
    limit: int = DEFAULT_LIMIT,
    common: Common = DEFAULT,
) -> Exit:
    """Which recorded calls a candidate grants file would decide otherwise.

    Every recorded decision is decided again with the same decide() brokerd uses, at
    its own time and on the taint and trust it saw; the calls whose verdict would
    change are printed grouped by grant (the one that decided then → the candidate's
    that would decide now), then the candidate's grants that would never have matched
    a recorded call.

    Exit 0 (1 with --fail-on-change when a verdict would change), 2 when the
    candidate does not parse (every problem is printed) or cannot be read.

    Parameters
    ----------
    candidate
        The candidate grants file (grants.toml's format).
    since
        Only decisions from this time on: 2026-01-02T14:00:00Z, 2026-01-02 (local
        midnight), or a duration back from now (90m, 2h, 7d).
    session
        Only this session's decisions (s-…).
    fail_on_change
        Exit 1 when any verdict would change (for a check before installing it).
    limit
        Show at most this many calls per group (0: all); the counts are always whole.
    """
    if limit < 0:
        return fail("--limit takes a number of calls, 0 (all) or more", Exit.USAGE)
    now = utc_now()
    try:
        since_at = parse_since(since, now) if since is not None else None
    except ValueError as exc:
        return fail(str(exc), Exit.USAGE)
    try:
        text = read_candidate(candidate)
    except CandidateUnreadable as exc:
        return fail(str(exc), Exit.USAGE)
    grants = parse_grants(text, str(candidate))
    if isinstance(grants, GrantsProblem):
        problems = candidate_problems(text, str(candidate)) or [grants]
        if common.json:
            print_json(
                {
                    "valid": False,
                    "candidate": str(candidate),
                    "problems": [
                        {"grant": p.grant_id, "key": p.key, "problem": p.message} for p in problems
                    ],
                }
            )
        else:
            print(f"the candidate does not parse ({len(problems)} problem(s)):")
            for problem in problems:
                print(printable(f"  {problem.describe()}"))
        return Exit.USAGE
    path = common.resolve().audit_log
    replay = Replay(grants)
    try:
        reader = LedgerReader(ledger_lines(ledger_files(path.parent)))
        with _collector_paused():
            groups = group_flips(
                replay.run(reader.decisions(since=since_at, session=session)), limit
            )
    except OSError as exc:
        return fail(f"{path}: {exc.strerror}", Exit.USAGE)
    except SegmentProblem as exc:
        return fail(f"{path.parent}: {exc}", Exit.USAGE)
    if common.json:
        print_json(
            {
                "valid": True,
                "candidate": str(candidate),
                "ledger": str(path),
                "since": None if since_at is None else format_utc(since_at),
                "session": session,
                "replayed": replay.replayed,
                "changed": replay.flips,
                "unchanged": replay.unchanged,
                "skipped": {
                    "not_by_grants": dict(sorted(replay.not_by_grants.items())),
                    "unreplayable": replay.unreplayable,
                    "malformed": reader.malformed,
                },
                "groups": [
                    {
                        "then": group.then,
                        "now": group.now,
                        "count": group.count,
                        "calls": [_flip_json(flip) for flip in group.flips],
                        "left_out": group.count - len(group.flips),
                    }
                    for group in groups
                ],
                "never_matched": [_grant_json(g) for g in replay.never_matched()],
                "never_deciding": [_grant_json(g) for g in replay.never_deciding()],
            }
        )
    else:
        header = f"what-if {candidate} ({len(grants.grants)} grants) against {path}"
        if since_at is not None:
            header += f", since {since_at.astimezone().strftime('%Y-%m-%d %H:%M:%S')}"
        if session is not None:
            header += f", session {session}"
        _print_text(printable(header), replay, groups, reader.malformed)
    changed = replay.flips > 0
    return Exit.FAILED if fail_on_change and changed else Exit.DONE
