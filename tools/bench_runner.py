"""What the sandbox costs: ``shell`` running ``true`` through the runner's execute()
(bubblewrap, namespaces, capture) against a plain ``trio.run_process(["true"])`` in the
same trio run (target: at most 3x). Prints the median of each and the ratio.

    python tools/bench_runner.py [--runs 50]
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

from boxmaker.broker.runner import RunSpec, execute
from boxmaker.core.decide import ToolRequest, evaluate
from boxmaker.core.grants import GrantSet, parse_grants
from boxmaker.core.labels import FRESH, LabelRules
from boxmaker.home import RunnerConfig

TARGET = 3.0
GRANTS = '[[grant]]\nid = "sh"\ntool = "shell"\nmode = "auto"\n'


def shell_spec(workspace: Path) -> RunSpec:
    grants = parse_grants(GRANTS)
    assert isinstance(grants, GrantSet)
    verdict = evaluate(
        ToolRequest("c-0123456789abcdef", "s-0123456789ab", "shell", {"command": "true"}),
        ledger_usable=True,
        grants=grants,
        state=FRESH,
        now=dt.datetime.now(dt.UTC),
        workspace=str(workspace),
    )
    return RunSpec.for_call(
        verdict.decision,
        grant=grants.grants[0],
        workspace=workspace,
        runner=RunnerConfig(),
        labels=LabelRules(),
    )


async def bench(runs: int, workspace: Path) -> tuple[float, float]:
    spec = shell_spec(workspace)
    plain: list[float] = []
    sandboxed: list[float] = []
    # Interleaved, so drift in the machine's load hits both alike.
    for _ in range(runs):
        start = time.perf_counter()
        await trio.run_process(["true"])
        plain.append(time.perf_counter() - start)
        start = time.perf_counter()
        result = await execute(spec)
        sandboxed.append(time.perf_counter() - start)
        if not result.ok:
            raise SystemExit(f"shell failed: {result.reason}: {result.detail}")
    return statistics.median(plain), statistics.median(sandboxed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    options = parser.parse_args()
    if shutil.which("bwrap") is None:
        sys.exit("bubblewrap (bwrap) is not installed: nothing to measure")
    with tempfile.TemporaryDirectory() as directory:
        plain, sandboxed = trio.run(bench, options.runs, Path(directory))
    ratio = sandboxed / plain
    print(f"plain trio.run_process(['true']): median {plain * 1000:.2f} ms")
    print(f"shell 'true' via execute():      median {sandboxed * 1000:.2f} ms")
    verdict = "ok" if ratio <= TARGET else "over target"
    print(f"ratio {ratio:.2f}x (target <= {TARGET:g}x): {verdict}")


if __name__ == "__main__":
    main()
