"""Time ``bxctl grants what-if`` against decide() alone (docs/performance.md).

Builds a 200,000-decision ledger in a temporary home (encode_line directly, no fsync):
the decisions of tools/bench_decide.py's 100 grants on a realistic mix — 40 sessions at
every label, read_file and list_dir over a few thousand paths, shell over a few hundred
command lines, http_get over a few hundred URLs, write_file with fresh content each
time, a result after each run, over 30 days — then times, best of 3:

- what-if: the whole command in process (``what_if()``: the candidate read and parsed,
  the ledger read streaming and replayed, the text printed to /dev/null), against a
  candidate that changes ten grants' modes;
- decide: decide() alone in a loop over the same decisions (arguments checked
  beforehand, grants parsed), the baseline: what a replay would cost with no reading,
  no parsing and no cache.

Run: ``python tools/bench_what_if.py [DECISIONS]``. The target: at least 100,000
decisions a second through the whole command.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
from bench_decide import grants_text

from boxmaker.cli.common import Common
from boxmaker.cli.what_if import what_if
from boxmaker.core.catalogue import CheckedArguments, check_arguments
from boxmaker.core.decide import CheckedRequest, decide
from boxmaker.core.grant_parse import parse_grants
from boxmaker.core.grants import GrantSet
from boxmaker.core.labels import Label, Taint
from boxmaker.core.reasons import Reason
from boxmaker.formats.clock import format_utc
from boxmaker.home.paths import Home
from boxmaker.ledger.records import (
    GENESIS_PREV,
    Decision,
    Genesis,
    Result,
    ResultStatus,
    Start,
    encode_line,
    line_hash,
)

DECISIONS = 200_000
TARGET = 100_000
START = dt.datetime(2026, 5, 1, tzinfo=dt.UTC)
LABELS = [Label(taint, untrusted) for taint in Taint for untrusted in (False, True)]


def _requests(rng: random.Random) -> Iterator[tuple[str, dict[str, object]]]:
    """An endless mix of tool requests (the model's, after checking)."""
    paths = [f"project{rng.randrange(100)}/src/m{i}.py" for i in range(2000)]
    paths += [f"notes/day-{i}.md" for i in range(1000)]
    paths += [f"docs/{rng.randrange(100)}/p{i}.md" for i in range(500)] + [".env", "secrets/k"]
    directories = [f"project{i}" for i in range(100)] + [f"project{i}/src" for i in range(100)]
    commands = [f"git status{s}" for s in ("", " -s", "; rm -rf x")]
    commands += [f"make test{i}" for i in range(100)] + [f"ls -l d{i}" for i in range(100)]
    commands += [f"pytest tests/test_{i}.py" for i in range(200)]
    urls = [f"https://docs{i}.example.org/page{j}" for i in range(100) for j in range(3)]
    urls += [f"https://a.pkg{i}.example/x" for i in range(100)] + ["https://evil.example/"]
    while True:
        roll = rng.random()
        if roll < 0.45:
            yield "read_file", {"path": rng.choice(paths)}
        elif roll < 0.55:
            yield "list_dir", {"path": rng.choice(directories)}
        elif roll < 0.65:
            content = f"line {rng.random()}\n" * rng.randint(1, 20)
            yield "write_file", {"path": f"out{rng.randrange(100)}/f.txt", "content": content}
        elif roll < 0.90:
            yield "shell", {"command": rng.choice(commands)}
        else:
            yield "http_get", {"url": rng.choice(urls)}


def write_ledger(path: Path, grants: GrantSet, count: int, seed: int = 10) -> None:
    """``count`` decisions of ``grants`` (and a result after each run), as brokerd
    writes them; a few are denied before the grants (bad_arguments)."""
    rng = random.Random(seed)
    sessions = [(f"s-{i:012x}", rng.choice(LABELS)) for i in range(40)]
    boot = "b-" + "0" * 16
    seq, prev = 0, GENESIS_PREV
    requests = _requests(rng)
    with path.open("wb") as file:

        def append(at: dt.datetime, body: object) -> None:
            nonlocal seq, prev
            line = encode_line(seq, format_utc(at), prev, body)  # type: ignore[arg-type]
            file.write(line + b"\n")
            seq, prev = seq + 1, line_hash(line)

        append(START, Genesis(ledger="l-" + "0" * 16))
        append(START, Start(boot=boot, version="bench"))
        for n in range(count):
            at = START + dt.timedelta(seconds=n * 30 * 86400 / count)
            session, state = rng.choice(sessions)
            tool, arguments = next(requests)
            call = f"c-{n:016x}"
            if rng.random() < 0.01:
                body = Decision(
                    call, session, tool, {"path": "../x"}, "deny", Reason.BAD_ARGUMENTS,
                    None, state.taint, state.untrusted, boot,
                )  # fmt: skip
                append(at, body)
                continue
            checked = check_arguments(tool, arguments)
            assert isinstance(checked, CheckedArguments), checked
            decision = decide(CheckedRequest(call, session, checked), grants, state, at).decision
            append(
                at,
                Decision(
                    call, session, tool, checked.to_json(), decision.verdict, decision.reason,
                    decision.grant, state.taint, state.untrusted, boot,
                ),
            )  # fmt: skip
            if decision.verdict == "run":
                append(
                    at,
                    Result(
                        call, ResultStatus.OK, None, Label(Taint.INTERNAL), state.taint,
                        state.untrusted, "0" * 64, 100,
                    ),
                )  # fmt: skip


def candidate_text() -> str:
    """The bench grants with ten grants' modes changed (auto → ask, ask → deny, deny → auto)."""
    text = grants_text()
    turn = {'mode = "auto"': 'mode = "ask"', 'mode = "ask"': 'mode = "deny"'}
    turn['mode = "deny"'] = 'mode = "auto"'
    tables = text.split("[[grant]]")
    for i in range(1, 60, 6):
        for old, new in turn.items():
            if old in tables[i]:
                tables[i] = tables[i].replace(old, new)
                break
    return "[[grant]]".join(tables)


def time_what_if(home: Home, candidate: Path) -> tuple[float, float]:
    """The whole command in process: (wall seconds, CPU seconds)."""
    sink = io.StringIO()
    start, start_cpu = time.perf_counter(), time.process_time()
    with contextlib.redirect_stdout(sink):
        code = what_if(candidate, common=Common(home=str(home.root)))
    elapsed, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    assert code == 0, sink.getvalue()
    return elapsed, cpu


def time_decide(path: Path, grants: GrantSet) -> tuple[float, int]:
    """decide() over the ledger's decisions, arguments checked beforehand."""
    requests = []
    for line in path.read_bytes().splitlines():
        fields = orjson.loads(line)
        if fields["kind"] != "decision" or fields["reason"] == "bad_arguments":
            continue
        checked = check_arguments(fields["tool"], fields["arguments"])
        assert isinstance(checked, CheckedArguments)
        state = Label(Taint(fields["taint"]), fields["untrusted"])
        at = dt.datetime.fromisoformat(fields["at"])
        requests.append((CheckedRequest(fields["call"], fields["session"], checked), state, at))
    start = time.perf_counter()
    for request, state, at in requests:
        decide(request, grants, state, at)
    return time.perf_counter() - start, len(requests)


def main() -> int:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else DECISIONS
    grants = parse_grants(grants_text())
    candidate_grants = parse_grants(candidate_text())
    assert isinstance(grants, GrantSet)
    assert isinstance(candidate_grants, GrantSet)
    with tempfile.TemporaryDirectory(prefix="bx-bench-") as root:
        home = Home(Path(root))
        home.create()
        write_ledger(home.audit_log, grants, count)
        candidate = Path(root) / "candidate.toml"
        candidate.write_text(candidate_text())
        size = home.audit_log.stat().st_size
        print(f"ledger: {count:,} decisions, {size / 1e6:.1f} MB; grants: {len(grants.grants)}")
        whole, whole_cpu = min(time_what_if(home, candidate) for _ in range(3))
        baseline, decided = min(
            (time_decide(home.audit_log, candidate_grants) for _ in range(3)),
            key=lambda pair: pair[0],
        )
    rate, decide_rate = count / whole, decided / baseline
    print(
        f"what-if, the whole command: {whole:.2f} s, {rate:,.0f} decisions/s "
        f"(CPU {whole_cpu:.2f} s: {count / whole_cpu:,.0f} decisions/s)"
    )
    print(f"decide() alone (baseline): {baseline:.2f} s, {decide_rate:,.0f} decisions/s")
    print(f"ratio what-if / decide(): {rate / decide_rate:.2f}")
    verdict = "ok" if rate >= TARGET else "BELOW TARGET"
    print(f"what-if: {rate:,.0f} decisions/s (target {TARGET:,}/s): {verdict}")
    return 0 if rate >= TARGET else 1


if __name__ == "__main__":
    raise SystemExit(main())
