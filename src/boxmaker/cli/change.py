r"""How the owner reads a write's change: the lines of brokerd's preview
(:mod:`boxmaker.broker.preview`), with every byte change visible. One function for
every screen that shows them (``bxctl approvals``, ``--watch``, the chat's prompt: all
through :func:`boxmaker.cli.owner.approval_block`); ``--json`` carries the lines as
brokerd sent them.

A diff hides what a terminal does not draw. On top of
:func:`~boxmaker.formats.printable.printable` (controls, ``\r`` and NUL among them, tabs,
format characters such as zero-width and bidi controls, separators), a line of the
change shows escaped, as ``\u`` and four hex digits (``\u00a0``):

- spaces other than U+0020 (no-break, en, ideographic …), private-use and unassigned
  characters, and the invisible characters Unicode says to ignore that are not format
  characters (variation selectors, Hangul fillers, the combining grapheme joiner, the
  blank braille pattern);
- its trailing spaces and tabs.

Two changed lines that differ but would still be shown the same (an escape typed as
text, ``\u00a0``, and the character it names) are both shown with every character but
printable ASCII escaped and each backslash doubled
(:func:`~boxmaker.formats.printable.printable_exactly`), a form that is never the same for two
texts. A file's missing final newline is diff's own note, which brokerd adds. A
look-alike letter of another script (Cyrillic U+0430 for Latin ``a``) is shown as it is:
its line shows as changed, not how (docs/threat-model.md says so).
"""

from __future__ import annotations

import re
import unicodedata
from typing import Final

from boxmaker.formats.printable import printable, printable_exactly

HIDDEN_CATEGORIES: Final = frozenset({"Zs", "Co", "Cn"})
"""Space separators (U+0020 aside), private use, unassigned."""
_IGNORABLE: Final = re.compile(
    "[\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180f\u2800\u3164\ufe00-\ufe0f\uffa0"
    "\U000e0100-\U000e01ef]"
)
"""Default-ignorable characters that are not format characters (``Cf``, which
:func:`printable` escapes already), and the blank braille pattern."""
_NOT_ASCII: Final = re.compile(r"[^\x00-\x7f]")
_TRAILING: Final = re.compile(r"[ \t]+$")


def _hidden(char: str) -> bool:
    return unicodedata.category(char) in HIDDEN_CATEGORIES or bool(_IGNORABLE.match(char))


def _visible(text: str) -> str:
    shown = printable(text)
    return _NOT_ASCII.sub(
        lambda match: printable_exactly(match.group()) if _hidden(match.group()) else match.group(),
        shown,
    )


def _content(text: str, *, exact: bool) -> str:
    r"""A line's text after its diff prefix, as shown; its trailing spaces and tabs
    escaped (``\u0020``, ``\u0009``) so that they show."""
    trailing = _TRAILING.search(text)
    body = text if trailing is None else text[: trailing.start()]
    tail = "" if trailing is None else "".join(f"\\u{ord(c):04x}" for c in trailing.group())
    return (printable_exactly(body) if exact else _visible(body)) + tail


def _is_content(index: int, line: str, diff: bool) -> bool:
    """A line of the file's text (`` ``, ``-``, ``+`` and the text), not a diff's own
    header, ``@@`` line or note."""
    if diff and index < 2:
        return False
    return line.startswith((" ", "-", "+"))


def change_lines(lines: list[str]) -> list[str]:
    r"""The preview's ``lines`` as the owner reads them (the module docstring says how).

    >>> change_lines(["+a\r", "+tab\t", "+no\u00a0break", "\\ No newline at end of file"])
    ['+a\\u000d', '+tab\\u0009', '+no\\u00a0break', '\\ No newline at end of file']
    >>> change_lines(["--- f (now)", "+++ f (written)", "@@ -1 +1 @@", "-a\\u00a0", "+a\u00a0"])
    ['--- f (now)', '+++ f (written)', '@@ -1 +1 @@', '-a\\\\u00a0', '+a\\u00a0']
    """
    diff = bool(lines) and lines[0].startswith("--- ")
    content = [i for i, line in enumerate(lines) if _is_content(i, line, diff)]
    changed = [i for i in content if lines[i][0] != " "]
    exact: set[int] = set()
    while True:
        shown = {i: _content(lines[i][1:], exact=i in exact) for i in content}
        texts: dict[str, set[str]] = {}
        for i in changed:
            texts.setdefault(shown[i], set()).add(lines[i][1:])
        # Differing lines shown the same: shown exactly (never the same), until none are.
        alike = {i for i in changed if len(texts[shown[i]]) > 1} - exact
        if not alike:
            return [
                lines[i][0] + shown[i] if i in shown else printable(line)
                for i, line in enumerate(lines)
            ]
        exact |= alike
