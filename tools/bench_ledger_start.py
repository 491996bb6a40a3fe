"""brokerd's start on a large ledger (docs/performance.md, "Ledger start").

Generates ledgers of 1,000,000 and 10,000,000 records (tests/harness/ledger_gen.py:
canonical lines, real chain hashes, a signed checkpoint every 1,000 records, the tree's
tiles), cached under /tmp between runs (the 10,000,000 takes minutes and ~3 GB), then
measures brokerd's start on each, in a fresh child process: ``_prepare`` (config, home,
the ledger's tail, the key, the verification from the newest checkpoint and the tree)
timed, best of 3, and the child's peak memory (ru_maxrss). Targets: ≤ 1 s at both
sizes, the memory flat (the larger within 10% of the smaller). For comparison, the full
verification of the 1,000,000 ledger is timed once.

Run: ``python tools/bench_ledger_start.py [RECORDS ...]``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.harness.ledger_gen import write_ledger  # noqa: E402

from boxmaker.home.paths import Home  # noqa: E402
from boxmaker.ledger.checkpoint import ledger_origin  # noqa: E402
from boxmaker.ledger.ledger_key import create_ledger_key, load_ledger_signer  # noqa: E402
from boxmaker.ledger.verify_files import verify_file  # noqa: E402

SIZES = (1_000_000, 10_000_000)
TARGET_S = 1.0
FLAT = 1.10
CACHE = Path("/tmp/boxmaker-bench-start")
GENERATOR_VERSION = 1
"""Raised when the generator's output changes, so a cached ledger is made again."""
CONFIG = "[broker]\npending_timeout = 30\n[ledger]\ncheckpoint_every = 1000\n"

CHILD = """
import json, logging, resource, sys, time
logging.basicConfig(level=logging.INFO)
from pathlib import Path
from boxmaker.broker.serve import _prepare
from boxmaker.home.paths import Home
from boxmaker.ledger.writer import OsLedgerFile
from boxmaker.runtime.threads import WORKER_THREAD
home = Home(Path(sys.argv[1]))
started = time.perf_counter()
prepared = _prepare(home, repair_torn=False, open_file=OsLedgerFile.open, to_thread=WORKER_THREAD)
took = time.perf_counter() - started
assert prepared.signed is not None and prepared.signed[1].size == prepared.tail.next_seq
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"seconds": took, "maxrss_kib": rss}))
"""


def ledger_home(records: int) -> Home:
    """The cached home with a generated ledger of ``records`` records (made when
    missing or made by another generator version)."""
    root = CACHE / f"{records}"
    done = root / f"generated-v{GENERATOR_VERSION}"
    home = Home(root / "home")
    if done.exists():
        return home
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    home.create()
    home.config_toml.write_text(CONFIG, encoding="utf-8")
    home.grants_toml.write_text("", encoding="utf-8")
    origin = ledger_origin(f"l-bench{records}")
    create_ledger_key(home, origin)
    started = time.perf_counter()
    generated = write_ledger(home.ledger_dir, records, load_ledger_signer(home, origin))
    print(f"generated {generated.records:,} records in {time.perf_counter() - started:.0f} s")
    done.touch()
    return home


def start_once(home: Home) -> tuple[float, int]:
    """One start in a fresh process: (seconds, peak memory in KiB)."""
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(home.root)],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    if "verified from checkpoint" not in out.stderr:
        raise SystemExit(f"the start did not take the fast path: {out.stderr[-2000:]}")
    return figures["seconds"], figures["maxrss_kib"]


def main() -> int:
    sizes = tuple(int(arg) for arg in sys.argv[1:]) or SIZES
    results: dict[int, tuple[float, int]] = {}
    for records in sizes:
        home = ledger_home(records)
        runs = [start_once(home) for _ in range(3)]
        results[records] = (min(s for s, _ in runs), max(m for _, m in runs))
        size = home.audit_log.stat().st_size
        seconds, kib = results[records]
        print(
            f"{records:>12,} records ({size / 2**30:.2f} GiB): start {seconds:.3f} s "
            f"(best of 3), peak memory {kib / 1024:.1f} MiB"
        )
    first = sizes[0]
    started = time.perf_counter()
    report = verify_file(ledger_home(first).audit_log)
    print(
        f"for comparison, the full verification of {first:,} records: "
        f"{time.perf_counter() - started:.1f} s (sound: {report.sound})"
    )
    ok = all(seconds <= TARGET_S for seconds, _ in results.values())
    memory = [kib for _, kib in results.values()]
    flat = max(memory) <= FLAT * min(memory)
    print(f"start ≤ {TARGET_S:.0f} s at every size: {'ok' if ok else 'MISSED'}")
    print(f"memory flat (within {FLAT - 1:.0%}): {'ok' if flat else 'MISSED'}")
    return 0 if ok and flat else 1


if __name__ == "__main__":
    sys.exit(main())
