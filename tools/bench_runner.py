"""What the sandbox costs: ``shell`` running ``true`` through the runner's execute()
(bubblewrap, namespaces, capture) against a plain ``trio.run_process(["true"])`` in the
same trio run (target: at most 3x). Prints the median of each and the ratios.

Three ways, interleaved: a call that finds a sandbox brokerd set up ahead of it (the
usual case: an agent's shell calls are a model round trip apart; the bench leaves
SPACING between calls), calls back to back (each waits for a sandbox to be set up), and
a call without brokerd's pool (sets up its own). The target is for the first.

Each way twice where cgroups can be had (as root here and in CI): with each sandbox in
a cgroup of its own, as brokerd runs it (docs/runbook.md#sandbox-limits), and without,
so the cgroup's cost (making it, joining it through a shell and setpriv, removing it)
is the ratio of the two in the same run.

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
from typing import Final

import trio

from boxmaker.broker.cgroups import CgroupTree, SandboxBounds, find_cgroups
from boxmaker.broker.run_spec import RunResult, RunSpec
from boxmaker.broker.runner import execute
from boxmaker.broker.sandbox_pool import SandboxPool
from boxmaker.core.decide import Run, evaluate
from boxmaker.core.grant_parse import parse_grants
from boxmaker.core.grants import GrantSet
from boxmaker.core.labels import FRESH, LabelRules
from boxmaker.core.vocabulary import ToolRequest
from boxmaker.home.config import RunnerConfig

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
        ToolRequest(
            call="c-0123456789abcdef",
            session="s-0123456789ab",
            tool="shell",
            arguments={"command": "true"},
        ),
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


WAYS: Final = ("set up ahead", "back to back", "own sandbox")
CGROUP: Final = " + cgroup"


async def bench(runs: int, workspace: Path, bounds: SandboxBounds | None) -> dict[str, float]:
    spec = shell_spec(workspace)
    kinds = ["", CGROUP] if bounds is not None else [""]
    calls: dict[str, list[float]] = {"plain": []}
    calls |= {way + kind: [] for kind in kinds for way in WAYS}
    pools = {"": SandboxPool()}
    if bounds is not None:
        pools[CGROUP] = SandboxPool(bounds)
    async with trio.open_nursery() as nursery:
        for kind in kinds:
            await nursery.start(pools[kind].run)
            await execute(spec, pools[kind])  # the first call sets the pool going
        # Interleaved, so drift in the machine's load hits all alike.
        for _ in range(runs):
            await timed(calls, "plain", trio.run_process, ["true"])
            for kind in kinds:
                pool = pools[kind]
                await trio.sleep(SPACING)
                await timed(calls, "set up ahead" + kind, execute, spec, pool)
                await timed(calls, "back to back" + kind, execute, spec, pool)
                # A pool that does not run sets up a sandbox for the call at hand only.
                own = SandboxPool(pool.bounds)
                await timed(calls, "own sandbox" + kind, execute, spec, own)
        nursery.cancel_scope.cancel()
    return {name: statistics.median(times) for name, times in calls.items()}


def cgroup_bounds() -> SandboxBounds | None:
    found = find_cgroups(f"b-bench{os.getpid()}")
    if not isinstance(found, CgroupTree):
        print(f"no cgroup for the sandbox here: {found.describe()}")
        return None
    return SandboxBounds(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    options = parser.parse_args()
    if shutil.which("bwrap") is None:
        sys.exit("bubblewrap (bwrap) is not installed: nothing to measure")
    with tempfile.TemporaryDirectory() as directory:
        if os.geteuid() == 0:
            os.chown(directory, SANDBOX_UID, SANDBOX_UID)
        bounds = cgroup_bounds()
        medians = trio.run(bench, options.runs, Path(directory), bounds)
    plain = medians.pop("plain")
    print(f"plain trio.run_process(['true']):        median {plain * 1000:.2f} ms")
    for name, median in medians.items():
        label = f"shell 'true', {name}:"
        print(f"{label:<49} median {median * 1000:.2f} ms ({median / plain:.2f}x)")
    if bounds is not None:
        print(f"each sandbox's cgroup: {bounds.describe()}; its cost, with / without:")
        for way in WAYS:
            cost = medians[way + CGROUP] - medians[way]
            ratio = medians[way + CGROUP] / medians[way]
            print(f"  {way + ':':<14} {ratio:.2f}x ({cost * 1000:+.2f} ms)")
    kind = CGROUP if bounds is not None else ""
    ratio = medians["set up ahead" + kind] / plain
    verdict = "ok" if ratio <= TARGET else "over target"
    print(
        f"ratio with a sandbox set up ahead{kind} {ratio:.2f}x (target <= {TARGET:g}x): {verdict}"
    )


if __name__ == "__main__":
    main()
