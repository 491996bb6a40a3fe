"""``printable``: what outside text may and may not do on a terminal and in a log."""

from __future__ import annotations

import io
import logging
import sys
import unicodedata

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from boxmaker.formats.printable import (
    PrintableFormatter,
    PrintableStream,
    printable,
    printable_exactly,
)

UNSAFE = {"Cc", "Cf", "Cs", "Zl", "Zp"}
# One of each kind the escaping is for, and one above U+FFFF (a tag character).
HOSTILE = (
    "\x1b[2J\x07\x7f\x85\x9b\u202a\u202e\u2066\u2069\u200e\u200f\u061c"
    "\u200b\u200d\u2060\ufeff\u2028\u2029\U000e0041"
)


def unsafe(text: str, keep: str = "") -> list[str]:
    return [c for c in text if c not in keep and unicodedata.category(c) in UNSAFE]


def test_every_kind_is_escaped_readably() -> None:
    shown = printable(HOSTILE)
    assert unsafe(shown) == []
    assert shown == (
        "\\u001b[2J\\u0007\\u007f\\u0085\\u009b\\u202a\\u202e\\u2066\\u2069\\u200e\\u200f"
        "\\u061c\\u200b\\u200d\\u2060\\ufeff\\u2028\\u2029\\udb40\\udc41"
    )


def test_lines_keep_newlines_and_tabs_only() -> None:
    assert printable("a\n\tb\r\x0bc\x0c", lines=True) == "a\n\tb\\u000d\\u000bc\\u000c"
    assert printable("a\n\tb") == "a\\u000a\\u0009b"


def test_ordinary_text_is_unchanged() -> None:
    text = 'C:\\path "quoted" — café 猫 🐈 \\u202e typed'
    assert printable(text) == text


@given(st.recursive(st.text(), lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner)))
def test_json_stays_the_same_json(value: object) -> None:
    text = orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()
    shown = printable(text, lines=True)
    assert unsafe(shown, keep="\n") == []
    assert orjson.loads(shown) == value


@given(st.text())
def test_no_unsafe_character_survives(text: str) -> None:
    assert unsafe(printable(text)) == []
    assert unsafe(printable(text, lines=True), keep="\n\t") == []


@given(st.text(), st.text())
def test_the_exact_form_is_printable_ascii_and_never_the_same_for_two_texts(
    first: str, second: str
) -> None:
    shown = printable_exactly(first)
    assert all(" " <= char <= "~" for char in shown)
    # Read back: the form is one-to-one (JSON's string escapes, a backslash doubled).
    assert orjson.loads(f'"{shown.replace(chr(34), chr(92) + chr(34))}"') == first
    assert (printable_exactly(second) == shown) is (first == second)


def test_the_exact_form_escapes_what_printable_leaves() -> None:
    assert printable_exactly("\\u00a0 \u00a0 \u0430 é\t") == (
        "\\\\u00a0 \\u00a0 \\u0430 \\u00e9\\u0009"
    )
    assert printable_exactly("\U0001f408") == "\\ud83d\\udc08"


def test_a_log_record_is_one_line_and_a_traceback_cannot_pass_for_one() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(PrintableFormatter("%(levelname)s %(message)s"))
    log = logging.getLogger("tests.printable")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning("tool=%s", "x\x1b[2J\nINFO forged")
        try:
            raise ValueError("bad\nINFO forged\u202e")
        except ValueError:
            log.exception("failed")
    finally:
        log.removeHandler(handler)
    lines = out.getvalue().splitlines()
    assert lines[0] == "WARNING tool=x\\u001b[2J\\u000aINFO forged"
    assert lines[1] == "ERROR failed"
    assert all(line.startswith("  ") for line in lines[2:])
    assert "  INFO forged\\u202e" in lines
    assert unsafe(out.getvalue(), keep="\n") == []


def test_the_stream_escapes_each_write_and_is_a_terminal_when_its_stream_is(
    capsys: pytest.CaptureFixture[str],
) -> None:
    stream = PrintableStream(sys.stdout)
    print("ok \x1b]2;title\x07\nnext", file=stream)
    assert capsys.readouterr().out == "ok \\u001b]2;title\\u0007\nnext\n"
    assert stream.isatty() is sys.stdout.isatty()
