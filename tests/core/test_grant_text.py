"""The text of one grant cut out of a grants.toml (core/grant_text.py): exact, or none."""

from __future__ import annotations

import tomllib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from boxmaker.core.grant_text import grant_text

FILE = """\
# My grants.
[[grant]]
id = "read-notes"   # the notes
tool = "read_file"
mode = "auto"
note = \"\"\"
[[grant]]
id = "fake"
\"\"\"

# Shell, with care.
[[grant]]
id = "git"
tool = "shell"
mode = "ask"
commands = ["git status", 'echo "[x]"']
note = "a \\"quoted\\" [[grant]] # not a comment"
"""


def test_each_grant_is_cut_at_the_next_real_header_and_keeps_its_comments() -> None:
    assert grant_text(FILE, "read-notes") == (
        '[[grant]]\nid = "read-notes"   # the notes\ntool = "read_file"\nmode = "auto"\n'
        'note = """\n[[grant]]\nid = "fake"\n"""'
    )
    assert grant_text(FILE, "git") == (
        '[[grant]]\nid = "git"\ntool = "shell"\nmode = "ask"\n'
        'commands = ["git status", \'echo "[x]"\']\n'
        'note = "a \\"quoted\\" [[grant]] # not a comment"'
    )


@pytest.mark.parametrize("grant_id", ["fake", "nope"])
def test_a_grant_that_is_not_in_the_file_has_no_text(grant_id: str) -> None:
    assert grant_text(FILE, grant_id) is None


def test_a_file_that_is_not_toml_has_no_text() -> None:
    assert grant_text('[[grant]]\nid = "a"\nid = "a"\n', "a") is None


def test_a_cut_that_would_be_wrong_gives_none_not_a_wrong_text() -> None:
    # A literal multi-line string ending in quotes of its own, then a header-like line
    # inside a second one: whatever the cut, it is checked against the whole file.
    text = "[[grant]]\nid = 'a'\nnote = '''x''''' \n[[grant]]\nid = 'b'\nnote = '''\n[y]\n'''\n"
    assert tomllib.loads(text)["grant"][1]["note"] == "[y]\n"
    assert grant_text(text, "a") == "[[grant]]\nid = 'a'\nnote = '''x''''' "
    assert grant_text(text, "b") == "[[grant]]\nid = 'b'\nnote = '''\n[y]\n'''"


NOTE_TEXT = st.text(
    st.sampled_from(list("ab[]#\"'\\ \n=")) | st.characters(codec="utf-8"), max_size=30
)


@given(st.lists(NOTE_TEXT, min_size=1, max_size=4))
def test_any_note_a_grant_can_have_gives_back_exactly_that_grant(notes: list[str]) -> None:
    """Notes written as TOML would write them (basic strings, escaped): the text cut
    out, parsed alone, is the grant the whole file has."""
    tables = []
    for index, note in enumerate(notes):
        quoted = '"' + "".join(_escape(char) for char in note) + '"'
        tables.append(f'[[grant]]\nid = "g{index}"\ntool = "list_dir"\nnote = {quoted}\n')
    text = "\n".join(tables)
    whole = tomllib.loads(text)["grant"]
    for index in range(len(notes)):
        cut = grant_text(text, f"g{index}")
        assert cut is not None
        assert tomllib.loads(cut)["grant"] == [whole[index]]


def _escape(char: str) -> str:
    if char in '"\\':
        return "\\" + char
    if ord(char) < 0x20 or ord(char) == 0x7F:
        return f"\\u{ord(char):04x}"
    return char


# Lines of a grant whose strings or comments hold quotes and brackets, each a way to
# lose track of where a string ends. Whatever they hold, the next grant's header is
# still found, and the grant above it cut there.
TRICKY_LINES = [
    # Two multi-line strings on one line: the second still opens.
    'notes = ["""x""", """\n[fake]\n"""]',
    "notes = [\"\"\"x\"\"\",'''\n[fake]\n''']",
    # A multi-line literal string ending in one quote of its own.
    "notes = ['''x'''', '''\n[fake]\n''']",
    # A comment, even straight after a string: the quotes and hashes in it open nothing.
    "note = '''x''''# '''",
    "note = '''x'''#'''",
    "id2 = \"x\" # see '''",
    'id2 = \'x\' # and """',
    "id2 = 'x' # see #1, then '''",
    # Escaped quotes in basic strings; an escaped backslash before the closing quote.
    'note = "say \\"\'\'\'\\" ok"',
    'cmds = ["say \\"", "\'\'\'"]',
    'paths = ["C:\\\\", "\'\'\'"]',
    'paths = ["C:\\\\\\\\", "\'\'\'"]',
    'paths = ["a\\\\\\"", "\'\'\'"]',
    # A literal string has no escapes: its backslash ends nothing.
    "paths = ['C:\\', \"'''\"]",
    # One-line strings closed just before another string.
    'x = ["a", "b\'\'\'"]',
    "x = ['a','b\"\"\"']",
]


@pytest.mark.parametrize("lines", TRICKY_LINES)
def test_quotes_in_strings_and_comments_do_not_hide_the_next_header(lines: str) -> None:
    text = f'[[grant]]\nid = "a"\n{lines}\n[[grant]]\nid = "b"\n'
    assert [grant["id"] for grant in tomllib.loads(text)["grant"]] == ["a", "b"]
    assert grant_text(text, "a") == f'[[grant]]\nid = "a"\n{lines}'
    assert grant_text(text, "b") == '[[grant]]\nid = "b"'


def test_a_header_written_with_blanks_inside_its_brackets_still_starts_a_grant() -> None:
    text = '[[ grant ]]\nid = "a"\n\n  [[grant ]]\nid = "b"\n'
    assert grant_text(text, "a") == '[[ grant ]]\nid = "a"'
    assert grant_text(text, "b") == '  [[grant ]]\nid = "b"'


def test_other_tables_before_and_between_the_grants_are_left_out() -> None:
    text = (
        '[defaults]\nmode = "ask"\n\n[[grant]]\nid = "a"\n\n'
        '[[rule]]\nname = "r"\n\n[[grant]]\nid = "b"\n'
    )
    assert grant_text(text, "a") == '[[grant]]\nid = "a"'
    assert grant_text(text, "b") == '[[grant]]\nid = "b"'


def test_comments_and_blanks_before_the_next_header_go_to_it_indented_or_not() -> None:
    text = (
        '[[grant]]\nid = "a"\n# about a, kept\ntool = "shell"  # ask MAX\n\n'
        '   # about b, indented\n\t# and more\n\n[[grant]]\nid = "b"\n'
    )
    assert grant_text(text, "a") == (
        '[[grant]]\nid = "a"\n# about a, kept\ntool = "shell"  # ask MAX'
    )


def test_a_file_with_crlf_line_ends_gives_its_lines_without_the_last_line_end() -> None:
    text = '[[grant]]\r\nid = "a"\r\ntool = "shell"\r\n\r\n[[grant]]\r\nid = "b"\r\n'
    assert grant_text(text, "a") == '[[grant]]\r\nid = "a"\r\ntool = "shell"'
    assert grant_text(text, "b") == '[[grant]]\r\nid = "b"'
