"""brokerd killed with SIGKILL after records its checkpoint does not cover, then started
again (docs/protocol.md, "Verifying"): it starts from the newest checkpoint, the call
left open stays refused, the ledger verifies sound and its tree's tiles are whole.
With the tiles written ahead of the checkpoint record (a kill between the two, made
here by writing them as the writer's flush would), the same. Real processes, every
wait bounded."""

from __future__ import annotations

import re
import signal

import pytest
from tests.harness.broker import PENDING_TIMEOUT, records, tool_request
from tests.harness.homes import grant, write_config, write_grants
from tests.harness.process import Daemon, connect, read_frame, send, start

from boxmaker.home.paths import Home
from boxmaker.ledger.ledger_key import read_ledger_origin
from boxmaker.ledger.merkle import Frontier
from boxmaker.ledger.signed_note import parse_vkey
from boxmaker.ledger.tiles import TileStore
from boxmaker.ledger.tree import LedgerTree, tree_dir
from boxmaker.ledger.verify_files import verify_file

pytestmark = pytest.mark.slow

EVERY = 4


def denied_calls(home: Home, count: int) -> None:
    for _ in range(count):
        with connect(home.broker_sock) as sock:
            send(sock, tool_request("write_file", {"path": "x", "content": "y"}))
            assert read_frame(sock)["kind"] == "answer"


@pytest.mark.parametrize("tiles_ahead", [False, True])
def test_a_kill_after_records_no_checkpoint_covers_then_a_fast_restart(
    home: Home, daemons: list[Daemon], tiles_ahead: bool
) -> None:
    write_config(
        home,
        f"[broker]\npending_timeout = {PENDING_TIMEOUT * 100}\n"
        f"[ledger]\ncheckpoint_every = {EVERY}\n",
    )
    write_grants(home, grant("notes", "read_file", "ask"))
    daemon = start(daemons, home)
    # start, policy and 2 * EVERY decisions make two checkpoints and leave two records
    # over: with the pending call's decision three, short of the next checkpoint, so
    # none can race the kill (the writer appends a due one after answering).
    denied_calls(home, 2 * EVERY)
    frame = tool_request("read_file", {"path": "notes.txt"})
    with connect(home.broker_sock) as sock:
        send(sock, frame)
        assert read_frame(sock)["kind"] == "pending"
        daemon.kill()
    kinds = [record["kind"] for record in records(home)]
    last = max(seq for seq, kind in enumerate(kinds) if kind == "checkpoint")
    assert kinds[-1] == "decision"
    assert last < len(kinds) - 2  # records after the newest checkpoint
    assert TileStore(tree_dir(home)).size == last
    if tiles_ahead:
        tree = LedgerTree.resume(TileStore(tree_dir(home)), last)
        tree.add(home.audit_log.read_bytes().split(b"\n")[last:-1])
        tree.flush()
        assert TileStore(tree_dir(home)).size == len(kinds)

    second = start(daemons, home)
    logged = re.search(r"ledger verified from checkpoint seq (\d+): (\d+) record", second.stderr())
    assert logged is not None, second.stderr()
    assert (int(logged[1]), int(logged[2])) == (last, len(kinds) - last - 1)
    with connect(home.broker_sock) as sock:
        send(sock, frame)
        assert read_frame(sock)["detail"] == "call id already used"
    second.process.send_signal(signal.SIGTERM)
    assert second.wait() == 0

    verifier = parse_vkey(home.ledger_vkey.read_text().strip())
    assert verifier.name == read_ledger_origin(home.audit_log)
    report = verify_file(home.audit_log, verifier=verifier)
    assert report.sound, report.problems
    assert report.open_calls == {frame["call"]}
    assert (report.tiles_sound, report.signatures_checked) == (True, True)
    store = TileStore(tree_dir(home))
    assert store.size == report.records  # flushed once more at the clean close
    assert report.checkpoints == kinds.count("checkpoint") + 1
    assert Frontier.at(store.size, store).size == store.size
