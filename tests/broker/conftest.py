"""Fixtures for brokerd's tests (see broker_harness.py for why threads run inline)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from tests.broker.broker_harness import PENDING_TIMEOUT, write_config, write_grants

from boxmaker.home import Home


@pytest.fixture
def home() -> Iterator[Home]:
    """A fresh home with no grants. Short path: AF_UNIX paths are capped at 107 bytes,
    and pytest's tmp_path can be longer than that."""
    root = Path(tempfile.mkdtemp(prefix="bx-", dir="/tmp"))
    home = Home(root)
    home.create()
    write_config(home, f"[broker]\npending_timeout = {PENDING_TIMEOUT}\n")
    write_grants(home, "")
    try:
        yield home
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def inline_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run ``trio.to_thread.run_sync`` functions inline, after a checkpoint, so the
    autojump clock never jumps while a worker thread is busy."""

    async def inline(sync_fn: Any, *args: Any, **_: Any) -> Any:
        await trio.lowlevel.checkpoint()
        return sync_fn(*args)

    monkeypatch.setattr(trio.to_thread, "run_sync", inline)
