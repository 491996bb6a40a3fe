"""``bxctl status`` shows each ``[[witness]]``'s lag from the files under
``ledger/tree/`` (brokerd need not run), and config.toml's ``[[witness]]`` checks."""

from __future__ import annotations

import orjson
import pytest
from tests.harness.cli import bxctl_in_process
from tests.harness.homes import write_config
from tests.harness.witness import WITNESS_NAME, MemoryLog, seeded_key

from boxmaker.home.config import ConfigError, parse_config
from boxmaker.home.paths import Home
from boxmaker.ledger.signed_note import NoteSigner, cosign

WITNESS = NoteSigner(WITNESS_NAME, seeded_key(9))
OTHER = NoteSigner("witness.test/w2", seeded_key(10))


def witness_table(name: str, signer: NoteSigner) -> str:
    vkey = signer.cosignature_verifier.vkey
    return f'[[witness]]\nname = "{name}"\nvkey = "{vkey}"\nurl = "http://127.0.0.1:9"\n'


def ledger_files(home: Home, ledger: MemoryLog, newest: int, cosigned: int) -> None:
    home.ensure_keys_dir()
    home.ledger_vkey.write_text(ledger.signer.vkey + "\n")
    tree = home.ledger_dir / "tree"
    (tree / "cosignatures").mkdir(parents=True)
    (tree / "checkpoint").write_bytes(ledger.note(newest))
    line = cosign(ledger.text(cosigned), WITNESS, 1_700_000_000)
    (tree / "cosignatures" / "w1").write_bytes(ledger.note(cosigned) + line.encode())
    # w2's file holds w1's cosignature: not w2's, so w2 never cosigned.
    (tree / "cosignatures" / "w2").write_bytes(ledger.note(cosigned) + line.encode())


async def test_status_shows_each_witness_lag(
    home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    config = "[ledger]\nwitness_max_lag = 500\n" + witness_table("w1", WITNESS)
    write_config(home, config + witness_table("w2", OTHER))
    ledger_files(home, MemoryLog(), newest=1300, cosigned=1000)
    assert await bxctl_in_process(home, "status") == 3
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:3] == [
        "witness        w1: cosigned size 1000, 300 records behind",
        "witness        w2: never cosigned (lagging; see docs/runbook.md#witness)",
    ]
    write_config(home, "[ledger]\nwitness_max_lag = 200\n" + witness_table("w1", WITNESS))
    assert await bxctl_in_process(home, "status", "--json") == 3
    shown = orjson.loads(capsys.readouterr().out)["witnesses"]
    assert shown == [{"name": "w1", "cosigned_size": 1000, "lag": 300, "lagging": True}]


async def test_status_without_witnesses_shows_none(
    home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await bxctl_in_process(home, "status", "--json") == 3
    assert orjson.loads(capsys.readouterr().out)["witnesses"] == []


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        ('name = "w 1"', "[[witness]] number 1: name: expected 1 to 64 letters"),
        ('vkey = "x"', "[[witness]] number 1: vkey: bad_vkey"),
        ('url = "ftp://x"', "[[witness]] number 1: url: expected an http:// or https:// URL"),
        ("timeout = 0", "[[witness]] number 1: timeout: expected a number above 0"),
    ],
)
def test_a_bad_witness_table_is_refused(home: Home, table: str, problem: str) -> None:
    good = dict(line.split(" = ", 1) for line in witness_table("w1", WITNESS).splitlines()[1:])
    key, value = table.split(" = ", 1)
    good[key] = value
    text = "[[witness]]\n" + "".join(f"{k} = {v}\n" for k, v in good.items())
    with pytest.raises(ConfigError) as caught:
        parse_config(text, home)
    assert caught.value.problems[0].startswith(f"config.toml: {problem}")


def test_a_ledger_key_as_a_witness_vkey_is_refused(home: Home) -> None:
    text = witness_table("w1", WITNESS).replace(
        WITNESS.cosignature_verifier.vkey, WITNESS.verifier.vkey
    )
    with pytest.raises(ConfigError, match=r"expected a cosignature \(0x04\) vkey"):
        parse_config(text, home)


def test_two_witnesses_of_one_name_and_another_lag_choice_are_refused(home: Home) -> None:
    with pytest.raises(ConfigError, match="two \\[\\[witness\\]\\] tables named w1"):
        parse_config(witness_table("w1", WITNESS) + witness_table("w1", OTHER), home)
    with pytest.raises(ConfigError, match='witness_lag: expected "warn" or "deny_risky"'):
        parse_config('[ledger]\nwitness_lag = "stop"\n', home)
    chosen = parse_config('[ledger]\nwitness_lag = "deny_risky"\n', home)
    assert chosen.ledger.witness_lag == "deny_risky"
