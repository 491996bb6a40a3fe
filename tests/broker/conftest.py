"""Fixtures for brokerd's tests (see broker_harness.py for why threads run inline)."""

from __future__ import annotations

from typing import Any

import pytest
import trio


@pytest.fixture
def inline_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run ``trio.to_thread.run_sync`` functions inline, after a checkpoint, so the
    autojump clock never jumps while a worker thread is busy."""

    async def inline(sync_fn: Any, *args: Any, **_: Any) -> Any:
        await trio.lowlevel.checkpoint()
        return sync_fn(*args)

    monkeypatch.setattr(trio.to_thread, "run_sync", inline)
