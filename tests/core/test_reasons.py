"""Reason codes and their words (core/reasons.py): one table, every code in it."""

from __future__ import annotations

import pytest

from boxmaker.core.reasons import REASON_WORDS, Reason, reason_words


def test_every_reason_code_has_words_and_every_word_is_for_a_code() -> None:
    assert set(REASON_WORDS) == set(Reason)
    assert all(type(code) is Reason for code in REASON_WORDS)
    assert all(words and words == words.strip() for words in REASON_WORDS.values())


def test_no_two_codes_share_their_words() -> None:
    assert len(set(REASON_WORDS.values())) == len(REASON_WORDS)


@pytest.mark.parametrize("code", list(Reason))
def test_the_words_are_found_by_the_code_as_records_carry_it(code: Reason) -> None:
    assert reason_words(code.value) == REASON_WORDS[code]
    assert reason_words(code) == REASON_WORDS[code]


@pytest.mark.parametrize("text", ["not today", "NO_GRANT", "", None, 7, ["no_grant"]])
def test_text_that_is_no_reason_code_has_no_words(text: object) -> None:
    assert reason_words(text) is None
