"""What a turn on the built-in model costs (docs/performance.md).

The whole stack as ``bxctl up`` starts it (llama.cpp's server with SmolLM2-135M,
brokerd, inferproxy, loopd, each its own process) on a fresh home in /tmp, with
``first_step = "tool"`` and an ``auto`` grant for read_file on ``notes.txt``.

- (a) a tool step's tokens: for each of three requests that name a file or folder, the
  first step of a turn as loopd sends it (``request_payload``, through inferproxy, by
  loopd's ``ModelClient``): the completion tokens it wrote against the call's own tokens
  (``{"name": …, "arguments": …}``, counted by the model's ``/tokenize``).
  Target: at most the call's own tokens + 16. Baseline in the same run: the first
  request without the stop at ``</tool_call>``, as before (tokens and seconds).
- (b) ``bxctl demo --yes`` after install, wall time (a cold start of everything).
  Target: at most 15 s on a quiet 2-core machine (the load average is printed).
- (c) what loopd and inferproxy add to a turn: turns on loop.sock ('Read the file at
  path "notes.txt" and tell me what it says.', each in a new session), the wall time
  from the ``say`` to loopd's end against the model's own time for the same requests
  (inferproxy's ``upstream_ms``: from its request to the model to the answer's last
  byte). What is left is loopd's, inferproxy's and brokerd's (the tool call: decision,
  ledger, read). Target: at most 5% of the model's time.

Run: ``python tools/bench_model.py [--turns N] [--skip-demo] [--skip-baseline]``. Exits
1 when a target is missed, 2 when the built-in model is not installed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Final

import orjson
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.harness.model import MISSING, call_text, tokens_of  # noqa: E402

from boxmaker.home.paths import Home  # noqa: E402
from boxmaker.loop.model_client import ModelClient, ModelFailure  # noqa: E402
from boxmaker.loop.turn import model_tools, request_payload  # noqa: E402
from boxmaker.runtime.ndjson import FrameReader  # noqa: E402

TOKEN_MARGIN: Final = 16
DEMO_TARGET_S: Final = 15.0
OVERHEAD_TARGET: Final = 0.05
QUESTION: Final = 'Read the file at path "notes.txt" and tell me what it says.'
STEPS: Final = (
    QUESTION,
    'Read the file at path "todo.md".',
    'List the folder at path "docs".',
)
CONFIG: Final = '[loop]\nfirst_step = "tool"\nmax_steps = 4\n'
GRANTS: Final = '[[grant]]\nid = "notes"\ntool = "read_file"\nmode = "auto"\n'
UPSTREAM_MS: Final = re.compile(rb"path=/v1/chat/completions status=200 upstream_ms=(\d+)")


def bxctl(home: Home, *arguments: str) -> None:
    command = [sys.executable, "-m", "boxmaker.cli.app", *arguments, "--home", str(home.root)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"bxctl {' '.join(arguments)} failed: {done.stderr}")


async def tool_steps(home: Home, *, baseline: bool) -> bool:
    """Part (a); True when every step met the target."""
    client = ModelClient(home.infer_sock)
    met = True
    try:
        for text in STEPS:
            payload = request_payload(
                [{"role": "user", "content": text}], model_tools(), force_tool=True
            )
            started = time.perf_counter()
            message = await client.complete(payload)
            seconds = time.perf_counter() - started
            if isinstance(message, ModelFailure) or not message.get("tool_calls"):
                print(f"  {text!r}: no tool call: {message}")
                met = False
                continue
            written = message["usage"]["completion_tokens"]
            own = tokens_of(home, call_text(message["tool_calls"][0]))
            ok = written <= own + TOKEN_MARGIN
            met &= ok
            name = message["tool_calls"][0]["function"]["name"]
            print(
                f"  {text!r}: {name}, {written} tokens written, the call's own {own} "
                f"(+{written - own}) in {seconds:.2f} s: {'met' if ok else 'MISSED'}"
            )
        if baseline:
            payload = request_payload(
                [{"role": "user", "content": STEPS[0]}], model_tools(), force_tool=True
            )
            del payload["stop"]
            started = time.perf_counter()
            message = await client.complete(payload)
            seconds = time.perf_counter() - started
            tokens = (
                "?" if isinstance(message, ModelFailure) else message["usage"]["completion_tokens"]
            )
            print(f"  baseline, without the stop: {tokens} tokens written in {seconds:.2f} s")
    finally:
        await client.aclose()
    return met


async def one_turn(home: Home) -> tuple[float, float]:
    """Part (c): one turn's wall time and the model's own time in it (seconds)."""
    log = home.log_file("inferproxy")
    await trio.sleep(0.5)  # the log lines of what came before are written
    before = log.stat().st_size
    started = time.perf_counter()
    stream = await trio.open_unix_socket(str(home.loop_sock))
    async with stream:
        await stream.send_all(orjson.dumps({"kind": "say", "text": QUESTION}) + b"\n")
        reader = FrameReader(stream)
        kinds = []
        while (line := await reader.receive_line()) is not None:
            kinds.append(orjson.loads(line)["kind"])
    wall = time.perf_counter() - started
    if kinds[-1] != "reply" or "tool_result" not in kinds:
        sys.exit(f"the turn did not read the file and reply: {kinds}")
    await trio.sleep(0.2)  # inferproxy's log line follows its answer's end
    with log.open("rb") as file:
        file.seek(before)
        model = sum(int(ms) for ms in UPSTREAM_MS.findall(file.read())) / 1000
    return wall, model


def demo() -> float:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "boxmaker.cli.app", "demo", "--yes"],
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"bxctl demo failed: {done.stdout}\n{done.stderr}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--skip-demo", action="store_true")
    parser.add_argument("--skip-baseline", action="store_true")
    options = parser.parse_args()
    if MISSING:
        print(f"the built-in model is not installed: {MISSING}", file=sys.stderr)
        sys.exit(2)
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    results: dict[str, bool] = {}
    home = Home(Path(tempfile.mkdtemp(prefix="bxm-", dir="/tmp")))
    try:
        bxctl(home, "init")
        home.config_toml.write_text(CONFIG)
        home.grants_toml.write_text(GRANTS)
        (home.default_workspace / "notes.txt").write_text("Buy milk.\n")
        bxctl(home, "up")
        try:
            print("(a) a tool step's tokens (target: the call's own + 16):")
            results["a"] = trio.run(lambda: tool_steps(home, baseline=not options.skip_baseline))
            print("(c) what loopd and inferproxy add to a turn (target: <= 5% of the model's):")
            ratios = []
            for _ in range(options.turns):
                wall, model = trio.run(one_turn, home)
                ratios.append((wall - model) / model)
                print(
                    f"  turn {wall:.3f} s, the model {model:.3f} s: added "
                    f"{(wall - model) * 1000:.0f} ms ({ratios[-1]:.1%})"
                )
            median = statistics.median(ratios)
            results["c"] = median <= OVERHEAD_TARGET
            verdict = "met" if results["c"] else "MISSED"
            print(f"  median added {median:.1%} of the model's time: {verdict}")
        finally:
            bxctl(home, "down")
    finally:
        shutil.rmtree(home.root, ignore_errors=True)
    if not options.skip_demo:
        seconds = demo()
        results["b"] = seconds <= DEMO_TARGET_S
        verdict = "met" if results["b"] else "MISSED"
        print(
            f"(b) bxctl demo --yes: {seconds:.1f} s (target <= {DEMO_TARGET_S:g} s when quiet; "
            f"load average {os.getloadavg()[0]:.2f}): {verdict}"
        )
    sys.exit(0 if all(results.values()) else 1)


if __name__ == "__main__":
    main()
