"""brokerd as a process writes signed checkpoints of its ledger's tree: every
``[ledger] checkpoint_every`` records and one last after its stop; the ledger key made
at its start signs them, the tiles under ledger/tree/ give the same root, and
``bxctl audit verify`` finds the ledger sound. Real time, every wait bounded."""

from __future__ import annotations

import signal
import stat
from typing import Any

import pytest
from tests.harness.broker import records, tool_request
from tests.harness.cli import bxctl
from tests.harness.homes import grant, write_config, write_grants
from tests.harness.process import Daemon, connect, read_frame, send, start

from boxmaker.home.paths import Home
from boxmaker.ledger.checkpoint import parse_checkpoint
from boxmaker.ledger.checkpointer import read_position
from boxmaker.ledger.ledger_key import read_ledger_origin
from boxmaker.ledger.merkle import tree_hash
from boxmaker.ledger.signed_note import open_note, parse_vkey
from boxmaker.ledger.tiles import TileStore
from boxmaker.ledger.tree import tree_dir

pytestmark = pytest.mark.slow


def read_notes(home: Home) -> dict[str, Any]:
    frame = tool_request("read_file", {"path": "notes.txt"})
    with connect(home.broker_sock) as sock:
        send(sock, frame)
        return read_frame(sock)


def test_brokerd_signs_checkpoints_and_ends_with_one(home: Home, daemons: list[Daemon]) -> None:
    write_config(home, home.config_toml.read_text() + "[ledger]\ncheckpoint_every = 4\n")
    (home.default_workspace / "notes.txt").write_text("hi")
    write_grants(home, grant("notes", "read_file", "auto"))
    assert not home.ledger_key.exists()
    daemon = start(daemons, home)
    for _ in range(3):
        assert read_notes(home)["outcome"] == "ok"
    daemon.process.send_signal(signal.SIGTERM)
    assert daemon.wait() == 0

    written = records(home)
    checkpoints = [record for record in written if record["kind"] == "checkpoint"]
    # start, policy, 3 x (decision, result), stop: one checkpoint at 4 records, one at 8
    # (the fourth, after it), one after the stop.
    assert [record["size"] for record in checkpoints] == [5, 10, 12]
    last = written[-1]
    assert (last["kind"], last["size"], last["seq"]) == ("checkpoint", 12, 12)
    assert (last["open_calls"], last["unfinished"]) == ({}, [])

    verified = bxctl(home, "audit", "verify")
    assert verified.returncode == 0, verified.stdout

    assert stat.S_IMODE(home.ledger_key.stat().st_mode) == 0o600
    verifier = parse_vkey(home.ledger_vkey.read_text().strip())
    origin = read_ledger_origin(home.audit_log)
    store = TileStore(tree_dir(home))
    assert store.size == len(written)  # the tiles hold every line after a clean stop
    for record in checkpoints:
        text, names = open_note(record["note"].encode(), [verifier])
        assert names == (origin,)
        checkpoint = parse_checkpoint(text)
        assert (checkpoint.origin, checkpoint.size) == (origin, record["size"])
        assert checkpoint.root.hex() == record["root"]
        assert tree_hash(record["size"], store).hex() == record["root"]

    assert (tree_dir(home) / "checkpoint").read_text() == last["note"]
    position = read_position(tree_dir(home) / "checkpoint.pos")
    with home.audit_log.open("rb") as ledger:
        ledger.seek(position.offset)
        assert ledger.readline().startswith(b'{"at":')
        ledger.seek(position.offset)
        assert ledger.read() == home.audit_log.read_bytes().splitlines(keepends=True)[-1]
    assert position.seq == 12
