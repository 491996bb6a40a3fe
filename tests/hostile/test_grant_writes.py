"""Hostile: writing grants.toml (approve-always, revoke; grants_edit.py).

brokerd may run as root and now writes a file the owner's policy lives in, from a call
the model chose. None of these may happen: a link or a FIFO planted at grants.toml or
its lock followed or blocked on; an editor's save clobbered; a path or command the model
chose (glob or TOML syntax in it) turned into a grant broader than that one string; the
lock used to hang brokerd."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.harness.broker import Brokerd, Client, admin, records_of, tool_request
from tests.harness.cli import bxctl_in_process as bxctl
from tests.harness.grants import checked, exact_always, grant_set
from tests.harness.homes import grant, write_grants

from boxmaker.core.catalogue import CheckedArguments, HttpGetArgs, check_arguments
from boxmaker.core.grant_scope import ScopeProblem, grant_of
from boxmaker.core.grants import Grant, GrantSet, Mode
from boxmaker.home.file_ops import OsFileOps
from boxmaker.home.grants_edit import GrantsEditError, add_grant, lock_path, locked
from boxmaker.home.grants_file import load_grants
from boxmaker.home.paths import Home

NOW_TEXT = "# the owner's\n"
NOW = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)
LATER = NOW + dt.timedelta(days=1)


def _always(arguments: CheckedArguments) -> dict[str, object] | ScopeProblem:
    """What approve-always writes for exactly these arguments, asked by grant 'asks'."""
    asking = Grant("asks", arguments.tool, Mode.ASK)
    return exact_always(
        arguments, asking, approval="a-0000000a", call="c-000000000000000a", owner="owner", now=NOW
    )


def _fields(tool: str, raw: dict[str, str]) -> tuple[dict[str, object], Grant, CheckedArguments]:
    arguments = checked(tool, raw)
    fields = _always(arguments)
    assert not isinstance(fields, ScopeProblem), fields
    return fields, grant_of(fields), arguments


@contextlib.contextmanager
def grants_file(text: str = NOW_TEXT) -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as root:
        path = Path(root) / "grants.toml"
        path.write_text(text, encoding="utf-8")
        yield path


# Model-chosen strings: glob and fnmatch syntax, TOML's quotes, escapes, newlines, "]]".
_PIECE = st.sampled_from(
    [*"*?[]!\"'\\\n\r\t#=", "]]", "[[grant]]", '"""', "'''", "\\u0000", "\\"]
) | st.characters(exclude_characters="\x00", codec="utf-8")
NASTY = st.lists(_PIECE, min_size=1, max_size=20).map("".join)


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(command=NASTY, other=NASTY)
def test_a_model_chosen_command_becomes_a_grant_for_exactly_that_string(
    command: str, other: str
) -> None:
    fields, grant, arguments = _fields("shell", {"command": command})
    with grants_file() as path:
        add_grant(path, fields, grant)
        read = load_grants(path)  # brokerd's own reading of the file written
        assert isinstance(read, GrantSet)
        assert read.grants == (grant,)
        assert path.read_text(encoding="utf-8").startswith(NOW_TEXT)
    [written] = read.grants
    assert written.covers(arguments, LATER)
    if other != command:
        assert not written.covers(checked("shell", {"command": other}), LATER)


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(
    path=NASTY.filter(lambda p: "*" not in p and "/" not in p and p not in (".", "..")),
    other=NASTY,
)
def test_a_model_chosen_path_becomes_a_grant_for_exactly_that_path(path: str, other: str) -> None:
    fields, grant, arguments = _fields("read_file", {"path": path})
    with grants_file() as file:
        add_grant(file, fields, grant)
        read = load_grants(file)
    assert isinstance(read, GrantSet)
    [written] = read.grants
    assert written == grant
    assert written.covers(arguments, LATER)
    theirs = check_arguments("read_file", {"path": other})
    if isinstance(theirs, CheckedArguments) and theirs.paths != arguments.paths:
        assert not written.covers(theirs, LATER)


def test_a_path_with_a_star_gets_no_grant_at_all() -> None:
    problem = _always(checked("read_file", {"path": "secrets/*"}))
    assert isinstance(problem, ScopeProblem)


def test_a_symlink_at_grants_toml_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "workspace-file.toml"
    target.write_text(NOW_TEXT)
    link = tmp_path / "grants.toml"
    link.symlink_to(target)
    fields, grant, _ = _fields("shell", {"command": "ls"})
    with pytest.raises(GrantsEditError, match="a symlink, which is not followed"):
        add_grant(link, fields, grant)
    assert link.is_symlink()
    assert target.read_text() == NOW_TEXT


def test_a_symlink_or_fifo_at_the_lock_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "grants.toml"
    path.write_text(NOW_TEXT)
    elsewhere = tmp_path / "elsewhere"
    lock_path(path).symlink_to(elsewhere)
    fields, grant, _ = _fields("shell", {"command": "ls"})
    with pytest.raises(GrantsEditError, match=r"grants\.toml\.lock: not a regular file"):
        add_grant(path, fields, grant)
    assert not elsewhere.exists()  # not created through the link
    lock_path(path).unlink()
    os.mkfifo(lock_path(path))
    began = time.monotonic()
    with pytest.raises(GrantsEditError, match=r"not a regular file \(a FIFO\)"):
        add_grant(path, fields, grant)
    assert time.monotonic() - began < 2
    assert path.read_text() == NOW_TEXT


def test_a_fifo_at_grants_toml_is_refused_without_blocking(tmp_path: Path) -> None:
    path = tmp_path / "grants.toml"
    os.mkfifo(path)
    fields, grant, _ = _fields("shell", {"command": "ls"})
    began = time.monotonic()
    with pytest.raises(GrantsEditError, match="FIFO"):
        add_grant(path, fields, grant)
    assert time.monotonic() - began < 2


class _EditorSavesMeanwhile(OsFileOps):
    """The disk, where an editor saves grants.toml while the new file is written."""

    def __init__(self, path: Path, saved: str) -> None:
        self.path, self.saved = path, saved

    def write(self, fd: int, data: bytes | memoryview) -> int:
        # The editor writes without the lock, as editors do: a new file renamed over.
        temp = self.path.with_name("editor.tmp")
        temp.write_text(self.saved)
        temp.replace(self.path)
        return super().write(fd, data)


def test_an_editor_saving_meanwhile_is_not_clobbered(tmp_path: Path) -> None:
    path = tmp_path / "grants.toml"
    path.write_text(NOW_TEXT)
    saved = NOW_TEXT + grant("mine", "read_file", "ask")
    fields, new, _ = _fields("shell", {"command": "ls"})
    with pytest.raises(GrantsEditError, match="changed while it was being rewritten"):
        add_grant(path, fields, new, files=_EditorSavesMeanwhile(path, saved))
    assert path.read_text() == saved
    assert not list(tmp_path.glob(".grants.toml.*.tmp"))


async def test_a_held_lock_cannot_hang_brokerd(
    home: Home, brokerd: Brokerd, capsys: pytest.CaptureFixture[str]
) -> None:
    """Real threads and real time: the lock is waited for in a worker thread (its 5 s),
    brokerd answers everything else meanwhile, and the approve fails cleanly; the call
    waits."""
    (home.default_workspace / "n.txt").write_text("n\n")
    write_grants(home, grant("asks", "read_file", "ask"))
    broker = await brokerd.start()
    client = await Client.open(home.broker_sock)
    pending = await client.ask(tool_request("read_file", {"path": "n.txt"}))
    approval = pending["approval"]
    before = home.grants_toml.read_bytes()
    codes: list[int] = []
    with locked(home.grants_toml):
        async with trio.open_nursery() as nursery:

            async def approve() -> None:
                codes.append(await bxctl(home, "approve", approval, "--always"))

            nursery.start_soon(approve)
            await trio.sleep(0.3)
            began = trio.current_time()
            status = await admin(home, {"kind": "status"})
            assert status["pending"] == 1
            assert trio.current_time() - began < 0.5
    assert codes == [1]
    assert "grant_not_written" in capsys.readouterr().err
    assert home.grants_toml.read_bytes() == before
    assert [entry.approval for entry in broker.table.entries()] == [approval]
    answer = await admin(home, {"kind": "approve", "approval": approval})
    assert answer["outcome"] == "ask"
    await client.aclose()


WILDCARD_ASK = grant(
    "ask-example", "http_get", "ask", hosts=["*.example.com", "localhost:9"], note="ask me"
)


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("http://*.example.com/", "*.example.com"),
        ("https://*.EXAMPLE.com:443/x", "*.example.com"),
        # Percent-escaped: the ask grant's '*.example.com' matches it as well.
        ("http://%2A.example.com/", "%2A.example.com"),
    ],
)
async def test_a_wildcard_url_is_refused_and_no_approve_can_write_it(
    home: Home,
    brokerd: Brokerd,
    capsys: pytest.CaptureFixture[str],
    url: str,
    host: str,
) -> None:
    """The attack: the owner asks for http_get to ``*.example.com``; the model asks for
    ``http://*.example.com/``, which that grant matches; the owner approves it always,
    trusting ``exact`` to mean this one host, and every subdomain would run unasked
    (``hosts = ["*.example.com"]``). Now the URL is ``bad_arguments`` before anyone is
    asked, and recorded so; an approve of a real host writes that host and port only."""
    write_grants(home, WILDCARD_ASK)
    # What the model counts on: the owner's ask grant covers the URL as it is.
    [asking, *_] = grant_set(WILDCARD_ASK).grants
    assert asking.covers(CheckedArguments("http_get", HttpGetArgs(url)), NOW)
    await brokerd.start()
    client = await Client.open(home.broker_sock)
    request = tool_request("http_get", {"url": url})
    answer = await client.ask(request)
    detail = (
        f"argument 'url': the host {host!r} is not a host name or IP address: "
        "it has glob characters or escapes"
    )
    assert answer == {
        "kind": "answer",
        "final": True,
        "call": request["call"],
        "outcome": "denied",
        "reason": "bad_arguments",
        "detail": detail,
    }
    await client.aclose()
    [decision] = [r for r in records_of(home, request["call"]) if r["kind"] == "decision"]
    assert (decision["verdict"], decision["reason"], decision["grant"]) == (
        "deny",
        "bad_arguments",
        None,
    )
    assert (decision["tool"], decision["arguments"]) == ("http_get", {"url": url})
    assert await bxctl(home, "approvals", "--json") == 0
    assert capsys.readouterr().out.strip() == "[]"
    assert home.grants_toml.read_text(encoding="utf-8") == WILDCARD_ASK

    # The same grant asks for a real host; approved always, exactly that host and port.
    client = await Client.open(home.broker_sock)
    pending = await client.ask(tool_request("http_get", {"url": "http://LOCALHOST:9/x"}))
    assert pending["kind"] == "pending", pending
    assert await bxctl(home, "approve", pending["approval"], "--always") == 0
    # It ran, and failed at the address check: loopback, which the grant does not name.
    assert (await client.final())["outcome"] == "failed"
    await client.aclose()
    written = load_grants(home.grants_toml)
    assert isinstance(written, GrantSet)
    hosts = [(g.id, g.hosts) for g in written.grants]
    assert hosts == [
        ("ask-example", ("*.example.com", "localhost:9")),
        (f"always-{pending['approval']}", ("localhost:9",)),
    ]
