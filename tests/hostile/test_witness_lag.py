"""Someone with the owner's account rewrote the ledger (the same origin and key, other
records), so the owner's witness (``bxctl witness serve``, a real process) refuses its
checkpoints (422). With ``[ledger] witness_lag = "deny_risky"`` brokerd then runs no
risky call: a write_file is denied ``witness_lagging`` and nothing is written
(docs/threat-model.md)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
import trio
from tests.harness.broker import Brokerd, call, records_of, tool_request
from tests.harness.homes import grant, write_config, write_grants
from tests.harness.process import START_S
from tests.harness.witness import MemoryLog, WitnessProcess

from boxmaker.home.paths import Home
from boxmaker.ledger.ledger_key import load_ledger_signer, read_ledger_origin
from boxmaker.ledger.witness_protocol import AddCheckpoint, format_add_checkpoint

pytestmark = pytest.mark.slow


@pytest.fixture
def witness_dir(tmp_path: Path) -> Iterator[list[WitnessProcess]]:
    started: list[WitnessProcess] = []
    yield started
    for witness in started:
        witness.kill()


async def test_a_rewritten_ledger_gets_no_risky_call_run(
    home: Home, brokerd: Brokerd, tmp_path: Path, witness_dir: list[WitnessProcess]
) -> None:
    write_grants(home, grant("r", "read_file", "auto") + grant("w", "write_file", "auto"))
    (home.default_workspace / "notes.txt").write_text("notes\n")
    await brokerd.start()  # the ledger and its key
    await brokerd.stop()
    origin = read_ledger_origin(home.audit_log)
    # What the witness cosigned before the rewrite: size 2 of other records.
    honest = MemoryLog(signer=load_ledger_signer(home, origin), tag="the owner's")
    witness = WitnessProcess(tmp_path, f"{origin}={honest.signer.vkey}")
    witness_dir.append(witness)
    witness.wait_ready()
    body = format_add_checkpoint(AddCheckpoint(0, (), honest.note(2)))
    async with httpx.AsyncClient(timeout=START_S) as client:
        first = await client.post(f"{witness.url}/add-checkpoint", content=body)
    assert first.status_code == 200, first.text
    held = {"size": 2, "root": base64.b64encode(honest.root(2)).decode()}
    table = f'\n[[witness]]\nname = "w1"\nvkey = "{witness.vkey}"\nurl = "{witness.url}"\n'
    ledger = '\n[ledger]\ncheckpoint_every = 2\nwitness_lag = "deny_risky"\nwitness_max_lag = 1\n'
    write_config(home, home.config_toml.read_text() + ledger + table)

    broker = await brokerd.start()
    assert broker.witnesses is not None
    link = broker.witnesses.links[0]
    with trio.fail_after(START_S * 4):
        while link.last_problem != "refused_422" or broker.witness_lagging() is None:
            frames = await call(home, tool_request("read_file", {"path": "notes.txt"}))
            assert frames[-1]["outcome"] == "ok", frames
            await trio.sleep(0.05)
    # The attack ran: the witness saw the rewritten ledger's checkpoint and refused it.
    assert "add-checkpoint refused: 422" in witness.stderr()
    state = orjson.loads(witness.state.read_bytes())["logs"][origin]
    assert state == held
    assert link.cosigned_size is None

    for tool, arguments in (
        ("write_file", {"path": "out.txt", "content": "planted"}),
        ("shell", {"command": "echo planted > out.txt"}),
    ):
        frame = tool_request(tool, arguments)
        answer = (await call(home, frame))[-1]
        assert (answer["outcome"], answer["reason"]) == ("denied", "witness_lagging"), answer
        assert "its last answer: refused_422" in answer["detail"]
        (decision,) = records_of(home, frame["call"])
        assert decision["reason"] == "witness_lagging"
    assert not (home.default_workspace / "out.txt").exists()
