"""The main job, ``bxctl demo`` (README.md), on the real built-in model: the whole
stack as processes, one approved call, a sound ledger, everything stopped afterwards.
It needs the optional model (``nox -s gate`` installs it); without it, it is skipped
and says so."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from boxmaker.model.serve import ModelUnavailable, check_installed

pytestmark = pytest.mark.slow

try:
    check_installed()
    MISSING = ""
except ModelUnavailable as exc:
    MISSING = str(exc)


@pytest.mark.skipif(bool(MISSING), reason=f"the built-in model is not installed: {MISSING}")
def test_the_demo_runs_one_approved_call_and_stops_everything() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "boxmaker.cli.app", "demo", "--yes"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, (out, done.stderr)
    home = Path(re.search(r"A temporary home: (\S+)", out)[1])  # type: ignore[index]
    assert re.search(r'-> read_file \{.*"path":"notes.txt".*\}', out), out
    assert "grant      read-notes (mode ask)" in out
    assert "approving (--yes): bxctl approve a-" in out
    assert "  <- ok" in out
    assert "Buy milk." in out.split("  <- ok", 1)[1]
    assert "calls: 1 (complete 1," in out
    assert "ledger: sound" in out
    assert out.rstrip().endswith(
        "loopd: stopped\ninferproxy: stopped\nbrokerd: stopped\nmodel: stopped"
    )
    assert not home.exists()
