"""The look before a write is asked (broker/workspace_paths.py): the first directory of
its path that does not exist, reached as the write reaches it; None wherever the write
itself must answer (it exists, it cannot be looked at)."""

from __future__ import annotations

from pathlib import Path

import pytest

from boxmaker.broker.workspace_paths import missing_directory


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "sub" / "deep").mkdir(parents=True)
    (ws / "notes.txt").write_text("notes\n")
    (tmp_path / "outside").mkdir()
    (ws / "in-link").symlink_to("sub")
    (ws / "out-link").symlink_to(tmp_path / "outside")
    return ws


@pytest.mark.parametrize(
    ("path", "missing"),
    [
        ("plan.md", None),
        ("sub/plan.md", None),
        ("sub/deep/plan.md", None),
        ("drafts/plan.md", "drafts"),
        ("drafts/2026/plan.md", "drafts"),
        ("sub/new/plan.md", "sub/new"),
        ("sub/deep/new/x/plan.md", "sub/deep/new"),
        # Through a link that stays in: its real path, as the write walks it.
        ("in-link/new/plan.md", "sub/new"),
        # Left to the write, which fails with its own reason: a link out of the
        # workspace (path_escape), a file where a directory should be, the root.
        ("out-link/new/plan.md", None),
        ("notes.txt/new/plan.md", None),
        (".", None),
    ],
)
def test_the_first_missing_directory_of_a_write(
    workspace: Path, path: str, missing: str | None
) -> None:
    assert missing_directory(workspace, path) == missing


def test_a_workspace_that_is_gone_is_no_missing_directory(tmp_path: Path) -> None:
    assert missing_directory(tmp_path / "gone", "drafts/plan.md") is None
