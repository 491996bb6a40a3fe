"""Fail unless mutmut killed at least the rate docs/testing.md states; report each module.

Reads mutants/mutmut-cicd-stats.json (written by `mutmut export-cicd-stats`) for the
total, and each mutated file's mutants/<path>.meta for the rate per module. A mutant
with no test covering it counts as a survivor: code no test reaches is not tested.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

STATS = Path("mutants/mutmut-cicd-stats.json")
MUTANTS = Path("mutants")
MIN_KILL_RATE = 0.90  # docs/testing.md: "Mutation testing"
KILLED = {1, 3, 36, 24, -24, 152, 255}
"""mutmut's exit codes for a killed mutant, a timeout counting as killed (a mutant that
broke the code badly enough to hang was caught)."""
SKIPPED = {34, None}
"""Skipped, or not run: a run limited to some mutants (``mutmut run "boxmaker.core.call*"``)
reports only those modules; the gate's total still counts every mutant."""


def per_module() -> list[tuple[str, int, int]]:
    """(module, killed, judged) for each mutated file that has results."""
    rows = []
    for meta in sorted(MUTANTS.glob("src/**/*.py.meta")):
        codes = json.loads(meta.read_text(encoding="utf-8")).get("exit_code_by_key", {})
        judged = [code for code in codes.values() if code not in SKIPPED]
        if judged:
            module = str(meta.relative_to(MUTANTS))[: -len(".meta")]
            rows.append((module, sum(code in KILLED for code in judged), len(judged)))
    return rows


def main() -> int:
    for module, killed, judged in per_module():
        print(f"  {module}: {killed}/{judged} killed ({killed / judged:.1%})")
    stats = json.loads(STATS.read_text(encoding="utf-8"))
    judged = stats["total"] - stats["skipped"]
    if judged <= 0:
        print("mutation gate: no mutants were run")
        return 1
    killed = stats["killed"] + stats["timeout"]
    rate = killed / judged
    print(
        f"mutation gate: {killed}/{judged} killed ({rate:.1%}); survived {stats['survived']}, "
        f"no tests {stats['no_tests']}, suspicious {stats['suspicious']}; "
        f"minimum {MIN_KILL_RATE:.0%}"
    )
    return 0 if rate >= MIN_KILL_RATE else 1


if __name__ == "__main__":
    sys.exit(main())
