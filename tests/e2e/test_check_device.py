"""tools/check-device.sh against the scripted llama-server, so that it
cannot rot: it passes when the model asks for the file, and it stops at once when slot 0
is busy; and without BOXMAKER_MODEL_URL against the built-in model (llama.cpp's real
server: its /slots, its tool-call parsing), as ``nox -s device`` runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from tests.fakes.llama_server import as_process
from tests.harness.model import MISSING

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "tools" / "check-device.sh"
READ_NOTES = {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]}


@pytest.fixture
def model(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    extra = request.param
    script = tmp_path / "script.json"
    script.write_bytes(orjson.dumps([READ_NOTES, {"content": "Buy milk."}]))
    with as_process("--script", str(script), *extra) as url:
        yield url


def check(url: str | None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("BOXMAKER_MODEL_URL", None)
    if url is not None:
        env["BOXMAKER_MODEL_URL"] = url
    return subprocess.run(
        ["bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=300, check=False
    )


@pytest.mark.parametrize("model", [[]], indirect=True)
def test_the_check_passes_against_a_model_that_asks_for_the_file(model: str) -> None:
    done = check(model)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "slot 0 is idle" in done.stdout
    assert "grant      check-read (mode ask): the device check" in done.stdout
    assert done.stdout.rstrip().splitlines()[-1].startswith("device check: passed (call c-")
    assert done.stdout.rstrip().endswith(": decision approval result)")


@pytest.mark.parametrize("model", [["--busy"]], indirect=True)
def test_the_check_stops_when_slot_0_is_busy(model: str) -> None:
    done = check(model)
    assert done.returncode == 1
    assert "device check: FAILED: slot 0 is not idle" in done.stderr
    assert "bxctl" not in done.stdout


@pytest.mark.skipif(bool(MISSING), reason=f"the built-in model is not installed: {MISSING}")
# The model started cold and a whole turn on it: about 60 s on a quiet 2-core machine,
# more on a loaded one (the script's own limit is 300 s).
@pytest.mark.timeout(300)
def test_without_a_url_the_check_meets_the_built_in_model() -> None:
    done = check(None)
    assert done.returncode == 0, (done.stdout, done.stderr)
    lines = done.stdout.splitlines()
    model = next(line for line in lines if line.startswith("the built-in model: "))
    assert model.startswith("the built-in model: unix:///tmp/bx-check-")
    assert model.endswith("/run/model.sock")
    assert lines[lines.index(model) + 1] == "slot 0 is idle"
    assert "grant      check-read (mode ask): the device check" in done.stdout
    assert lines[-1].startswith("device check: passed (call c-")
    assert lines[-1].endswith(": decision approval result)")
