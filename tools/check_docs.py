"""Docs checks of the gate (docs/testing.md).

1. Every ``docs/runbook.md#anchor`` named anywhere in src/ exists as a heading of
   docs/runbook.md (GitHub's anchor rule: the heading text, lower-cased, spaces to dashes).
2. Every module in src/ that can open a network connection is listed in docs/egress.md.
3. Every attack family replayed in tests/hostile/ is named in docs/threat-model.md, so
   the page says what each test defends and no defence goes undocumented.
4. The call's table is drawn twice, in core/call_table.py's docstring and in docs/protocol.md
   ("The call's states"); both drawings name exactly the table's data
   (``boxmaker.core.call_table.TRANSITIONS``): the same phases, the same events in each, and
   for each row the same next phases. So neither copy can drift from the code.
5. docs/architecture.md's code map ("The code") names every module of src/boxmaker, each
   on a line of its own at its folder's depth, and no module that is not there.

Exit 0 when all hold; otherwise one line per problem and exit 1.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from boxmaker.core import call_table

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "boxmaker"
RUNBOOK = ROOT / "docs" / "runbook.md"
EGRESS = ROOT / "docs" / "egress.md"
THREAT_MODEL = ROOT / "docs" / "threat-model.md"
HOSTILE = ROOT / "tests" / "hostile"
CALL_MODULE = SRC / "core" / "call_table.py"
PROTOCOL = ROOT / "docs" / "protocol.md"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
CODE_MAP_HEADING = "## The code"
# A code map entry: two spaces a level, then a module or a folder; deeper lines go on
# with the entry above them.
MAP_ENTRY = re.compile(r"^((?:  ){1,4})([a-z0-9_]+(?:\.py|/))(?:\s|$)")

ANCHOR_REFERENCE = re.compile(r"docs/runbook\.md#([a-z0-9-]+)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*$", re.MULTILINE)
# What opens a connection: an HTTP client, or a raw socket connect.
EGRESS_MARKERS = re.compile(
    r"httpx\.(?:AsyncClient|Client|get|post|stream)\b|\.connect\(|open_tcp_stream|open_unix_socket"
)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading.

    >>> github_anchor("Audit unavailable")
    'audit-unavailable'
    >>> github_anchor("ledger-torn: the last line is cut")
    'ledger-torn-the-last-line-is-cut'
    """
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def runbook_problems() -> list[str]:
    anchors = {github_anchor(h) for h in HEADING.findall(RUNBOOK.read_text(encoding="utf-8"))}
    problems = []
    for path in sorted(SRC.rglob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for anchor in ANCHOR_REFERENCE.findall(line):
                if anchor not in anchors:
                    where = path.relative_to(ROOT)
                    problems.append(f"{where}:{number}: runbook anchor #{anchor} does not exist")
    return problems


def egress_problems() -> list[str]:
    listed = EGRESS.read_text(encoding="utf-8")
    problems = []
    for path in sorted(SRC.rglob("*.py")):
        if EGRESS_MARKERS.search(path.read_text(encoding="utf-8")):
            module = path.relative_to(ROOT / "src").as_posix()
            if module not in listed:
                problems.append(f"{module}: opens connections but is not in docs/egress.md")
    return problems


def threat_model_problems() -> list[str]:
    if not THREAT_MODEL.exists():
        return ["docs/threat-model.md does not exist"]
    named = THREAT_MODEL.read_text(encoding="utf-8")
    return [
        f"tests/hostile/{test.name}: not named in docs/threat-model.md"
        for test in sorted(HOSTILE.glob("test_*.py"))
        if f"tests/hostile/{test.name}" not in named
    ]


Table = dict[tuple[str, str], set[str]]
"""(phase, event) → the next phases: a drawing's rows, or the table's data."""

PHASE_HEADER = re.compile(r"([A-Z][A-Z_]*)(?:\s.*)?")
EVENT_NAME = re.compile(r"(?:^|\|)\s*([A-Z]\w*)")
NEXT_PHASE = re.compile(r"→\s*([A-Z][A-Z_]*)\s*$")


def drawn_table(lines: Iterable[str]) -> Table:
    """The rows of a drawing of the call's table, from its first phase (``IDLE``) to its
    first blank line or fence: each phase at the drawing's indent, each row two spaces
    in (``Event(...)  → what is done  → NEXT``; ``A | B`` for two events, ``A, case``
    for one of several rows of one event), continued on lines further in. A row's next
    phases are the phase names ending its lines; a row may name none (its case goes on
    "as below").

    >>> drawn_table(["IDLE", "  Reused  → send; close  → DONE", "  A | B   → x", "     → DONE"])
    {('IDLE', 'Reused'): {'DONE'}, ('IDLE', 'A'): {'DONE'}, ('IDLE', 'B'): {'DONE'}}
    """
    table: Table = {}
    base: int | None = None
    phase = ""
    events: list[str] = []
    for line in lines:
        text = line.strip()
        indent = len(line) - len(line.lstrip(" "))
        if base is None:
            if text == "IDLE":
                base, phase = indent, "IDLE"
            continue
        if not text or text.startswith("```") or indent < base:
            break
        if indent == base:
            header = PHASE_HEADER.fullmatch(text)
            phase, events = (header.group(1) if header else text), []
            continue
        if indent == base + 2:
            head = re.sub(r"\([^)]*\)", "", text.split("→", 1)[0])
            events = EVENT_NAME.findall(head)
            for event in events:
                table.setdefault((phase, event), set())
        found = NEXT_PHASE.search(text)
        if found:
            for event in events:
                table[(phase, event)].add(found.group(1))
    return table


def table_problems(where: str, drawn: Table, data: Table) -> list[str]:
    """What a drawing names that the table's data does not, and the other way round."""
    problems = []
    for phase, event in sorted(drawn.keys() - data.keys()):
        problems.append(f"{where}: draws {event} in {phase}, which the table has no row for")
    for phase, event in sorted(data.keys() - drawn.keys()):
        problems.append(f"{where}: does not draw the table's row {event} in {phase}")
    for key in sorted(drawn.keys() & data.keys()):
        if drawn[key] != data[key]:
            phase, event = key
            problems.append(
                f"{where}: {event} in {phase} goes to {' or '.join(sorted(drawn[key]))}, "
                f"the table says {' or '.join(sorted(data[key]))}"
            )
    return problems


def transitions() -> Table:
    """The table's data, by name (``boxmaker.core.call_table.TRANSITIONS``)."""
    return {
        (phase.name, event.__name__): {step.name for step in going}
        for (phase, event), going in call_table.TRANSITIONS.items()
    }


def drawings() -> dict[str, str]:
    """The two drawings of the call's table, by where they are."""
    return {
        "src/boxmaker/core/call_table.py (the docstring's table)": call_table.__doc__ or "",
        "docs/protocol.md (The call's states)": PROTOCOL.read_text(encoding="utf-8"),
    }


def call_table_problems(drawn: Mapping[str, str] | None = None) -> list[str]:
    data = transitions()
    problems = []
    for where, text in (drawings() if drawn is None else drawn).items():
        problems += table_problems(where, drawn_table(text.splitlines()), data)
    return problems


def mapped_modules(text: str) -> list[str]:
    """The modules a code map names, as paths below src/boxmaker/, in its order.

    >>> mapped_modules("```\\nsrc/boxmaker/\\n  a.py   x\\n  b/     y\\n    c.py  z\\n"
    ...                "                 d.py is named in a description\\n  e.py\\n```")
    ['a.py', 'b/c.py', 'e.py']
    """
    above: list[str] = []  # the entry last seen at each depth above this one
    named = []
    for line in text.splitlines():
        entry = MAP_ENTRY.match(line)
        if entry is None:
            continue
        depth, name = len(entry[1]) // 2, entry[2]
        above = above[: depth - 1]
        # Indented under a module rather than a folder: the path says so, and is not there.
        path = "".join(step if step.endswith("/") else f"{step}/" for step in above)
        if not name.endswith("/"):
            named.append(path + name)
        above.append(name)
    return named


def code_map_problems(text: str | None = None) -> list[str]:
    if text is None:
        text = ARCHITECTURE.read_text(encoding="utf-8")
    after = text[text.index(CODE_MAP_HEADING) :]
    start = after.index("```") + 3
    block = after[start : after.index("```", start)]
    named = mapped_modules(block)
    present = {
        path.relative_to(SRC).as_posix() for path in SRC.rglob("*.py") if path.name != "__init__.py"
    }
    problems = [
        f"docs/architecture.md: the code map does not name src/boxmaker/{module}"
        for module in sorted(present - set(named))
    ]
    problems += [
        f"docs/architecture.md: the code map names src/boxmaker/{module}, which is not there"
        for module in sorted(set(named) - present)
    ]
    problems += [
        f"docs/architecture.md: the code map names src/boxmaker/{module} twice"
        for module in sorted({m for m in named if named.count(m) > 1})
    ]
    return problems


def main() -> int:
    problems = (
        runbook_problems()
        + egress_problems()
        + threat_model_problems()
        + call_table_problems()
        + code_map_problems()
    )
    for problem in problems:
        print(problem)
    print(f"docs: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
