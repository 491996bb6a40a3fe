"""The built-in model's log (docs/decisions.md, "The built-in model"): llama.cpp stamps
its lines with its uptime; each is logged again with the wall time, as every daemon's.
Needs the optional model; skipped without it."""

from __future__ import annotations

import re
import signal
import subprocess
import sys

import pytest
from tests.harness.homes import short_home
from tests.harness.process import START_S, wait_for

from boxmaker.model.serve import ModelUnavailable, check_installed

try:
    check_installed()
    MISSING = ""
except ModelUnavailable as exc:
    MISSING = str(exc)

WALL_TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} model"
UPTIME = r"\d+\.\d\d\.\d{3}\.\d{3}"


@pytest.mark.skipif(bool(MISSING), reason=f"the built-in model is not installed: {MISSING}")
def test_every_line_of_the_model_log_has_the_wall_time() -> None:
    with short_home() as home:
        log_path = home.logs_dir / "model.log"
        home.logs_dir.mkdir(exist_ok=True)
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "boxmaker.model.serve", "serve", "--home", str(home.root)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        try:
            wait_for(home.model_url_file.exists, "the model to load")
            process.send_signal(signal.SIGINT)
            assert process.wait(timeout=START_S) == 0
        finally:
            process.kill()
        lines = log_path.read_text().splitlines()
        assert [line for line in lines if not re.match(rf"{WALL_TIME} ", line)] == []
        # llama.cpp's own lines, from loading to its last at the stop, its levels kept.
        assert any(re.match(rf"{WALL_TIME} INFO {UPTIME} I .*loading model", ln) for ln in lines)
        assert any(re.match(rf"{WALL_TIME} WARNING {UPTIME} W ", line) for line in lines)
        assert re.match(rf"{WALL_TIME} INFO {UPTIME} I ~Server: main loop exited$", lines[-1])
