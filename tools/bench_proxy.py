"""What inferproxy adds to a model request (docs/performance.md).

The scripted llama-server (tests/fakes/llama_server.py) runs as a process on
127.0.0.1, and inferproxy (``python -m boxmaker.proxy.serve serve``) as a process in front
of it on a fresh home's ``run/infer.sock``. This process sends the same small chat
request (the answer: a 27-character reply, 7 tokens, no wait) to the model directly and
through inferproxy, interleaved one by one on two kept-alive connections, and compares
the medians: inferproxy's added latency is p50(through) - p50(direct).
Target: at most 2 ms. Streamed requests (what loopd sends) are measured the same way
and reported too.

Run: ``python tools/bench_proxy.py [--requests N]``. Exits 1 when the target is missed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fakes.llama_server import as_process  # noqa: E402

from boxmaker.home.paths import Home  # noqa: E402

TARGET_MS: Final = 2.0
PROFILE: Final = os.environ.get("BENCH_PROXY_PROFILE", "")
"""A file to write inferproxy's cProfile to (for finding where its time goes)."""
START_S: Final = 30.0
WARMUP: Final = 50
REQUEST: Final[dict[str, Any]] = {
    "messages": [{"role": "user", "content": "read notes.txt"}],
    "max_tokens": 64,
}


def start_proxy(home: Home, upstream: str) -> subprocess.Popen[bytes]:
    log = (home.logs_dir / "bench-inferproxy.log").open("wb")
    process = subprocess.Popen(
        [
            sys.executable,
            *(["-m", "cProfile", "-o", PROFILE] if PROFILE else []),
            "-m",
            "boxmaker.proxy.serve",
            "serve",
            "--home",
            str(home.root),
            "--upstream",
            upstream,
        ],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
    )
    deadline = time.monotonic() + START_S
    while not home.infer_sock.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            sys.exit("inferproxy did not start; see its log in " + str(home.logs_dir))
        time.sleep(0.05)
    return process


def timed(client: httpx.Client, body: dict[str, Any]) -> float:
    started = time.perf_counter()
    if body.get("stream"):
        with client.stream("POST", "/v1/chat/completions", json=body) as answer:
            answer.read()
    else:
        answer = client.post("/v1/chat/completions", json=body)
    elapsed = time.perf_counter() - started
    if answer.status_code != 200:
        sys.exit(f"HTTP {answer.status_code}: {answer.text[:300]}")
    return elapsed


def compare(direct: httpx.Client, proxied: httpx.Client, body: dict[str, Any], n: int) -> float:
    """inferproxy's added p50 (ms) for ``body``, printed with both medians."""
    for _ in range(WARMUP):
        timed(direct, body)
        timed(proxied, body)
    straight, through = [], []
    for _ in range(n):
        straight.append(timed(direct, body))
        through.append(timed(proxied, body))
    p50_direct = statistics.median(straight) * 1000
    p50_through = statistics.median(through) * 1000
    added = p50_through - p50_direct
    kind = "streamed" if body.get("stream") else "whole"
    print(
        f"{kind:>8}: direct p50 {p50_direct:.2f} ms, through inferproxy p50 "
        f"{p50_through:.2f} ms: added {added:.2f} ms ({p50_through / p50_direct:.2f}x)"
    )
    return added


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=500)
    options = parser.parse_args()
    home = Home(Path(tempfile.mkdtemp(prefix="bxp-", dir="/tmp")))
    home.create()
    home.config_toml.write_text('[model]\nname = "default"\nmax_tokens = 64\n')
    try:
        with as_process() as url:
            proxy = start_proxy(home, url)
            try:
                transport = httpx.HTTPTransport(uds=str(home.infer_sock))
                with (
                    httpx.Client(base_url=url, timeout=START_S) as direct,
                    httpx.Client(
                        transport=transport, base_url="http://proxy", timeout=START_S
                    ) as proxied,
                ):
                    added = compare(direct, proxied, REQUEST, options.requests)
                    streamed = {**REQUEST, "stream": True}
                    compare(direct, proxied, streamed, options.requests)
            finally:
                proxy.terminate()
                proxy.wait(timeout=START_S)
    finally:
        shutil.rmtree(home.root, ignore_errors=True)
    verdict = "met" if added <= TARGET_MS else "MISSED"
    print(f"inferproxy's added latency p50 {added:.2f} ms (target <= {TARGET_MS:g} ms): {verdict}")
    sys.exit(0 if added <= TARGET_MS else 1)


if __name__ == "__main__":
    main()
