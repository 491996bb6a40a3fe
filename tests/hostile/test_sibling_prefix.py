"""Hostile: a sibling of the workspace whose name starts with the workspace's own.

The attack: the workspace is ``ws/``; beside it lie ``ws-evil/``, ``ws2/`` or ``ws.d/``
(another project, a backup, a configuration directory), whose real paths start with the
string ``…/ws``. A link the model's shell planted in the workspace (``f ->
../ws-evil/secret.txt``, ``d -> ../ws-evil``) then passes any containment check that is
a bare string prefix, and the file tools read, list or overwrite the sibling; so does a
name moved to the sibling between the walk and the check on the open descriptor, and
an absolute path argument. Every place containment is decided is replayed here against
the real brokerd (serve_broker on its real sockets, in process): the file tools' real
path check and their check of the opened descriptor (broker/tools/files.py), the cached
read's (broker/nowait.py), the write preview's reading (broker/preview.py), the absolute
path argument (core/paths.py); and the home's own check (home/config.py), which must neither
refuse a sibling of the home nor take one for the home.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import attrs
import pytest
from tests.harness.broker import PENDING_TIMEOUT, Brokerd, Client, call, records_of, tool_request
from tests.harness.cli import bxctl_in_process as bxctl
from tests.harness.homes import grant, write_config, write_grants

from boxmaker.broker import nowait, runner
from boxmaker.broker.tools.host import Host
from boxmaker.home.config import workspace_problem
from boxmaker.home.paths import Home

SECRET: Final = "the sibling's own words\n"
SIBLINGS: Final = ["ws-evil", "ws2", "ws.d"]
FILE_TOOLS_AUTO: Final = (
    grant("read", "read_file", "auto")
    + grant("list", "list_dir", "auto")
    + grant("write", "write_file", "auto")
)


@attrs.frozen
class Planted:
    workspace: Path
    sibling: Path
    secret: Path


@pytest.fixture(params=SIBLINGS)
def planted(request: pytest.FixtureRequest, home: Home, tmp_path: Path) -> Planted:
    """The workspace ``ws/`` beside the sibling, with links into the sibling."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    sibling = tmp_path / request.param
    sibling.mkdir()
    secret = sibling / "secret.txt"
    secret.write_text(SECRET, encoding="utf-8")
    (workspace / "notes.txt").write_text("notes\n", encoding="utf-8")
    (workspace / "f").symlink_to(f"../{request.param}/secret.txt")
    (workspace / "d").symlink_to(f"../{request.param}")
    write_config(
        home, f'workspace = "{workspace}"\n[broker]\npending_timeout = {PENDING_TIMEOUT}\n'
    )
    # What a bare string prefix would let through: each link's real path starts with
    # the workspace's, and following it reads the sibling.
    for link in ("f", "d"):
        assert os.path.realpath(workspace / link).startswith(str(workspace))
    assert (workspace / "f").read_text(encoding="utf-8") == SECRET
    return Planted(workspace, sibling, secret)


def _untouched(planted: Planted) -> None:
    assert planted.secret.read_text(encoding="utf-8") == SECRET
    assert sorted(os.listdir(planted.sibling)) == ["secret.txt"]


async def _failed(home: Home, tool: str, arguments: dict[str, Any]) -> tuple[str, str]:
    """One call's final answer (its reason and detail), checked against its records."""
    frame = tool_request(tool, arguments)
    answer = (await call(home, frame))[-1]
    assert answer["outcome"] in ("failed", "denied"), answer
    assert "content" not in answer
    records = records_of(home, frame["call"])
    if answer["outcome"] == "failed":
        [result] = [r for r in records if r["kind"] == "result"]
        assert (result["status"], result["reason"], result["output_bytes"]) == (
            "failed",
            answer["reason"],
            0,
        )
    else:
        [decision] = [r for r in records if r["kind"] == "decision"]
        assert (decision["verdict"], decision["reason"]) == ("deny", answer["reason"])
    return answer["reason"], answer["detail"]


ESCAPES = [
    pytest.param("read_file", {"path": "f"}, "f", id="read-link-to-file"),
    pytest.param("read_file", {"path": "d/secret.txt"}, "d/secret.txt", id="read-through-dir"),
    pytest.param("list_dir", {"path": "d"}, "d", id="list-link-to-dir"),
    # write_file names the directory it would write in.
    pytest.param("write_file", {"path": "d/secret.txt", "content": "x"}, "d", id="overwrite"),
    pytest.param("write_file", {"path": "d/new.txt", "content": "x"}, "d", id="create"),
]


@pytest.mark.parametrize(("tool", "arguments", "named"), ESCAPES)
async def test_a_link_into_a_sibling_is_an_escape(
    home: Home,
    brokerd: Brokerd,
    planted: Planted,
    tool: str,
    arguments: dict[str, Any],
    named: str,
) -> None:
    write_grants(home, FILE_TOOLS_AUTO)
    await brokerd.start()
    failure = await _failed(home, tool, arguments)
    assert failure == ("path_escape", f"{named}: a symlink leads outside the workspace")
    _untouched(planted)


async def test_a_name_moved_into_a_sibling_after_the_walk_is_an_escape(
    home: Home, planted: Planted, brokerd: Brokerd
) -> None:
    """The check on the open descriptor: what it names now is the sibling (a name moved
    after the walk), which ``opened_path`` stands for; the cached read is left out so
    the worker-thread path decides."""
    moved_to = {"file": str(planted.secret), "dir": str(planted.sibling)}

    def opened_path(fd: int) -> str:
        return moved_to["dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "file"]

    host = Host(read_cached=lambda *_: None, opened_path=opened_path)
    write_grants(home, FILE_TOOLS_AUTO)
    await brokerd.start(execute=functools.partial(runner.execute, host=host))
    for tool, arguments, named in [
        ("read_file", {"path": "notes.txt"}, "notes.txt"),
        ("list_dir", {"path": "."}, "."),
        ("write_file", {"path": "new.txt", "content": "x"}, "new.txt"),
    ]:
        failure = await _failed(home, tool, arguments)
        assert failure == ("path_escape", f"{named}: a symlink leads outside the workspace")
    assert sorted(os.listdir(planted.workspace)) == ["d", "f", "notes.txt"]
    _untouched(planted)


async def test_an_absolute_path_into_a_sibling_is_refused(
    home: Home, planted: Planted, brokerd: Brokerd
) -> None:
    write_grants(home, FILE_TOOLS_AUTO)
    await brokerd.start()
    for tool, arguments in [
        ("read_file", {"path": str(planted.secret)}),
        ("list_dir", {"path": str(planted.sibling)}),
        ("write_file", {"path": str(planted.sibling / "new.txt"), "content": "x"}),
    ]:
        failure = await _failed(home, tool, arguments)
        assert failure == ("bad_arguments", "argument 'path': absolute path outside the workspace")
    _untouched(planted)


async def test_the_write_preview_does_not_read_a_sibling(
    home: Home, planted: Planted, brokerd: Brokerd, capsys: pytest.CaptureFixture[str]
) -> None:
    write_grants(home, grant("write", "write_file", "ask"))
    await brokerd.start()
    client = await Client.open(home.broker_sock)
    request = tool_request("write_file", {"path": "d/secret.txt", "content": "new\n"})
    assert (await client.ask(request))["kind"] == "pending"
    assert await bxctl(home, "approvals") == 0
    out = capsys.readouterr().out
    assert "  change     cannot show: d: a symlink leads outside the workspace" in out.splitlines()
    assert SECRET.strip() not in out
    await client.aclose()
    _untouched(planted)


def _syscall_that_follows_links(
    _number: object, dir_fd: ctypes.c_int, path: ctypes.c_char_p, how: Any, _size: object
) -> int:
    """openat2 as a kernel that did not hold RESOLVE_BENEATH would answer: the path is
    followed wherever its links lead."""
    assert path.value is not None
    return os.open(path.value, how._obj.flags, dir_fd=dir_fd.value)


@pytest.mark.parametrize("sibling", SIBLINGS)
def test_the_cached_read_checks_the_real_path_on_whole_segments(
    tmp_path: Path, sibling: str
) -> None:
    """broker/nowait.py's own check, behind the kernel's RESOLVE_BENEATH: what the
    opened descriptor names must be below the root, a sibling is not."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (tmp_path / sibling).mkdir()
    (tmp_path / sibling / "secret.txt").write_text(SECRET, encoding="utf-8")
    (workspace / "notes.txt").write_text("notes\n", encoding="utf-8")
    (workspace / "f").symlink_to(f"../{sibling}/secret.txt")
    syscall: Callable[..., int] = _syscall_that_follows_links
    read = functools.partial(nowait.read_cached_beneath, str(workspace), max_size=4096)
    # The fake kernel does open and read: the plain case goes through it.
    assert read("notes.txt", syscall=syscall) == nowait.CachedFile(b"notes\n", "notes.txt")
    assert read("f", syscall=syscall) is None


@pytest.mark.parametrize("sibling", ["bxhome-evil", "bxhome2", "bxhome.d"])
def test_the_home_check_tells_a_sibling_from_the_home(tmp_path: Path, sibling: str) -> None:
    """home/config.py: a workspace beside the home, named like it, is allowed (by its name and
    by its real path through a link); one inside the home, or holding it, is not."""
    home = Home(tmp_path / "bxhome")
    home.create()
    beside = tmp_path / sibling
    beside.mkdir()
    (tmp_path / "link").symlink_to(beside)
    assert workspace_problem(home, beside) is None
    assert workspace_problem(home, tmp_path / "link") is None
    assert workspace_problem(home, home.default_workspace) is None
    assert workspace_problem(home, home.root / "ledger") == (
        "inside the home, only workspace/ may be used"
    )
    assert workspace_problem(home, tmp_path) == "must not be the home or contain it"
    # A home named like a sibling of the workspace: ws/ beside ws-evil/ as the home.
    other = Home(tmp_path / f"{sibling}-home")
    other.create()
    assert workspace_problem(other, tmp_path / sibling) is None
