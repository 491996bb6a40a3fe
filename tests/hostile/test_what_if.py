"""Hostile: what ``bxctl grants what-if`` reads and shows.

The ledger holds what the model chose (a shell command line may hold any character but
NUL), and a ledger edited by hand may hold anything; the candidate is a file the owner
names, which may be a FIFO (an open would block for good), a link (to somewhere else),
or huge. So: every text from the ledger or the candidate is shown escaped, in text and
in JSON; a line that is not a well-formed decision is counted and skipped, never a
crash; the candidate is read only when it is a regular file at its own name, and only up
to 1 MiB.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from boxmaker.cli.app import app
from boxmaker.cli.what_if import MAX_CANDIDATE_BYTES
from boxmaker.core.labels import Taint
from boxmaker.core.reasons import Reason
from boxmaker.formats.clock import format_utc
from boxmaker.ledger.records import GENESIS_PREV, Decision, Genesis, encode_line, line_hash

AT = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)
BOOT = "b-" + "0" * 16
SESSION = "s-" + "1" * 12
ESCAPES = "\x1b[2J\x1b]0;owned\x07\u202egnp.exe\u200b\n"
ESCAPED = "\\u001b[2J\\u001b]0;owned\\u0007\\u202egnp.exe\\u200b\\u000a"
ESCAPED_IN_JSON = ESCAPED.replace("\\u000a", "\\n")
"""Arguments are shown as JSON, which writes the newline ``\\n`` itself."""
CANDIDATE = '[[grant]]\nid = "sh"\ntool = "shell"\nmode = "ask"\n'


def bxctl(*args: str) -> int:
    return int(app(list(args), result_action="return_value"))


@pytest.fixture
def home(tmp_path: Path) -> Path:
    root = tmp_path / "home"
    assert bxctl("init", "--home", str(root)) == 0
    return root


def write_lines(home: Path, lines: list[bytes]) -> None:
    (home / "ledger" / "audit.jsonl").write_bytes(b"".join(line + b"\n" for line in lines))


def decision_line(seq: int, prev: str, **fields: Any) -> bytes:
    body = {
        "call": f"c-{seq:016x}",
        "session": SESSION,
        "tool": "shell",
        "arguments": {"command": "ls"},
        "verdict": "run",
        "reason": None,
        "grant": "sh-auto",
        "taint": Taint.PUBLIC,
        "untrusted": False,
        "boot": BOOT,
    } | fields
    return encode_line(seq, format_utc(AT), prev, Decision(**body))


def ledger_of(*decisions: dict[str, Any]) -> list[bytes]:
    lines = [encode_line(0, format_utc(AT), GENESIS_PREV, Genesis(ledger="l-1"))]
    for fields in decisions:
        lines.append(decision_line(len(lines), line_hash(lines[-1]), **fields))
    return lines


def run_what_if(
    home: Path, candidate: Path, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, str, str]:
    capsys.readouterr()
    code = bxctl("grants", "what-if", str(candidate), *args, "--home", str(home))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.usefixtures("utc_owner")
def test_the_models_text_in_the_ledger_is_shown_escaped(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A command line the model chose, a grant id and a session id from a ledger edited
    # by hand: each reaches the screen only escaped.
    write_lines(
        home,
        ledger_of(
            {"arguments": {"command": "echo " + ESCAPES}},
            {"grant": "sh" + ESCAPES, "session": "s-" + ESCAPES},
        ),
    )
    candidate = tmp_path / "c.toml"
    candidate.write_text(CANDIDATE)
    code, out, _ = run_what_if(home, candidate, capsys)
    assert code == 0
    assert "\x1b" not in out
    assert "\u202e" not in out
    lines = out.splitlines()
    assert lines[3:] == [
        "sh-auto → sh: 1 call",
        f"  run → ask  2026-06-01 12:00:00  c-0000000000000001  {SESSION}  "
        f'shell {{"command":"echo {ESCAPED_IN_JSON}"}}',
        "",
        f"sh{ESCAPED} → sh: 1 call",
        f"  run → ask  2026-06-01 12:00:00  c-0000000000000002  s-{ESCAPED}  "
        'shell {"command":"ls"}',
    ]
    code, out, _ = run_what_if(home, candidate, capsys, "--json")
    assert code == 0
    assert "\x1b" not in out
    assert "\u202e" not in out
    answer = orjson.loads(out)
    assert answer["groups"][0]["calls"][0]["arguments"] == {"command": "echo " + ESCAPES}


def test_a_candidates_name_and_problems_are_shown_escaped(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    named = tmp_path / "grants\x1b[2J.toml"
    # A key spelled with TOML's escapes holds the controls themselves.
    named.write_text(
        '[[grant]]\nid = "x"\ntool = "shell"\nmode = "ask"\n"\\u001b]0;t\\u0007" = 1\n'
    )
    code, out, _ = run_what_if(home, named, capsys)
    assert code == 2
    assert "\x1b" not in out
    assert "\x07" not in out
    assert out.splitlines() == [
        "the candidate does not parse (1 problem(s)):",
        f"  {tmp_path}/grants\\u001b[2J.toml, grant 'x', key '\\x1b]0;t\\x07': unknown key",
    ]
    missing = tmp_path / "gone\x1b[2J.toml"
    code, _, err = run_what_if(home, missing, capsys)
    assert (code, err) == (2, f"bxctl: {tmp_path}/gone\\u001b[2J.toml: No such file or directory\n")


def test_malformed_ledger_lines_are_counted_not_fatal(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = ledger_of({})
    deep = b"[" * 100_000 + b"]" * 100_000  # past orjson's nesting limit
    bad_fields = [
        {"arguments": ["ls"]},
        {"untrusted": 1},
        {"taint": "top-secret"},
        {"verdict": "maybe"},
        {"reason": "because"},
        {"seq": "1"},
        {"at": "yesterday"},
        {"at": "2026-06-01T12:00:00"},  # no zone
        {"grant": 7},
    ]
    lines = list(good)
    for fields in bad_fields:
        record = orjson.loads(good[1]) | fields
        lines.append(orjson.dumps(record))
    lines += [b'{"kind":"decision"', b"decision " + deep, b'"decision"', b"\xff decision"]
    write_lines(home, lines)
    candidate = tmp_path / "c.toml"
    candidate.write_text(CANDIDATE)
    code, out, _ = run_what_if(home, candidate, capsys, "--json")
    assert code == 0
    answer = orjson.loads(out)
    assert (answer["replayed"], answer["changed"]) == (1, 1)
    assert answer["skipped"]["malformed"] == len(bad_fields) + 4
    # Arguments that are a JSON object but no longer check: replayed as nothing.
    write_lines(home, ledger_of({"arguments": {"command": "a\x00b"}}, {"tool": "rm_rf"}))
    code, out, _ = run_what_if(home, candidate, capsys, "--json")
    assert orjson.loads(out)["skipped"]["unreplayable"] == 2


def test_a_huge_candidate_is_refused_unread(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    huge = tmp_path / "huge.toml"
    with huge.open("wb") as file:
        file.truncate(64 * 1024 * 1024 * 1024)  # sparse: 64 GiB that take no room
    started = time.monotonic()
    code, _, err = run_what_if(home, huge, capsys)
    assert time.monotonic() - started < 5
    assert (code, err) == (
        2,
        f"bxctl: {huge}: over {MAX_CANDIDATE_BYTES} bytes, not a grants file\n",
    )


def test_a_link_at_the_candidates_name_is_not_followed(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    real = tmp_path / "real.toml"
    real.write_text(CANDIDATE)
    link = tmp_path / "link.toml"
    link.symlink_to(real)
    code, out, err = run_what_if(home, link, capsys)
    assert (code, out) == (2, "")
    assert err == f"bxctl: {link}: not a regular file (a symlink, which is not followed)\n"


def test_a_fifo_candidate_is_refused_at_once(home: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo, 0o600)
    # A process of its own: a blocking open would hang it (no writer ever comes), and
    # the timeout would then fail the test instead of hanging the suite.
    done = subprocess.run(
        [sys.executable, "-m", "boxmaker.cli.app", "grants", "what-if", str(fifo),
         "--home", str(home)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr == f"bxctl: {fifo}: not a regular file (a FIFO)\n"


def test_a_decision_not_made_by_grants_is_never_shown_as_a_flip(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A bad_arguments denial holds the model's raw arguments (never checked): it is
    # counted, and its arguments are not replayed or shown.
    raw = {"command": ESCAPES * 3, "extra": [1, 2]}
    write_lines(
        home,
        ledger_of(
            {"arguments": raw, "verdict": "deny", "reason": Reason.BAD_ARGUMENTS, "grant": None}
        ),
    )
    candidate = tmp_path / "c.toml"
    candidate.write_text(CANDIDATE)
    code, out, _ = run_what_if(home, candidate, capsys)
    assert code == 0
    assert out.splitlines()[1:] == [
        "replayed 0 decisions: 0 would change, 0 would not",
        "skipped 1 decision not made by grants (bad_arguments 1)",
        "",
        "candidate grants that would never have matched a recorded call:",
        "  sh: shell ask",
    ]
