"""``bxctl witness serve`` as a real process on loopback, spoken to by plain HTTP and by
brokerd's sender (broker/witnesses.py): cosignatures that verify with the vkey it
prints, its state kept across a restart, the spec's 409; a witness down and then up
(caught up), a slow one (timed out and retried while another witness cosigns), and a
409 followed by a cosignature."""

from __future__ import annotations

import base64
import functools
import logging
import re
import socket
import stat
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import httpx
import orjson
import pytest
import trio
from tests.harness.cli import bxctl
from tests.harness.homes import write_config
from tests.harness.process import START_S, Daemon, start, wait_for
from tests.harness.witness import ORIGIN, MemoryLog, WitnessProcess

from boxmaker.broker.witnesses import Backoff, WitnessSender
from boxmaker.home.config import WitnessConfig
from boxmaker.home.paths import Home
from boxmaker.ledger.cosignatures import cosignature_path, read_cosigned
from boxmaker.ledger.signed_note import open_note, parse_vkey, verify_cosignature
from boxmaker.ledger.tree import tree_dir
from boxmaker.ledger.witness_protocol import AddCheckpoint, format_add_checkpoint

pytestmark = pytest.mark.slow

FAST = Backoff(first=0.05, most=0.2)


@pytest.fixture
def ledger() -> MemoryLog:
    return MemoryLog()


@pytest.fixture
def witnesses(tmp_path: Path) -> Iterator[list[WitnessProcess]]:
    started: list[WitnessProcess] = []
    yield started
    for witness in started:
        witness.kill()


def start_witness(
    started: list[WitnessProcess], directory: Path, ledger: MemoryLog, port: int = 0
) -> WitnessProcess:
    directory.mkdir(exist_ok=True)
    witness = WitnessProcess(directory, f"{ORIGIN}={ledger.signer.vkey}", port=port)
    started.append(witness)
    return witness.wait_ready()


def post(witness: WitnessProcess, ledger: MemoryLog, size: int, old: int) -> httpx.Response:
    body = format_add_checkpoint(AddCheckpoint(old, ledger.proof(size, old), ledger.note(size)))
    return httpx.post(f"{witness.url}/add-checkpoint", content=body, timeout=START_S)


def state_of(witness: WitnessProcess) -> dict[str, object]:
    logs: dict[str, object] = orjson.loads(witness.state.read_bytes())["logs"]
    return logs


def config_for(witness: WitnessProcess, name: str = "w1", timeout: float = 5.0) -> WitnessConfig:
    return WitnessConfig(name=name, vkey=witness.vkey, url=witness.url, timeout=timeout)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_the_witness_cosigns_answers_409_and_keeps_its_state(
    tmp_path: Path, ledger: MemoryLog, witnesses: list[WitnessProcess]
) -> None:
    witness = start_witness(witnesses, tmp_path / "w", ledger)
    first = post(witness, ledger, 5, 0)
    assert first.status_code == 200, first.text
    verifier = parse_vkey(witness.vkey)
    assert verify_cosignature(ledger.text(5), first.text, verifier) > 1_600_000_000
    assert stat.S_IMODE(witness.state.stat().st_mode) == 0o600
    assert state_of(witness) == {ORIGIN: {"size": 5, "root": _b64(ledger.root(5))}}

    conflict = post(witness, ledger, 20, 0)
    assert conflict.status_code == 409
    assert conflict.headers["content-type"] == "text/x.tlog.size"
    assert conflict.content == b"5\n"
    assert post(witness, ledger, 20, 5).status_code == 200
    assert witness.stop() == 0

    again = start_witness(witnesses, tmp_path / "w", ledger)
    assert again.vkey == witness.vkey
    assert post(again, ledger, 30, 0).content == b"20\n"
    assert "add-checkpoint refused: 409 conflict" in again.stderr()


def test_the_witness_answers_only_post_add_checkpoint(
    tmp_path: Path, ledger: MemoryLog, witnesses: list[WitnessProcess]
) -> None:
    witness = start_witness(witnesses, tmp_path / "w", ledger)
    assert httpx.get(f"{witness.url}/add-checkpoint", timeout=START_S).status_code == 405
    assert httpx.post(f"{witness.url}/other", content=b"", timeout=START_S).status_code == 404
    big = httpx.post(f"{witness.url}/add-checkpoint", content=b"x" * 70000, timeout=START_S)
    assert big.status_code == 413


def test_a_second_witness_on_the_same_state_is_refused(
    tmp_path: Path, ledger: MemoryLog, witnesses: list[WitnessProcess]
) -> None:
    start_witness(witnesses, tmp_path / "w", ledger)
    second = WitnessProcess(tmp_path / "w", f"{ORIGIN}={ledger.signer.vkey}")
    witnesses.append(second)
    assert second.process.wait(timeout=START_S) == 1
    assert "another witness is serving this state" in second.stderr()


async def _until(sender: WitnessSender, predicate: Callable[[], bool]) -> None:
    with trio.fail_after(START_S):
        while not predicate():
            await sender.progressed.wait()


async def test_the_sender_gets_cosignatures_from_a_real_witness(
    tmp_path: Path, ledger: MemoryLog, witnesses: list[WitnessProcess]
) -> None:
    witness = start_witness(witnesses, tmp_path / "w", ledger)
    tree = tmp_path / "tree"
    ledger.write_tiles(tree, 40)
    sender = WitnessSender([config_for(witness)], tree, ledger.signer.verifier, backoff=FAST)
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        sender.checkpointed(ledger.note(5), 5)
        await _until(sender, lambda: sender.links[0].cosigned_size == 5)
        sender.checkpointed(ledger.note(40), 40)
        await _until(sender, lambda: sender.links[0].cosigned_size == 40)
        nursery.cancel_scope.cancel()
    kept = cosignature_path(tree, "w1").read_bytes()
    opened = open_note(kept, [ledger.signer.verifier, parse_vkey(witness.vkey)])
    assert opened.text == ledger.text(40)
    assert opened.verified_names == (ORIGIN, "witness.test/w1")
    assert read_cosigned(cosignature_path(tree, "w1"), parse_vkey(witness.vkey), ORIGIN) == 40
    assert "cosigned boxmaker.local/ledger/l-test: size 40 (old 5)" in witness.stderr()


async def test_a_witness_down_then_up_catches_up(
    tmp_path: Path,
    ledger: MemoryLog,
    witnesses: list[WitnessProcess],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "boxmaker.brokerd.witness")
    port = free_port()
    tree = tmp_path / "tree"
    ledger.write_tiles(tree, 70)
    directory = tmp_path / "w"
    directory.mkdir()
    # `bxctl witness init` makes the key first: its vkey is known while it is down.
    vkey = _witness_init(directory / "witness.key")
    config = WitnessConfig(name="w1", vkey=vkey, url=f"http://127.0.0.1:{port}", timeout=2.0)
    sender = WitnessSender([config], tree, ledger.signer.verifier, backoff=FAST)
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        sender.checkpointed(ledger.note(30), 30)
        await _until(sender, lambda: sender.links[0].failures >= 2)
        assert sender.links[0].last_problem == "unreachable"
        assert sender.lag(sender.links[0]) is None
        sender.checkpointed(ledger.note(70), 70)
        await trio.to_thread.run_sync(start_witness, witnesses, directory, ledger, port)
        await _until(sender, lambda: sender.links[0].cosigned_size == 70)
        assert sender.lag(sender.links[0]) == 0
        nursery.cancel_scope.cancel()
    assert "witness w1: no cosignature (attempt 1): unreachable" in caplog.text
    assert "witness w1 is lagging: never cosigned" in caplog.text


async def test_a_slow_witness_times_out_and_is_retried_while_another_cosigns(
    tmp_path: Path,
    ledger: MemoryLog,
    witnesses: list[WitnessProcess],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "boxmaker.brokerd.witness")
    witness = start_witness(witnesses, tmp_path / "w", ledger)
    tree = tmp_path / "tree"
    ledger.write_tiles(tree, 12)
    requests: list[bytes] = []
    async with trio.open_nursery() as nursery:
        serve = functools.partial(trio.serve_tcp, _never_answers(requests), 0, host="127.0.0.1")
        listeners = await nursery.start(serve)
        slow_port = listeners[0].socket.getsockname()[1]
        slow = WitnessConfig(
            name="slow", vkey=witness.vkey, url=f"http://127.0.0.1:{slow_port}", timeout=0.3
        )
        sender = WitnessSender(
            [slow, config_for(witness)], tree, ledger.signer.verifier, backoff=FAST
        )
        await nursery.start(sender.run)
        before = trio.current_time()
        sender.checkpointed(ledger.note(12), 12)
        assert trio.current_time() - before < 0.05  # the hook returns at once
        await _until(sender, lambda: sender.links[1].cosigned_size == 12)
        await _until(sender, lambda: sender.links[0].failures >= 2)
        assert sender.links[0].last_problem == "timeout"
        assert sender.links[0].cosigned_size is None
        assert len(requests) >= 2
        assert all(request.startswith(b"POST /add-checkpoint HTTP/1.1\r\n") for request in requests)
        nursery.cancel_scope.cancel()
    assert "witness slow: no cosignature (attempt 2): timeout" in caplog.text


async def test_a_409_is_followed_by_a_request_from_the_witness_size(
    tmp_path: Path, ledger: MemoryLog, witnesses: list[WitnessProcess]
) -> None:
    witness = start_witness(witnesses, tmp_path / "w", ledger)
    # Someone (a copy of this home, an older brokerd) already showed it size 9.
    assert (await trio.to_thread.run_sync(post, witness, ledger, 9, 0)).status_code == 200
    tree = tmp_path / "tree"
    ledger.write_tiles(tree, 25)
    sender = WitnessSender([config_for(witness)], tree, ledger.signer.verifier, backoff=FAST)
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        assert sender.links[0].known_size == 0
        sender.checkpointed(ledger.note(25), 25)
        await _until(sender, lambda: sender.links[0].cosigned_size == 25)
        nursery.cancel_scope.cancel()
    assert sender.links[0].failures == 0
    log = witness.stderr()
    assert "add-checkpoint refused: 409 conflict" in log
    assert "cosigned boxmaker.local/ledger/l-test: size 25 (old 9)" in log
    assert log.index("409 conflict") < log.index("size 25 (old 9)")


def _never_answers(
    requests: list[bytes],
) -> Callable[[trio.SocketStream], Awaitable[None]]:
    async def handler(stream: trio.SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = await stream.receive_some()
            if not chunk:
                return
            data += chunk
        requests.append(data)
        await trio.sleep_forever()

    return handler


def _witness_init(key: Path) -> str:
    command = [sys.executable, "-m", "boxmaker.cli.app", "witness", "init"]
    done = subprocess.run(
        [*command, "--key", str(key), "--name", "witness.test/w1"],
        capture_output=True,
        text=True,
        timeout=START_S,
        check=True,
    )
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    vkey = done.stdout.strip()
    assert vkey.startswith("witness.test/w1+")
    return vkey


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_brokerd_gets_its_checkpoints_cosigned(
    tmp_path: Path, home: Home, daemons: list[Daemon], witnesses: list[WitnessProcess]
) -> None:
    bxctl(home, "init", check=False)
    vkey = home.ledger_vkey.read_text().strip()
    origin = vkey.split("+", 1)[0]
    directory = tmp_path / "w"
    directory.mkdir()
    witness = WitnessProcess(directory, f"{origin}={vkey}")
    witnesses.append(witness.wait_ready())
    config = home.config_toml.read_text()
    table = f'[[witness]]\nname = "w1"\nvkey = "{witness.vkey}"\nurl = "{witness.url}"\n'
    write_config(home, config + "\n[ledger]\ncheckpoint_every = 1\n" + table)
    start(daemons, home)
    kept = cosignature_path(tree_dir(home), "w1")
    wait_for(kept.exists, "brokerd's first cosignature")
    opened = open_note(kept.read_bytes(), [parse_vkey(vkey), parse_vkey(witness.vkey)])
    assert opened.verified_names == (origin, "witness.test/w1")
    size = int(opened.text.split("\n")[1])
    # The kept note is the newest cosigned: under load brokerd may have had a second
    # checkpoint cosigned by now. Its line is in the witness's log, and the first one
    # the witness cosigned started from nothing.
    cosigned = re.findall(
        rf"cosigned {re.escape(origin)}: size (\d+) \(old (\d+)\)", witness.stderr()
    )
    assert cosigned[0][1] == "0"
    assert str(size) in [new for new, _ in cosigned]
    status = bxctl(home, "status", "--json", check=False)
    shown = orjson.loads(status.stdout)["witnesses"]
    assert shown[0]["name"] == "w1"
    assert shown[0]["cosigned_size"] >= size
