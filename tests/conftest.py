"""Fixtures every part of the suite shares."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.broker.broker_harness import PENDING_TIMEOUT, write_config, write_grants

from boxmaker.home import Home


@contextlib.contextmanager
def short_home(prefix: str = "bx-") -> Iterator[Home]:
    """A fresh home, removed afterwards. Short path: AF_UNIX paths are capped at 107
    bytes, and pytest's tmp_path can be longer than that."""
    home = Home(Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp")))
    home.create()
    try:
        yield home
    finally:
        shutil.rmtree(home.root, ignore_errors=True)


@pytest.fixture
def home() -> Iterator[Home]:
    """A fresh home with no grants, brokerd's pending timeout short."""
    with short_home() as fresh:
        write_config(fresh, f"[broker]\npending_timeout = {PENDING_TIMEOUT}\n")
        write_grants(fresh, "")
        yield fresh
