"""``bxctl why`` and ``bxctl audit show --call``: the grant that decided a call as the
policy in force then had it (the last ``policy`` record of its boot before the decision),
from hand-written ledgers, in process."""

from __future__ import annotations

import hashlib
from pathlib import Path

import orjson
import pytest
import trio

from boxmaker.cli.app import app
from boxmaker.core.labels import Taint
from boxmaker.ledger.policies import keep, policies_dir
from boxmaker.ledger.records import Body, Decision, Policy, Start, VerdictCode
from boxmaker.ledger.writer import LedgerWriter

CALL = "c-" + "a" * 16
BOOT = "b-" + "0" * 16
OLDER_BOOT = "b-" + "9" * 16
EARLIER = b'[[grant]]\nid = "read-notes"\ntool = "read_file"\nmode = "ask"\n'
# A note with a bidi override and a zero-width space: valid TOML, hostile on a terminal.
LATER = (
    '# the second version\n[[grant]]\nid = "read-notes"\ntool = "read_file"\nmode = "auto"\n'
    'note = "\u202eevil\u200b"\n'
).encode()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def policy(boot: str, data: bytes) -> Policy:
    return Policy(boot=boot, sha256=sha(data), grants=1, problem=None)


def decision(boot: str = BOOT) -> Decision:
    return Decision(
        call=CALL,
        session="s-" + "1" * 12,
        tool="read_file",
        arguments={"path": "notes.txt"},
        verdict=VerdictCode.RUN,
        reason=None,
        grant="read-notes",
        taint=Taint.PUBLIC,
        untrusted=False,
        boot=boot,
    )


async def write_ledger(home: Path, *bodies: Body) -> None:
    writer = LedgerWriter.open(home / "ledger" / "audit.jsonl")
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        for body in bodies:
            await writer.append(body)
        await writer.aclose()


async def bxctl(*args: str) -> int:
    return int(await app.run_async(list(args), result_action="return_value"))


@pytest.fixture
def home(tmp_path: Path) -> Path:
    root = tmp_path / "home"
    (root / "ledger").mkdir(parents=True)
    (root / "grants.toml").write_bytes(b"")  # the grants now: none
    return root


async def test_the_last_policy_of_its_boot_before_the_decision_decides_and_is_escaped(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keep(policies_dir(home / "ledger" / "audit.jsonl"), EARLIER)
    keep(policies_dir(home / "ledger" / "audit.jsonl"), LATER)
    await write_ledger(
        home,
        Start(boot=BOOT, version="t"),
        policy(BOOT, EARLIER),
        policy(BOOT, LATER),
        decision(),
    )
    assert await bxctl("why", CALL, "--home", str(home)) == 0
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("  grant read-notes (no longer in grants.toml)")
    as_it_was = [
        f"grant read-notes as it was then (grants.toml {sha(LATER)[:12]}…, policy seq 3):",
        "  [[grant]]",
        '  id = "read-notes"',
        '  tool = "read_file"',
        '  mode = "auto"',
        '  note = "\\u202eevil\\u200b"',
    ]
    assert lines[at + 1 : at + 7] == [f"    {line}" for line in as_it_was]
    assert await bxctl("audit", "show", "--call", CALL, "--home", str(home)) == 0
    shown = capsys.readouterr().out.splitlines()
    assert shown[1:] == [f"  {line}" for line in as_it_was]
    # --json: the records' own lines, nothing else.
    assert await bxctl("audit", "show", "--call", CALL, "--json", "--home", str(home)) == 0
    [line] = capsys.readouterr().out.splitlines()
    assert orjson.loads(line)["kind"] == "decision"
    assert await bxctl("why", CALL, "--json", "--home", str(home)) == 0
    then = orjson.loads(capsys.readouterr().out)["decision"]["grant"]["then"]
    assert then == {
        "sha256": sha(LATER),
        "policy_seq": 3,
        "text": LATER.decode().removeprefix("# the second version\n").rstrip("\n"),
        "missing": None,
    }


async def test_a_policy_of_an_earlier_boot_is_not_the_one_in_force(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keep(policies_dir(home / "ledger" / "audit.jsonl"), EARLIER)
    await write_ledger(
        home,
        Start(boot=OLDER_BOOT, version="t"),
        policy(OLDER_BOOT, EARLIER),
        Start(boot=BOOT, version="t"),
        decision(),
    )
    assert await bxctl("why", CALL, "--home", str(home)) == 0
    assert (
        "    its text then is not known: no policy record of its boot before the decision"
        in capsys.readouterr().out.splitlines()
    )


async def test_a_version_without_that_grant_says_so(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = b'[[grant]]\nid = "other"\ntool = "list_dir"\nmode = "auto"\n'
    keep(policies_dir(home / "ledger" / "audit.jsonl"), other)
    await write_ledger(home, Start(boot=BOOT, version="t"), policy(BOOT, other), decision())
    assert await bxctl("why", CALL, "--home", str(home)) == 0
    assert (
        "    its text then is not known: the kept version has no grant read-notes to show"
        in capsys.readouterr().out.splitlines()
    )
