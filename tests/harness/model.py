"""The built-in model (llama.cpp's server with SmolLM2-135M) as a real process, for the
tests and benchmarks that must meet the real thing: started on a home the way ``bxctl
up`` starts it, waited for, and asked directly on its ``run/model.sock``."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any, Final

import attrs
import httpx

from boxmaker.home.config import LoopConfig
from boxmaker.home.paths import Home
from boxmaker.loop.broker_port import OnPending, PortAnswer
from boxmaker.loop.model_client import ModelClient
from boxmaker.loop.turn import run_turn
from boxmaker.model.serve import ModelUnavailable, check_installed
from boxmaker.wire import LoopEvent, ToolRequest

START_S: Final = 60.0

try:
    check_installed()
    MISSING = ""
except ModelUnavailable as exc:
    MISSING = str(exc)
"""Why the built-in model cannot run here ("" when it can)."""


@contextlib.contextmanager
def builtin_model(home: Home) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m boxmaker.model.serve serve --home H``, once it has written its URL;
    stopped (SIGTERM) on the way out."""
    log = home.root / f"model-{time.monotonic_ns()}.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "boxmaker.model.serve", "serve", "--home", str(home.root)],
            stdout=output,
            stderr=output,
        )
    try:
        deadline = time.monotonic() + START_S
        while not home.model_url_file.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the model did not start: {log.read_text(errors='replace')}")
            time.sleep(0.05)
        yield process
    finally:
        process.terminate()
        process.wait(timeout=START_S)


def model_client(home: Home) -> httpx.Client:
    """A client on the model's own socket (not through inferproxy)."""
    transport = httpx.HTTPTransport(uds=str(home.model_sock))
    return httpx.Client(transport=transport, base_url="http://model", timeout=START_S)


def call_text(call: dict[str, Any]) -> str:
    """What the model writes for one tool call after the ``<tool_call>\\n`` prefill, as
    the chat template writes a call (model/chatml_tools.jinja)."""
    function = call["function"]
    return f'{{"name": "{function["name"]}", "arguments": {function["arguments"]}}}'


def tokens_of(home: Home, text: str) -> int:
    """How many tokens ``text`` is to the model (its own ``/tokenize``)."""
    with model_client(home) as client:
        answer = client.post("/tokenize", json={"content": text})
        answer.raise_for_status()
        return len(answer.json()["tokens"])


def slot_busy(home: Home) -> bool:
    with model_client(home) as client:
        return bool(client.get("/slots").json()[0]["is_processing"])


@attrs.define
class AnsweringBroker:
    """A broker that answers every call with one answer (a denial, a failure): the turn
    the model then has to end (tools/bench_turns.py, tests/e2e)."""

    answer: PortAnswer
    requests: list[ToolRequest] = attrs.Factory(list)

    async def call(self, request: ToolRequest, on_pending: OnPending | None = None) -> PortAnswer:
        self.requests.append(request)
        return self.answer


async def turn_answered(
    client: ModelClient, answer: PortAnswer, *, text: str, config: LoopConfig
) -> list[LoopEvent]:
    """One turn on the model behind ``client`` (loopd's own :func:`run_turn`), every
    tool call answered ``answer``: its events."""
    events: list[LoopEvent] = []

    async def emit(event: LoopEvent) -> None:
        events.append(event)

    await run_turn(
        session="s-0123456789ab",
        text=text,
        history=[],
        broker=AnsweringBroker(answer),
        model=client,
        config=config,
        emit=emit,
        added=[],
    )
    return events
