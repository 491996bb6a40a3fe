"""The text of one ``[[grant]]`` table as a grants.toml has it: what ``bxctl why`` shows
of the grant that decided a call, from the version kept when it decided (pure).

TOML gives values, not text, so the file is cut at its table headers: a line that
starts (after blanks) with ``[`` outside a multi-line string. The cut is then checked:
the piece, parsed alone, must give exactly the table the whole file gives for that id;
otherwise (a file this cut misreads) there is no text rather than a wrong one. Blank
and comment lines just before the next header are left to it (they usually describe
the grant below them).

>>> text = '# mine\\n[[grant]]\\nid = "a"\\ntool = "list_dir"\\n\\n# b\\n[[grant]]\\nid = "b"\\n'
>>> print(grant_text(text, "a"))
[[grant]]
id = "a"
tool = "list_dir"
>>> grant_text(text, "c") is None
True
"""

from __future__ import annotations

import re
import tomllib
from typing import Any, Final

_HEADER: Final = re.compile(r"[ \t]*\[")
_DELIMITERS: Final = re.compile(r'"""|\'\'\'|"|\'|#')


def _header_lines(lines: list[str]) -> list[int]:
    """The indexes of the lines that start a table (outside multi-line strings)."""
    headers = []
    inside: str | None = None  # the delimiter of the multi-line string we are in
    for number, line in enumerate(lines):
        if inside is None and _HEADER.match(line):
            headers.append(number)
        position = 0
        while True:
            if inside is not None:
                end = _close(line, position, inside)
                if end < 0:
                    break
                position, inside = end, None
                continue
            found = _DELIMITERS.search(line, position)
            if found is None or found.group() == "#":
                break
            delimiter = found.group()
            if len(delimiter) == 3:
                position, inside = found.end(), delimiter
                continue
            end = _close(line, found.end(), delimiter)
            if end < 0:
                break  # an unclosed one-line string: TOML's error, not ours
            position = end
    return headers


def _close(line: str, start: int, delimiter: str) -> int:
    """Where the string opened by ``delimiter`` ends on this line (after the closing
    delimiter), or -1. Basic strings (``"``) have backslash escapes."""
    position = start
    while True:
        end = line.find(delimiter, position)
        if end < 0:
            return -1
        if delimiter[0] == '"':
            backslashes = len(line[:end]) - len(line[:end].rstrip("\\"))
            if backslashes % 2:
                position = end + 1
                continue
        # A multi-line string may end with up to two more quotes of its own kind.
        stop = end + len(delimiter)
        while len(delimiter) == 3 and line[stop : stop + 1] == delimiter[0] and stop < end + 5:
            stop += 1
        return stop


def _grant_table(text: str, grant_id: str) -> dict[str, Any] | None:
    try:
        document = tomllib.loads(text)
    except (ValueError, RecursionError):
        return None
    grants = document.get("grant")
    if not isinstance(grants, list):
        return None
    for table in grants:
        if isinstance(table, dict) and table.get("id") == grant_id:
            return table
    return None


def grant_text(text: str, grant_id: str) -> str | None:
    """The ``[[grant]]`` table with this id, as written (no trailing newline); None when
    the file has no such grant, or its text cannot be cut out exactly."""
    wanted = _grant_table(text, grant_id)
    if wanted is None:
        return None
    # TOML's line ends only ("\n", "\r\n"): splitlines() would also cut at U+0085,
    # U+2028 and others, which a string may hold.
    lines = text.split("\n")
    headers = _header_lines(lines)
    for index, start in enumerate(headers):
        if not lines[start].strip().replace(" ", "").startswith("[[grant]]"):
            continue
        end = headers[index + 1] if index + 1 < len(headers) else len(lines)
        piece = lines[start:end]
        while len(piece) > 1 and (not piece[-1].strip() or piece[-1].lstrip().startswith("#")):
            piece.pop()
        candidate = "\n".join(piece).rstrip("\r")
        if _grant_table(candidate, grant_id) == wanted:
            return candidate
    return None
