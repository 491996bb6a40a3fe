"""The suite's fixtures live in tests/harness/fixtures.py, and each test's time limit in
tests/harness/time_limit.py, and the order of a mutant's tests under mutmut in
tests/harness/mutation_order.py: these plugins are loaded here for every test.

Two settings for the whole run, so a result never depends on how the suite was started:

- Ctrl-C is Python's own again. A shell without job control starts a background job
  with SIGINT ignored, Python then installs no handler of its own, and every program a
  test starts inherits the ignoring: a test that stops ``bxctl logs -f`` with SIGINT
  would wait for ever.
- No hypothesis deadline: an example that meets a busy machine (a 2-core CI runner with
  daemons started by other tests) is not a failure; the suite's time limits catch hangs.
  Under mutmut the examples are derandomized as well (the gate keeps exploring).
"""

from __future__ import annotations

import os
import signal

from hypothesis import settings

pytest_plugins = [
    "pytester",
    "tests.harness.fixtures",
    "tests.harness.egress_fixtures",
    "tests.harness.time_limit",
    "tests.harness.mutation_order",
]

signal.signal(signal.SIGINT, signal.default_int_handler)
settings.register_profile("boxmaker", deadline=None)
# Under mutmut every run draws the same examples: a mutant is killed or not by the tests
# alone, and mutmut's clean run cannot fail on an example the gate never drew.
settings.register_profile("mutation", deadline=None, derandomize=True)
settings.load_profile("mutation" if "MUTANT_UNDER_TEST" in os.environ else "boxmaker")
