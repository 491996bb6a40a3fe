"""The repetition guard (loop/runaway.py): a tail that repeats is cut at its first
repeat, text that does not repeat is never cut, and the cut depends on the text alone,
not on how the stream split it."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from boxmaker.loop.runaway import MAX_UNIT, MIN_SPAN, Cut, RepetitionGuard, find_cut, span_needed

LETTERS = "ab<>/ \n"
SMALL = st.builds(
    lambda before, unit, times, after: before + unit * times + after,
    st.text(alphabet=LETTERS, max_size=100),
    st.text(alphabet=LETTERS, min_size=1, max_size=12),
    st.integers(min_value=0, max_value=40),
    st.text(alphabet=LETTERS, max_size=60),
)
"""Few letters, and a unit written some number of times: texts with a loop, just short
of one, and without one all come."""
WORDS = st.text(max_size=200)


def first_loop(text: str) -> Cut | None:
    """The rule read plainly: at the first character where some tail of the text so far
    repeats a unit of at most MAX_UNIT characters for span_needed(unit) characters (the
    shortest such unit), the whole run of that unit ending there; keep it up to the end
    of the unit's first occurrence."""
    for end in range(1, len(text) + 1):
        for unit in range(1, min(MAX_UNIT, end - 1) + 1):
            span = span_needed(unit)
            if span > end:
                continue
            tail = text[end - span : end]
            if tail[unit:] != tail[:-unit]:
                continue
            start = end - span
            while start > 0 and text[start - 1] == text[start - 1 + unit]:
                start -= 1
            return Cut(keep=start + unit, unit=text[start : start + unit])
    return None


def pieces(text: str, cuts: list[int]) -> list[str]:
    bounds = sorted({0, len(text), *(min(cut, len(text)) for cut in cuts)})
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


@given(SMALL)
def test_the_guard_cuts_exactly_where_the_rule_says(text: str) -> None:
    assert find_cut(text) == first_loop(text)


@given(WORDS, st.text(min_size=1, max_size=40), st.integers(min_value=0, max_value=50))
def test_a_tail_that_repeats_is_cut_at_its_first_repeat(before: str, unit: str, extra: int) -> None:
    repeats = -(-span_needed(len(unit)) // len(unit)) + extra
    text = before + unit * repeats
    cut = find_cut(text)
    assert cut is not None
    # Kept: no more than the text before the loop and the unit once; the kept text
    # ends in the unit, and what is cut off starts with the unit again (its repeat).
    assert cut.keep <= len(before) + len(unit)
    size = len(cut.unit)
    assert text[cut.keep - size : cut.keep + size] == cut.unit * 2


@given(st.lists(st.sampled_from(["alpha ", "beta ", "gamma\n", "delta, ", "<tag> "]), max_size=60))
def test_text_whose_words_never_run_four_times_is_never_cut(words: list[str]) -> None:
    # No word right after itself, and no two-word pair twice in a row, and so on: the
    # sequence never repeats a stretch, so the text has no run to cut.
    kept: list[str] = []
    for word in words:
        candidate = [*kept, word]
        if not any(
            candidate[-2 * size :][:size] == candidate[-size:]
            for size in range(1, len(candidate) // 2 + 1)
        ):
            kept = candidate
    text = "".join(kept)
    assert find_cut(text) is None


@given(SMALL, st.lists(st.integers(min_value=0, max_value=300), max_size=20))
def test_the_cut_does_not_depend_on_how_the_stream_split_the_text(
    text: str, cuts: list[int]
) -> None:
    guard = RepetitionGuard()
    results = [guard.feed(piece) for piece in pieces(text, cuts)]
    fired = [result for result in results if result is not None]
    assert (fired[0] if fired else None) == find_cut(text)
    # Once cut, always the same cut.
    assert all(result == fired[0] for result in fired)


def test_a_run_just_short_of_the_span_is_not_cut_and_one_character_more_is() -> None:
    assert find_cut("x" + "-" * (MIN_SPAN - 1)) is None
    assert find_cut("x" + "-" * MIN_SPAN) == Cut(keep=2, unit="-")
    # A long unit needs four whole rounds.
    unit = "".join(chr(0x4E00 + index) for index in range(MAX_UNIT))
    assert find_cut(unit * 3 + unit[:-1]) is None
    assert find_cut(unit * 4) == Cut(keep=MAX_UNIT, unit=unit)
    # A unit one longer than MAX_UNIT is never a loop here.
    longer = unit + "!"
    assert find_cut(longer * 6) is None


def test_the_loops_the_built_in_model_wrote_are_cut() -> None:
    # Replies seen after a grants_invalid denial and a not_found failure.
    assert find_cut("I could not read it.\n" + "<error>" * 100) == Cut(
        keep=len("I could not read it.\n<error>"), unit="<error>"
    )
    phrase = "The file does not exist. "
    cut = find_cut("Sorry!\n" + phrase * 10)
    assert cut == Cut(keep=len("Sorry!\n" + phrase), unit=phrase)
    # A plain reply, a table rule and a short laugh are left alone.
    assert find_cut("| a | b |\n|" + "-" * 80 + "|\n| 1 | 2 |\nha ha ha ha.") is None
