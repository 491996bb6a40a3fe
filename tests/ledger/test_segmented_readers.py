"""Every reader of the ledger over a segmented ledger gives what it gives over the same
lines in one file (docs/protocol.md, "Reading and verifying segments"): ``bxctl audit
verify``, ``audit show`` (all, a tail, a call, a session, as JSON), ``why``, ``grants
list``, ``grants what-if``, ``audit prove`` and ``audit consistency``, in process, their
exit codes and their output, line for line."""

from __future__ import annotations

import contextlib
import io
import re
import shutil
import tempfile
from pathlib import Path

import orjson
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.harness.ledger_gen import write_ledger

from boxmaker.cli.app import app
from boxmaker.home.paths import Home
from boxmaker.ledger.ledger_key import load_ledger_signer, read_ledger_origin
from boxmaker.ledger.segments import SEGMENTS_DIR, ledger_files

AGO = re.compile(r"\b(\d+[hms] ?)+ ago\b")
CANDIDATE = b"""\
[[grant]]
id = "read-notes"
tool = "read_file"
paths = ["notes/**"]
mode = "ask"
"""


def run(*args: str, is_async: bool = False) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        if is_async:
            code = trio.run(lambda: app.run_async(list(args), result_action="return_value"))
        else:
            code = app(list(args), result_action="return_value")
    return int(code), since(out.getvalue()), since(err.getvalue())


def since(text: str) -> str:
    """The text less how long ago each time was (the clock moves between the runs)."""
    return AGO.sub("ago", text)


def readers(
    home: Home, call: str, session: str, kept: Path, candidate: Path
) -> list[tuple[int, str, str]]:
    at = ("--home", str(home.root))
    return [
        run("audit", "verify", *at),
        run("audit", "show", *at),
        run("audit", "show", "--tail", "7", *at),
        run("audit", "show", "--call", call, *at),
        run("audit", "show", "--session", session, "--tail", "30", "--json", *at),
        run("why", call, *at, is_async=True),
        run("why", call, "--json", *at, is_async=True),
        run("grants", "list", *at),
        run("grants", "what-if", str(candidate), *at),
        run("audit", "prove", call, *at),
        run("audit", "consistency", str(kept), *at),
    ]


def unsegment(home: Home) -> None:
    """The same lines in one file: the segments' and the live file's, in order."""
    whole = b"".join(path.read_bytes() for path in ledger_files(home.ledger_dir).paths())
    shutil.rmtree(home.ledger_dir / SEGMENTS_DIR)
    home.audit_log.write_bytes(whole)


@settings(max_examples=6, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    records=st.integers(150, 400),
    segment=st.integers(2, 100),
    every=st.integers(40, 300),
    pick=st.integers(0, 10_000),
)
def test_each_reader_reads_a_segmented_ledger_as_the_same_lines_in_one_file(
    seed: int, records: int, segment: int, every: int, pick: int
) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        home = Home(Path(scratch) / "home")
        assert run("init", "--home", str(home.root))[0] == 0
        signer = load_ledger_signer(home, read_ledger_origin(home.audit_log))
        write_ledger(
            home.ledger_dir, records, signer, every=every, seed=seed, segment_records=segment
        )
        assert ledger_files(home.ledger_dir).segments
        decisions = [
            fields
            for path in ledger_files(home.ledger_dir).paths()
            for line in path.read_bytes().splitlines()
            if (fields := orjson.loads(line))["kind"] == "decision"
        ]
        chosen = decisions[pick % len(decisions)]
        first_note = next(
            orjson.loads(line)["note"]
            for path in ledger_files(home.ledger_dir).paths()
            for line in path.read_bytes().splitlines()
            if b'"kind":"checkpoint"' in line
        )
        kept = Path(scratch) / "kept.note"
        kept.write_text(first_note)
        candidate = Path(scratch) / "candidate.toml"
        candidate.write_bytes(CANDIDATE)
        segmented = readers(home, chosen["call"], chosen["session"], kept, candidate)
        # Where the use was counted is named as the owner sees the files: told apart.
        described = ledger_files(home.ledger_dir).describe()
        assert described.startswith(f"{home.ledger_dir} (")
        assert "sealed segment" in described
        assert f"use counted in {described} (" in segmented[7][1]
        unsegment(home)
        whole = readers(home, chosen["call"], chosen["session"], kept, candidate)
        one_file = str(home.audit_log)
        assert [
            (code, out.replace(described, one_file), err) for code, out, err in segmented
        ] == whole
        assert segmented[0][0] == 0  # verify: sound
        assert segmented[3][0] == 0  # show --call: found


def test_a_call_in_archived_lines_is_said_to_be_archived(tmp_path: Path) -> None:
    home = Home(tmp_path / "home")
    assert run("init", "--home", str(home.root))[0] == 0
    signer = load_ledger_signer(home, read_ledger_origin(home.audit_log))
    write_ledger(home.ledger_dir, 200, signer, every=60, seed=5, segment_records=50)
    oldest = ledger_files(home.ledger_dir).segments[0]
    call = next(
        fields["call"]
        for line in oldest.path.read_bytes().splitlines()
        if (fields := orjson.loads(line))["kind"] == "decision"
    )
    oldest.path.rename(tmp_path / oldest.path.name)  # archived away
    code, out, err = run("why", call, "--home", str(home.root), is_async=True)
    assert (code, out) == (1, "")
    assert err == (
        f"bxctl: no call {call} in the ledger ({home.ledger_dir} (3 sealed segments and "
        f"audit.jsonl; lines 0-49 archived away))\n"
    )
