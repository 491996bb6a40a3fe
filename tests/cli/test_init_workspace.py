"""``bxctl init --workspace DIR``: a workspace the shell's sandbox can use (cli/init.py;
docs/decisions.md, "A workspace the sandbox can use"; docs/runbook.md#sandbox-as-root).

As root the sandbox runs as an ordinary uid: the tests play the real case, a new
workspace given to it, and those init must not fix by itself."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from tests.harness.sandbox import AS_ROOT, SANDBOX_UID

from boxmaker.broker.sandbox_check import sandbox_problem
from boxmaker.cli.app import app
from boxmaker.cli.init import SANDBOX_OWNER
from boxmaker.home.config import load_config
from boxmaker.home.paths import Home

as_root = pytest.mark.skipif(not AS_ROOT, reason="the sandbox runs as another uid only as root")


def bxctl(*args: str) -> int:
    return int(app(list(args), result_action="return_value"))


@pytest.fixture
def base() -> Iterator[Path]:
    """A directory every uid can search (pytest's tmp_path is under root's 0700)."""
    made = Path(tempfile.mkdtemp(prefix="bx-init-", dir="/tmp"))
    made.chmod(0o711)
    try:
        yield made
    finally:
        shutil.rmtree(made, ignore_errors=True)


def init(base: Path, workspace: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, Any]:
    capsys.readouterr()
    code = bxctl("init", "--home", str(base / "home"), "--workspace", str(workspace), "--json")
    return code, orjson.loads(capsys.readouterr().out)


def test_a_new_workspace_is_created_and_named_in_the_new_config(
    base: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workspace = base / "srv" / "agent work"
    code, said = init(base, workspace, capsys)
    assert code == 0
    assert load_config(Home(base / "home")).workspace == workspace
    assert f'workspace = "{workspace}"' in (base / "home" / "config.toml").read_text()
    assert stat.S_IMODE(workspace.stat().st_mode) == 0o700
    assert (said["workspace"], said["shell_ready"], said["shell_problem"]) == (
        str(workspace),
        True,
        None,
    )
    assert sandbox_problem(workspace, None) is None
    # The owner: the sandbox's uid as root (never root), else whoever ran init.
    owner = SANDBOX_OWNER if AS_ROOT else os.geteuid()
    assert (workspace.stat().st_uid, workspace.stat().st_gid) == (
        owner,
        owner if AS_ROOT else os.getegid(),
    )
    assert said["workspace_owner"] == (SANDBOX_OWNER if AS_ROOT else None)


@as_root
def test_as_root_a_new_workspace_goes_to_the_configured_sandbox_uid(
    base: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = base / "home"
    home.mkdir(mode=0o700)
    workspace = base / "work"
    (home / "config.toml").write_text(f'workspace = "{workspace}"\n[runner]\nsandbox_uid = 4242\n')
    code, said = init(base, workspace, capsys)
    assert code == 0
    assert (workspace.stat().st_uid, workspace.stat().st_gid) == (4242, 4242)
    assert (said["workspace_owner"], said["shell_ready"]) == (4242, True)


@as_root
def test_as_root_an_empty_workspace_of_roots_is_given_to_the_sandbox(
    base: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workspace = base / "work"
    workspace.mkdir(mode=0o700)
    code, said = init(base, workspace, capsys)
    assert code == 0
    assert workspace.stat().st_uid == SANDBOX_OWNER == SANDBOX_UID
    assert said["shell_ready"] is True


@as_root
def test_as_root_a_workspace_of_roots_with_files_is_left_and_the_command_said(
    base: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workspace = base / "work"
    workspace.mkdir(mode=0o700)
    (workspace / "notes.txt").write_text("mine\n")
    code, said = init(base, workspace, capsys)
    assert code == 1
    # Nothing taken from its owner.
    assert (workspace.stat().st_uid, (workspace / "notes.txt").stat().st_uid) == (0, 0)
    assert said["shell_ready"] is False
    assert said["shell_problem"] == (
        f"brokerd runs as root and the workspace {workspace} belongs to root; the sandbox "
        "never runs as host root (uid 0): set [runner] sandbox_uid to an ordinary uid "
        "that owns the workspace (or run brokerd as an ordinary user); "
        "see docs/runbook.md#sandbox-as-root"
    )
    assert said["run"] == f"chown -R {SANDBOX_OWNER}:{SANDBOX_OWNER} {workspace}"
    # What it says to run is what makes the shell runnable there.
    os.chown(workspace, SANDBOX_OWNER, SANDBOX_OWNER)
    assert sandbox_problem(workspace, None) is None


@as_root
def test_as_root_a_directory_above_that_the_sandbox_cannot_search_is_named_not_opened(
    base: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    closed = base / "closed"
    closed.mkdir(mode=0o700)
    workspace = closed / "work"
    code, said = init(base, workspace, capsys)
    assert code == 1
    assert stat.S_IMODE(closed.stat().st_mode) == 0o700
    assert workspace.stat().st_uid == SANDBOX_OWNER
    assert said["shell_problem"] == (
        f"the sandbox runs as uid {SANDBOX_OWNER} (gid {SANDBOX_OWNER}) and cannot reach the "
        f"workspace: {closed}, above the workspace, is not searchable by it (mode 0700, "
        f"owner 0, group 0); `chmod o+x {closed}`, or use another workspace; "
        "see docs/runbook.md#sandbox-as-root"
    )
    assert said["run"] is None


@as_root
def test_as_root_the_homes_own_workspace_is_warned_of_and_init_still_succeeds(
    base: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bxctl("init", "--home", str(base / "home")) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(
        "bxctl: warning: the shell tool cannot run in this workspace: brokerd runs as root "
        f"and the workspace {base / 'home' / 'workspace'} belongs to root;"
    )
    assert err[1] == (
        "bxctl: `bxctl init --workspace DIR` sets up a workspace it can use; "
        "see docs/runbook.md#sandbox-as-root"
    )


def test_an_existing_config_naming_another_workspace_is_not_edited(
    base: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = base / "home"
    home.mkdir(mode=0o700)
    config = f'workspace = "{base / "old"}"\n'
    (home / "config.toml").write_text(config)
    capsys.readouterr()
    workspace = base / "new"
    assert bxctl("init", "--home", str(home), "--workspace", str(workspace)) == 2
    assert capsys.readouterr().err.strip() == (
        f"bxctl: {home / 'config.toml'} names the workspace {base / 'old'}; to use "
        f'{workspace}, set `workspace = "{workspace}"` there and run init again; '
        "see docs/runbook.md#config"
    )
    assert (home / "config.toml").read_text() == config
    assert not workspace.exists()
