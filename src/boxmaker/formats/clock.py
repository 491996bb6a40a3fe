"""Wall-clock time for records and displays: records in UTC, ISO 8601, milliseconds,
``Z``; what bxctl shows a person in the local zone, with "in 4m 59s" (:func:`local_time`).

Deadlines never use this module; they use ``trio.current_time()``.
"""

from __future__ import annotations

import datetime as dt


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def format_utc(moment: dt.datetime) -> str:
    """Render an aware datetime the way records carry it.

    >>> format_utc(dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC))
    '2026-01-02T03:04:05.678Z'
    """
    return (
        moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.")
        + f"{moment.microsecond // 1000:03d}Z"
    )


def parse_utc(text: str) -> dt.datetime:
    """Read back what :func:`format_utc` wrote (and any ISO 8601 with an offset).

    >>> parse_utc("2026-01-02T03:04:05.678Z")
    datetime.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=datetime.timezone.utc)
    """
    moment = dt.datetime.fromisoformat(text)
    if moment.tzinfo is None:
        raise ValueError(f"time without a zone: {text!r}")
    return moment.astimezone(dt.UTC)


def span(seconds: float) -> str:
    """A duration as a person reads it, whole seconds.

    >>> span(299.9), span(3725), span(7), span(0.2)
    ('4m 59s', '1h 02m 05s', '7s', '0s')
    """
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m {secs:02d}s"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


def relative(moment: dt.datetime, now: dt.datetime) -> str:
    """How far ``moment`` is from ``now``: "in 4m 59s", "2m 10s ago", "now".

    >>> now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    >>> relative(now + dt.timedelta(seconds=299.4), now)
    'in 4m 59s'
    >>> relative(now - dt.timedelta(seconds=130), now)
    '2m 10s ago'
    >>> relative(now + dt.timedelta(seconds=0.4), now)
    'now'
    """
    seconds = (moment - now).total_seconds()
    if abs(seconds) < 1:
        return "now"
    return f"in {span(seconds)}" if seconds > 0 else f"{span(-seconds)} ago"


def local_time(moment: dt.datetime, now: dt.datetime) -> str:
    """``moment`` in the owner's local zone (the process's TZ), with the distance from
    ``now``: "14:03:12 (in 4m 59s)". A moment on another local day than ``now`` gets
    its date: "2026-01-02 14:03:12 (1h 02m 05s ago)". Every time bxctl shows a person
    goes through here (the records keep UTC: :func:`format_utc`).

    >>> now = dt.datetime(2026, 1, 1, 12, tzinfo=dt.UTC)
    >>> local_time(now + dt.timedelta(seconds=299), now).endswith(":59 (in 4m 59s)")
    True
    """
    local = moment.astimezone()
    shown = local.strftime("%H:%M:%S")
    if local.date() != now.astimezone().date():
        shown = local.strftime("%Y-%m-%d %H:%M:%S")
    return f"{shown} ({relative(moment, now)})"
