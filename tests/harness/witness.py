"""Witness tests' helpers: a log in memory (its tree, checkpoints signed at any size,
proofs), and ``bxctl witness serve`` as a real process on loopback."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import attrs
import pytest
from tests.harness.process import START_S

from boxmaker.ledger.checkpoint import Checkpoint, format_checkpoint
from boxmaker.ledger.merkle import (
    Frontier,
    Hash,
    ListHashes,
    leaf_hash,
    prove_tree,
    stored_hash_count,
    tree_hash,
)
from boxmaker.ledger.signed_note import Ed25519PrivateKey, NoteSigner, sign_note
from boxmaker.ledger.tiles import TileStore

ORIGIN = "boxmaker.local/ledger/l-test"
WITNESS_NAME = "witness.test/w1"


def seeded_key(seed: int) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(seed.to_bytes(32, "big"))


@attrs.define
class MemoryLog:
    """A log whose leaf i is ``b"<tag> line i"``: two logs of one origin with other tags
    are forks of each other from their first leaf."""

    signer: NoteSigner = attrs.Factory(lambda: NoteSigner(ORIGIN, seeded_key(1)))
    tag: str = "record"
    stored: list[Hash] = attrs.Factory(list)
    frontier: Frontier = attrs.Factory(Frontier)

    def grow(self, size: int) -> None:
        while self.frontier.size < size:
            line = f"{self.tag} line {self.frontier.size}".encode()
            self.stored += self.frontier.append(leaf_hash(line))

    def root(self, size: int) -> Hash:
        self.grow(size)
        return tree_hash(size, ListHashes(self.stored))

    def text(self, size: int) -> str:
        return format_checkpoint(Checkpoint(self.signer.name, size, self.root(size)))

    def note(self, size: int) -> bytes:
        return sign_note(self.text(size), [self.signer])

    def proof(self, size: int, old: int) -> tuple[Hash, ...]:
        if old in (0, size):
            return ()
        self.grow(size)
        return tuple(prove_tree(size, old, ListHashes(self.stored)))

    def write_tiles(self, root: Path, size: int) -> None:
        """Store the tree's hashes up to ``size`` leaves in the tlog-tiles layout."""
        self.grow(size)
        store = TileStore(root)
        store.append(self.stored[stored_hash_count(store.size) : stored_hash_count(size)])


class WitnessProcess:
    """``bxctl witness serve`` on 127.0.0.1, any free port; :attr:`url` once ready."""

    def __init__(self, directory: Path, *logs: str, port: int = 0) -> None:
        self.directory = directory
        self.key = directory / "witness.key"
        self.state = directory / "witness.state"
        self.log = directory / f"witness-{time.monotonic_ns()}.log"
        command = [
            sys.executable,
            "-m",
            "boxmaker.cli.app",
            "witness",
            "serve",
            "--listen",
            f"127.0.0.1:{port}",
            "--key",
            str(self.key),
            "--name",
            WITNESS_NAME,
            "--state",
            str(self.state),
        ]
        for log in logs:
            command += ["--log", log]
        with self.log.open("wb") as log_file:
            self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log_file)
        self.url = ""
        self.vkey = ""

    def wait_ready(self) -> WitnessProcess:
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"the witness exited {self.process.returncode}: {self.stderr()}")
            found = re.search(r"serving (http://\S+) .*; vkey (\S+)", self.stderr())
            if found:
                self.url, self.vkey = found.group(1).rstrip(","), found.group(2)
                return self
            time.sleep(0.05)
        pytest.fail(f"the witness did not start: {self.stderr()}")

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.terminate()
        return self.process.wait(timeout=START_S)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=START_S)
