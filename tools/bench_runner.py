"""What the sandbox costs: ``shell`` running ``true`` through the runner's execute()
(bubblewrap, namespaces, capture) against a plain ``trio.run_process(["true"])`` in the
same trio run (target: at most 3x). Prints the median of each and the ratios.

Three ways, interleaved: a call that finds a sandbox brokerd set up ahead of it (the
usual case: an agent's shell calls are a model round trip apart; the bench leaves
SPACING between calls), calls back to back (each waits for a sandbox to be set up), and
a call without brokerd's pool (sets up its own). The target is for the first.

    python tools/bench_runner.py [--runs 50]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

from boxmaker.broker.runner import RunResult, RunSpec, execute
from boxmaker.broker.sandbox import SandboxPool
from boxmaker.core.decide import Run, ToolRequest, evaluate
from boxmaker.core.grants import GrantSet, parse_grants
from boxmaker.core.labels import FRESH, LabelRules
from boxmaker.home import RunnerConfig

TARGET = 3.0
SANDBOX_UID = 65534
"""As root, the workspace's owner: brokerd runs the sandbox as it, never as root."""
SPACING = 0.05
"""Seconds between warm calls: far less than a model round trip."""
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
    assert isinstance(verdict, Run), verdict.decision
    return RunSpec.for_verdict(
        verdict, workspace=workspace, runner=RunnerConfig(), labels=LabelRules()
    )


async def timed(
    calls: dict[str, list[float]], name: str, call: Callable[..., Awaitable[object]], *args: object
) -> None:
    start = time.perf_counter()
    result = await call(*args)
    calls[name].append(time.perf_counter() - start)
    if isinstance(result, RunResult) and not result.ok:
        raise SystemExit(f"shell failed: {result.reason}: {result.detail}")


async def bench(runs: int, workspace: Path) -> dict[str, float]:
    spec = shell_spec(workspace)
    calls: dict[str, list[float]] = {
        name: [] for name in ("plain", "set up ahead", "back to back", "own sandbox")
    }
    pool = SandboxPool()
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        await execute(spec, pool)  # the first call sets the pool going
        # Interleaved, so drift in the machine's load hits all alike.
        for _ in range(runs):
            await timed(calls, "plain", trio.run_process, ["true"])
            await trio.sleep(SPACING)
            await timed(calls, "set up ahead", execute, spec, pool)
            await timed(calls, "back to back", execute, spec, pool)
            await timed(calls, "own sandbox", execute, spec)
        nursery.cancel_scope.cancel()
    return {name: statistics.median(times) for name, times in calls.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    options = parser.parse_args()
    if shutil.which("bwrap") is None:
        sys.exit("bubblewrap (bwrap) is not installed: nothing to measure")
    with tempfile.TemporaryDirectory() as directory:
        if os.geteuid() == 0:
            os.chown(directory, SANDBOX_UID, SANDBOX_UID)
        medians = trio.run(bench, options.runs, Path(directory))
    plain = medians.pop("plain")
    print(f"plain trio.run_process(['true']):        median {plain * 1000:.2f} ms")
    for name, median in medians.items():
        label = f"shell 'true', {name}:"
        print(f"{label:<40} median {median * 1000:.2f} ms ({median / plain:.2f}x)")
    ratio = medians["set up ahead"] / plain
    verdict = "ok" if ratio <= TARGET else "over target"
    print(f"ratio with a sandbox set up ahead {ratio:.2f}x (target <= {TARGET:g}x): {verdict}")


if __name__ == "__main__":
    main()
