"""Fail unless mutmut killed at least the rate docs/testing.md states.

Reads mutants/mutmut-cicd-stats.json (written by `mutmut export-cicd-stats`). A mutant
with no test covering it counts as a survivor: code no test reaches is not tested.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

STATS = Path("mutants/mutmut-cicd-stats.json")
MIN_KILL_RATE = 0.90  # docs/testing.md: "Mutation testing"


def main() -> int:
    stats = json.loads(STATS.read_text(encoding="utf-8"))
    judged = stats["total"] - stats["skipped"]
    if judged <= 0:
        print("mutation gate: no mutants were run")
        return 1
    # A timeout means the mutant broke the code badly enough to hang: the tests caught it.
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
