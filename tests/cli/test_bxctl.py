"""bxctl's file-only commands, in process: init, grants check, audit verify/show."""

from __future__ import annotations

import datetime as dt
import functools
import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from boxmaker.cli import why as why_module
from boxmaker.cli.app import app
from boxmaker.core.labels import Label, Taint
from boxmaker.core.reasons import Reason
from boxmaker.formats.clock import parse_utc
from boxmaker.ledger.records import (
    Approval,
    ApprovalBy,
    ApprovalOutcome,
    Decision,
    Record,
    Result,
    ResultStatus,
    Start,
    VerdictCode,
)
from boxmaker.ledger.writer import LedgerWriter

CALL_A = "c-" + "a" * 16
CALL_B = "c-" + "b" * 16
SESSION_1 = "s-" + "1" * 12
SESSION_2 = "s-" + "2" * 12
BOOT = "b-" + "0" * 16


def bxctl(*args: str) -> int:
    return int(app(list(args), result_action="return_value"))


async def bxctl_in_trio(*args: str) -> int:
    """An async command (it may ask brokerd) from inside a trio test."""
    return int(await app.run_async(list(args), result_action="return_value"))


@pytest.fixture
def home(tmp_path: Path) -> Path:
    root = tmp_path / "home"
    assert bxctl("init", "--home", str(root)) == 0
    return root


def decision(call: str, session: str, verdict: VerdictCode, reason: Reason | None) -> Decision:
    return Decision(
        call=call,
        session=session,
        tool="read_file",
        arguments={"path": "notes.txt"},
        verdict=verdict,
        reason=reason,
        grant="read-notes" if reason is None else None,
        taint=Taint.PUBLIC,
        untrusted=False,
        boot=BOOT,
    )


async def write_calls(home: Path) -> None:
    """Call A: asked, approved, ran. Call B (another session): denied no_grant."""
    writer = LedgerWriter.open(home / "ledger" / "audit.jsonl")
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        await writer.append(Start(boot=BOOT, version="test"))
        await writer.append(decision(CALL_A, SESSION_1, VerdictCode.ASK, None))
        await writer.append(decision(CALL_B, SESSION_2, VerdictCode.DENY, Reason.NO_GRANT))
        await writer.append(
            Approval(
                call=CALL_A,
                approval="a-12345678",
                outcome=ApprovalOutcome.ASK,
                reason=None,
                by=ApprovalBy.OWNER,
                taint=Taint.PUBLIC,
                untrusted=False,
                note="ok for today",
            )
        )
        await writer.append(
            Result(
                call=CALL_A,
                status=ResultStatus.OK,
                reason=None,
                label=Label(Taint.INTERNAL, False),
                taint_after=Taint.INTERNAL,
                untrusted_after=False,
                output_sha256="0" * 64,
                output_bytes=5,
            )
        )
        await writer.aclose()


def json_out(capsys: pytest.CaptureFixture[str]) -> Any:
    return orjson.loads(capsys.readouterr().out)


# --- init -----------------------------------------------------------------------------


def test_init_creates_a_private_home_with_a_sound_ledger(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for directory in ("", "run", "ledger", "state/sessions", "state/conversations", "logs"):
        assert stat.S_IMODE((home / directory).stat().st_mode) == 0o700, directory
    for file in ("config.toml", "grants.toml", "ledger/audit.jsonl"):
        assert stat.S_IMODE((home / file).stat().st_mode) == 0o600, file
    assert (home / "workspace").is_dir()
    capsys.readouterr()
    assert bxctl("audit", "verify", "--home", str(home), "--json") == 0
    report = json_out(capsys)
    assert report["sound"] is True
    assert report["records"] == 1


def test_init_again_keeps_the_owners_files(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (home / "grants.toml").write_text("# mine\n")
    ledger_before = (home / "ledger" / "audit.jsonl").read_bytes()
    capsys.readouterr()
    assert bxctl("init", "--home", str(home), "--json") == 0
    assert json_out(capsys)["written"] == []
    assert (home / "grants.toml").read_text() == "# mine\n"
    assert (home / "ledger" / "audit.jsonl").read_bytes() == ledger_before


def test_init_with_a_bad_config_names_the_key_and_the_runbook(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "home"
    root.mkdir(mode=0o700)
    (root / "config.toml").write_text("[broker]\npending_timout = 3\n")
    assert bxctl("init", "--home", str(root)) == 1
    err = capsys.readouterr().err
    assert "config.toml" in err
    assert "pending_timout" in err
    assert "docs/runbook.md#config" in err


# --- grants check -----------------------------------------------------------------------


def test_grants_check_valid(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (home / "grants.toml").write_text(
        '[[grant]]\nid = "read-notes"\ntool = "read_file"\nmode = "ask"\npaths = ["notes/**"]\n'
    )
    capsys.readouterr()
    assert bxctl("grants", "check", "--home", str(home), "--json") == 0
    assert json_out(capsys)["grants"] == [{"id": "read-notes", "tool": "read_file", "mode": "ask"}]


def test_grants_check_names_file_grant_and_key(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (home / "grants.toml").write_text(
        '[[grant]]\nid = "run-git"\ntool = "shell"\nmode = "auto"\npaths = ["x/**"]\n'
    )
    capsys.readouterr()
    assert bxctl("grants", "check", "--home", str(home)) == 1
    out = capsys.readouterr().out
    assert "grants.toml" in out
    assert "run-git" in out
    assert "paths" in out
    assert "docs/runbook.md#grants" in out
    assert bxctl("grants", "check", "--home", str(home), "--json") == 1
    problem = json_out(capsys)
    assert (problem["valid"], problem["grant"], problem["key"]) == (False, "run-git", "paths")


def test_grants_check_missing_file_is_invalid(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (home / "grants.toml").unlink()
    assert bxctl("grants", "check", "--home", str(home)) == 1
    assert "no such file" in capsys.readouterr().out


# --- audit verify -------------------------------------------------------------------------


async def test_verify_counts_calls_by_state(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    await write_calls(home)
    capsys.readouterr()
    assert bxctl("audit", "verify", "--home", str(home), "--json") == 0
    report = json_out(capsys)
    assert report["records"] == 6
    assert report["calls"]["complete"] == 1
    assert report["calls"]["denied"] == 1
    assert report["head"].startswith("5:")


async def test_verify_finds_a_flipped_byte_and_exits_1(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await write_calls(home)
    ledger = home / "ledger" / "audit.jsonl"
    lines = ledger.read_bytes().splitlines(keepends=True)
    lines[3] = lines[3].replace(b"no_grant", b"no_grunt")
    ledger.write_bytes(b"".join(lines))
    capsys.readouterr()
    assert bxctl("audit", "verify", "--home", str(home)) == 1
    out = capsys.readouterr().out
    # seq 3 itself still parses; the next line's prev no longer names it: seq 3 is named.
    assert out.splitlines()[0] == (
        "seq 3: seq 3 was changed (its hash is not what seq 4 names as prev)"
    )
    assert "problem(s) found" in out


async def test_verify_expect_head_detects_truncation(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await write_calls(home)
    assert bxctl("audit", "verify", "--home", str(home), "--json") == 0
    head = json_out(capsys)["head"]
    assert bxctl("audit", "verify", "--home", str(home), "--expect-head", head) == 0
    ledger = home / "ledger" / "audit.jsonl"
    lines = ledger.read_bytes().splitlines(keepends=True)
    ledger.write_bytes(b"".join(lines[:-1]))
    capsys.readouterr()
    # Without the noted head the shorter chain is sound (docs/threat-model.md); with
    # it, not.
    assert bxctl("audit", "verify", "--home", str(home)) == 0
    assert bxctl("audit", "verify", "--home", str(home), "--expect-head", head) == 1


def test_verify_usage_and_io_errors_exit_2(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert bxctl("audit", "verify", "--home", str(home), "--expect-head", "nonsense") == 2
    (home / "ledger" / "audit.jsonl").unlink()
    assert bxctl("audit", "verify", "--home", str(home)) == 2
    assert "audit.jsonl" in capsys.readouterr().err


def test_unknown_option_is_a_usage_error(home: Path) -> None:
    with pytest.raises(SystemExit) as exited:
        app(["audit", "verify", "--home", str(home), "--bogus"], result_action="return_value")
    assert exited.value.code == 2


# --- audit show -------------------------------------------------------------------------


async def test_show_by_call_session_and_tail(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await write_calls(home)
    capsys.readouterr()

    def shown(*args: str) -> list[dict[str, Any]]:
        assert bxctl("audit", "show", "--home", str(home), "--json", *args) == 0
        return [orjson.loads(line) for line in capsys.readouterr().out.splitlines()]

    assert [r["kind"] for r in shown("--call", CALL_A)] == ["decision", "approval", "result"]
    assert [r["call"] for r in shown("--session", SESSION_2)] == [CALL_B]
    assert [r["seq"] for r in shown("--tail", "2")] == [4, 5]
    assert len(shown()) == 6
    assert bxctl("audit", "show", "--home", str(home), "--call", CALL_B) == 0
    line = capsys.readouterr().out.strip()
    assert "decision" in line
    assert "reason=no_grant" in line
    assert bxctl("audit", "show", "--home", str(home), "--call", CALL_A, "--tail", "1") == 0
    result_line = capsys.readouterr().out.strip()
    assert 'label={"taint":"internal","untrusted":false}' in result_line
    assert "taint_after=internal" in result_line
    assert "untrusted_after=false" in result_line  # JSON's words, not Python's False
    assert "False" not in result_line
    assert bxctl("audit", "show", "--home", str(home), "--call", CALL_A, "--tail", "2") == 0
    approval_line = capsys.readouterr().out.splitlines()[0]
    assert "approval  c-" in approval_line
    assert "by=owner  note=ok for today  taint=public" in approval_line
    assert shown("--call", CALL_A)[1]["note"] == "ok for today"


async def test_show_says_which_lines_are_not_records_and_a_call_skips_them(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await write_calls(home)
    ledger = home / "ledger" / "audit.jsonl"
    # A line cut short, and one that is JSON of a decision of this call but not a record
    # (its verdict is no verdict): each read by the reader's typed path.
    bad = b'{"call":"%s","kind":"decision","verdict":"maybe"}' % CALL_A.encode()
    with ledger.open("ab") as file:
        file.write(b'{"seq":6,"at"\n' + bad + b"\n")
    capsys.readouterr()
    assert bxctl("audit", "show", "--home", str(home), "--tail", "2") == 0
    assert capsys.readouterr().out.splitlines() == [
        '(not a record) {"seq":6,"at"',
        f"(not a record) {bad.decode()}",
    ]
    assert bxctl("audit", "show", "--home", str(home), "--json", "--call", CALL_A) == 0
    kinds = [orjson.loads(line)["kind"] for line in capsys.readouterr().out.splitlines()]
    assert kinds == ["decision", "approval", "result"]


def test_show_of_a_call_not_in_the_ledger_exits_1(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    unknown = "c-" + "f" * 16
    assert bxctl("audit", "show", "--home", str(home), "--call", unknown) == 1
    err = capsys.readouterr().err
    assert err == f"bxctl: no records of call {unknown} in the ledger ({home}/ledger/audit.jsonl)\n"


# --- why ------------------------------------------------------------------------------------


def later_than_the_records(home: Path, monkeypatch: pytest.MonkeyPatch, seconds: float) -> str:
    """``why``'s now, ``seconds`` after the last record; that record's local time."""
    last = orjson.loads((home / "ledger" / "audit.jsonl").read_bytes().splitlines()[-1])
    at = parse_utc(last["at"])
    monkeypatch.setattr(why_module, "utc_now", lambda: at + dt.timedelta(seconds=seconds))
    return at.strftime("%H:%M:%S")


@pytest.mark.usefixtures("utc_owner")
async def test_why_tells_an_approved_call_in_sentences(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    await write_calls(home)
    (home / "grants.toml").write_text(
        '[[grant]]\nid = "read-notes"\ntool = "read_file"\nmode = "ask"\nnote = "my notes"\n'
    )
    capsys.readouterr()
    # All records within a moment: each is "2m 10s ago" give or take a second.
    when = later_than_the_records(home, monkeypatch, 130)
    assert await bxctl_in_trio("why", CALL_A, "--home", str(home)) == 0
    lines = capsys.readouterr().out.splitlines()
    ago = r"\d\d:\d\d:\d\d \(2m 1[01]s ago\)"
    expected = [
        f'call {CALL_A}: read_file {{"path":"notes.txt"}}, asked by session {SESSION_1}',
        rf"decided {ago}: ask",
        '  grant read-notes (in grants.toml now: mode ask, note "my notes")',
        # A ledger without policy records (written before them, or by hand): said so.
        "    its text then is not known: no policy record of its boot before the decision",
        "  the session was taint public, trusted",
        rf"approved by the owner; it ran on their word {ago} \(approval a-12345678, by owner\)",
        '  the owner\'s note: "ok for today"',
        "  decided again on the session at taint public, trusted",
        rf"ran {when} \(2m 10s ago\): ok, 5 bytes of output, labelled internal",
        "  the session is now taint internal, trusted",
    ]
    assert lines[0] == expected[0]
    for line, pattern in zip(lines[1:], expected[1:], strict=True):
        assert re.fullmatch(pattern, line) or line == pattern, (line, pattern)


@pytest.mark.usefixtures("utc_owner")
async def test_why_tells_a_denial_and_json_has_the_records(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    await write_calls(home)
    capsys.readouterr()
    later_than_the_records(home, monkeypatch, 5)
    assert await bxctl_in_trio("why", CALL_B, "--home", str(home)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert (
        lines[0] == f'call {CALL_B}: read_file {{"path":"notes.txt"}}, asked by session {SESSION_2}'
    )
    assert lines[2:] == [
        "  no grant decided it",
        "  denied because no_grant (no grant allows it)",
        "  the session was taint public, trusted",
    ]
    assert "True" not in "".join(lines)
    assert "None" not in "".join(lines)
    assert await bxctl_in_trio("why", CALL_A, "--home", str(home), "--json") == 0
    story = orjson.loads(capsys.readouterr().out)
    assert (story["call"], story["earlier"]) == (CALL_A, [])
    assert story["decision"]["grant"] == {
        "id": "read-notes",
        "mode": None,
        "note": None,
        "in_grants_now": False,
        "then": {
            "sha256": None,
            "policy_seq": None,
            "text": None,
            "missing": "no policy record of its boot before the decision",
        },
    }
    assert (story["approval"]["outcome"], story["approval"]["by"]) == ("ask", "owner")
    assert (story["result"]["status"], story["result"]["output_bytes"]) == ("ok", 5)


async def test_why_of_an_approval_id_tells_its_call(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await write_calls(home)
    assert await bxctl_in_trio("why", CALL_A, "--home", str(home)) == 0
    by_call = capsys.readouterr().out
    assert await bxctl_in_trio("why", "a-12345678", "--home", str(home)) == 0
    by_approval = capsys.readouterr().out
    assert by_approval.startswith(f"call {CALL_A}: ")
    # Only the "ago" of each line may differ between the two runs.
    strip = functools.partial(re.sub, r"\([^()]*ago\)", "")
    assert strip(by_approval) == strip(by_call)
    unknown = "a-" + "f" * 8
    assert await bxctl_in_trio("why", unknown, "--home", str(home)) == 1
    assert capsys.readouterr().err == (
        f"bxctl: no approval {unknown} in the ledger ({home}/ledger/audit.jsonl) nor waiting now\n"
    )


def test_why_of_an_unknown_call_exits_1_and_a_bad_id_2(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    unknown = "c-" + "f" * 16
    assert bxctl("why", unknown, "--home", str(home)) == 1
    assert capsys.readouterr().err == (
        f"bxctl: no call {unknown} in the ledger ({home}/ledger/audit.jsonl)\n"
    )
    assert bxctl("why", "c-123", "--home", str(home)) == 2


def test_show_rejects_a_tail_below_one(home: Path) -> None:
    assert bxctl("audit", "show", "--home", str(home), "--tail", "0") == 2


# --- the console script -------------------------------------------------------------------


def test_console_script_exit_code_is_the_commands(home: Path) -> None:
    (home / "grants.toml").write_text("[[grant]]\nid = 'Bad'\n")
    env = {**os.environ, "BOXMAKER_HOME": str(home)}
    done = subprocess.run(
        [sys.executable, "-c", "from boxmaker.cli.app import main; main()", "grants", "check"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1
    assert "invalid" in done.stdout


@pytest.mark.parametrize(
    ("stopped", "said"),
    [
        (
            True,
            "began 03:04:05 (1s ago) and was stopped: requester_gone "
            "(its requester left while it ran)",
        ),
        (
            False,
            "did not run 03:04:05 (1s ago): requester_gone (the requester left before it began)",
        ),
    ],
)
@pytest.mark.usefixtures("utc_owner")
def test_why_tells_whether_a_call_whose_requester_left_had_begun(stopped: bool, said: str) -> None:
    at = "2026-01-02T03:04:05.000Z"
    # The records as the ledger's reader yields them.
    decision = Decision(
        CALL_A,
        SESSION_1,
        "shell",
        {"command": "make"},
        VerdictCode.RUN,
        None,
        None,
        Taint.PUBLIC,
        False,
        "b-1",
    )
    result = Result.requester_gone(CALL_A, Label(Taint.PUBLIC, False), stopped=stopped)
    life = why_module.Life(
        CALL_A, Record(1, at, "00", decision), result=Record(2, at, "00", result)
    )
    lines = why_module.describe_life(life, parse_utc(at) + dt.timedelta(seconds=1))
    assert lines[-2:] == [said, "  the session is now taint public, trusted"]


@pytest.mark.usefixtures("utc_owner")
def test_why_names_an_mcp_calls_server_definition_and_approver() -> None:
    at = "2026-01-02T03:04:05.000Z"
    digest = "ab" * 32
    decision = Decision(
        CALL_A,
        SESSION_1,
        "mcp.git.git_log",
        {"repo_path": "/w"},
        VerdictCode.ASK,
        None,
        None,
        Taint.PUBLIC,
        False,
        "b-1",
        digest,
    )
    approval = Approval(
        CALL_A,
        "a-01234567",
        ApprovalOutcome.DENIED,
        "tool_changed",
        ApprovalBy.OWNER,
        Taint.PUBLIC,
        False,
        definition="cd" * 32,
        approver="mcp-client:claude-code",
    )
    life = why_module.Life(
        CALL_A, Record(1, at, "00", decision), approval=Record(2, at, "00", approval)
    )
    lines = why_module.describe_life(life, parse_utc(at) + dt.timedelta(seconds=1))
    assert lines[:3] == [
        f'call {CALL_A}: mcp.git.git_log {{"repo_path":"/w"}}, asked by session {SESSION_1}',
        "decided 03:04:05 (1s ago): ask",
        "  no grant decided it",
    ]
    assert lines[3] == f"  MCP server git, tool definition sha256 {digest}"
    assert lines[-4:] == [
        "  because tool_changed (the MCP tool's definition changed since it was pinned or "
        "asked about)",
        "  answered from mcp-client:claude-code, not at bxctl",
        "  decided again on the session at taint public, trusted",
        f"  on tool definition sha256 {'cd' * 32}",
    ]
