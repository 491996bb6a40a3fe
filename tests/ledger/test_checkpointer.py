"""Checkpoints made by the ledger writer (ledger/checkpointer.py): after every N records,
after T seconds with records, none for a quiet ledger, one at a clean close; each one's
record has its own seq as size and the root of the lines before it, a note that
verifies with the ledger key and says the same, the open calls with their phases, and
a position file that finds its line; a failed tile write or signature skips one
checkpoint and the ledger goes on."""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import orjson
import pytest
import trio
import trio.testing
from tests.harness.broker import inline
from tests.ledger.test_ledger_verify import approval, decision, result

from boxmaker.home.file_ops import OsFileOps
from boxmaker.home.paths import Home
from boxmaker.ledger.checkpoint import Checkpoint, parse_checkpoint
from boxmaker.ledger.checkpointer import Checkpointer, read_position
from boxmaker.ledger.ledger_key import read_ledger_origin
from boxmaker.ledger.live_file import open_ledger
from boxmaker.ledger.merkle import Frontier, Hash, tree_hash
from boxmaker.ledger.open_calls import OpenCalls
from boxmaker.ledger.records import Body, CallPhase, Start, Stop, line_hash
from boxmaker.ledger.signed_note import Ed25519PrivateKey, NoteSigner, open_note
from boxmaker.ledger.tiles import TileStore
from boxmaker.ledger.tree import LedgerTree, open_tree, tree_dir
from boxmaker.ledger.verify_files import verify_file
from boxmaker.ledger.writer import LedgerWriter, LiveSealer, OsLedgerFile

NOW = dt.datetime(2026, 3, 4, 5, 6, 7, 890000, tzinfo=dt.UTC)
BOOT = "b-1"
GUARD = 10_000  # seconds of the autojump clock: a hung writer fails the test


def _mth(lines: list[bytes]) -> Hash:
    """RFC 6962's MTH written out (as tests/ledger/test_tree.py holds the tree to it)."""
    if len(lines) == 1:
        return hashlib.sha256(b"\x00" + lines[0]).digest()
    k = 1
    while k * 2 < len(lines):
        k *= 2
    return hashlib.sha256(b"\x01" + _mth(lines[:k]) + _mth(lines[k:])).digest()


class FailingKey:
    """A signing key that fails while ``failing`` (a key store gone away)."""

    def __init__(self) -> None:
        self.real = Ed25519PrivateKey.generate()
        self.failing = False

    def public_key(self) -> Any:
        return self.real.public_key()

    def sign(self, data: bytes) -> bytes:
        if self.failing:
            raise RuntimeError("the signing key is unavailable")
        return self.real.sign(data)


class FailingFsync(OsFileOps):
    def __init__(self) -> None:
        self.failing = False

    def fsync(self, fd: int) -> None:
        if self.failing:
            raise OSError(5, "Input/output error")
        super().fsync(fd)


@attrs.define
class Ledger:
    home: Home
    writer: LedgerWriter
    checkpointer: Checkpointer
    signer: NoteSigner
    hooked: list[tuple[bytes, int]]

    def lines(self) -> list[bytes]:
        return self.home.audit_log.read_bytes().splitlines()

    def records(self) -> list[dict[str, Any]]:
        return [orjson.loads(line) for line in self.lines()]

    def checkpoints(self) -> list[dict[str, Any]]:
        return [record for record in self.records() if record["kind"] == "checkpoint"]

    async def append(self, *bodies: Body) -> None:
        """Append one by one, then let the writer finish what a record made due."""
        for body in bodies:
            await self.writer.append(body)
        await trio.testing.wait_all_tasks_blocked()


@asynccontextmanager
async def ledger(
    tmp_path: Path,
    *,
    every: int = 1000,
    seconds: float = 60.0,
    unfinished: tuple[str, ...] = (),
    key: Any = None,
    tile_files: OsFileOps | None = None,
    sealer: LiveSealer | None = None,
) -> AsyncIterator[Ledger]:
    """A new ledger with its writer running (sealed by ``sealer``: ledger/seal.py);
    closed cleanly at the end of the block."""
    home = Home(tmp_path / "home")
    tail = open_ledger(home.audit_log, now=NOW)
    tree = open_tree(home, tail.next_seq)
    if tile_files is not None:
        store = TileStore(tree_dir(home), tile_files)
        tree = LedgerTree(store, Frontier.at(store.size, store))
    signer = NoteSigner(read_ledger_origin(home.audit_log), key or Ed25519PrivateKey.generate())
    hooked: list[tuple[bytes, int]] = []
    checkpointer = Checkpointer(
        tree,
        signer,
        boot=BOOT,
        open_calls=OpenCalls(BOOT, unfinished=unfinished),
        directory=tree_dir(home),
        every=every,
        seconds=seconds,
        on_checkpoint=lambda note, size: hooked.append((note, size)),
        to_thread=inline,
    )
    writer = LedgerWriter(
        OsLedgerFile.open(home.audit_log),
        tail,
        clock=lambda: NOW,
        to_thread=inline,
        checkpointer=checkpointer,
        end=home.audit_log.stat().st_size,
        sealer=sealer,
    )
    with trio.fail_after(GUARD):
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            yield Ledger(home, writer, checkpointer, signer, hooked)
            await writer.aclose()


def check_checkpoint(ledger: Ledger, record: dict[str, Any]) -> None:
    """What every checkpoint record must be, against the ledger as written."""
    lines = ledger.lines()
    size = record["size"]
    assert size == record["seq"]
    root = _mth(lines[:size])
    assert record["root"] == root.hex()
    assert record["boot"] == BOOT
    text, names = open_note(record["note"].encode(), [ledger.signer.verifier])
    assert names == (ledger.signer.name,)
    assert parse_checkpoint(text) == Checkpoint(ledger.signer.name, size, root)
    assert ledger.signer.name == read_ledger_origin(ledger.home.audit_log)


def check_files(ledger: Ledger, record: dict[str, Any]) -> None:
    """ledger/tree/ holds the record's note, its position, and tiles of its size or more."""
    directory = tree_dir(ledger.home)
    assert (directory / "checkpoint").read_bytes() == record["note"].encode()
    position = read_position(directory / "checkpoint.pos")
    with ledger.home.audit_log.open("rb") as file:
        file.seek(position.offset)
        line = file.readline().removesuffix(b"\n")
    assert orjson.loads(line) == record
    assert (position.seq, position.sha256) == (record["seq"], line_hash(line))
    store = TileStore(directory)
    assert store.size >= record["size"]
    assert tree_hash(record["size"], store).hex() == record["root"]


async def test_a_checkpoint_after_every_n_records(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with ledger(tmp_path, every=5) as book:
        await book.append(*(Start(boot=BOOT, version="1") for _ in range(12)))
        assert [record["size"] for record in book.checkpoints()] == [6, 12]
        assert [size for _, size in book.hooked] == [6, 12]
        for record in book.checkpoints():
            check_checkpoint(book, record)
        check_files(book, book.checkpoints()[-1])
        assert book.hooked[-1][0] == book.checkpoints()[-1]["note"].encode()
    # 1 + 12 records and 2 checkpoints; the close adds one for the last record.
    assert [record["size"] for record in book.checkpoints()] == [6, 12, 15]
    assert book.records()[-1]["kind"] == "checkpoint"
    check_checkpoint(book, book.checkpoints()[-1])
    check_files(book, book.checkpoints()[-1])
    assert verify_file(book.home.audit_log).sound


async def test_a_checkpoint_t_seconds_after_a_record_and_none_when_quiet(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with ledger(tmp_path, seconds=60.0) as book:
        await trio.sleep(600)
        assert book.checkpoints() == []  # only genesis, which no writer wrote
        await book.append(Start(boot=BOOT, version="1"))
        await trio.sleep(59.9)
        assert book.checkpoints() == []
        await trio.sleep(0.2)
        assert [record["size"] for record in book.checkpoints()] == [2]
        check_checkpoint(book, book.checkpoints()[0])
        await trio.sleep(3600)
        assert len(book.checkpoints()) == 1  # its own record is no new record
    # Nothing new since: the close adds none.
    assert len(book.checkpoints()) == 1
    check_files(book, book.checkpoints()[0])


async def test_one_checkpoint_at_a_clean_close(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with ledger(tmp_path) as book:
        await book.append(Start(boot=BOOT, version="1"), Stop(boot=BOOT))
        assert book.checkpoints() == []
    assert [record["kind"] for record in book.records()] == [
        "genesis",
        "start",
        "stop",
        "checkpoint",
    ]
    check_checkpoint(book, book.checkpoints()[0])
    check_files(book, book.checkpoints()[0])
    assert book.hooked == [(book.checkpoints()[0]["note"].encode(), 3)]
    # The tiles hold the checkpoint's own line too: the next start resumes from them.
    assert TileStore(tree_dir(book.home)).size == len(book.lines()) == 4
    lines = book.lines()
    book.home.audit_log.unlink()  # a rebuild would need the lines: resumed, it does not
    assert open_tree(book.home, 4).root() == _mth(lines)


async def test_the_open_calls_and_their_phases(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with ledger(tmp_path, every=13, unfinished=("c-00000000000000ff",)) as book:
        await book.append(
            Start(boot=BOOT, version="1"),
            decision("c-0000000000000001", "run"),
            decision("c-0000000000000002", "ask"),
            decision("c-0000000000000003", "ask"),
            approval("c-0000000000000003", "allowed"),
            decision("c-0000000000000004", "run"),
            result("c-0000000000000004"),
            decision("c-0000000000000005", "ask"),
            approval("c-0000000000000005", "refused"),
            decision("c-0000000000000006", "deny"),
            decision("c-0000000000000007", "ask"),
            approval("c-0000000000000007", "ask"),
            result("c-0000000000000007", "failed"),
        )
        [first] = book.checkpoints()
        assert first["open_calls"] == {
            "c-0000000000000001": CallPhase.RUNNING,
            "c-0000000000000002": CallPhase.ASKED,
            "c-0000000000000003": CallPhase.APPROVED,
        }
        assert first["unfinished"] == ["c-00000000000000ff"]
        await book.append(result("c-0000000000000001"), Stop(boot=BOOT))
    last = book.checkpoints()[-1]
    # After the boot's stop nobody will end its calls: unfinished, as verify counts them.
    assert (last["open_calls"], last["unfinished"]) == (
        {},
        ["c-0000000000000002", "c-0000000000000003", "c-00000000000000ff"],
    )


@pytest.mark.parametrize("failing", ["tiles", "signature"])
async def test_a_failed_tile_write_or_signature_skips_the_checkpoint_only(
    autojump_clock: trio.testing.MockClock,
    tmp_path: Path,
    failing: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    key, files = FailingKey(), FailingFsync()

    def fail(on: bool) -> None:
        (files if failing == "tiles" else key).failing = on

    caplog.set_level(logging.ERROR, "boxmaker.ledger")
    async with ledger(tmp_path, every=3, key=key, tile_files=files) as book:
        fail(True)
        await book.append(*(Start(boot=BOOT, version="1") for _ in range(4)))
        assert book.checkpoints() == []
        assert book.writer.usable
        assert book.checkpointer.skipped == 1
        what = "tiles could not be written" if failing == "tiles" else "could not be signed"
        assert [what in message for message in caplog.messages] == [True]
        assert not (tree_dir(book.home) / "checkpoint").exists()
        fail(False)
        await book.append(*(Start(boot=BOOT, version="1") for _ in range(3)))
        # Three records after the skipped try: the next one covers every line.
        assert [record["size"] for record in book.checkpoints()] == [7]
        check_checkpoint(book, book.checkpoints()[0])
        check_files(book, book.checkpoints()[0])
    assert verify_file(book.home.audit_log).sound
