"""Durations as the owner types them (core/durations.py): NUMBER+UNIT, longer than 0 s."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from boxmaker.core.durations import EXPECTED, MAX_SECONDS, parse_duration

UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1s", 1), ("45s", 45), ("30m", 1800), ("2h", 7200), ("7d", 604800), ("1w", 604800)],
)
def test_each_unit_counts_its_seconds(text: str, seconds: int) -> None:
    assert parse_duration(text) == dt.timedelta(seconds=seconds)


@given(
    st.lists(
        st.tuples(st.integers(0, 99_999), st.sampled_from(sorted(UNIT_SECONDS))),
        min_size=1,
        max_size=5,
    ).filter(lambda parts: 0 < sum(n * UNIT_SECONDS[u] for n, u in parts) <= MAX_SECONDS)
)
def test_parts_in_any_order_add_up(parts: list[tuple[int, str]]) -> None:
    text = "".join(f"{number}{unit}" for number, unit in parts)
    seconds = sum(number * UNIT_SECONDS[unit] for number, unit in parts)
    assert parse_duration(text) == dt.timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["0s", "0m", "0h0d", "00w"])
def test_a_duration_of_nothing_is_refused_with_its_own_message(text: str) -> None:
    with pytest.raises(ValueError, match=r"^a duration must be longer than 0 s$"):
        parse_duration(text)


@pytest.mark.parametrize(
    "text", ["", "2", "h", "2x", "-1h", "1.5h", "2h ", "2 hours", "1H", "1234567890s"]
)
def test_what_is_not_a_duration_is_refused_saying_what_is_expected(text: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(repr(text))}: ") as raised:
        parse_duration(text)
    assert str(raised.value) == f"{text!r}: {EXPECTED}"


def test_the_refusal_quotes_only_the_first_40_characters_of_a_long_text() -> None:
    text = "1h" * 10 + "x" * 30
    with pytest.raises(ValueError, match=r"^'1h") as raised:
        parse_duration(text)
    assert str(raised.value) == f"{text[:40]!r}: {EXPECTED}"
    assert str(raised.value).startswith("'1h1h1h1h1h1h1h1h1h1hxxxxxxxxxxxxxxxxxxxx': ")


def test_a_duration_beyond_a_century_is_refused_not_an_overflow() -> None:
    assert parse_duration("36600d") == dt.timedelta(days=36600)
    with pytest.raises(ValueError, match=r"^'36601d': longer than 36600 days$"):
        parse_duration("36601d")
    with pytest.raises(ValueError, match="longer than 36600 days"):
        parse_duration("999999999w")
