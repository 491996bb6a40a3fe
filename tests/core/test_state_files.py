"""State files on disk: fresh, unreadable, raised atomically, never rewritten
when unchanged."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from boxmaker.core.labels import FRESH, Label, Taint
from boxmaker.core.state import StateUnreadable, encode_state
from boxmaker.home.file_ops import OsFileOps
from boxmaker.home.state_files import raise_state, read_state, state_path

SESSION = "s-0123456789ab"
INTERNAL = Label(Taint.INTERNAL, False)
SECRET = Label(Taint.SECRET, False)
UNTRUSTED = Label(Taint.PUBLIC, True)


def test_no_file_is_a_fresh_session(tmp_path: Path) -> None:
    assert read_state(tmp_path, SESSION) == FRESH


def test_raise_writes_0600_and_reads_back(tmp_path: Path) -> None:
    assert raise_state(tmp_path, SESSION, INTERNAL) == INTERNAL
    path = state_path(tmp_path, SESSION)
    assert path == tmp_path / f"{SESSION}.json"
    assert path.read_bytes() == b'{"v":1,"taint":"internal","untrusted":false}\n'
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_state(tmp_path, SESSION) == INTERNAL
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{SESSION}.json"]


def test_labels_join(tmp_path: Path) -> None:
    assert raise_state(tmp_path, SESSION, INTERNAL) == INTERNAL
    assert raise_state(tmp_path, SESSION, UNTRUSTED) == Label(Taint.INTERNAL, True)
    assert raise_state(tmp_path, SESSION, SECRET) == Label(Taint.SECRET, True)
    assert raise_state(tmp_path, SESSION, FRESH) == Label(Taint.SECRET, True)
    assert read_state(tmp_path, SESSION) == Label(Taint.SECRET, True)


def test_an_unchanged_state_is_not_rewritten(tmp_path: Path) -> None:
    raise_state(tmp_path, SESSION, SECRET)
    path = state_path(tmp_path, SESSION)
    before = path.stat()
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    for label in (FRESH, INTERNAL, SECRET):
        assert raise_state(tmp_path, SESSION, label) == SECRET
    after = path.stat()
    assert after.st_ino == before.st_ino
    assert after.st_mtime_ns == 1_000_000_000


def test_a_fresh_session_raised_by_public_writes_nothing(tmp_path: Path) -> None:
    assert raise_state(tmp_path, SESSION, FRESH) == FRESH
    assert list(tmp_path.iterdir()) == []


def test_a_raise_replaces_the_file(tmp_path: Path) -> None:
    raise_state(tmp_path, SESSION, INTERNAL)
    inode = state_path(tmp_path, SESSION).stat().st_ino
    raise_state(tmp_path, SESSION, SECRET)
    # A rename, not an in-place write: a reader never sees a half-written file.
    assert state_path(tmp_path, SESSION).stat().st_ino != inode


@pytest.mark.parametrize(
    "content",
    [b"", b"{", b'{"v": 2, "taint": "public", "untrusted": false}', b"x" * 5000],
)
def test_bad_content_is_unreadable_and_never_overwritten(tmp_path: Path, content: bytes) -> None:
    path = state_path(tmp_path, SESSION)
    path.write_bytes(content)
    result = read_state(tmp_path, SESSION)
    assert isinstance(result, StateUnreadable)
    assert SESSION in result.detail
    assert isinstance(raise_state(tmp_path, SESSION, SECRET), StateUnreadable)
    assert path.read_bytes() == content


def test_a_directory_in_place_of_the_file_is_unreadable(tmp_path: Path) -> None:
    state_path(tmp_path, SESSION).mkdir()
    assert isinstance(read_state(tmp_path, SESSION), StateUnreadable)


def test_a_symlink_in_place_of_the_file_is_unreadable(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.json"
    target.write_bytes(encode_state(FRESH))
    state_path(tmp_path, SESSION).symlink_to(target)
    assert isinstance(read_state(tmp_path, SESSION), StateUnreadable)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files regardless of mode")
def test_a_file_without_permission_is_unreadable(tmp_path: Path) -> None:
    path = state_path(tmp_path, SESSION)
    path.write_bytes(encode_state(FRESH))
    path.chmod(0)
    assert isinstance(read_state(tmp_path, SESSION), StateUnreadable)


def test_a_missing_directory_cannot_be_raised(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    assert read_state(missing, SESSION) == FRESH
    result = raise_state(missing, SESSION, SECRET)
    assert isinstance(result, StateUnreadable)
    assert "write failed" in result.detail


@pytest.mark.parametrize("session", ["../x", "s-0123", "s-0123456789ab/../../x", ""])
def test_a_bad_session_id_is_never_a_path(tmp_path: Path, session: str) -> None:
    assert isinstance(read_state(tmp_path, session), StateUnreadable)
    assert isinstance(raise_state(tmp_path, session, SECRET), StateUnreadable)
    assert list(tmp_path.iterdir()) == []


def test_a_leftover_temp_file_is_ignored(tmp_path: Path) -> None:
    raise_state(tmp_path, SESSION, INTERNAL)
    crash = tmp_path / f".{SESSION}.json.deadbeef0000.tmp"
    crash.write_bytes(b'{"v":1,"taint":"pub')
    assert read_state(tmp_path, SESSION) == INTERNAL
    assert raise_state(tmp_path, SESSION, SECRET) == SECRET
    assert read_state(tmp_path, SESSION) == SECRET
    assert crash.read_bytes() == b'{"v":1,"taint":"pub'


class FailingFsync(OsFileOps):
    def fsync(self, fd: int) -> None:
        raise OSError(5, "Input/output error")


class FailingWrite(OsFileOps):
    def write(self, fd: int, data: bytes | memoryview) -> int:
        raise OSError(28, "No space left on device")


class OneByteWrites(OsFileOps):
    def write(self, fd: int, data: bytes | memoryview) -> int:
        return os.write(fd, bytes(data[:1]))


def test_a_crash_before_the_rename_keeps_the_good_state(tmp_path: Path) -> None:
    raise_state(tmp_path, SESSION, INTERNAL)
    good = state_path(tmp_path, SESSION).read_bytes()

    result = raise_state(tmp_path, SESSION, SECRET, files=FailingFsync())
    assert isinstance(result, StateUnreadable)
    assert "Input/output error" in result.detail
    assert state_path(tmp_path, SESSION).read_bytes() == good
    assert read_state(tmp_path, SESSION) == INTERNAL
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{SESSION}.json"]


def test_a_failed_write_leaves_no_temp_file(tmp_path: Path) -> None:
    result = raise_state(tmp_path, SESSION, SECRET, files=FailingWrite())
    assert isinstance(result, StateUnreadable)
    assert "No space left on device" in result.detail
    assert list(tmp_path.iterdir()) == []
    assert read_state(tmp_path, SESSION) == FRESH


def test_short_writes_are_completed(tmp_path: Path) -> None:
    assert raise_state(tmp_path, SESSION, SECRET, files=OneByteWrites()) == SECRET
    assert read_state(tmp_path, SESSION) == SECRET
