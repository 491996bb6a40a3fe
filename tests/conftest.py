"""The suite's fixtures live in tests/harness/fixtures.py, loaded here for every test."""

from __future__ import annotations

pytest_plugins = ["tests.harness.fixtures"]
