"""Does every turn end? A denial or failure of each kind through the built-in model
(docs/performance.md, "Turns that end").

The built-in model (llama.cpp's server with SmolLM2-135M) behind the real inferproxy, and
loopd's own turn (``run_turn``, ``[loop]`` at its defaults but ``first_step = "named"``,
as ``bxctl init`` writes it) on 'Read the file at path "notes.txt".': the model's call is
answered with one reason code a tool answer can carry (core/reasons.py), with a detail
like brokerd's, and the model then has to end the turn. For each reason: the steps, the
tokens of each step after the answer (the model's answer to it), whether a step was cut
(``repeated``: the repetition guard; ``max_tokens``: the step's limit), and the time.

Targets: no step reaches ``[loop] max_step_tokens`` (none runs away), and the median of
the replies' tokens is at most 64.

Run: ``python tools/bench_turns.py [--reason CODE ...]``. Exits 1 when a target is
missed, 2 when the built-in model is not installed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Final

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.harness.homes import short_home  # noqa: E402
from tests.harness.model import MISSING, builtin_model, turn_answered  # noqa: E402
from tests.harness.stack import proxied_client  # noqa: E402

from boxmaker.core.reasons import Reason  # noqa: E402
from boxmaker.core.vocabulary import AnswerOutcome  # noqa: E402
from boxmaker.home.config import LoopConfig  # noqa: E402
from boxmaker.home.paths import Home  # noqa: E402
from boxmaker.loop.broker_port import PortAnswer  # noqa: E402
from boxmaker.wire import ErrorCode, ErrorFrame, ModelDoneEvent, ReplyEvent  # noqa: E402

TEXT: Final = 'Read the file at path "notes.txt".'
MEDIAN_TARGET: Final = 64
FAILURES: Final = frozenset(
    {
        Reason.TOOL_ERROR,
        Reason.TIMEOUT,
        Reason.NOT_FOUND,
        Reason.TOO_LARGE,
        Reason.PATH_ESCAPE,
        Reason.SANDBOX_UNAVAILABLE,
        Reason.REQUESTER_GONE,
        Reason.RESULT_UNRECORDED,
    }
)
"""The reasons of a ``failed`` answer (the rest are a ``denied`` one's)."""
DETAILS: Final[dict[Reason, str]] = {
    Reason.UNKNOWN_TOOL: "no tool named read_files",
    Reason.BAD_ARGUMENTS: "path: expected a string",
    Reason.GRANTS_INVALID: (
        "grants.toml: grant 1 (notes): mode: expected one of auto, ask, deny; got 'yes' "
        "(see docs/runbook.md#grants)"
    ),
    Reason.STATE_UNREADABLE: "state/sessions/s-0123456789ab.json: not valid JSON",
    Reason.NO_GRANT: "no grant allows read_file on notes.txt",
    Reason.DENIED_BY_GRANT: "grant no-notes denies read_file on notes.txt",
    Reason.TAINT_EXCEEDED: "the session is secret; grant notes allows at most untrusted",
    Reason.UNTRUSTED: "the session is untrusted and grant notes says if_untrusted = deny",
    Reason.REFUSED: "not now",
    Reason.EXPIRED: "nobody answered within 300 s",
    Reason.WITHDRAWN: "the owner withdrew the call",
    Reason.AUDIT_UNAVAILABLE: "an earlier write failed; see docs/runbook.md#audit-unavailable",
    Reason.BROKER_STOPPING: "brokerd is stopping",
    Reason.TOO_MANY_PENDING: "10000 calls already wait for the owner",
    Reason.TOOL_ERROR: "notes.txt: permission denied",
    Reason.TIMEOUT: "ran past 30 s",
    Reason.NOT_FOUND: "notes.txt: no such file",
    Reason.TOO_LARGE: "notes.txt is 2000000 bytes, over the 65536-byte limit",
    Reason.PATH_ESCAPE: "notes.txt leads outside the workspace",
    Reason.SANDBOX_UNAVAILABLE: "bwrap: setting up uid map: Permission denied",
    Reason.REQUESTER_GONE: "the requester left before the call ran",
    Reason.RESULT_UNRECORDED: "the ledger write failed after the call ran",
}


def answer_for(reason: Reason) -> PortAnswer:
    outcome = AnswerOutcome.FAILED if reason in FAILURES else AnswerOutcome.DENIED
    return PortAnswer(outcome, reason=reason, detail=DETAILS[reason])


async def play(home: Home, reasons: list[Reason], config: LoopConfig) -> list[tuple[int, bool]]:
    """Each reason's turn, printed; for each, the reply's tokens and whether a step ran
    into the step's limit."""
    results = []
    async with proxied_client(home, f"unix://{home.model_sock}") as client:
        for reason in reasons:
            started = time.perf_counter()
            events = await turn_answered(client, answer_for(reason), text=TEXT, config=config)
            end = events[-1]
            if isinstance(end, ErrorFrame) and end.code == ErrorCode.MODEL_UNREACHABLE:
                # Said, and the turn played again: the model's answer is what is measured.
                print(f"  {reason:<20} error {end.code}: {end.detail}; once more")
                started = time.perf_counter()
                events = await turn_answered(client, answer_for(reason), text=TEXT, config=config)
            seconds = time.perf_counter() - started
            steps = [event for event in events if isinstance(event, ModelDoneEvent)]
            answered = [step.tokens or 0 for step in steps[1:]]
            reply = answered[-1] if answered else 0
            ran_away = any(
                step.cut == "max_tokens" or (step.tokens or 0) >= config.max_step_tokens
                for step in steps
            )
            cuts = [f"step {step.step}: {step.cut}" for step in steps if step.cut]
            end = events[-1]
            ending = (
                f"reply {end.text[:100]!r}"
                if isinstance(end, ReplyEvent)
                else f"error {end.code}: {end.detail}"
                if isinstance(end, ErrorFrame)
                else type(end).__name__
            )
            print(
                f"  {reason:<20} {len(steps)} steps, answered in {answered} tokens, "
                f"{seconds:5.1f} s{'; cut ' + ', '.join(cuts) if cuts else ''}; {ending}"
                f"{'  RAN AWAY' if ran_away else ''}"
            )
            results.append((reply, ran_away))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reason", action="append", choices=[r.value for r in Reason])
    options = parser.parse_args()
    if MISSING:
        print(f"the built-in model is not installed: {MISSING}", file=sys.stderr)
        sys.exit(2)
    reasons = [Reason(code) for code in options.reason] if options.reason else list(Reason)
    config = LoopConfig(first_step="named")
    print(
        f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; "
        f"max_step_tokens {config.max_step_tokens}"
    )
    with short_home("bxt-") as home:
        home.config_toml.write_text("")
        with builtin_model(home):
            results = trio.run(play, home, reasons, config)
    replies = [tokens for tokens, _ in results]
    median = statistics.median(replies)
    ran_away = sum(away for _, away in results)
    met = not ran_away and median <= MEDIAN_TARGET
    print(
        f"{len(results)} turns: {ran_away} ran away; replies median {median:g} tokens, "
        f"max {max(replies)} (target: none runs away, median <= {MEDIAN_TARGET}): "
        f"{'met' if met else 'MISSED'}"
    )
    sys.exit(0 if met else 1)


if __name__ == "__main__":
    main()
