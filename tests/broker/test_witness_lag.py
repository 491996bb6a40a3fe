"""brokerd in process with ``[ledger] witness_lag = "deny_risky"`` and a witness that
never answers or refuses (httpx's mock transport, real time: the sender reads tiles in
worker threads): once it lags, a write_file is denied ``witness_lagging`` (the answer,
the decision record, ``bxctl status``'s field), a read_file still runs; once the witness
cosigns again, the write runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
import trio
from tests.harness.broker import Brokerd, admin, call, records_of, tool_request
from tests.harness.homes import grant, write_config, write_grants
from tests.harness.process import START_S
from tests.harness.witness import WITNESS_NAME, seeded_key

from boxmaker.broker.state import Broker
from boxmaker.home.paths import Home
from boxmaker.ledger.signed_note import NoteSigner, cosign
from boxmaker.ledger.witness_protocol import parse_add_checkpoint

WITNESS = NoteSigner(WITNESS_NAME, seeded_key(9))


def deny_risky_config(home: Home) -> None:
    table = (
        '\n[[witness]]\nname = "w1"\n'
        f'vkey = "{WITNESS.cosignature_verifier.vkey}"\n'
        'url = "http://witness.test"\ntimeout = 0.2\n'
    )
    ledger = '\n[ledger]\ncheckpoint_every = 2\nwitness_lag = "deny_risky"\nwitness_max_lag = 1\n'
    write_config(home, home.config_toml.read_text() + ledger + table)


class Witness:
    """Answers as the test says: ``never`` (no answer: a timeout), ``refuse`` (503),
    ``cosign`` (a valid cosignature)."""

    def __init__(self) -> None:
        self.mode = "never"
        self.requests = 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        if self.mode == "never":
            await trio.sleep_forever()
        if self.mode == "refuse":
            return httpx.Response(503, content=b"busy\n")
        note = parse_add_checkpoint(request.content).note
        text = note[: note.index(b"\n\n") + 1].decode()
        return httpx.Response(200, content=cosign(text, WITNESS, 1).encode())


async def until(predicate: Callable[[], bool], home: Home) -> None:
    """Read calls (each writes records, so checkpoints come) until ``predicate``."""
    with trio.fail_after(START_S * 4):
        while not predicate():
            frames = await call(home, tool_request("read_file", {"path": "notes.txt"}))
            assert frames[-1]["outcome"] == "ok", frames
            await trio.sleep(0.05)


def write(home: Home) -> dict[str, Any]:
    return tool_request("write_file", {"path": "out.txt", "content": "hello"})


@pytest.mark.parametrize("mode", ["never", "refuse"])
async def test_risky_calls_are_denied_while_the_witness_lags(
    home: Home, brokerd: Brokerd, mode: str
) -> None:
    write_grants(home, grant("r", "read_file", "auto") + grant("w", "write_file", "auto"))
    (home.default_workspace / "notes.txt").write_text("notes\n")
    deny_risky_config(home)
    witness = Witness()
    witness.mode = mode
    client = httpx.AsyncClient(transport=httpx.MockTransport(witness))
    broker: Broker = await brokerd.start(witness_client=client)
    assert broker.witnesses is not None
    await until(lambda: broker.witness_lagging() is not None, home)
    link = broker.witnesses.links[0]
    assert link.cosigned_size is None
    assert witness.requests >= 1
    behind = broker.witnesses.behind(link)
    assert behind > 1
    detail = (
        f"witness w1 is {behind} records behind the ledger's newest checkpoint (it never "
        "cosigned this ledger"
    )

    frame = write(home)
    answer = (await call(home, frame))[-1]
    assert (answer["outcome"], answer["reason"]) == ("denied", "witness_lagging"), answer
    assert answer["detail"].startswith(detail)
    assert answer["detail"].endswith(
        "more than witness_max_lag 1: risky calls are denied until it cosigns; "
        "see docs/runbook.md#witness"
    )
    (decision,) = records_of(home, frame["call"])
    assert (decision["kind"], decision["verdict"], decision["reason"]) == (
        "decision",
        "deny",
        "witness_lagging",
    )
    assert decision["grant"] is None
    assert not (home.default_workspace / "out.txt").exists()
    status = await admin(home, {"kind": "status"})
    assert status["witness_lagging"] == answer["detail"]
    # A read-only call goes on.
    read = await call(home, tool_request("read_file", {"path": "notes.txt"}))
    assert read[-1]["outcome"] == "ok"

    witness.mode = "cosign"
    await until(lambda: broker.witness_lagging() is None, home)
    assert link.cosigned_size is not None
    frame = write(home)
    assert (await call(home, frame))[-1]["outcome"] == "ok"
    assert (home.default_workspace / "out.txt").read_text() == "hello"
    # witness_max_lag 1 is below checkpoint_every 2: even a witness that answers at
    # once lags from each checkpoint until it cosigns it (docs/decisions.md).
    with trio.fail_after(START_S):
        while broker.witness_lagging() is not None:
            await broker.witnesses.progressed.wait()
    assert (await admin(home, {"kind": "status"}))["witness_lagging"] is None
