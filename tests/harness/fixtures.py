"""The fixtures every part of the suite shares: a pytest plugin that tests/conftest.py
loads (``pytest_plugins``), so a test names a fixture and never imports it."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import trio

from boxmaker.broker.state import Broker
from boxmaker.home.paths import Home
from boxmaker.runtime.threads import ToThread

from .broker import GUARD, PENDING_TIMEOUT, Brokerd, inline
from .homes import short_home, write_config, write_grants
from .process import Daemon
from .sandbox import sandbox_workspace, use_sandbox_workspace


@pytest.fixture
def home() -> Iterator[Home]:
    """A fresh home with no grants, brokerd's pending timeout short."""
    with short_home() as fresh:
        write_config(fresh, f"[broker]\npending_timeout = {PENDING_TIMEOUT}\n")
        write_grants(fresh, "")
        yield fresh


@pytest.fixture
def shell_workspace(home: Home) -> Iterator[Path]:
    """``home`` with a workspace the shell's sandbox can use, whoever runs the tests
    (sandbox.py): as root a shell ask on the home's own workspace, root's, is denied
    before anyone is asked (tests/broker/test_shell_before_asking.py)."""
    with sandbox_workspace() as workspace:
        use_sandbox_workspace(home, workspace)
        yield workspace


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    """brokerd processes a test started (harness.process.start), killed at the end."""
    started: list[Daemon] = []
    yield started
    for daemon in started:
        daemon.kill()


@pytest.fixture
def inline_threads() -> ToThread:
    """brokerd's blocking steps run inline, after a checkpoint, so the autojump clock
    never jumps while a worker thread is busy (see harness/broker.py): the ``brokerd``
    fixture of a test that names this one passes it as serve_broker's ``to_thread``; a
    test that starts brokerd itself passes it (``running(home, to_thread=...)``)."""
    return inline


@pytest.fixture
async def brokerd(home: Home, request: pytest.FixtureRequest) -> AsyncIterator[Brokerd]:
    """brokerd on ``home``, started when the test says (``await brokerd.start()``, after
    it wrote grants and files) and stopped at the end unless the test stopped it; the
    ledger must then verify. The whole test is bounded by GUARD virtual seconds: a hang
    fails it (this fixture's deadline crashes the fixture, and pytest-trio cancels the
    test)."""
    with trio.fail_after(GUARD):
        async with trio.open_nursery() as nursery:
            to_thread = inline if "inline_threads" in request.fixturenames else None
            handle = Brokerd(home, nursery, to_thread=to_thread)
            yield handle
            await handle.stop()


@pytest.fixture
async def broker(brokerd: Brokerd) -> Broker:
    """brokerd on ``home`` as it is when the test starts, started with no options."""
    return await brokerd.start()


@pytest.fixture
def utc_owner(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The owner's zone is UTC, so the local times bxctl shows are the records' own."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()
