"""``bxctl runbook [TOPIC]``: docs/runbook.md from the installed package (README.md).

Every message that says "see docs/runbook.md#TOPIC" names a topic here: ``bxctl runbook
TOPIC`` prints that entry. The wheel carries the runbook as ``boxmaker/runbook.md`` (hatch's
force-include of docs/runbook.md, pyproject.toml), so an installed copy has it; a source
checkout reads docs/runbook.md itself. One text, never two copies kept by hand.

A topic is only ever looked up among the runbook's own headings: what the owner types is
never a path.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Final

import attrs

from boxmaker.cli.common import DEFAULT, Common, Exit, fail, print_json

ENTRY: Final = re.compile(r"^## (.+?)\s*$", re.MULTILINE)
WHAT_HAPPENED: Final = re.compile(
    r"^What happened: (.+?)(?:\.\s|\n\n|\Z)", re.MULTILINE | re.DOTALL
)
SUMMARY_CHARS: Final = 76
SOURCE_CHECKOUT: Final = Path(__file__).resolve().parents[3] / "docs" / "runbook.md"


class RunbookMissing(Exception):
    pass


def runbook_text() -> str:
    """The runbook: the package's copy, else the source checkout's docs/runbook.md."""
    shipped = resources.files("boxmaker").joinpath("runbook.md")
    if shipped.is_file():
        return shipped.read_text(encoding="utf-8")
    if SOURCE_CHECKOUT.is_file():
        return SOURCE_CHECKOUT.read_text(encoding="utf-8")
    raise RunbookMissing("the runbook is not installed with boxmaker (reinstall it)")


def anchor_of(heading: str) -> str:
    """GitHub's anchor for a heading (as tools/check_docs.py computes it).

    >>> anchor_of("Sandbox as root")
    'sandbox-as-root'
    """
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@attrs.frozen
class Entry:
    topic: str
    heading: str
    text: str

    @property
    def summary(self) -> str:
        """The first sentence of its "What happened", shortened."""
        found = WHAT_HAPPENED.search(self.text)
        if found is None:
            return ""
        words = " ".join(found.group(1).split())
        if len(words) > SUMMARY_CHARS:
            words = words[: SUMMARY_CHARS - 1].rsplit(" ", 1)[0] + "…"
        return words


def entries(text: str) -> dict[str, Entry]:
    """The runbook's entries (its ``##`` headings), by topic, in order."""
    found: dict[str, Entry] = {}
    headings = list(ENTRY.finditer(text))
    for heading, after in zip(headings, [*headings[1:], None], strict=True):
        end = after.start() if after is not None else len(text)
        topic = anchor_of(heading.group(1))
        found[topic] = Entry(topic, heading.group(1), text[heading.start() : end].rstrip() + "\n")
    return found


def runbook(topic: str | None = None, /, *, common: Common = DEFAULT) -> Exit:
    """Show the runbook: its topics, or one entry (what a message means, what boxmaker
    did, what to do). Every "see docs/runbook.md#TOPIC" in a message is a topic here.

    Parameters
    ----------
    topic
        The entry to show: its name, or the whole "docs/runbook.md#TOPIC".
    """
    try:
        known = entries(runbook_text())
    except (RunbookMissing, OSError) as exc:
        return fail(str(exc))
    if topic is None:
        if common.json:
            print_json([{"topic": e.topic, "summary": e.summary} for e in known.values()])
            return Exit.DONE
        print("The runbook's topics (bxctl runbook TOPIC shows one):\n")
        width = max(len(name) for name in known)
        for entry in known.values():
            print(f"  {entry.topic:{width}}  {entry.summary}".rstrip())
        return Exit.DONE
    name = topic.rsplit("#", 1)[-1].strip().lower()
    chosen = known.get(name)
    if chosen is None:
        return fail(f"no runbook topic {topic!r}; `bxctl runbook` lists them", Exit.USAGE)
    if common.json:
        print_json({"topic": chosen.topic, "heading": chosen.heading, "text": chosen.text})
    else:
        print(chosen.text, end="")
    return Exit.DONE
