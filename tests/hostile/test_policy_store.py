"""Hostile: the kept grants versions beside the ledger (``ledger/policies/``).

brokerd writes there (possibly as root) and ``bxctl audit verify`` / ``bxctl why`` read
there. Someone who can plant files in the home could try to make brokerd write through
a link (a kept name, or the directory itself, pointing elsewhere), hang it or verify on
a FIFO, exhaust memory with a huge grants.toml or kept file, or swap a kept version
after it was written so that ``why`` shows a grant that never decided. None works:
kept files are opened ``O_NOFOLLOW | O_NONBLOCK`` and used only when regular, the
directory is refused when it is a link, reads are bounded (1 MiB + 1 byte), and every
kept version must hash to its record's sha.
"""

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
from tests.harness.process import Daemon, connect, read_frame, send, start

from boxmaker.home.grants_file import MAX_GRANTS_BYTES
from boxmaker.home.paths import Home
from boxmaker.ledger.policies import kept_path, policies_dir

pytestmark = pytest.mark.slow

GRANTS = grant("notes", "read_file", "auto", note="the owner's")
SHA = hashlib.sha256(GRANTS.encode()).hexdigest()
BXCTL_S = 30.0
"""Real seconds: a verify on a FIFO must answer, not hang."""
HUGE = 8 << 30
"""A sparse file this large: read whole, it would take minutes and all the memory."""


def bxctl(home: Home, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "boxmaker.cli.app", *args, "--home", str(home.root)],
        capture_output=True,
        text=True,
        timeout=BXCTL_S,
        check=False,
    )


def ask(home: Home) -> dict[str, Any]:
    with connect(home.broker_sock) as sock:
        send(sock, tool_request("read_file", {"path": "notes.txt"}))
        return read_frame(sock)


def stop(daemon: Daemon) -> None:
    daemon.process.send_signal(signal.SIGINT)
    assert daemon.wait() == 0


def policies(home: Home) -> list[dict[str, Any]]:
    return [r for r in records(home) if r["kind"] == "policy"]


@pytest.fixture
def served(home: Home) -> Home:
    (home.default_workspace / "notes.txt").write_text("hi")
    write_grants(home, GRANTS)
    return home


def test_a_link_planted_at_a_kept_name_is_never_written_through(
    served: Home, daemons: list[Daemon]
) -> None:
    home = served
    victim = home.default_workspace / "victim.txt"
    victim.write_text("the model's file")
    directory = policies_dir(home.audit_log)
    directory.mkdir(mode=0o700)
    kept_path(directory, SHA).symlink_to(victim)
    daemon = start(daemons, home)
    assert ask(home)["outcome"] == "ok"
    stop(daemon)
    assert victim.read_text() == "the model's file"
    kept = kept_path(directory, SHA)
    assert not kept.is_symlink()
    assert kept.read_bytes() == GRANTS.encode()  # the right bytes, in the link's place
    assert "replaced an untrusted kept version" in daemon.stderr()
    assert bxctl(home, "audit", "verify").returncode == 0


def test_a_policies_directory_that_is_a_link_is_refused_and_verify_says_so(
    served: Home, daemons: list[Daemon]
) -> None:
    home = served
    elsewhere = home.default_workspace / "policies"
    elsewhere.mkdir()
    policies_dir(home.audit_log).symlink_to(elsewhere)
    daemon = start(daemons, home)
    assert ask(home)["outcome"] == "ok"  # recorded all the same; only the copy is missing
    stop(daemon)
    assert list(elsewhere.iterdir()) == []
    assert [p["sha256"] for p in policies(home)] == [SHA]
    assert "this grants.toml could not be kept" in daemon.stderr()
    done = bxctl(home, "audit", "verify")
    assert done.returncode == 1
    assert done.stdout.splitlines()[0] == (
        f"seq {policies(home)[0]['seq']}: policy {SHA[:12]}…: the kept version "
        f"{policies_dir(home.audit_log)} is a symlink, which is not followed; "
        "see docs/runbook.md#policy-kept"
    )


def test_a_fifo_at_a_kept_name_blocks_neither_brokerd_nor_verify_nor_why(
    served: Home, daemons: list[Daemon]
) -> None:
    home = served
    directory = policies_dir(home.audit_log)
    directory.mkdir(mode=0o700)
    os.mkfifo(kept_path(directory, SHA))
    daemon = start(daemons, home)  # ready within START_S: the FIFO was never waited on
    with connect(home.broker_sock) as sock:
        frame = tool_request("read_file", {"path": "notes.txt"})
        send(sock, frame)
        assert read_frame(sock)["outcome"] == "ok"
    stop(daemon)
    assert kept_path(directory, SHA).read_bytes() == GRANTS.encode()
    # A FIFO where a recorded version was: verify and why answer at once.
    kept_path(directory, SHA).unlink()
    os.mkfifo(kept_path(directory, SHA))
    done = bxctl(home, "audit", "verify")
    assert done.returncode == 1
    assert done.stdout.splitlines()[0].endswith(
        f"{SHA}.toml is not a regular file (a FIFO), not trusted; see docs/runbook.md#policy-kept"
    )
    why = bxctl(home, "why", frame["call"])
    assert why.returncode == 0
    assert "(a FIFO), not trusted; see docs/runbook.md#policy-kept" in why.stdout


def test_a_kept_version_swapped_after_it_was_written_fails_verify_and_why_shows_no_text(
    served: Home, daemons: list[Daemon]
) -> None:
    """The swap a reader of ``why`` would be fooled by: a broader grant under the same id,
    put in the kept version's place by a rename."""
    home = served
    daemon = start(daemons, home)
    with connect(home.broker_sock) as sock:
        frame = tool_request("read_file", {"path": "notes.txt"})
        send(sock, frame)
        assert read_frame(sock)["outcome"] == "ok"
    stop(daemon)
    kept = kept_path(policies_dir(home.audit_log), SHA)
    forged = kept.with_name("forged")
    forged.write_text(grant("notes", "read_file", "auto", paths=["**"], note="the owner's"))
    forged.replace(kept)
    done = bxctl(home, "audit", "verify")
    assert done.returncode == 1
    assert f"{SHA}.toml was changed: its bytes hash to" in done.stdout
    why = bxctl(home, "why", frame["call"]).stdout
    assert "paths" not in why
    assert "was changed" in why


def test_a_huge_grants_toml_is_never_read_whole_and_denies_as_invalid(
    served: Home, daemons: list[Daemon]
) -> None:
    home = served
    with home.grants_toml.open("r+b") as file:
        file.truncate(HUGE)  # sparse: costs no disk
    daemon = start(daemons, home)
    answer = ask(home)
    assert (answer["outcome"], answer["reason"]) == ("denied", "grants_invalid")
    assert f"larger than {MAX_GRANTS_BYTES} bytes" in answer["detail"]
    stop(daemon)
    [record] = policies(home)
    assert (record["sha256"], record["grants"]) == (None, None)
    assert record["problem"] == f"{home.grants_toml}: larger than {MAX_GRANTS_BYTES} bytes"
    assert not policies_dir(home.audit_log).exists() or not any(
        policies_dir(home.audit_log).iterdir()
    )
    assert bxctl(home, "audit", "verify").returncode == 0


def test_a_huge_file_at_a_kept_name_is_read_only_up_to_the_limit(
    served: Home, daemons: list[Daemon]
) -> None:
    home = served
    daemon = start(daemons, home)
    stop(daemon)
    kept = kept_path(policies_dir(home.audit_log), SHA)
    with kept.open("r+b") as file:
        file.truncate(HUGE)
    done = bxctl(home, "audit", "verify")
    assert done.returncode == 1
    assert f"{SHA}.toml is larger than any grants.toml brokerd reads" in done.stdout
