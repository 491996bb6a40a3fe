"""Under mutmut a mutant's tests run fastest first (tests/harness/mutation_order.py), by
the durations in ``mutmut-stats.json``; outside a mutant's run, in the order written."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

ROOT = Path(__file__).resolve().parent.parent

TESTS = """
def test_slow():
    pass

def test_unmeasured():
    pass

def test_quick():
    pass
"""


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(
        f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n"
        'pytest_plugins = ["tests.harness.mutation_order"]\n'
    )
    pytester.makepyfile(test_order=TESTS)
    durations = {"test_order.py::test_slow": 3.0, "test_order.py::test_quick": 0.01}
    (pytester.path / "mutmut-stats.json").write_bytes(orjson.dumps({"duration_by_test": durations}))
    return pytester


def ran(suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, mutant: str) -> list[str]:
    monkeypatch.setenv("MUTANT_UNDER_TEST", mutant)
    result = suite.runpytest_subprocess("-p", "no:cacheprovider", "-v")
    result.assert_outcomes(passed=3)
    return [line.split()[0] for line in result.outlines if " PASSED" in line]


def test_a_mutants_tests_run_fastest_first_and_unmeasured_last(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert ran(suite, monkeypatch, "boxmaker.core.decide.x_decide__mutmut_7") == [
        "test_order.py::test_quick",
        "test_order.py::test_slow",
        "test_order.py::test_unmeasured",
    ]


@pytest.mark.parametrize("phase", ["", "stats", "fail"])
def test_outside_a_mutants_run_the_order_is_as_written(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, phase: str
) -> None:
    assert ran(suite, monkeypatch, phase) == [
        "test_order.py::test_slow",
        "test_order.py::test_unmeasured",
        "test_order.py::test_quick",
    ]
