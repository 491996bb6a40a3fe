"""Every rename that makes a file take its name is followed by an fsync of the directory
(without it a crash may lose the rename): a raised session state, a new ledger's genesis.
The file layer is injected and records each call, in order."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import attrs

from boxmaker.core.labels import Label, Taint
from boxmaker.home.file_ops import OsFileOps
from boxmaker.home.state_files import raise_state, read_state
from boxmaker.ledger.live_file import open_ledger

SESSION = "s-0123456789ab"
NOW = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)


@attrs.define
class RecordingFiles(OsFileOps):
    """The real calls, each recorded as (call, path) — an fd is named by its path."""

    calls: list[tuple[str, Path]] = attrs.field(factory=list)
    paths: dict[int, Path] = attrs.field(factory=dict)

    def open(self, path: Path, flags: int, mode: int = 0o777) -> int:
        fd = super().open(path, flags, mode)
        self.paths[fd] = Path(path)
        self.calls.append(("open", Path(path)))
        return fd

    def write(self, fd: int, data: bytes | memoryview) -> int:
        self.calls.append(("write", self.paths[fd]))
        return super().write(fd, data)

    def fsync(self, fd: int) -> None:
        self.calls.append(("fsync", self.paths[fd]))
        super().fsync(fd)

    def close(self, fd: int) -> None:
        self.calls.append(("close", self.paths.pop(fd)))
        super().close(fd)

    def replace(self, source: Path, target: Path) -> None:
        self.calls.append(("rename", source))
        self.calls.append(("onto", target))
        super().replace(source, target)

    def unlink(self, path: Path) -> None:
        self.calls.append(("unlink", path))
        super().unlink(path)


def durable_replace(temp: Path, target: Path) -> list[tuple[str, Path]]:
    """The calls of one durable replace of ``target`` through ``temp``."""
    directory = target.parent
    return [
        ("open", temp),
        ("write", temp),
        ("fsync", temp),
        ("close", temp),
        ("rename", temp),
        ("onto", target),
        ("open", directory),
        ("fsync", directory),
        ("close", directory),
    ]


def temps(files: RecordingFiles) -> list[Path]:
    return [path for call, path in files.calls if call == "rename"]


def test_each_raised_state_fsyncs_the_directory_after_its_rename(tmp_path: Path) -> None:
    files = RecordingFiles()
    internal, secret = Label(Taint.INTERNAL, False), Label(Taint.SECRET, False)
    assert raise_state(tmp_path, SESSION, internal, files=files) == internal
    assert raise_state(tmp_path, SESSION, internal, files=files) == internal  # no change
    assert raise_state(tmp_path, SESSION, secret, files=files) == secret
    target = tmp_path / f"{SESSION}.json"
    first, second = temps(files)
    assert files.calls == durable_replace(first, target) + durable_replace(second, target)
    assert first.parent == second.parent == tmp_path
    assert read_state(tmp_path, SESSION) == secret
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]


def test_a_new_ledgers_genesis_fsyncs_the_directory_after_its_rename(tmp_path: Path) -> None:
    files = RecordingFiles()
    ledger = tmp_path / "ledger" / "audit.ndjson"
    tail = open_ledger(ledger, now=NOW, files=files)
    [temp] = temps(files)
    assert files.calls == durable_replace(temp, ledger)
    assert temp.parent == ledger.parent
    assert sorted(p.name for p in ledger.parent.iterdir()) == [ledger.name]
    assert tail.next_seq == 1
    # An existing ledger is only read: nothing is renamed, nothing goes through files.
    files.calls.clear()
    assert open_ledger(ledger, now=NOW, files=files) == tail
    assert files.calls == []
