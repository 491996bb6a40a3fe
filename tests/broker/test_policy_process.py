"""Provenance on the real daemon and CLI (docs/protocol.md, "Policy records"): brokerd as
a process records every change of the grants it decides with, keeps each version,
``bxctl why`` shows the grant as it was at the decision, and ``bxctl audit verify``
finds a kept version tampered with. Real time, every wait bounded."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from typing import Any

import pytest
from tests.harness.broker import records, tool_request
from tests.harness.homes import grant, write_grants
from tests.harness.process import Daemon, connect, read_frame, send, start, wait_for

from boxmaker.core.grant_parse import parse_grants
from boxmaker.home.paths import Home
from boxmaker.ledger.policies import kept_path, policies_dir

pytestmark = pytest.mark.slow

FIRST = "# the owner's own grants\n" + grant("notes", "read_file", "auto", note="first")
SECOND = grant("notes", "read_file", "auto", note="second") + grant("look", "list_dir", "auto")
BROKEN = "[[grant]]\nid = 'Bad'\n"


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def ask(home: Home, tool: str, arguments: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    frame = tool_request(tool, arguments)
    with connect(home.broker_sock) as sock:
        send(sock, frame)
        return frame["call"], read_frame(sock)


def policies(home: Home) -> list[dict[str, Any]]:
    return [r for r in records(home) if r["kind"] == "policy"]


def seq_of_decision(home: Home, call: str) -> int:
    [decision] = [r for r in records(home) if r["kind"] == "decision" and r["call"] == call]
    return int(decision["seq"])


def bxctl(home: Home, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "boxmaker.cli.app", *args, "--home", str(home.root)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def grant_lines(text: str, gid: str) -> list[str]:
    """The ``[[grant]]`` table ``gid`` of ``text`` as ``why`` indents it."""
    tables = text.split("[[grant]]\n")[1:]
    [table] = [t for t in tables if f'id = "{gid}"' in t]
    return ["      [[grant]]", *[f"      {line}" for line in table.rstrip("\n").split("\n")]]


def start_on_first(home: Home, daemons: list[Daemon]) -> Daemon:
    """brokerd as a process on FIRST, with a notes.txt to read."""
    (home.default_workspace / "notes.txt").write_text("hi")
    write_grants(home, FIRST)
    return start(daemons, home)


def test_policy_records_follow_every_change_and_why_shows_the_grant_as_it_was(
    home: Home, daemons: list[Daemon]
) -> None:
    daemon = start_on_first(home, daemons)
    # Start: one.
    assert [(p["sha256"], p["grants"], p["problem"]) for p in policies(home)] == [
        (sha(FIRST), 1, None)
    ]
    first_kept = kept_path(policies_dir(home.audit_log), sha(FIRST))
    first_inode = first_kept.stat().st_ino
    first_call, answer = ask(home, "read_file", {"path": "notes.txt"})
    assert answer["outcome"] == "ok"

    # An edit, noticed at the next call: one more, before that call's decision.
    write_grants(home, SECOND)
    second_call, answer = ask(home, "list_dir", {"path": "."})
    assert answer["outcome"] == "ok"
    assert [p["sha256"] for p in policies(home)] == [sha(FIRST), sha(SECOND)]
    assert seq_of_decision(home, first_call) < policies(home)[1]["seq"]
    assert policies(home)[1]["seq"] < seq_of_decision(home, second_call)
    assert policies(home)[1]["grants"] == 2

    # SIGHUP without a change: none.
    daemon.process.send_signal(signal.SIGHUP)
    wait_for(lambda: "SIGHUP: config.toml re-read" in daemon.stderr(), "the SIGHUP re-read")
    assert len(policies(home)) == 2

    # An invalid file: a record with the problem; calls are denied as before.
    write_grants(home, BROKEN)
    _, answer = ask(home, "read_file", {"path": "notes.txt"})
    assert (answer["outcome"], answer["reason"]) == ("denied", "grants_invalid")
    problem = parse_grants(BROKEN, str(home.grants_toml))
    assert not hasattr(problem, "grants")
    assert {k: policies(home)[2][k] for k in ("sha256", "grants", "problem")} == {
        "sha256": sha(BROKEN),
        "grants": None,
        "problem": problem.describe(),
    }

    # Fixed again (the first file's very bytes): one more; the kept copy stays as it was.
    write_grants(home, FIRST)
    third_call, answer = ask(home, "read_file", {"path": "notes.txt"})
    assert answer["outcome"] == "ok"
    assert [p["sha256"] for p in policies(home)] == [
        sha(FIRST),
        sha(SECOND),
        sha(BROKEN),
        sha(FIRST),
    ]
    assert first_kept.stat().st_ino == first_inode
    assert {p["boot"] for p in policies(home)} == {records(home)[1]["boot"]}
    for record in policies(home):
        kept = kept_path(policies_dir(home.audit_log), record["sha256"])
        assert hashlib.sha256(kept.read_bytes()).hexdigest() == record["sha256"]
        assert oct(kept.stat().st_mode & 0o777) == "0o600"

    # why: the grant that decided each call, as it was then, though grants.toml changed.
    write_grants(home, grant("notes", "read_file", "deny", note="third"))
    for call, text, then in ((first_call, FIRST, 0), (second_call, SECOND, 1)):
        done = bxctl(home, "why", call)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        gid = "notes" if call == first_call else "look"
        header = (
            f"    grant {gid} as it was then (grants.toml {sha(text)[:12]}…, "
            f"policy seq {policies(home)[then]['seq']}):"
        )
        at = lines.index(header)
        assert lines[at + 1 : at + 1 + len(grant_lines(text, gid))] == grant_lines(text, gid)
    why_third = bxctl(home, "why", third_call).stdout
    assert 'note = "first"' in why_third
    assert 'note = "third"' not in why_third
    shown = bxctl(home, "audit", "show", "--call", second_call)
    assert shown.returncode == 0
    assert "  grant look as it was then" in shown.stdout
    assert '    tool = "list_dir"' in shown.stdout.splitlines()

    daemon.process.send_signal(signal.SIGINT)
    assert daemon.wait() == 0
    verified = bxctl(home, "audit", "verify")
    assert verified.returncode == 0, verified.stdout


def test_audit_verify_finds_a_kept_version_changed_removed_or_replaced_by_a_link(
    home: Home, daemons: list[Daemon]
) -> None:
    daemon = start_on_first(home, daemons)
    call, answer = ask(home, "read_file", {"path": "notes.txt"})
    assert answer["outcome"] == "ok"
    daemon.process.send_signal(signal.SIGINT)
    assert daemon.wait() == 0
    [record] = policies(home)
    kept = kept_path(policies_dir(home.audit_log), sha(FIRST))
    original = kept.read_bytes()
    assert bxctl(home, "audit", "verify").returncode == 0

    where = f"seq {record['seq']}: policy {sha(FIRST)[:12]}…: the kept version {kept.name}"
    see = "; see docs/runbook.md#policy-kept"
    kept.write_bytes(original.replace(b"first", b"firsT"))  # one byte
    done = bxctl(home, "audit", "verify")
    changed = hashlib.sha256(original.replace(b"first", b"firsT")).hexdigest()[:12]
    assert done.returncode == 1
    assert done.stdout.splitlines()[0] == f"{where} was changed: its bytes hash to {changed}…{see}"
    assert done.stdout.splitlines()[-1] == "ledger: 1 problem(s) found"

    kept.unlink()
    done = bxctl(home, "audit", "verify")
    assert (done.returncode, done.stdout.splitlines()[0]) == (1, f"{where} is missing{see}")
    why = bxctl(home, "why", call).stdout.splitlines()
    assert (
        f"    its text then is not known: the kept version {kept.name} is missing; "
        "see docs/runbook.md#policy-kept"
    ) in why

    copy = home.root / "copy.toml"
    copy.write_bytes(original)
    os.symlink(copy, kept)  # the right bytes, through a link: still not trusted
    done = bxctl(home, "audit", "verify")
    assert (done.returncode, done.stdout.splitlines()[0]) == (
        1,
        f"{where} is not a regular file (a symlink, which is not followed), not trusted{see}",
    )
    done = bxctl(home, "audit", "verify", "--json")
    assert done.returncode == 1
    assert '"sound":false' in done.stdout.replace(" ", "")

    kept.unlink()
    kept.write_bytes(original)
    assert bxctl(home, "audit", "verify").returncode == 0
