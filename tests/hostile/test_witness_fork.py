"""An attacker who holds the owner's account rewrites the ledger (a fork: the same
origin and key, other records) or replaces the ledger key, then shows the new ledger's
checkpoints to the owner's witness (``bxctl witness serve``, a real process, as another
user would run it). The witness must refuse both and keep what it cosigned; brokerd's
sender must log the refusal with its runbook entry (docs/threat-model.md)."""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
import trio
from tests.harness.process import START_S
from tests.harness.witness import ORIGIN, MemoryLog, WitnessProcess, seeded_key

from boxmaker.broker.witnesses import WitnessSender
from boxmaker.home.config import WitnessConfig
from boxmaker.ledger.signed_note import NoteSigner
from boxmaker.ledger.witness_protocol import AddCheckpoint, format_add_checkpoint

pytestmark = pytest.mark.slow


@pytest.fixture
def honest() -> MemoryLog:
    return MemoryLog()


@pytest.fixture
def witness(tmp_path: Path, honest: MemoryLog) -> Iterator[WitnessProcess]:
    process = WitnessProcess(tmp_path, f"{ORIGIN}={honest.signer.vkey}")
    try:
        process.wait_ready()
        answer = post(process, honest, 17, 0)
        assert answer.status_code == 200, answer.text
        yield process
    finally:
        process.kill()


def post(witness: WitnessProcess, ledger: MemoryLog, size: int, old: int) -> httpx.Response:
    body = format_add_checkpoint(AddCheckpoint(old, ledger.proof(size, old), ledger.note(size)))
    return httpx.post(f"{witness.url}/add-checkpoint", content=body, timeout=START_S)


def cosigned_head(witness: WitnessProcess) -> dict[str, object]:
    head: dict[str, object] = orjson.loads(witness.state.read_bytes())["logs"][ORIGIN]
    return head


def honest_head(honest: MemoryLog) -> dict[str, object]:
    return {"size": 17, "root": base64.b64encode(honest.root(17)).decode()}


@pytest.mark.parametrize("size", [17, 40])
def test_a_forked_ledger_is_refused_by_the_witness(
    witness: WitnessProcess, honest: MemoryLog, size: int
) -> None:
    forked = MemoryLog(signer=honest.signer, tag="rewritten")
    assert forked.root(size) != honest.root(size)
    answer = post(witness, forked, size, 17)
    # The attack reached the witness, signed by the right key: only the tree is wrong.
    assert answer.status_code == 422
    problem = "fork" if size == 17 else "bad_proof"
    assert answer.text.startswith(f"{problem}: ")
    assert f"add-checkpoint refused: 422 {problem} (origin {ORIGIN})" in witness.stderr()
    assert cosigned_head(witness) == honest_head(honest)
    # The honest ledger goes on being cosigned.
    assert post(witness, honest, 40, 17).status_code == 200


def test_a_fork_from_size_zero_is_a_409_not_a_cosignature(
    witness: WitnessProcess, honest: MemoryLog
) -> None:
    forked = MemoryLog(signer=honest.signer, tag="rewritten")
    answer = post(witness, forked, 40, 0)
    assert (answer.status_code, answer.content) == (409, b"17\n")
    assert cosigned_head(witness) == honest_head(honest)


def test_a_replaced_ledger_key_is_refused(witness: WitnessProcess, honest: MemoryLog) -> None:
    replaced = MemoryLog(signer=NoteSigner(ORIGIN, seeded_key(77)))
    answer = post(witness, replaced, 17, 17)
    assert answer.status_code == 403
    assert answer.text.startswith("not_signed: the checkpoint note: not_verified")
    assert "add-checkpoint refused: 403 not_signed" in witness.stderr()
    # Even a true extension of the honest tree, signed by the new key, is refused.
    resigned = MemoryLog(signer=replaced.signer, tag=honest.tag)
    assert resigned.root(40) == honest.root(40)
    assert post(witness, resigned, 40, 17).status_code == 403
    assert cosigned_head(witness) == honest_head(honest)


async def test_brokerd_logs_the_witness_refusing_its_fork(
    tmp_path: Path,
    witness: WitnessProcess,
    honest: MemoryLog,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "boxmaker.brokerd.witness")
    forked = MemoryLog(signer=honest.signer, tag="rewritten")
    tree = tmp_path / "tree"
    forked.write_tiles(tree, 40)
    config = WitnessConfig(name="w1", vkey=witness.vkey, url=witness.url, timeout=5.0)
    sender = WitnessSender([config], tree, forked.signer.verifier)
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        sender.checkpointed(forked.note(40), 40)
        with trio.fail_after(START_S):
            while sender.links[0].last_problem is None:
                await sender.progressed.wait()
        nursery.cancel_scope.cancel()
    # A 409 taught it the witness's size 17, then the proof from 17 was refused.
    assert sender.links[0].last_problem == "refused_422"
    assert sender.links[0].cosigned_size is None
    assert (
        "witness w1: no cosignature (attempt 1): refused_422: bad_proof: no consistency "
        "from size 17 to 40" in caplog.text
    )
    assert "see docs/runbook.md#witness-fork" in caplog.text
    assert cosigned_head(witness) == honest_head(honest)
