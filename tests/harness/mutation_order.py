"""Under mutmut, a mutant's tests run fastest first.

mutmut runs each mutant with the tests that reached its function and ``-x``: the first
failure kills it and ends the run. It passes those tests in no particular order, so a
mutant that the quickest of them would kill can wait seconds behind a generated-ledger
property test. Sorting by the durations mutmut itself measured in its clean run
(``mutmut-stats.json``, in the directory the mutants run from) makes a killed mutant
cost about its cheapest killing test; a survivor still runs every test. Outside a
mutant's run (the gate, mutmut's own clean and stats runs) nothing is reordered.
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

STATS_FILE = Path("mutmut-stats.json")
MUTANT_MARK = "__mutmut_"


def measured_durations() -> dict[str, float]:
    """Each test's seconds as mutmut measured them, or nothing outside a mutant's run."""
    if MUTANT_MARK not in os.environ.get("MUTANT_UNDER_TEST", ""):
        return {}
    try:
        stats = orjson.loads(STATS_FILE.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    durations = stats.get("duration_by_test")
    return durations if isinstance(durations, dict) else {}


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    durations = measured_durations()
    if durations:
        # Unmeasured tests last: mutmut saw them in no clean run, so they may be slow.
        items.sort(key=lambda item: durations.get(item.nodeid, float("inf")))
