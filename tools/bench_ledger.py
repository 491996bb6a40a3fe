"""Time ledger verification against a bare hash+parse loop (docs/performance.md).

Builds a realistic 200,000-record ledger in a temporary directory (encode_line directly,
no fsync), then times, best of 3:

- raw: for each line, ``hashlib.sha256(line).hexdigest()`` and ``orjson.loads(line)``,
  and the Merkle tree's hashes (the leaf's, and a node's per carry: the least any
  verification of the tree does);
- verify: ``boxmaker.ledger.verify_files.verify_file`` (the chain, the calls, the tree);
- the bare loop without the tree, printed beside it: the tree's own cost.

Run: ``python tools/bench_ledger.py [RECORDS]``. The target is a ratio of at least 0.70.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import random
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson

from boxmaker import __version__
from boxmaker.core.labels import Label, Taint
from boxmaker.core.reasons import Reason
from boxmaker.formats.clock import format_utc
from boxmaker.ledger.policies import keep, policies_dir
from boxmaker.ledger.reader import READ_BUFFER
from boxmaker.ledger.records import (
    GENESIS_PREV,
    Approval,
    ApprovalBy,
    ApprovalOutcome,
    Body,
    Decision,
    Genesis,
    Policy,
    Result,
    ResultStatus,
    Start,
    Stop,
    VerdictCode,
    encode_line,
    line_hash,
)
from boxmaker.ledger.verify_files import verify_file

RECORDS = 200_000
TARGET = 0.70
GRANTS_VERSIONS = tuple(
    f'[[grant]]\nid = "read-notes"\ntool = "read_file"\nmode = "{mode}"\n'.encode()
    for mode in ("auto", "ask")
)
"""The grants the ledger's policy records name, kept beside it (verify checks them)."""


def _policy(rng: random.Random, boot: str) -> Policy:
    data = rng.choice(GRANTS_VERSIONS)
    return Policy(boot=boot, sha256=hashlib.sha256(data).hexdigest(), grants=1, problem=None)


def _bodies(rng: random.Random) -> Iterator[Body]:
    """A plausible mix: boots, each with its policy and a change now and then, denials,
    auto runs, asks with every outcome."""
    yield Genesis(ledger="l-" + rng.randbytes(8).hex())
    while True:
        boot = "b-" + rng.randbytes(8).hex()
        yield Start(boot=boot, version=__version__)
        yield _policy(rng, boot)
        session = "s-" + rng.randbytes(6).hex()
        for _ in range(rng.randint(200, 2000)):
            if rng.random() < 0.002:
                yield _policy(rng, boot)
            call = "c-" + rng.randbytes(8).hex()
            arguments = {"path": f"notes/day-{rng.randint(1, 999)}.md"}
            roll = rng.random()
            verdict = (
                VerdictCode.DENY
                if roll < 0.2
                else VerdictCode.ASK
                if roll < 0.5
                else VerdictCode.RUN
            )
            yield Decision(
                call=call,
                session=session,
                tool="read_file",
                arguments=arguments,
                verdict=verdict,
                reason=Reason.NO_GRANT if verdict is VerdictCode.DENY else None,
                grant=None if verdict is VerdictCode.DENY else "read-notes",
                taint=Taint.INTERNAL,
                untrusted=False,
                boot=boot,
            )
            if verdict is VerdictCode.DENY:
                continue
            if verdict is VerdictCode.ASK:
                outcome = rng.choice(list(ApprovalOutcome))
                yield Approval(
                    call=call,
                    approval="a-" + rng.randbytes(4).hex(),
                    outcome=outcome,
                    reason=None,
                    by=ApprovalBy.OWNER,
                    taint=Taint.INTERNAL,
                    untrusted=False,
                )
                if outcome not in (ApprovalOutcome.ASK, ApprovalOutcome.ALLOWED):
                    continue
            size = rng.randint(0, 65536)
            yield Result(
                call=call,
                status=ResultStatus.OK,
                reason=None,
                label=Label(Taint.INTERNAL, False),
                taint_after=Taint.INTERNAL,
                untrusted_after=False,
                output_sha256=rng.randbytes(32).hex(),
                output_bytes=size,
            )
        yield Stop(boot=boot)


def build(path: Path, records: int) -> None:
    rng = random.Random(5)
    for data in GRANTS_VERSIONS:
        keep(policies_dir(path), data)
    moment = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    prev = GENESIS_PREV
    with path.open("wb") as file:
        for seq, body in zip(range(records), _bodies(rng), strict=False):
            line = encode_line(seq, format_utc(moment + dt.timedelta(seconds=seq)), prev, body)
            prev = line_hash(line)
            file.write(line + b"\n")


def raw_loop(path: Path, *, tree: bool = True) -> int:
    sha256, loads, count = hashlib.sha256, orjson.loads, 0
    edge: list[bytes] = []
    with path.open("rb", buffering=READ_BUFFER) as file:
        for line in file:
            sha256(line).hexdigest()
            loads(line)
            if tree:
                leaf = sha256(b"\x00" + line).digest()
                carry = count
                while carry & 1:
                    leaf = sha256(b"\x01" + edge.pop() + leaf).digest()
                    carry >>= 1
                edge.append(leaf)
            count += 1
    return count


def best_of(runs: int, work: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - started)
    return best


def main() -> int:
    records = int(sys.argv[1]) if len(sys.argv) > 1 else RECORDS
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "audit.jsonl"
        build(path, records)
        report = verify_file(path)
        if not report.sound:
            print(f"the benchmark ledger does not verify: {report.problems[0]}")
            return 1
        raw = best_of(3, lambda: raw_loop(path))
        bare = best_of(3, lambda: raw_loop(path, tree=False))
        verify = best_of(3, lambda: verify_file(path))
        size = path.stat().st_size
    ratio = raw / verify
    print(f"records: {records} ({size / records:.0f} bytes a line)")
    print(f"calls: {report.calls}")
    print(f"policy records: {len(report.policies)} (their kept versions checked)")
    print(f"raw hash+parse, no tree: {records / bare:,.0f} records/s")
    print(f"raw hash+parse+tree: {records / raw:,.0f} records/s")
    print(f"verify_file:    {records / verify:,.0f} records/s")
    print(f"ratio: {ratio:.2f} (target {TARGET:.2f}) {'ok' if ratio >= TARGET else 'BELOW TARGET'}")
    return 0 if ratio >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
