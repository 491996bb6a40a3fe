"""Wall-clock time for records and displays : UTC, ISO 8601, milliseconds, ``Z``.

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
