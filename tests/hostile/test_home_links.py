"""Hostile: links that make the workspace expose the home (docs/runbook.md#config).

The workspace is bound read-write into the sandbox. If, through a symlink anywhere on
either path, the workspace is the home or contains it, the model's shell could append an
``auto`` grant to grants.toml and talk to admin.sock as the owner: it would approve its
own calls. Every program refuses such a config at start (exit 2, like every config.toml
problem), and brokerd refuses a home that becomes contained while it runs.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.harness.broker import tool_request
from tests.harness.homes import grant, write_config, write_grants
from tests.harness.process import Daemon, connect, read_frame, send, start
from tests.harness.sandbox import AS_ROOT, SANDBOX_UID

from boxmaker.home.config import ConfigError, load_config
from boxmaker.home.paths import Home

pytestmark = pytest.mark.slow

EXIT_S = 30.0


@pytest.fixture
def base() -> Iterator[Path]:
    """A short scratch directory (AF_UNIX paths are capped at 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="bxl-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def make_home(directory: Path, *, name: Path | None = None) -> Home:
    """A real home at ``directory``, used under ``name`` (a link to it) when given."""
    Home(directory).create()
    if name is not None:
        name.symlink_to(directory)
    home = Home(name or directory)
    write_grants(home, grant("sh", "shell", "auto"))
    return home


def layout(base: Path, kind: str) -> tuple[Home, Path]:
    """One home and workspace, the config written; named paths never nest."""
    (base / "real").mkdir()
    if kind == "home-link-into-workspace":
        # The case: /base/hs -> /base/real/bxhome, workspace /base/real.
        home = make_home(base / "real" / "bxhome", name=base / "hs")
        workspace = base / "real"
    elif kind == "home-parent-link":
        # A link above the home: /base/up/bxhome is /base/real/up/bxhome.
        (base / "real" / "up").mkdir()
        (base / "up").symlink_to(base / "real" / "up")
        make_home(base / "real" / "up" / "bxhome")
        home = Home(base / "up" / "bxhome")
        workspace = base / "real"
    elif kind == "workspace-link-to-parent":
        # The workspace is a link to a directory that holds the home.
        home = make_home(base / "real" / "bxhome")
        (base / "ws").symlink_to(base / "real")
        workspace = base / "ws"
    elif kind == "workspace-link-to-home":
        home = make_home(base / "real" / "bxhome")
        (base / "ws").symlink_to(base / "real" / "bxhome")
        workspace = base / "ws"
    elif kind == "workspace-link-into-home":
        # Inside the home only workspace/ may be used; ledger/ through a link is not.
        home = make_home(base / "real" / "bxhome")
        (base / "ws").symlink_to(base / "real" / "bxhome" / "ledger")
        workspace = base / "ws"
    else:
        raise AssertionError(kind)
    write_config(home, f'workspace = "{workspace}"\n')
    return home, workspace


KINDS = [
    "home-link-into-workspace",
    "home-parent-link",
    "workspace-link-to-parent",
    "workspace-link-to-home",
    "workspace-link-into-home",
]


@pytest.mark.parametrize("kind", KINDS)
def test_every_program_reads_the_config_through_the_real_path_check(base: Path, kind: str) -> None:
    home, _ = layout(base, kind)
    with pytest.raises(ConfigError, match=r"^config\.toml: workspace: .*real path"):
        load_config(home)


@pytest.mark.parametrize("kind", KINDS)
def test_brokerd_refuses_to_start_when_the_workspace_reaches_the_home(
    base: Path, kind: str, daemons: list[Daemon]
) -> None:
    home, _ = layout(base, kind)
    daemon = start(daemons, home, ready=False)
    assert daemon.wait() == 2
    stderr = daemon.stderr()
    assert "config.toml: workspace: " in stderr
    assert "see docs/runbook.md#config" in stderr
    assert not home.broker_sock.exists()
    assert not home.audit_log.exists()


@pytest.mark.parametrize("module", ["boxmaker.loop.serve", "boxmaker.proxy.serve"])
def test_loopd_and_inferproxy_refuse_the_same_config(base: Path, module: str) -> None:
    home, _ = layout(base, "home-link-into-workspace")
    done = subprocess.run(
        [sys.executable, "-m", module, "serve", "--home", str(home.root)],
        capture_output=True,
        timeout=EXIT_S,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert b"config.toml: workspace: " in done.stderr
    assert b"see docs/runbook.md#config" in done.stderr


def move_home_into(home_dir: Path, link: Path, target: Path) -> None:
    """Move the home's directory to ``target`` and point its link there (atomically)."""
    home_dir.rename(target)
    temp = link.with_name(link.name + ".new")
    temp.symlink_to(target)
    temp.replace(link)


@pytest.mark.parametrize("how", ["SIGHUP", "poll"])
def test_brokerd_stops_when_the_home_is_moved_into_the_workspace(
    base: Path, daemons: list[Daemon], how: str
) -> None:
    (base / "real").mkdir()
    (base / "away").mkdir()
    home = make_home(base / "away" / "bxhome", name=base / "hs")
    write_config(home, f'workspace = "{base / "real"}"\n')
    daemon = start(daemons, home)
    move_home_into(base / "away" / "bxhome", base / "hs", base / "real" / "bxhome")
    if how == "SIGHUP":
        daemon.process.send_signal(signal.SIGHUP)
    # Without a signal, the grants watcher's look every 2 s finds it.
    assert daemon.wait() == 2
    stderr = daemon.stderr()
    assert "config.toml: workspace: " in stderr
    assert "see docs/runbook.md#config" in stderr


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_a_link_in_the_workspace_to_the_home_leads_nowhere(
    base: Path, daemons: list[Daemon]
) -> None:
    home = make_home(base / "bxhome")
    write_grants(
        home, grant("sh", "shell", "auto") + grant("rd", "read_file", "auto", paths=["**"])
    )
    # As root the sandbox runs as the workspace's owner: a workspace of an ordinary uid.
    workspace = base / "ws"
    workspace.mkdir()
    base.chmod(0o711)
    if AS_ROOT:
        os.chown(workspace, SANDBOX_UID, SANDBOX_UID)
    (workspace / "h").symlink_to(home.root)
    write_config(home, f'workspace = "{workspace}"\n')
    start(daemons, home)
    with connect(home.broker_sock) as sock:
        send(sock, tool_request("shell", {"command": "cat h/grants.toml; ls h/run"}))
        answer = read_frame(sock)
    # Only the workspace is bound: inside the sandbox the link dangles.
    assert (answer["outcome"], answer["reason"]) == ("failed", "tool_error"), answer
    assert answer["detail"] == (
        "exit status 2: cat: h/grants.toml: No such file or directory\n"
        "ls: cannot access 'h/run': No such file or directory"
    )
    with connect(home.broker_sock) as sock:
        send(sock, tool_request("read_file", {"path": "h/grants.toml"}))
        answer = read_frame(sock)
    assert (answer["outcome"], answer["reason"]) == ("failed", "path_escape"), answer


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_a_workspace_link_repointed_after_start_changes_nothing(
    base: Path, daemons: list[Daemon]
) -> None:
    # brokerd uses the real path it checked at start: a link repointed later (here at
    # a harmless directory; it could be one that holds the home) is not followed.
    home = make_home(base / "bxhome")
    write_grants(
        home, grant("sh", "shell", "auto") + grant("rd", "read_file", "auto", paths=["**"])
    )
    base.chmod(0o711)
    for name in ("one", "two"):
        (base / name).mkdir()
        (base / name / "marker").write_text(f"{name}\n")
        if AS_ROOT:
            os.chown(base / name, SANDBOX_UID, SANDBOX_UID)
    (base / "ws").symlink_to(base / "one")
    write_config(home, f'workspace = "{base / "ws"}"\n')
    start(daemons, home)
    temp = base / "ws.new"
    temp.symlink_to(base / "two")
    temp.replace(base / "ws")
    for frame in (
        tool_request("shell", {"command": "cat marker"}),
        tool_request("shell", {"command": "cat marker"}),
        tool_request("read_file", {"path": "marker"}),
    ):
        with connect(home.broker_sock) as sock:
            send(sock, frame)
            answer = read_frame(sock)
        assert (answer["outcome"], answer["content"]) == ("ok", "one\n"), answer
