"""``bxctl audit verify`` with the tree and the ledger key, and ``--since-checkpoint``
(docs/protocol.md, "Verifying"): on a generated ledger signed by the home's key."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from tests.harness.ledger_gen import Generated, write_ledger

from boxmaker.cli.app import app
from boxmaker.home.paths import Home
from boxmaker.ledger.ledger_key import load_ledger_signer, read_ledger_origin


def bxctl(*args: str) -> int:
    return int(app(list(args), result_action="return_value"))


@pytest.fixture
def home(tmp_path: Path) -> Home:
    root = tmp_path / "home"
    assert bxctl("init", "--home", str(root)) == 0
    return Home(root)


@pytest.fixture
def ledger(home: Home) -> Generated:
    signer = load_ledger_signer(home, read_ledger_origin(home.audit_log))
    return write_ledger(home.ledger_dir, 1500, signer, every=400, seed=11)


def test_the_full_check_counts_checkpoints_signatures_and_tiles(
    home: Home, ledger: Generated, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert bxctl("audit", "verify", "--home", str(home.root)) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "records: 1500"
    assert "checkpoints: 3, signatures checked" in out
    assert "tree tiles compared: 7" in out
    assert out[-1] == "ledger: sound"


def test_since_checkpoint_checks_the_records_after_the_newest(
    home: Home, ledger: Generated, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert bxctl("audit", "verify", "--since-checkpoint", "--home", str(home.root)) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == ["verified from checkpoint seq 1200", "records: 299 (from seq 1201)"]
    assert out[-1] == "ledger: sound"
    assert bxctl("audit", "verify", "--since-checkpoint", "--json", "--home", str(home.root)) == 0
    report = orjson.loads(capsys.readouterr().out)
    assert (report["verified"], report["resumed_from"], report["records"]) == (
        "from checkpoint seq 1200",
        1201,
        299,
    )
    assert report["head"].startswith("1499:")


def test_since_checkpoint_without_the_key_checks_in_full_and_says_why(
    home: Home, ledger: Generated, capsys: pytest.CaptureFixture[str]
) -> None:
    home.ledger_vkey.unlink()
    capsys.readouterr()
    assert bxctl("audit", "verify", "--since-checkpoint", "--home", str(home.root)) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        "verified in full: the checkpoint cannot be used: no_key: no ledger key to check "
        "the checkpoint's signature"
    )
    assert out[1] == "records: 1500"
    assert f"checkpoints: 3, signatures not checked: no key ({home.ledger_vkey})" in out


def test_expect_head_is_for_the_full_check_only(
    home: Home, ledger: Generated, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    args = ("audit", "verify", "--since-checkpoint", "--expect-head", "1:" + "0" * 64)
    assert bxctl(*args, "--home", str(home.root)) == 2
    assert "not with --since-checkpoint" in capsys.readouterr().err
