"""The ledger key on disk (ledger/ledger_key.py; docs/runbook.md#ledger-key): made 0600
in a 0700 keys/, never replaced, refused when missing, loose, another's or not a key;
made by `bxctl init`; never inside a workspace."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import (
    BestAvailableEncryption,
    Encoding,
    NoEncryption,
    PrivateFormat,
)
from tests.harness.homes import short_home
from tests.harness.sandbox import AS_ROOT, SANDBOX_UID

from boxmaker.cli.app import app
from boxmaker.home.config import workspace_problem
from boxmaker.home.paths import Home
from boxmaker.ledger.checkpoint import ledger_origin
from boxmaker.ledger.ledger_key import (
    RUNBOOK_LEDGER_KEY,
    LedgerKeyError,
    LedgerKeyProblem,
    create_ledger_key,
    load_ledger_signer,
    read_ledger_origin,
)
from boxmaker.ledger.records import GENESIS_PREV, BadRecord, Genesis, Stop, encode_line
from boxmaker.ledger.signed_note import Ed25519PrivateKey, open_note, parse_vkey, sign_note

ORIGIN = ledger_origin("l-0123456789abcdef")


@pytest.fixture
def home() -> Iterator[Home]:
    with short_home("bx-key-") as made:
        yield made


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def refusal(home: Home) -> LedgerKeyError:
    with pytest.raises(LedgerKeyError) as caught:
        load_ledger_signer(home, ORIGIN)
    assert str(caught.value).endswith(f"; see {RUNBOOK_LEDGER_KEY}")
    assert str(caught.value).startswith(f"{home.ledger_key}: the ledger key ")
    return caught.value


def test_the_keys_directory_is_part_of_the_home_and_made_private() -> None:
    assert Home(Path("/h")).keys_dir == Path("/h/keys")
    assert Home(Path("/h")).ledger_key == Path("/h/keys/ledger.ed25519")
    assert Home(Path("/h")).ledger_vkey == Path("/h/keys/ledger.vkey")
    with short_home() as made:
        assert made.keys_dir in made.directories
        assert mode(made.keys_dir) == 0o700
        made.keys_dir.chmod(0o755)
        made.create()
        assert mode(made.keys_dir) == 0o700


def test_a_new_key_is_0600_pkcs8_pem_in_a_0700_dir_with_its_vkey(home: Home) -> None:
    home.keys_dir.rmdir()
    assert create_ledger_key(home, ORIGIN) is True
    assert mode(home.keys_dir) == 0o700
    assert mode(home.ledger_key) == 0o600
    assert home.ledger_key.stat().st_uid == os.getuid()
    pem = home.ledger_key.read_bytes()
    assert pem.startswith(b"-----BEGIN PRIVATE KEY-----\n")
    assert pem.endswith(b"-----END PRIVATE KEY-----\n")
    assert sorted(path.name for path in home.keys_dir.iterdir()) == [
        "ledger.ed25519",
        "ledger.vkey",
    ]
    signer = load_ledger_signer(home, ORIGIN)
    assert signer.name == ORIGIN
    vkey = home.ledger_vkey.read_text()
    assert vkey == signer.vkey + "\n"
    assert mode(home.ledger_vkey) == 0o644
    note = sign_note("hello\n", [signer])
    assert open_note(note, [parse_vkey(vkey.strip())]).verified_names == (ORIGIN,)


def test_an_existing_key_is_never_replaced(home: Home) -> None:
    create_ledger_key(home, ORIGIN)
    before = home.ledger_key.read_bytes()
    inode = home.ledger_key.stat().st_ino
    assert create_ledger_key(home, ORIGIN) is False
    assert (home.ledger_key.read_bytes(), home.ledger_key.stat().st_ino) == (before, inode)
    # A ledger that starts over has a new origin: same key, its vkey named anew.
    other = ledger_origin("l-fedcba9876543210")
    assert create_ledger_key(home, other) is False
    assert home.ledger_key.read_bytes() == before
    assert home.ledger_vkey.read_text().startswith(other + "+")
    assert list(home.keys_dir.glob(".*")) == []


def test_something_else_at_the_keys_name_is_neither_replaced_nor_used(home: Home) -> None:
    home.ledger_key.write_bytes(b"not a key")
    home.ledger_key.chmod(0o600)
    with pytest.raises(LedgerKeyError) as caught:
        create_ledger_key(home, ORIGIN)
    assert caught.value.reason is LedgerKeyProblem.UNREADABLE
    assert home.ledger_key.read_bytes() == b"not a key"
    assert not home.ledger_vkey.exists()
    assert list(home.keys_dir.glob(".*")) == []


def test_a_symlink_at_the_keys_name_is_not_followed(home: Home, tmp_path: Path) -> None:
    elsewhere = tmp_path / "planted.pem"
    key = Ed25519PrivateKey.generate()
    elsewhere.write_bytes(key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    elsewhere.chmod(0o600)
    home.ledger_key.symlink_to(elsewhere)
    with pytest.raises(LedgerKeyError) as caught:
        create_ledger_key(home, ORIGIN)
    assert caught.value.reason is LedgerKeyProblem.NOT_A_FILE
    assert "a symlink, which is not followed" in str(caught.value)
    assert home.ledger_key.is_symlink()
    assert refusal(home).reason is LedgerKeyProblem.NOT_A_FILE


def test_a_fifo_at_the_keys_name_is_refused_without_blocking(home: Home) -> None:
    os.mkfifo(home.ledger_key, 0o600)
    error = refusal(home)
    assert error.reason is LedgerKeyProblem.NOT_A_FILE
    assert "a FIFO" in str(error)


def test_a_missing_key_is_refused_with_the_anchor(home: Home) -> None:
    error = refusal(home)
    assert error.reason is LedgerKeyProblem.MISSING
    assert str(error) == f"{home.ledger_key}: the ledger key is missing; see {RUNBOOK_LEDGER_KEY}"
    home.keys_dir.rmdir()
    assert refusal(home).reason is LedgerKeyProblem.MISSING
    assert "no keys/ directory" in str(refusal(home))


@pytest.mark.parametrize("loose", [0o640, 0o604, 0o660, 0o644, 0o601])
def test_a_key_open_to_others_is_refused_not_tightened(home: Home, loose: int) -> None:
    create_ledger_key(home, ORIGIN)
    home.ledger_key.chmod(loose)
    error = refusal(home)
    assert error.reason is LedgerKeyProblem.LOOSE_MODE
    assert f"its file has mode {loose:04o}, open to others; it must be 0600" in str(error)
    assert mode(home.ledger_key) == loose


def test_a_read_only_key_is_fine(home: Home) -> None:
    create_ledger_key(home, ORIGIN)
    home.ledger_key.chmod(0o400)
    assert load_ledger_signer(home, ORIGIN).name == ORIGIN


def test_a_keys_directory_open_to_others_is_refused(home: Home) -> None:
    create_ledger_key(home, ORIGIN)
    home.keys_dir.chmod(0o750)
    error = refusal(home)
    assert error.reason is LedgerKeyProblem.LOOSE_MODE
    assert f"its directory {home.keys_dir} has mode 0750" in str(error)
    assert "it must be 0700" in str(error)


def test_a_keys_directory_that_is_a_symlink_is_refused(home: Home, tmp_path: Path) -> None:
    home.keys_dir.rmdir()
    real = tmp_path / "keys"
    real.mkdir(mode=0o700)
    home.keys_dir.symlink_to(real)
    error = refusal(home)
    assert error.reason is LedgerKeyProblem.NOT_A_FILE
    assert "is not a directory" in str(error)


@pytest.mark.skipif(not AS_ROOT, reason="giving a file to another uid needs root")
def test_another_users_key_is_refused(home: Home) -> None:
    create_ledger_key(home, ORIGIN)
    os.chown(home.ledger_key, SANDBOX_UID, SANDBOX_UID)
    error = refusal(home)
    assert error.reason is LedgerKeyProblem.NOT_OURS
    assert f"owned by uid {SANDBOX_UID}, not by you (uid 0)" in str(error)


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"garbage",
        ec.generate_private_key(ec.SECP256R1()).private_bytes(
            Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()
        ),
        Ed25519PrivateKey.generate().private_bytes(
            Encoding.PEM, PrivateFormat.PKCS8, BestAvailableEncryption(b"pw")
        ),
        Ed25519PrivateKey.generate().private_bytes(
            Encoding.DER, PrivateFormat.PKCS8, NoEncryption()
        ),
        b"-----BEGIN PRIVATE KEY-----\n" + b"A" * 20000 + b"\n-----END PRIVATE KEY-----\n",
    ],
    ids=["empty", "garbage", "ecdsa", "encrypted", "der", "huge"],
)
def test_a_file_that_is_not_an_ed25519_pem_key_is_refused(home: Home, content: bytes) -> None:
    home.ledger_key.write_bytes(content)
    home.ledger_key.chmod(0o600)
    error = refusal(home)
    assert error.reason is LedgerKeyProblem.UNREADABLE
    assert "is not an unencrypted PKCS#8 PEM Ed25519 key" in str(error)


def test_the_keys_directory_can_never_be_or_hold_the_workspace(home: Home, tmp_path: Path) -> None:
    inside = "inside the home, only workspace/ may be used"
    assert workspace_problem(home, home.keys_dir) == inside
    assert workspace_problem(home, home.keys_dir / "sub") == inside
    assert workspace_problem(home, home.root) == "must not be the home or contain it"
    assert workspace_problem(home, home.root.parent) == "must not be the home or contain it"
    link = tmp_path / "looks-elsewhere"
    link.symlink_to(home.keys_dir)
    problem = workspace_problem(home, link)
    assert problem is not None
    assert "inside the home" in problem
    assert f"by its real path {home.keys_dir}" in problem
    # The one place in the home a workspace may be does not reach keys/.
    assert not home.keys_dir.is_relative_to(home.default_workspace)
    assert workspace_problem(home, home.default_workspace) is None


def bxctl(*args: str) -> int:
    return int(app(list(args), result_action="return_value"))


def test_bxctl_init_makes_the_key_and_says_where_its_public_half_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = Home(tmp_path / "home")
    assert bxctl("init", "--home", str(home.root), "--json") == 0
    said = orjson.loads(capsys.readouterr().out)
    assert said["ledger_key"] == str(home.ledger_key)
    assert said["ledger_vkey"] == str(home.ledger_vkey)
    assert said["ledger_key_created"] is True
    assert (mode(home.keys_dir), mode(home.ledger_key)) == (0o700, 0o600)
    origin = read_ledger_origin(home.audit_log)
    genesis = orjson.loads(home.audit_log.read_bytes().split(b"\n")[0])
    assert origin == "boxmaker.local/ledger/" + genesis["ledger"]
    vkey = parse_vkey(home.ledger_vkey.read_text().strip())
    assert vkey == load_ledger_signer(home, origin).verifier
    key = home.ledger_key.read_bytes()

    assert bxctl("init", "--home", str(home.root)) == 0
    out = capsys.readouterr().out
    assert f"ledger key: {home.ledger_key} (kept); its public key: {home.ledger_vkey}\n" in out
    assert home.ledger_key.read_bytes() == key


def test_bxctl_init_refuses_a_loose_key_with_the_anchor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = Home(tmp_path / "home")
    assert bxctl("init", "--home", str(home.root), "--json") == 0
    home.ledger_key.chmod(0o644)
    capsys.readouterr()
    assert bxctl("init", "--home", str(home.root)) == 1
    err = capsys.readouterr().err
    assert "its file has mode 0644" in err
    assert RUNBOOK_LEDGER_KEY in err


def test_the_origin_is_read_from_the_genesis_record_only(tmp_path: Path) -> None:
    ledger = tmp_path / "audit.jsonl"
    at = "2026-01-02T03:04:05.678Z"
    genesis = Genesis(ledger="l-00000000000000aa")
    ledger.write_bytes(encode_line(0, at, GENESIS_PREV, genesis) + b"\n")
    assert read_ledger_origin(ledger) == "boxmaker.local/ledger/l-00000000000000aa"
    ledger.write_bytes(encode_line(0, at, GENESIS_PREV, Stop(boot="b-1")) + b"\n")
    with pytest.raises(BadRecord, match="line 0 is a stop record, not genesis"):
        read_ledger_origin(ledger)
