"""The suite's fixtures live in tests/harness/fixtures.py, and each test's time limit in
tests/harness/time_limit.py: both plugins are loaded here for every test."""

from __future__ import annotations

pytest_plugins = ["pytester", "tests.harness.fixtures", "tests.harness.time_limit"]
