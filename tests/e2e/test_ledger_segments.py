"""The real brokerd keeps its ledger in files of ``[ledger] segment_records`` lines
(docs/protocol.md, "Segments"): killed with SIGKILL after a seal, it starts again from
the checkpoint that begins the live file, seals on, and stops cleanly; every sealed file
is read-only, named for its lines, holds exactly that many, and (but the first) begins
with the checkpoint of everything before it; all files chain into one sound ledger
whose checkpoints verify with the ledger key and whose tiles hold every line. Real
processes, every wait bounded."""

from __future__ import annotations

import re
import signal

import orjson
import pytest
from tests.e2e.test_ledger_restart import denied_calls
from tests.harness.broker import PENDING_TIMEOUT
from tests.harness.cli import bxctl
from tests.harness.homes import write_config
from tests.harness.process import Daemon, start

from boxmaker.home.paths import Home
from boxmaker.ledger.checkpointer import read_position
from boxmaker.ledger.segments import ledger_files, ledger_lines, segment_name
from boxmaker.ledger.signed_note import parse_vkey
from boxmaker.ledger.tiles import TileStore
from boxmaker.ledger.tree import CHECKPOINT_POS_FILE, tree_dir
from boxmaker.ledger.verify import verify_lines

pytestmark = pytest.mark.slow

SEGMENT = 50


def test_a_segmented_ledger_across_a_kill_and_restarts(home: Home, daemons: list[Daemon]) -> None:
    write_config(
        home,
        f"[broker]\npending_timeout = {PENDING_TIMEOUT * 100}\n"
        f"[ledger]\ncheckpoint_every = 1000\nsegment_records = {SEGMENT}\n",
    )
    daemon = start(daemons, home)
    denied_calls(home, 60)  # genesis, start, policy and 60 decisions: one seal at 50
    daemon.kill()
    assert [p.name for p in ledger_files(home.ledger_dir).paths()] == [
        segment_name(0, SEGMENT - 1),
        "audit.jsonl",
    ]
    assert read_position(tree_dir(home) / CHECKPOINT_POS_FILE).seq == SEGMENT

    second = start(daemons, home)
    logged = re.search(r"ledger verified from checkpoint seq (\d+)", second.stderr())
    assert logged is not None, second.stderr()
    assert int(logged[1]) == SEGMENT  # the fast start, from the live file's first line
    denied_calls(home, 100)
    second.process.send_signal(signal.SIGTERM)
    assert second.wait() == 0

    third = start(daemons, home)  # a clean restart over three segments
    third.process.send_signal(signal.SIGTERM)
    assert third.wait() == 0

    files = ledger_files(home.ledger_dir)
    assert files.archived == 0
    assert len(files.segments) == 3
    for number, segment in enumerate(files.segments):
        first = number * SEGMENT
        assert segment.path.name == segment_name(first, first + SEGMENT - 1)
        assert segment.path.stat().st_mode & 0o777 == 0o444
        lines = segment.path.read_bytes().split(b"\n")
        assert lines[-1] == b""  # ends with a newline
        assert len(lines) - 1 == SEGMENT
        leading = orjson.loads(lines[0])
        if number == 0:
            assert leading["kind"] == "genesis"
        else:
            assert (leading["kind"], leading["seq"], leading["size"]) == (
                "checkpoint",
                first,
                first,
            )
    leading = orjson.loads(files.live.read_bytes().split(b"\n", 1)[0])
    assert (leading["kind"], leading["seq"], leading["size"]) == ("checkpoint", 150, 150)
    assert (home.ledger_dir / "segments").stat().st_mode & 0o777 == 0o700
    assert not (home.ledger_dir / "audit.jsonl.next").exists()

    verifier = parse_vkey(home.ledger_vkey.read_text().strip())
    report = verify_lines(ledger_lines(files), verifier=verifier)
    assert report.sound, report.problems
    assert report.signatures_checked
    kinds = [orjson.loads(line)["kind"] for line in ledger_lines(files)]
    assert kinds.count("decision") == 160
    assert kinds.count("start") == 3
    assert report.records == len(kinds)
    assert TileStore(tree_dir(home)).size == report.records

    # The owner's commands over every file, as the real bxctl runs them.
    verified = bxctl(home, "audit", "verify", "--json")
    summary = orjson.loads(verified.stdout)
    assert (summary["sound"], summary["records"], summary["archived"]) == (
        True,
        report.records,
        0,
    )
    since = bxctl(home, "audit", "verify", "--since-checkpoint")
    assert since.returncode == 0, since.stdout
    shown = bxctl(home, "audit", "show", "--json")
    assert len(shown.stdout.splitlines()) == report.records
