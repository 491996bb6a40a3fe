"""Durations as the owner types them: ``30m``, ``2h``, ``1d12h`` (``bxctl approve
--for``, ``bxctl grants what-if --since``)."""

from __future__ import annotations

import datetime as dt
import re
from typing import Final

_PART: Final = re.compile(r"([0-9]{1,9})([smhdw])")
_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
EXPECTED: Final = "expected a duration such as 30m, 2h, 7d (units s, m, h, d, w)"
MAX_SECONDS: Final = 100 * 366 * 86400
"""A century: far beyond any use, and well inside what ``datetime`` can hold."""


def parse_duration(text: str) -> dt.timedelta:
    """One or more NUMBER+UNIT, longer than 0 s. Raises ValueError saying what is
    expected.

    >>> parse_duration("30m"), parse_duration("1d12h")
    (datetime.timedelta(seconds=1800), datetime.timedelta(days=1, seconds=43200))
    >>> parse_duration("2 hours")
    Traceback (most recent call last):
    ...
    ValueError: '2 hours': expected a duration such as 30m, 2h, 7d (units s, m, h, d, w)
    >>> parse_duration("0s")
    Traceback (most recent call last):
    ...
    ValueError: a duration must be longer than 0 s
    """
    if not text or _PART.sub("", text) != "":
        raise ValueError(f"{text[:40]!r}: {EXPECTED}")
    seconds = sum(int(number) * _UNITS[unit] for number, unit in _PART.findall(text))
    if seconds <= 0:
        raise ValueError("a duration must be longer than 0 s")
    if seconds > MAX_SECONDS:
        raise ValueError(f"{text[:40]!r}: longer than {MAX_SECONDS // 86400} days")
    return dt.timedelta(seconds=seconds)
