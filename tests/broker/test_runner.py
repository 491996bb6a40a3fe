"""The runner: RunSpec only from a run decision, the file tools' safe
resolution, the bubblewrap sandbox, http_get's limits — each failure with its exact
reason code. RunSpecs come from real decisions (core.decide.evaluate on parsed grants)."""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from tests.harness.runner import (
    GRANTS,
    GRANTS_TEXT,
    grant_set,
    spec_for,
    spec_for_verdict,
    verdict_for,
)
from tests.harness.sandbox import AS_ROOT, SANDBOX_UID, sandbox_workspace, wait_gone

from boxmaker.broker import sandbox, sandbox_plan
from boxmaker.broker.run_spec import RunResult, RunSpec, ToolFailed
from boxmaker.broker.runner import execute
from boxmaker.broker.sandbox_check import NO_BWRAP_DETAIL
from boxmaker.broker.tools.file_walk import real_relative_inside, walk_directory
from boxmaker.broker.tools.host import REAL_HOST, Host, resolve_addresses
from boxmaker.core.catalogue import MAX_BYTES, CheckedArguments, ReadFileArgs
from boxmaker.core.decide import Run, Verdict
from boxmaker.core.grants import GrantSet
from boxmaker.core.labels import HTTP_GET_LABEL, WRITE_FILE_LABEL, Label, LabelRules, Taint
from boxmaker.core.reasons import Reason
from boxmaker.home.config import RunnerConfig

INTERNAL = Label(Taint.INTERNAL, False)
SECRET = Label(Taint.SECRET, False)
ASK_TEXT = '[[grant]]\nid = "ask-read"\ntool = "read_file"\nmode = "ask"\n'
needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap is not installed"
)


async def run(
    tool: str, arguments: dict[str, Any], workspace: Path, host: Host = REAL_HOST, **options: Any
) -> RunResult:
    with trio.fail_after(20):
        return await execute(spec_for(tool, arguments, workspace, **options), host=host)


def no_cache(*_: object) -> None:
    """The cached read never serves: read_file goes to its worker thread."""


NO_CACHE = Host(read_cached=no_cache)


def failed(result: RunResult, reason: Reason) -> str:
    assert not result.ok, result
    assert result.reason is reason, result
    assert result.content == ""
    assert result.detail is not None
    return result.detail


def ok(result: RunResult) -> str:
    assert result.ok, result
    assert result.reason is None
    assert result.detail is None
    return result.content


@pytest.fixture
def ws() -> Iterator[Path]:
    # As root (CI), a workspace of an ordinary uid: the sandbox never runs as root.
    with sandbox_workspace() as workspace:
        yield workspace


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    target = tmp_path / "outside.txt"
    target.write_text("outside the workspace\n")
    return target


# --- RunSpec.for_verdict ----------------------------------------------------------------


def spec_of(verdict: Verdict, ws: Path, *, approved: bool = False) -> RunSpec:
    return RunSpec.for_verdict(
        verdict,  # type: ignore[arg-type]  # a Deny too: for_verdict must refuse it
        workspace=ws,
        runner=RunnerConfig(),
        labels=LabelRules(),
        approved=approved,
    )


def test_for_verdict_refuses_a_deny_verdict(ws: Path) -> None:
    verdict = verdict_for("read_file", {"path": "x"}, ws, GrantSet())
    assert verdict.decision.verdict == "deny"
    with pytest.raises(ValueError, match="only a run or ask verdict runs"):
        spec_of(verdict, ws)
    with pytest.raises(ValueError, match="only a run or ask verdict runs"):
        spec_of(verdict, ws, approved=True)


def test_for_verdict_runs_an_ask_verdict_only_when_approved(ws: Path) -> None:
    grants = grant_set(ASK_TEXT)
    verdict = verdict_for("read_file", {"path": "x"}, ws, grants)
    assert verdict.decision.verdict == "ask"
    with pytest.raises(ValueError, match="only once approved"):
        spec_of(verdict, ws)
    spec = spec_of(verdict, ws, approved=True)
    assert spec.tool == "read_file"
    assert spec.grant == "ask-read"


def test_for_verdict_refuses_a_grant_for_another_tool(ws: Path) -> None:
    verdict = verdict_for("read_file", {"path": "x"}, ws)
    assert isinstance(verdict, Run)
    other = GRANTS.grants[1]
    assert other.tool == "list_dir"
    with pytest.raises(ValueError, match="grant list is not for read_file"):
        spec_of(attrs.evolve(verdict, grant=other), ws)


async def test_for_verdict_runs_what_core_checked_not_a_forged_decision(ws: Path) -> None:
    """What runs is built from the arguments core checked, never from the decision's
    (which are recorded): a decision forged after the verdict changes nothing, checked
    arguments for another tool than the grant's are refused, and an escaping path put
    into the checked arguments by hand is still refused by the file tool at run time."""
    verdict = verdict_for("read_file", {"path": "x"}, ws)
    assert isinstance(verdict, Run)
    forged = attrs.evolve(
        verdict, decision=attrs.evolve(verdict.decision, arguments={"path": "../etc/passwd"})
    )
    spec = spec_of(forged, ws)
    assert spec.arguments == verdict.checked
    assert spec.arguments.value == ReadFileArgs(path="x")
    listed = verdict_for("list_dir", {"path": "."}, ws)
    assert isinstance(listed, Run)
    with pytest.raises(ValueError, match="grant read is not for list_dir"):
        spec_of(attrs.evolve(verdict, checked=listed.checked), ws)
    by_hand = CheckedArguments("read_file", ReadFileArgs(path="../etc/passwd"))
    escaping = spec_of(attrs.evolve(verdict, checked=by_hand), ws)
    with trio.fail_after(20):
        failed(await execute(escaping), Reason.PATH_ESCAPE)


def untouched(outside: Path) -> bool:
    return outside.read_text() == "outside the workspace\n"


def etc_names() -> list[str]:
    return sorted(Path(path).name for path in sandbox_plan.ETC_FILES if Path(path).exists())


def test_a_runspec_cannot_be_built_by_hand(ws: Path) -> None:
    spec = spec_for("read_file", {"path": "x"}, ws)
    with pytest.raises(TypeError, match=r"only by RunSpec\.for_verdict"):
        attrs.evolve(spec, token=object())


def test_runspec_says_what_runs(ws: Path) -> None:
    config = RunnerConfig(shell_timeout=7.0, output_cap=1234)
    shell = spec_for("shell", {"command": "ls"}, ws, config=config)
    assert shell.time_limit == 7.0
    assert shell.output_cap == 1234
    assert shell.label == INTERNAL
    assert shell.network == ()
    assert dict(shell.env) == {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": "/workspace",
        "LANG": "C.UTF-8",
    }
    if shell.argv is not None:
        argv = shell.argv
        # The limits from [runner]: CPU time is shell_timeout rounded up by default.
        limits = sandbox_plan.SandboxLimits(
            memory=1 << 30, processes=256, file_size=1 << 30, cpu_time=7
        )
        assert argv[-3:] == ("/bin/sh", "-c", limits.ulimit() + sandbox_plan.LAUNCHER)
        assert "ulimit -v 1048576 && ulimit -f 2097152 && ulimit -St 7 && " in argv[-1]
        launch = shell.sandbox
        assert isinstance(launch, sandbox_plan.Launch)
        assert launch.limits == limits
        # Never root: as root, the workspace's owner (an ordinary uid); else brokerd's.
        expected_user = sandbox_plan.SandboxUser(SANDBOX_UID, SANDBOX_UID) if AS_ROOT else None
        assert launch.user == expected_user
        assert argv[argv.index("--proc") + 1 : argv.index("--dev")] == (
            "/proc",
            *("--ro-bind-try", "/proc/sys", "/proc/sys"),
            *("--ro-bind-try", "/proc/sysrq-trigger", "/proc/sysrq-trigger"),
            *("--ro-bind-try", "/proc/irq", "/proc/irq"),
            *("--ro-bind-try", "/proc/bus", "/proc/bus"),
        )
        for flag in ("--unshare-all", "--die-with-parent", "--new-session", "--clearenv"):
            assert flag in argv
        assert argv[argv.index("--bind") + 1 : argv.index("--bind") + 3] == (
            str(ws),
            "/workspace",
        )
        assert "--share-net" not in argv
    web = spec_for("http_get", {"url": "http://127.0.0.1/"}, ws)
    assert web.network == ("127.0.0.1",)
    assert web.argv is None
    assert web.label == HTTP_GET_LABEL
    assert spec_for("write_file", {"path": "a", "content": ""}, ws).label == WRITE_FILE_LABEL
    read = spec_for("read_file", {"path": "notes.txt"}, ws)
    assert read.time_limit is None
    assert read.output_cap == MAX_BYTES


def test_a_shell_grants_label_taint_raises_the_label(ws: Path) -> None:
    spec = spec_for("shell", {"command": "cat secrets/key"}, ws)
    assert spec.grant == "sh"  # the first auto grant in file order: no label_taint
    assert spec.label == INTERNAL
    only_secret = grant_set(
        '[[grant]]\nid = "s"\ntool = "shell"\nmode = "auto"\nlabel_taint = "secret"\n'
    )
    assert spec_for("shell", {"command": "ls"}, ws, grants=only_secret).label == SECRET


# --- read_file ---------------------------------------------------------------------------


async def test_read_file_returns_the_content_with_the_label_from_the_rules(ws: Path) -> None:
    (ws / "notes.txt").write_text("hello\n")
    (ws / "app").mkdir()
    (ws / "app" / ".env").write_text("TOKEN=x\n")
    result = await run("read_file", {"path": "notes.txt"}, ws)
    assert ok(result) == "hello\n"
    assert result.label == INTERNAL
    result = await run("read_file", {"path": "app/.env"}, ws)
    assert ok(result) == "TOKEN=x\n"
    assert result.label == SECRET


async def test_read_file_replaces_bad_utf8(ws: Path) -> None:
    (ws / "bin.dat").write_bytes(b"a\xffb")
    assert ok(await run("read_file", {"path": "bin.dat"}, ws)) == "a\ufffdb"


async def test_a_symlink_to_etc_passwd_is_a_path_escape(ws: Path) -> None:
    (ws / "passwd").symlink_to("/etc/passwd")
    result = await run("read_file", {"path": "passwd"}, ws)
    detail = failed(result, Reason.PATH_ESCAPE)
    assert detail == "passwd: a symlink leads outside the workspace"
    assert "root" not in detail


async def test_a_symlinked_directory_leaving_the_workspace_is_a_path_escape(
    ws: Path, outside: Path
) -> None:
    (ws / "up").symlink_to(outside.parent)
    failed(await run("read_file", {"path": f"up/{outside.name}"}, ws), Reason.PATH_ESCAPE)
    failed(await run("list_dir", {"path": "up"}, ws), Reason.PATH_ESCAPE)
    failed(await run("write_file", {"path": "up/new.txt", "content": "x"}, ws), Reason.PATH_ESCAPE)
    assert not (outside.parent / "new.txt").exists()


async def test_a_dangling_symlink_out_of_the_workspace_is_a_path_escape(ws: Path) -> None:
    (ws / "gone").symlink_to("/nonexistent/boxmaker/file")
    failed(await run("read_file", {"path": "gone"}, ws), Reason.PATH_ESCAPE)


PUB_TEXT = """
[[grant]]
id = "read-pub"
tool = "read_file"
mode = "auto"
paths = ["pub/**"]

[[grant]]
id = "list-pub"
tool = "list_dir"
mode = "auto"
paths = ["pub/**"]

[[grant]]
id = "write-pub"
tool = "write_file"
mode = "auto"
paths = ["pub/**"]
"""
PUB = grant_set(PUB_TEXT)
HARD_LINKS = grant_set(
    PUB_TEXT.replace('paths = ["pub/**"]', 'paths = ["pub/**"]\nhard_links = true', 1)
)
PUB_SECRET = "TOPSECRET\n"


@pytest.fixture
def linked(ws: Path) -> Path:
    """pub/ with links into secrets/: a symlink to the file, one to the directory, a
    hard link, and a symlink that stays in pub/. Returns secrets/key."""
    (ws / "secrets").mkdir()
    key = ws / "secrets" / "key"
    key.write_text(PUB_SECRET)
    (ws / "pub").mkdir()
    (ws / "pub" / "readme.txt").write_text("hello\n")
    (ws / "pub" / "k").symlink_to("../secrets/key")
    (ws / "pub" / "s").symlink_to("../secrets")
    (ws / "pub" / "alias").symlink_to("readme.txt")
    os.link(key, ws / "pub" / "hard")
    return key


def kept(key: Path) -> bool:
    """secrets/key still holds the secret, under its one name."""
    return key.read_text() == PUB_SECRET and os.listdir(key.parent) == ["key"]


@pytest.fixture(params=["cached", "thread"])
def read_path(request: pytest.FixtureRequest) -> Host:
    """read_file both ways: on the trio thread from the caches, and in a worker thread."""
    return NO_CACHE if request.param == "thread" else REAL_HOST


@pytest.mark.parametrize(
    ("path", "detail"),
    [
        ("pub/k", "pub/k: a link leads outside grant read-pub's paths"),
        ("pub/s/key", "pub/s/key: a link leads outside grant read-pub's paths"),
        ("pub/s/missing", "pub/s/missing: a link leads outside grant read-pub's paths"),
        (
            "pub/hard",
            "pub/hard: the file has 2 names (hard links), "
            "and grant read-pub does not set hard_links = true",
        ),
    ],
)
async def test_a_paths_grant_bounds_the_file_a_link_opens(
    ws: Path, linked: Path, read_path: Host, path: str, detail: str
) -> None:
    result = await run("read_file", {"path": path}, ws, grants=PUB, host=read_path)
    assert failed(result, Reason.PATH_ESCAPE) == detail
    assert result.label == INTERNAL  # nothing was read: the requested path's label


async def test_a_link_that_stays_in_the_grant_is_followed(
    ws: Path, linked: Path, read_path: Host
) -> None:
    result = await run("read_file", {"path": "pub/alias"}, ws, grants=PUB, host=read_path)
    assert (ok(result), result.label) == ("hello\n", INTERNAL)


async def test_list_dir_through_a_link_out_of_the_grant_is_refused(ws: Path, linked: Path) -> None:
    result = await run("list_dir", {"path": "pub/s"}, ws, grants=PUB)
    assert (
        failed(result, Reason.PATH_ESCAPE) == "pub/s: a link leads outside grant list-pub's paths"
    )
    assert ok(await run("list_dir", {"path": "pub"}, ws, grants=PUB)).split("\n") == [
        "alias@",
        "hard",
        "k@",
        "readme.txt",
        "s@",
    ]


@pytest.mark.parametrize("path", ["pub/s/key", "pub/s/new"])
async def test_write_file_through_a_linked_directory_out_of_the_grant_is_refused(
    ws: Path, linked: Path, path: str
) -> None:
    result = await run("write_file", {"path": path, "content": "pwned"}, ws, grants=PUB)
    assert failed(result, Reason.PATH_ESCAPE) == (
        f"{path}: a link leads outside grant write-pub's paths"
    )
    assert kept(linked)


async def test_write_file_replaces_a_hard_linked_name_never_its_other_names(
    ws: Path, linked: Path
) -> None:
    ok(await run("write_file", {"path": "pub/hard", "content": "new"}, ws, grants=PUB))
    assert (ws / "pub" / "hard").read_text() == "new"
    assert kept(linked)
    assert os.stat(linked).st_nlink == 1  # the rename replaced pub/hard's name


async def test_a_hard_link_read_by_opt_in_reads_as_the_highest_label(
    ws: Path, linked: Path, read_path: Host
) -> None:
    result = await run("read_file", {"path": "pub/hard"}, ws, grants=HARD_LINKS, host=read_path)
    assert ok(result) == PUB_SECRET
    assert result.label == LabelRules().highest() == Label(Taint.SECRET, True)
    # Without paths a hard link is allowed, and still never launders a label.
    result = await run("read_file", {"path": "pub/hard"}, ws, host=read_path)
    assert (ok(result), result.label) == (PUB_SECRET, Label(Taint.SECRET, True))


def link_raced_in(final: Path, target: str) -> Host:
    """The machine as a racing sandboxed shell makes it: the path resolves while
    ``final`` is a plain file, and ``final`` is a symlink to ``target`` right after."""

    def resolve_then_swap(workspace: Path, path: str) -> tuple[str, str]:
        resolved = real_relative_inside(workspace, path)
        final.unlink()
        final.symlink_to(target)
        return resolved

    return Host(read_cached=no_cache, real_relative=resolve_then_swap)


@pytest.mark.parametrize("target", ["other.txt", "../secrets/key"])
async def test_read_file_never_follows_a_link_raced_in_at_the_final_name(
    ws: Path, linked: Path, target: str
) -> None:
    """Even a link that stays in the grant: the final name is opened O_NOFOLLOW."""
    (ws / "pub" / "other.txt").write_text("other\n")
    final = ws / "pub" / "readme.txt"
    raced = link_raced_in(final, target)
    result = await run("read_file", {"path": "pub/readme.txt"}, ws, raced, grants=PUB)
    assert failed(result, Reason.PATH_ESCAPE) == (
        "pub/readme.txt: a symlink leads outside the workspace"
    )
    assert final.is_symlink()


@pytest.mark.parametrize("target", ["other.txt", "../secrets/key"])
async def test_write_file_never_follows_a_link_raced_in_at_the_final_name(
    ws: Path, linked: Path, target: str
) -> None:
    (ws / "pub" / "other.txt").write_text("other\n")
    final = ws / "pub" / "readme.txt"
    raced = link_raced_in(final, target)
    arguments = {"path": "pub/readme.txt", "content": "pwned"}
    result = await run("write_file", arguments, ws, raced, grants=PUB)
    assert failed(result, Reason.PATH_ESCAPE) == (
        "pub/readme.txt: a symlink leads outside the workspace"
    )
    assert os.readlink(final) == target  # not replaced, and not written through
    assert (ws / "pub" / "other.txt").read_text() == "other\n"
    assert kept(linked)
    assert temp_files(ws / "pub") == []


async def test_the_grant_decides_on_the_opened_descriptor(ws: Path, linked: Path) -> None:
    """What the descriptor names when it is checked wins over the walk's names: a name
    moved after the walk (the sandboxed shell shares the workspace) is caught."""
    moved = Host(read_cached=no_cache, opened_path=lambda _fd: os.path.realpath(linked))
    read = await run("read_file", {"path": "pub/readme.txt"}, ws, moved, grants=PUB)
    assert failed(read, Reason.PATH_ESCAPE) == (
        "pub/readme.txt: a link leads outside grant read-pub's paths"
    )
    listing = await run("list_dir", {"path": "pub"}, ws, moved, grants=PUB)
    assert failed(listing, Reason.PATH_ESCAPE) == "pub: a link leads outside grant list-pub's paths"
    moved = Host(read_cached=no_cache, opened_path=lambda _fd: os.path.realpath(ws / "secrets"))
    write = await run("write_file", {"path": "pub/new.txt", "content": "x"}, ws, moved, grants=PUB)
    assert failed(write, Reason.PATH_ESCAPE) == (
        "pub/new.txt: a link leads outside grant write-pub's paths"
    )
    assert not (ws / "pub" / "new.txt").exists()
    assert temp_files(ws / "pub") == []
    # A descriptor outside the workspace altogether is the plain escape.
    outside_host = Host(read_cached=no_cache, opened_path=lambda _fd: "/etc/passwd")
    outside = await run("read_file", {"path": "pub/readme.txt"}, ws, outside_host, grants=PUB)
    assert failed(outside, Reason.PATH_ESCAPE) == (
        "pub/readme.txt: a symlink leads outside the workspace"
    )


async def test_a_symlink_inside_the_workspace_is_followed_and_labels_by_its_target(
    ws: Path,
) -> None:
    (ws / ".env").write_text("KEY=1\n")
    (ws / "innocent.txt").symlink_to(".env")
    result = await run("read_file", {"path": "innocent.txt"}, ws)
    assert ok(result) == "KEY=1\n"
    assert result.label == SECRET


def test_a_symlink_swapped_in_after_the_check_is_not_followed(ws: Path) -> None:
    # _walk is the race guard: it is given a symlink-free path, so a link it meets was
    # put there after realpath looked.
    (ws / "real").mkdir()
    (ws / "link").symlink_to("real")
    with pytest.raises(ToolFailed) as caught:
        walk_directory(os.path.realpath(ws), "link", "link")
    assert caught.value.reason is Reason.PATH_ESCAPE


async def test_read_file_not_found_and_directories(ws: Path) -> None:
    (ws / "dir").mkdir()
    (ws / "file").write_text("x")
    assert failed(await run("read_file", {"path": "missing.txt"}, ws), Reason.NOT_FOUND) == (
        "missing.txt: no such file or directory"
    )
    failed(await run("read_file", {"path": "nodir/x"}, ws), Reason.NOT_FOUND)
    failed(await run("read_file", {"path": "file/x"}, ws), Reason.NOT_FOUND)
    assert failed(await run("read_file", {"path": "dir"}, ws), Reason.TOOL_ERROR) == (
        "dir: is a directory"
    )
    failed(await run("read_file", {"path": "."}, ws), Reason.TOOL_ERROR)


async def test_read_file_of_a_fifo_fails_without_hanging(ws: Path) -> None:
    os.mkfifo(ws / "pipe")
    detail = failed(await run("read_file", {"path": "pipe"}, ws), Reason.TOOL_ERROR)
    assert detail == "pipe: not a regular file"


async def test_read_file_over_one_mib_is_too_large(ws: Path) -> None:
    (ws / "big.txt").write_bytes(b"a" * (MAX_BYTES + 1))
    (ws / "exact.txt").write_bytes(b"b" * MAX_BYTES)
    failed(await run("read_file", {"path": "big.txt"}, ws), Reason.TOO_LARGE)
    assert ok(await run("read_file", {"path": "exact.txt"}, ws)) == "b" * MAX_BYTES


async def test_read_file_with_max_bytes_reads_the_start(ws: Path) -> None:
    (ws / "big.txt").write_bytes(b"0123456789" * 200_000)
    content = ok(await run("read_file", {"path": "big.txt", "max_bytes": 10}, ws))
    assert content == "0123456789\n[file cut at 10 of 2000000 bytes]"
    content = ok(await run("read_file", {"path": "big.txt", "max_bytes": 2_000_000 // 2}, ws))
    assert content.endswith("\n[file cut at 1000000 of 2000000 bytes]")
    (ws / "small.txt").write_text("abc")
    assert ok(await run("read_file", {"path": "small.txt", "max_bytes": 3}, ws)) == "abc"


async def test_read_file_accepts_an_absolute_path_inside_the_workspace(ws: Path) -> None:
    (ws / "a.txt").write_text("A")
    assert ok(await run("read_file", {"path": str(ws / "a.txt")}, ws)) == "A"


# --- list_dir ----------------------------------------------------------------------------


async def test_list_dir_lists_sorted_with_markers(ws: Path, outside: Path) -> None:
    (ws / "b.txt").write_text("")
    (ws / "a").mkdir()
    (ws / "a" / "inner").write_text("")
    (ws / "link").symlink_to(outside)
    result = await run("list_dir", {"path": "."}, ws)
    assert ok(result) == "a/\nb.txt\nlink@"
    assert result.label == INTERNAL
    assert ok(await run("list_dir", {"path": "a"}, ws)) == "inner"
    (ws / "secrets").mkdir()
    assert (await run("list_dir", {"path": "secrets"}, ws)).label == SECRET
    assert ok(await run("list_dir", {"path": "secrets"}, ws)) == ""


async def test_list_dir_failures(ws: Path) -> None:
    (ws / "file").write_text("")
    failed(await run("list_dir", {"path": "missing"}, ws), Reason.NOT_FOUND)
    assert failed(await run("list_dir", {"path": "file"}, ws), Reason.TOOL_ERROR) == (
        "file: not a directory"
    )


# --- write_file --------------------------------------------------------------------------


def temp_files(directory: Path) -> list[str]:
    return [name for name in os.listdir(directory) if name.endswith(".tmp")]


async def test_write_file_writes_atomically(ws: Path) -> None:
    result = await run("write_file", {"path": "new.txt", "content": "héllo"}, ws)
    assert ok(result) == "wrote 6 bytes to new.txt"
    assert result.label == WRITE_FILE_LABEL
    assert (ws / "new.txt").read_text() == "héllo"
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((ws / "new.txt").stat().st_mode) == 0o666 & ~umask
    assert temp_files(ws) == []


async def test_write_file_replaces_and_keeps_the_mode(ws: Path) -> None:
    target = ws / "keep.txt"
    target.write_text("old")
    target.chmod(0o600)
    inode = target.stat().st_ino
    ok(await run("write_file", {"path": "keep.txt", "content": "new"}, ws))
    assert target.read_text() == "new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert target.stat().st_ino != inode  # replaced by rename, not rewritten in place
    assert temp_files(ws) == []


async def test_write_file_through_a_symlink_at_the_final_name_is_a_path_escape(
    ws: Path, outside: Path
) -> None:
    (ws / "out.txt").symlink_to(outside)
    result = await run("write_file", {"path": "out.txt", "content": "pwned"}, ws)
    failed(result, Reason.PATH_ESCAPE)
    assert untouched(outside)
    assert (ws / "out.txt").is_symlink()
    assert temp_files(ws) == []


async def test_write_file_never_follows_even_an_inside_symlink_at_the_final_name(
    ws: Path,
) -> None:
    (ws / ".env").write_text("KEY=1\n")
    (ws / "notes.txt").symlink_to(".env")
    failed(await run("write_file", {"path": "notes.txt", "content": "x"}, ws), Reason.PATH_ESCAPE)
    assert (ws / ".env").read_text() == "KEY=1\n"


async def test_write_file_needs_an_existing_parent_and_not_a_directory(ws: Path) -> None:
    failed(await run("write_file", {"path": "no/such.txt", "content": "x"}, ws), Reason.NOT_FOUND)
    (ws / "dir").mkdir()
    failed(await run("write_file", {"path": "dir", "content": "x"}, ws), Reason.TOOL_ERROR)
    failed(await run("write_file", {"path": ".", "content": "x"}, ws), Reason.TOOL_ERROR)


# --- shell -------------------------------------------------------------------------------


@needs_bwrap
async def test_shell_writes_in_the_workspace(ws: Path) -> None:
    result = await run("shell", {"command": "echo made > made.txt && pwd && echo $HOME"}, ws)
    assert ok(result) == "/workspace\n/workspace\n"
    assert result.label == INTERNAL
    assert (ws / "made.txt").read_text() == "made\n"


@needs_bwrap
async def test_shell_cannot_write_the_system(ws: Path) -> None:
    for target in ("/etc/boxmaker", "/usr/boxmaker", "/boxmaker"):
        detail = failed(await run("shell", {"command": f"touch {target}"}, ws), Reason.TOOL_ERROR)
        assert "Read-only file system" in detail, detail
    ok(await run("shell", {"command": "touch /tmp/scratch"}, ws))


@needs_bwrap
async def test_shell_sees_nothing_of_the_host_but_the_system(ws: Path, outside: Path) -> None:
    for path in ("/root", "/work", "/home", str(outside), "/etc/passwd", "/etc/shadow"):
        failed(await run("shell", {"command": f"test -e {path}"}, ws), Reason.TOOL_ERROR)
    assert ok(await run("shell", {"command": "ls /etc"}, ws)).split() == etc_names()
    # The control: the same check passes for what is meant to be there.
    ok(await run("shell", {"command": "test -e /usr/bin && test -d /workspace"}, ws))


@needs_bwrap
async def test_shell_has_no_capabilities(ws: Path) -> None:
    content = ok(await run("shell", {"command": "grep CapEff /proc/self/status"}, ws))
    assert content.split() == ["CapEff:", "0000000000000000"]


@needs_bwrap
async def test_shell_has_no_network(ws: Path) -> None:
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    probe = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)"
    try:
        # The control: the host reaches the listener...
        with trio.fail_after(5):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.aclose()
        # ...the sandbox, in its own network namespace, does not.
        detail = failed(
            await run("shell", {"command": f'python3 -c "{probe}"'}, ws), Reason.TOOL_ERROR
        )
        assert "ConnectionRefusedError" in detail or "unreachable" in detail, detail
    finally:
        await listener.aclose()


@needs_bwrap
async def test_shell_environment_is_cleared(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BOXMAKER_TEST_SECRET", "hunter2")
    content = ok(await run("shell", {"command": "env"}, ws))
    assert "hunter2" not in content
    assert "BOXMAKER_TEST_SECRET" not in content
    variables = dict(line.split("=", 1) for line in content.splitlines())
    assert variables["HOME"] == "/workspace"
    assert variables["PATH"] == "/usr/local/bin:/usr/bin:/bin"
    assert set(variables) <= {"HOME", "PATH", "LANG", "PWD", "SHLVL", "_", "OLDPWD"}


@needs_bwrap
async def test_shell_non_zero_exit_is_a_tool_error_with_the_stderr_tail(ws: Path) -> None:
    command = "echo out; head -c 5000 /dev/zero | tr '\\0' x >&2; echo LAST >&2; exit 3"
    detail = failed(await run("shell", {"command": command}, ws), Reason.TOOL_ERROR)
    assert detail.startswith("exit status 3: x")
    assert detail.endswith("LAST")
    assert len(detail) <= sandbox.STDERR_TAIL + len("exit status 3: ")


@needs_bwrap
async def test_shell_stderr_follows_stdout_on_success(ws: Path) -> None:
    content = ok(await run("shell", {"command": "echo out; echo warn >&2"}, ws))
    assert content == "out\n\n[stderr]\nwarn\n"
    # The same through /dev/stdout and /dev/stderr, which reopen the pipes brokerd made
    # (as root, for another uid: the pipes are that uid's).
    command = "echo out > /dev/stdout; echo warn > /dev/stderr"
    assert ok(await run("shell", {"command": command}, ws)) == "out\n\n[stderr]\nwarn\n"


@needs_bwrap
async def test_shell_output_is_cut_at_the_cap_with_a_marker(ws: Path) -> None:
    config = RunnerConfig(output_cap=1000)
    # Far more than a pipe buffer: the runner must keep draining past the cap.
    command = "head -c 3000000 /dev/zero | tr '\\0' a"
    content = ok(await run("shell", {"command": command}, ws, config=config))
    assert content == "a" * 1000 + "\n[output cut at 1000 bytes]"
    content = ok(
        await run("shell", {"command": "head -c 1000 /dev/zero | tr '\\0' b"}, ws, config=config)
    )
    assert content == "b" * 1000


@needs_bwrap
async def test_shell_is_killed_at_its_time_limit_with_its_children(ws: Path) -> None:
    marker = "314.159265"
    config = RunnerConfig(shell_timeout=0.5)
    command = f"sleep {marker} & echo started > started; sleep 30"
    start = trio.current_time()
    result = await run("shell", {"command": command}, ws, config=config)
    assert failed(result, Reason.TIMEOUT) == "killed after 0.5 s (the time limit)"
    assert trio.current_time() - start < 5
    assert (ws / "started").exists()
    assert await wait_gone(marker) == []


@needs_bwrap
async def test_a_background_child_dies_with_the_command(ws: Path) -> None:
    marker = "271.828182"
    start = trio.current_time()
    result = await run("shell", {"command": f"sleep {marker} & echo done"}, ws)
    assert ok(result) == "done\n"
    assert trio.current_time() - start < 5
    assert await wait_gone(marker) == []


@needs_bwrap
async def test_a_command_outlives_the_worker_thread_cache(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # --die-with-parent is PR_SET_PDEATHSIG, tied to the thread that forked bwrap; trio
    # retires idle worker threads (after 10 s, shortened here), so bwrap must not be
    # forked from one or a longer command dies with that thread.
    thread_cache = pytest.importorskip("trio._core._thread_cache")
    monkeypatch.setattr(thread_cache, "IDLE_TIMEOUT", 0.1)
    result = await run("shell", {"command": "sleep 1; echo done"}, ws)
    assert ok(result) == "done\n"


@needs_bwrap
async def test_a_cancelled_shell_is_killed_and_cancelled_propagates(ws: Path) -> None:
    marker = "161.803398"
    spec = spec_for("shell", {"command": f"sleep {marker}"}, ws)
    with trio.move_on_after(0.5) as scope:
        await execute(spec)
    assert scope.cancelled_caught
    assert await wait_gone(marker) == []


async def test_no_bwrap_is_sandbox_unavailable_and_nothing_runs(
    ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    spec = spec_for("shell", {"command": "touch ran"}, ws)
    assert spec.argv is None
    result = await execute(spec)
    assert failed(result, Reason.SANDBOX_UNAVAILABLE) == NO_BWRAP_DETAIL
    assert NO_BWRAP_DETAIL == (
        "bubblewrap (bwrap) is not available; the shell tool never runs unsandboxed; "
        "see docs/runbook.md#sandbox"
    )
    assert result.label == INTERNAL
    assert not (ws / "ran").exists()


async def test_a_bwrap_that_cannot_set_up_the_sandbox_is_sandbox_unavailable(
    ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = ws.parent / "fake-bin"  # where the sandbox's uid can run it from
    fake.mkdir()
    bwrap = fake / "bwrap"
    # New enough (the version is checked before anything starts), then it fails.
    bwrap.write_text(
        "#!/bin/sh\n[ \"$1\" = --version ] && echo 'bubblewrap 0.8.0' && exit 0\n"
        "echo 'bwrap: No permissions to create new namespace' >&2\nexit 1\n"
    )
    bwrap.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake))
    detail = failed(await run("shell", {"command": "true"}, ws), Reason.SANDBOX_UNAVAILABLE)
    assert detail == (
        "bubblewrap could not set up the sandbox: bwrap: No permissions to create new "
        "namespace; see docs/runbook.md#sandbox"
    )


# --- http_get ----------------------------------------------------------------------------


@attrs.define
class Server:
    port: int
    paths: list[str] = attrs.Factory(list)
    hosts: list[str] = attrs.Factory(list)


def response(status: str, body: bytes, headers: str = "") -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n{headers}"
    return head.encode() + b"\r\n" + body


async def handle(server: Server, stream: trio.SocketStream) -> None:
    try:
        request = b""
        with trio.fail_after(5):
            while b"\r\n\r\n" not in request:
                chunk = await stream.receive_some(4096)
                if not chunk:
                    return
                request += chunk
        path = request.split(b" ")[1].decode()
        server.paths.append(path)
        for line in request.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.lower() == b"host":
                server.hosts.append(value.strip().decode())
        if path == "/hello":
            await stream.send_all(
                response("200 OK", "héllo".encode(), "Content-Type: text/plain; charset=utf-8\r\n")
            )
        elif path == "/big":
            head = f"HTTP/1.1 200 OK\r\nContent-Length: {2 * MAX_BYTES}\r\n\r\n"
            await stream.send_all(head.encode())
            for _ in range(32):
                await stream.send_all(b"z" * (MAX_BYTES // 16))
        elif path == "/exact":
            await stream.send_all(response("200 OK", b"e" * MAX_BYTES))
        elif path == "/redirect":
            await stream.send_all(response("302 Found", b"", "Location: http://evil.test/\r\n"))
        elif path == "/missing":
            await stream.send_all(response("404 Not Found", b"nope"))
        elif path == "/slow":
            await trio.sleep(30)
    except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError):
        pass
    finally:
        await stream.aclose()


@pytest.fixture
async def server(nursery: trio.Nursery) -> Server:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    state = Server(listeners[0].socket.getsockname()[1])

    async def handler(stream: trio.SocketStream) -> None:
        await handle(state, stream)

    nursery.start_soon(trio.serve_listeners, handler, listeners)
    return state


def url(server: Server, path: str) -> str:
    return f"http://127.0.0.1:{server.port}{path}"


def web(*hosts: str) -> GrantSet:
    """GRANTS with the http_get grant's ``hosts`` replaced."""
    entries = ", ".join(f'"{host}"' for host in hosts)
    return grant_set(GRANTS_TEXT.replace('hosts = ["127.0.0.1"]', f"hosts = [{entries}]"))


async def get(server: Server, path: str, ws: Path, host: Host = REAL_HOST) -> RunResult:
    """http_get of the test server, under a grant that names its address and port."""
    return await run(
        "http_get",
        {"url": url(server, path)},
        ws,
        host,
        grants=web(f"127.0.0.1:{server.port}"),
    )


async def test_http_get_fetches_from_a_granted_host(ws: Path, server: Server) -> None:
    result = await get(server, "/hello", ws)
    assert ok(result) == "héllo"
    assert result.label == HTTP_GET_LABEL
    assert server.paths == ["/hello"]
    assert server.hosts == [f"127.0.0.1:{server.port}"]


async def test_http_get_checks_the_grants_hosts_again_at_run_time(ws: Path, server: Server) -> None:
    verdict = verdict_for(
        "http_get", {"url": url(server, "/hello")}, ws, web(f"127.0.0.1:{server.port}")
    )
    assert isinstance(verdict, Run)
    # grants.toml changed between the decision and the run: the grant no longer names it.
    changed = web("example.org")
    grant = next(g for g in changed.grants if g.id == "web")
    spec = spec_for_verdict(attrs.evolve(verdict, grant=grant), ws)
    with trio.fail_after(10):
        result = await execute(spec)
    assert failed(result, Reason.TOOL_ERROR) == "host '127.0.0.1' is not allowed by grant web"
    assert server.paths == []


async def test_http_get_body_over_one_mib_is_too_large(ws: Path, server: Server) -> None:
    failed(await get(server, "/big", ws), Reason.TOO_LARGE)
    assert len(ok(await get(server, "/exact", ws))) == MAX_BYTES


async def test_http_get_does_not_follow_redirects(ws: Path, server: Server) -> None:
    detail = failed(await get(server, "/redirect", ws), Reason.TOOL_ERROR)
    assert detail == "HTTP 302: redirect to http://evil.test/ (not followed; ask for that URL)"
    assert server.paths == ["/redirect"]


async def test_http_get_error_status_is_a_tool_error(ws: Path, server: Server) -> None:
    detail = failed(await get(server, "/missing", ws), Reason.TOOL_ERROR)
    assert detail == "HTTP 404 Not Found"


async def test_http_get_network_error_is_a_tool_error(ws: Path) -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    await listeners[0].aclose()
    detail = failed(
        await run(
            "http_get", {"url": f"http://127.0.0.1:{port}/"}, ws, grants=web(f"127.0.0.1:{port}")
        ),
        Reason.TOOL_ERROR,
    )
    assert detail.startswith("ConnectError")


async def test_http_get_times_out(ws: Path, server: Server) -> None:
    detail = failed(await get(server, "/slow", ws, Host(http_timeout=0.3)), Reason.TIMEOUT)
    assert detail.endswith("no complete answer within 0.3 s")


# --- http_get: ports and the addresses connected to ---------------------------------------


@attrs.define
class Resolver:
    """The resolver seam: what each name resolves to, and every lookup made."""

    answers: dict[str, list[str]]
    lookups: list[tuple[str, int]] = attrs.Factory(list)

    @property
    def host(self) -> Host:
        """The machine with this resolver, for :func:`run`."""
        return Host(resolve=self)

    async def __call__(self, host: str, port: int) -> list[str]:
        self.lookups.append((host, port))
        if host not in self.answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return self.answers[host]


@pytest.fixture
def resolver() -> Resolver:
    return Resolver({})


def svc_url(server: Server, path: str = "/hello") -> str:
    return f"http://svc.test:{server.port}{path}"


async def test_a_name_resolving_to_loopback_is_refused_unless_the_grant_names_the_address(
    ws: Path, server: Server, resolver: Resolver
) -> None:
    resolver.answers["svc.test"] = ["127.0.0.1"]
    grants = web(f"svc.test:{server.port}")
    detail = failed(
        await run("http_get", {"url": svc_url(server)}, ws, grants=grants, host=resolver.host),
        Reason.TOOL_ERROR,
    )
    assert detail == (
        "svc.test resolves to 127.0.0.1, a loopback address, which the grant does not name; "
        "see docs/runbook.md#http-get"
    )
    assert server.paths == []
    assert resolver.lookups == [("svc.test", server.port)]


async def test_the_connection_goes_to_the_checked_address_with_the_name_as_host(
    ws: Path, server: Server, resolver: Resolver
) -> None:
    resolver.answers["svc.test"] = ["127.0.0.1"]
    grants = web(f"svc.test:{server.port}", f"127.0.0.1:{server.port}")
    result = await run("http_get", {"url": svc_url(server)}, ws, grants=grants, host=resolver.host)
    assert ok(result) == "héllo"
    # One lookup only: the connection went to the address checked (the test server
    # listens on 127.0.0.1 alone), the name travelled in the Host header.
    assert resolver.lookups == [("svc.test", server.port)]
    assert server.hosts == [f"svc.test:{server.port}"]


async def test_every_resolved_address_is_checked(
    ws: Path, server: Server, resolver: Resolver
) -> None:
    # The first address is allowed (named); the second is private and not named.
    resolver.answers["svc.test"] = ["127.0.0.1", "10.1.2.3"]
    grants = web(f"svc.test:{server.port}", f"127.0.0.1:{server.port}")
    detail = failed(
        await run("http_get", {"url": svc_url(server)}, ws, grants=grants, host=resolver.host),
        Reason.TOOL_ERROR,
    )
    assert detail.startswith("svc.test resolves to 10.1.2.3, a private address,")
    assert server.paths == []


async def test_the_next_checked_address_is_tried_when_one_does_not_connect(
    ws: Path, server: Server, resolver: Resolver
) -> None:
    # The test server listens on 127.0.0.1 only: ::1 (or a missing IPv6) refuses.
    resolver.answers["svc.test"] = ["::1", "127.0.0.1"]
    port = server.port
    grants = web(f"svc.test:{port}", f"[::1]:{port}", f"127.0.0.1:{port}")
    result = await run("http_get", {"url": svc_url(server)}, ws, grants=grants, host=resolver.host)
    assert ok(result) == "héllo"
    assert server.hosts == [f"svc.test:{port}"]


async def test_when_no_address_connects_the_last_error_is_the_detail(
    ws: Path, resolver: Resolver
) -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    await listeners[0].aclose()
    resolver.answers["svc.test"] = ["127.0.0.1", "127.0.0.1"]
    grants = web(f"svc.test:{port}", f"127.0.0.1:{port}")
    target = f"http://svc.test:{port}/"
    detail = failed(
        await run("http_get", {"url": target}, ws, grants=grants, host=resolver.host),
        Reason.TOOL_ERROR,
    )
    assert detail.startswith("ConnectError")


async def test_the_named_address_must_have_the_urls_port(
    ws: Path, server: Server, resolver: Resolver
) -> None:
    resolver.answers["svc.test"] = ["127.0.0.1"]
    grants = web(f"svc.test:{server.port}", "127.0.0.1:1")
    detail = failed(
        await run("http_get", {"url": svc_url(server)}, ws, grants=grants, host=resolver.host),
        Reason.TOOL_ERROR,
    )
    assert "a loopback address, which the grant does not name" in detail
    assert server.paths == []


@pytest.mark.parametrize(
    ("answer", "detail"),
    [
        (None, "svc.test: the name does not resolve (Name or service not known)"),
        ([], "svc.test: the name resolves to no address; see docs/runbook.md#http-get"),
    ],
)
async def test_a_name_that_does_not_resolve_is_a_tool_error(
    ws: Path, server: Server, resolver: Resolver, answer: list[str] | None, detail: str
) -> None:
    if answer is not None:
        resolver.answers["svc.test"] = answer
    grants = web(f"svc.test:{server.port}")
    result = await run("http_get", {"url": svc_url(server)}, ws, grants=grants, host=resolver.host)
    assert failed(result, Reason.TOOL_ERROR) == detail


async def test_a_port_the_grant_no_longer_names_is_refused_at_run_time(
    ws: Path, server: Server
) -> None:
    verdict = verdict_for(
        "http_get", {"url": url(server, "/hello")}, ws, web(f"127.0.0.1:{server.port}")
    )
    assert isinstance(verdict, Run)
    grant = next(g for g in web("127.0.0.1").grants if g.id == "web")
    spec = spec_for_verdict(attrs.evolve(verdict, grant=grant), ws)
    with trio.fail_after(10):
        result = await execute(spec)
    assert failed(result, Reason.TOOL_ERROR) == "host '127.0.0.1' is not allowed by grant web"
    assert server.paths == []


async def test_a_numeric_host_is_judged_by_the_address_it_resolves_to(
    ws: Path, server: Server
) -> None:
    # The real resolver: "2130706433" is 127.0.0.1 written as one number (inet_aton reads
    # it; no lookup leaves the machine). A grant naming that spelling is not naming the
    # loopback address.
    grants = web(f"2130706433:{server.port}")
    target = f"http://2130706433:{server.port}/hello"
    detail = failed(await run("http_get", {"url": target}, ws, grants=grants), Reason.TOOL_ERROR)
    assert detail == (
        "2130706433 resolves to 127.0.0.1, a loopback address, which the grant does not "
        "name; see docs/runbook.md#http-get"
    )
    assert server.paths == []


def _tls_listener(tmp: Path) -> tuple[socket.socket, ssl.SSLContext, list[str | None]]:
    """A TLS server socket on 127.0.0.1 with a throwaway self-signed certificate; the
    list collects the server names (SNI) clients send."""
    key, cert = tmp / "key.pem", tmp / "cert.pem"
    request = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
    names_and_files = ["-subj", "/CN=svc.test", "-keyout", str(key), "-out", str(cert)]
    subprocess.run([*request, *names_and_files], check=True, capture_output=True)
    names: list[str | None] = []
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    context.sni_callback = lambda _sock, name, _context: names.append(name)
    listener = socket.create_server(("127.0.0.1", 0))
    return listener, context, names


def _accept_one_handshake(listener: socket.socket, context: ssl.SSLContext) -> None:
    connection, _ = listener.accept()
    with connection:
        connection.settimeout(10)
        try:
            with context.wrap_socket(connection, server_side=True):
                pass
        except (ssl.SSLError, OSError):
            pass  # the client refuses the self-signed certificate: expected


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl to make a cert")
async def test_https_to_a_name_sends_the_name_as_tls_server_name(
    ws: Path, tmp_path: Path, resolver: Resolver
) -> None:
    listener, context, names = _tls_listener(tmp_path)
    port = listener.getsockname()[1]
    resolver.answers["svc.test"] = ["127.0.0.1"]
    grants = web(f"svc.test:{port}", f"127.0.0.1:{port}")
    with listener:
        server = threading.Thread(target=_accept_one_handshake, args=(listener, context))
        server.start()
        result = await run(
            "http_get", {"url": f"https://svc.test:{port}/"}, ws, grants=grants, host=resolver.host
        )
        await trio.to_thread.run_sync(server.join, 10)
    # The connection went to 127.0.0.1 (the only address listening), the TLS server name
    # was the URL's name, and the certificate was checked (a self-signed one fails).
    assert names == ["svc.test"]
    assert failed(result, Reason.TOOL_ERROR).startswith("ConnectError")


async def test_the_real_resolver_returns_an_address_as_itself() -> None:
    assert await resolve_addresses("127.0.0.1", 80) == ["127.0.0.1"]
    assert await resolve_addresses("0:0::1", 80) == ["::1"]
    assert await resolve_addresses("2130706433", 80) == ["127.0.0.1"]


@pytest.fixture(autouse=True)
def _no_proxy_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # A proxy in the test's environment must not matter: the runner ignores it.
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9/")
    monkeypatch.setenv("ALL_PROXY", "http://127.0.0.1:9/")
