"""The sandbox needs bubblewrap 0.8.0 or newer (``--disable-userns``): an older one, or
one whose version cannot be read, makes a shell call fail ``sandbox_unavailable``
before anything starts, and ``bxctl up`` names it. The version is read once per binary.
(docs/runbook.md#sandbox)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from tests.harness.homes import short_home
from tests.harness.runner import spec_for
from tests.harness.sandbox import sandbox_workspace

from boxmaker.broker.run_spec import RunResult
from boxmaker.broker.runner import execute
from boxmaker.cli.common import Exit
from boxmaker.cli.preflight import preflight
from boxmaker.core.reasons import Reason

NEEDED = "the shell sandbox needs 0.8.0 or newer (for --disable-userns)"
SEE = "see docs/runbook.md#sandbox"


@pytest.fixture
def ws() -> Iterator[Path]:
    with sandbox_workspace() as workspace:
        yield workspace


def fake_bwrap(where: Path, version_output: str, status: int = 0) -> Path:
    """A bwrap that answers ``--version`` so (and notes each time it is asked in
    ``version.log`` beside it), exits 0 for ``--unshare-all …`` (bxctl's check) and
    fails to set up a sandbox otherwise. Written as an editor would: a new inode."""
    where.mkdir(exist_ok=True)
    bwrap = where / "bwrap"
    temp = where / "bwrap.new"
    temp.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = --version ]; then echo asked >> {where}/version.log; '
        f"printf '%s' '{version_output}'; exit {status}; fi\n"
        '[ "$1" = --unshare-all ] && exit 0\n'
        "echo 'bwrap: fake' >&2; exit 1\n"
    )
    temp.chmod(0o755)
    temp.replace(bwrap)
    return bwrap


def times_asked(bwrap: Path) -> int:
    log = bwrap.with_name("version.log")
    return len(log.read_text().splitlines()) if log.exists() else 0


async def shell_detail(ws: Path) -> str:
    with trio.fail_after(20):
        result: RunResult = await execute(spec_for("shell", {"command": "touch ran"}, ws))
    assert (result.ok, result.reason) == (False, Reason.SANDBOX_UNAVAILABLE), result
    assert not (ws / "ran").exists()
    assert result.detail is not None
    return result.detail


@pytest.mark.parametrize(
    ("output", "status", "said"),
    [
        ("bubblewrap 0.7.1\n", 0, "is version 0.7.1"),
        ("bubblewrap 0.4\n", 0, "is version 0.4.0"),
        ("bubblewrap 0.7.99-dev\n", 0, "is version 0.7.99"),
        ("some other program 9.9\n", 0, "printed 'some other program 9.9', exit status 0"),
        ("", 1, "printed nothing, exit status 1"),
        ("bubblewrap 0.8.0\n", 2, "printed 'bubblewrap 0.8.0', exit status 2"),
    ],
)
async def test_an_old_or_unknown_bwrap_is_sandbox_unavailable(
    ws: Path, monkeypatch: pytest.MonkeyPatch, output: str, status: int, said: str
) -> None:
    bwrap = fake_bwrap(ws.parent / "bin", output, status)
    monkeypatch.setenv("PATH", str(bwrap.parent))
    detail = await shell_detail(ws)
    if said.startswith("is version"):
        assert detail == f"bubblewrap ({bwrap}) {said}; {NEEDED}; {SEE}"
    else:
        assert detail == (
            f"the version of bubblewrap ({bwrap}) cannot be read (`bwrap --version` {said}); "
            f"{NEEDED}; {SEE}"
        )


@pytest.mark.parametrize("version", ["0.8.0", "0.10.0", "1.0"])
async def test_a_new_enough_bwrap_is_started(
    ws: Path, monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    # 0.10 is newer than 0.8: compared as numbers, not text.
    bwrap = fake_bwrap(ws.parent / "bin", f"bubblewrap {version}\n")
    monkeypatch.setenv("PATH", str(bwrap.parent))
    detail = await shell_detail(ws)
    assert detail == f"bubblewrap could not set up the sandbox: bwrap: fake; {SEE}"


async def test_the_version_is_read_once_per_binary(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bwrap = fake_bwrap(ws.parent / "bin", "bubblewrap 0.7.0\n")
    monkeypatch.setenv("PATH", str(bwrap.parent))
    for _ in range(3):
        assert "is version 0.7.0;" in await shell_detail(ws)
    assert times_asked(bwrap) == 1
    # Upgraded in place (a new file at the same path): read again, and used.
    fake_bwrap(bwrap.parent, "bubblewrap 0.9.0\n")
    assert await shell_detail(ws) == f"bubblewrap could not set up the sandbox: bwrap: fake; {SEE}"
    assert await shell_detail(ws) == f"bubblewrap could not set up the sandbox: bwrap: fake; {SEE}"
    assert times_asked(bwrap) == 2


async def test_a_version_that_could_not_be_read_is_asked_again(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bwrap = fake_bwrap(ws.parent / "bin", "", status=1)
    monkeypatch.setenv("PATH", str(bwrap.parent))
    for _ in range(2):
        assert "cannot be read" in await shell_detail(ws)
    assert times_asked(bwrap) == 2


def test_bxctl_up_names_an_old_bwrap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bwrap = fake_bwrap(tmp_path / "bin", "bubblewrap 0.7.1\n")
    monkeypatch.setenv("PATH", str(bwrap.parent))
    with short_home() as home:
        _, problems = preflight(home)
    assert problems[0].describe() == f"bubblewrap ({bwrap}) is version 0.7.1; {NEEDED}; {SEE}"
    assert problems[0].code is Exit.FAILED


def test_bxctl_up_is_content_with_a_new_enough_bwrap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bwrap = fake_bwrap(tmp_path / "bin", "bubblewrap 0.8.0\n")
    monkeypatch.setenv("PATH", str(bwrap.parent))
    with short_home() as home:
        _, problems = preflight(home)
    assert "bubblewrap" not in " ".join(problem.describe() for problem in problems)
    assert times_asked(bwrap) == 1
