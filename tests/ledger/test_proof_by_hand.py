"""docs/protocol.md ("Proofs") says how to check a proof by hand, with Python's standard
library for the tree and OpenSSL for the signature. These tests run those two blocks
exactly as the page prints them on a proof ``bxctl audit prove`` wrote: what they accept
and refuse proves the page right, with none of boxmaker's own checking code."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.harness.proof_ledgers import approved_call, home_signer, load_home, save_home, start

from boxmaker.cli.app import app
from boxmaker.home.paths import Home
from boxmaker.ledger.records import Stop

PROTOCOL = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
CALL = "c-" + "a" * 16
WAIT_S = 30
BOOT = "b-" + "0" * 16


def documented_block(language: str) -> str:
    """The first ``language`` code block of docs/protocol.md's "Proofs" section."""
    text = PROTOCOL.read_text(encoding="utf-8")
    section = text[text.index("\n## Proofs\n") :]
    section = section[: section.index("\n## ", 1)]
    found = re.search(rf"\n```{language}\n(.*?)\n```\n", section, re.DOTALL)
    assert found, f"no {language} block in docs/protocol.md's Proofs"
    return found.group(1) + "\n"


@pytest.fixture
def proof(tmp_path: Path) -> Path:
    home = Home(tmp_path / "home")
    assert app(["init", "--home", str(home.root)], result_action="return_value") == 0
    built = load_home(home)
    start(built)
    for _ in range(20):  # a tree of some depth, the call not at its edge
        built.append(Stop(boot=BOOT))
    approved_call(built, CALL)
    for _ in range(7):
        built.append(Stop(boot=BOOT))
    built.checkpoint(home_signer(home))
    save_home(home, built)
    out = tmp_path / "proof.json"
    args = ["audit", "prove", CALL, "--out", str(out), "--home", str(home.root)]
    assert app(args, result_action="return_value") == 0
    return out


def run_tree_check(tmp_path: Path, proof: Path) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "check_tree.py"
    script.write_text(documented_block("python"))
    return subprocess.run(
        [sys.executable, "-I", str(script), str(proof)],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
    )


def run_signature_check(workdir: Path, proof: Path) -> subprocess.CompletedProcess[str]:
    block = documented_block("sh").replace("python3 -", f"{sys.executable} -I -")
    block = block.replace("PROOF.json", str(proof))
    return subprocess.run(
        ["bash", "-e", "-c", block],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
    )


def test_the_documented_tree_check_accepts_the_proof_and_refuses_an_edit(
    tmp_path: Path, proof: Path
) -> None:
    done = run_tree_check(tmp_path, proof)
    assert done.returncode == 0, done.stderr
    origin = re.search(r'"origin": "([^"]+)"', proof.read_text())
    assert origin
    assert done.stdout.splitlines() == [
        f"seq {seq}: in the checkpoint of size 32 of {origin.group(1)}" for seq in (22, 23, 24)
    ]
    edited = tmp_path / "edited.json"
    edited.write_text(proof.read_text().replace("notes.txt", "other.txt", 1))
    done = run_tree_check(tmp_path, edited)
    assert (done.returncode, done.stderr) == (1, "refused: seq 22: not in the checkpoint\n")


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl here")
def test_the_documented_signature_check_accepts_the_proof_and_refuses_an_edit(
    tmp_path: Path, proof: Path
) -> None:
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.mkdir()
    bad.mkdir()
    done = run_signature_check(good, proof)
    assert done.returncode == 0, done.stderr
    assert "Signature Verified Successfully" in done.stdout
    edited = tmp_path / "edited.json"
    edited.write_text(proof.read_text().replace("\\n32\\n", "\\n33\\n", 1))
    assert edited.read_text() != proof.read_text()
    done = run_signature_check(bad, edited)
    assert done.returncode == 1
    assert "Signature Verification Failure" in done.stdout + done.stderr
