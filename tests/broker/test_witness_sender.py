"""brokerd's witness sender (broker/witnesses.py) against answers a witness could give,
through httpx's mock transport (real time: the tiles are read in a worker thread,
which trio's autojump clock does not wait for): what it refuses to keep, the
backoff, and the hook that never blocks nor takes a note that is not the ledger's."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import trio
from tests.harness.process import START_S
from tests.harness.witness import WITNESS_NAME, MemoryLog, seeded_key

from boxmaker.broker.witnesses import Backoff, WitnessSender
from boxmaker.home.config import WitnessConfig
from boxmaker.ledger.cosignatures import cosignature_path
from boxmaker.ledger.signed_note import NoteSigner, cosign
from boxmaker.ledger.witness_protocol import parse_add_checkpoint

WITNESS = NoteSigner(WITNESS_NAME, seeded_key(9))
CONFIG = WitnessConfig(
    name="w1", vkey=WITNESS.cosignature_verifier.vkey, url="http://witness.test/sub", timeout=1.0
)


def sender_with(
    tmp_path: Path, ledger: MemoryLog, answer: Callable[[httpx.Request], httpx.Response]
) -> WitnessSender:
    ledger.write_tiles(tmp_path / "tree", 50)
    client = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    return WitnessSender(
        [CONFIG],
        tmp_path / "tree",
        ledger.signer.verifier,
        client=client,
        backoff=Backoff(0.01, 0.05),
    )


async def run_until(
    sender: WitnessSender, done: Callable[[], bool], note: bytes, size: int
) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        sender.checkpointed(note, size)
        with trio.fail_after(START_S):
            while not done():
                await sender.progressed.wait()
        nursery.cancel_scope.cancel()


def test_the_backoff_doubles_up_to_its_most() -> None:
    assert [Backoff(1, 8).after(n) for n in range(1, 7)] == [1, 2, 4, 8, 8, 8]


async def test_a_cosignature_by_another_key_is_not_kept(tmp_path: Path) -> None:
    ledger = MemoryLog()
    impostor = NoteSigner(WITNESS_NAME, seeded_key(66))

    def answer(request: httpx.Request) -> httpx.Response:
        assert request.url == "http://witness.test/sub/add-checkpoint"
        assert parse_add_checkpoint(request.content).note == ledger.note(30)
        text = ledger.text(30)
        return httpx.Response(200, content=cosign(text, impostor, 5).encode())

    sender = sender_with(tmp_path, ledger, answer)
    await run_until(sender, lambda: sender.links[0].failures >= 3, ledger.note(30), 30)
    assert sender.links[0].last_problem == "bad_answer"
    assert sender.links[0].cosigned_size is None
    assert not cosignature_path(tmp_path / "tree", "w1").exists()


async def test_a_witness_ahead_of_the_ledger_is_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ledger = MemoryLog()

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(409, content=b"45\n", headers={"content-type": "text/x.tlog.size"})

    sender = sender_with(tmp_path, ledger, answer)
    await run_until(sender, lambda: sender.links[0].failures >= 1, ledger.note(30), 30)
    assert sender.links[0].last_problem == "witness_ahead"
    assert "the witness has size 45, beyond this ledger's newest checkpoint 30" in caplog.text


async def test_a_409_of_another_type_is_a_bad_answer(tmp_path: Path) -> None:
    ledger = MemoryLog()

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(409, content=b"5\n", headers={"content-type": "text/plain"})

    sender = sender_with(tmp_path, ledger, answer)
    await run_until(sender, lambda: sender.links[0].failures >= 1, ledger.note(30), 30)
    assert sender.links[0].last_problem == "bad_answer"


async def test_a_refusal_waits_for_the_next_checkpoint(tmp_path: Path) -> None:
    ledger = MemoryLog()
    times: list[float] = []

    def answer(request: httpx.Request) -> httpx.Response:
        times.append(trio.current_time())
        return httpx.Response(503, content=b"busy\n")

    sender = sender_with(tmp_path, ledger, answer)
    await run_until(sender, lambda: sender.links[0].failures >= 1, ledger.note(30), 30)
    # A refusal waits for the next checkpoint: no retry loop against a witness that
    # answers, only against one that does not (unreachable, timeout).
    assert sender.links[0].last_problem == "refused_503"
    assert len(times) == 1


def test_the_hook_drops_a_note_that_is_not_the_ledgers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, "boxmaker.brokerd.witness")
    ledger = MemoryLog()
    sender = WitnessSender([CONFIG], tmp_path, ledger.signer.verifier)
    other = MemoryLog(signer=NoteSigner(ledger.signer.name, seeded_key(5)))
    sender.checkpointed(other.note(3), 3)
    sender.checkpointed(ledger.note(3), 4)
    assert not sender.links[0].wake.is_set()
    assert "a checkpoint not sent to witnesses: not_verified" in caplog.text
    assert "a checkpoint of size 3 handed over as size 4" in caplog.text
    sender.checkpointed(ledger.note(9), 9)
    sender.checkpointed(ledger.note(5), 5)
    assert sender.links[0].wake.is_set()
    assert sender.lag(sender.links[0]) is None
    sender.links[0].cosigned_size = 2
    assert sender.lag(sender.links[0]) == 7


def test_a_witness_lags_only_past_witness_max_lag(tmp_path: Path) -> None:
    ledger = MemoryLog()
    sender = WitnessSender([CONFIG], tmp_path, ledger.signer.verifier, max_lag=10, start_size=5)
    link = sender.links[0]
    # Never cosigned: behind by what was checkpointed since brokerd's start (size 5).
    assert (sender.behind(link), sender.lagging()) == (0, None)
    sender.checkpointed(ledger.note(15), 15)
    assert (sender.behind(link), sender.lagging()) == (10, None)  # equal: not lagging
    sender.checkpointed(ledger.note(16), 16)
    assert sender.behind(link) == 11
    assert sender.lagging() == (
        "witness w1 is 11 records behind the ledger's newest checkpoint (it never "
        "cosigned this ledger), more than witness_max_lag 10: risky calls are denied "
        "until it cosigns; see docs/runbook.md#witness"
    )
    link.cosigned_size, link.last_problem = 6, "refused_422"
    assert (sender.behind(link), sender.lagging()) == (10, None)
    link.cosigned_size = 5
    assert sender.lagging() == (
        "witness w1 is 11 records behind the ledger's newest checkpoint (it last cosigned "
        "size 5, its last answer: refused_422), more than witness_max_lag 10: risky calls "
        "are denied until it cosigns; see docs/runbook.md#witness"
    )
    link.cosigned_size = 16
    assert (sender.behind(link), sender.lagging()) == (0, None)
