"""Docs checks of the gate (docs/testing.md).

1. Every ``docs/runbook.md#anchor`` named anywhere in src/ exists as a heading of
   docs/runbook.md (GitHub's anchor rule: the heading text, lower-cased, spaces to dashes).
2. Every module in src/ that can open a network connection is listed in docs/egress.md.
3. Every attack family replayed in tests/hostile/ is named in docs/threat-model.md, so
   the page says what each test defends and no defence goes undocumented.

Exit 0 when all hold; otherwise one line per problem and exit 1.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "boxmaker"
RUNBOOK = ROOT / "docs" / "runbook.md"
EGRESS = ROOT / "docs" / "egress.md"
THREAT_MODEL = ROOT / "docs" / "threat-model.md"
HOSTILE = ROOT / "tests" / "hostile"

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


def main() -> int:
    problems = runbook_problems() + egress_problems() + threat_model_problems()
    for problem in problems:
        print(problem)
    print(f"docs: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
