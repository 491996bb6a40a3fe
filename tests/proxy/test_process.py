"""inferproxy as a real process in front of the fake llama-server as a real process
: start, serve, SIGTERM, exit codes. Real time, every wait bounded."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tests.fakes.llama_server import as_process
from tests.harness.homes import short_home

from boxmaker.home.paths import Home

pytestmark = pytest.mark.slow

START_S = 30.0


@pytest.fixture
def home() -> Iterator[Home]:
    with short_home("bx-proxyp-") as fresh:
        yield fresh


@pytest.fixture
def model_url() -> Iterator[str]:
    with as_process("--port", "0", stop_timeout=START_S) as url:
        yield url


def proxy(home: Home, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "boxmaker.proxy.serve", "serve", "--home", str(home.root), *extra],
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_socket(path: Path, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + START_S
    while not path.exists():
        assert process.poll() is None, process.communicate()[1]
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def test_serves_until_sigterm_then_exits_0_and_removes_its_socket(
    home: Home, model_url: str
) -> None:
    process = proxy(home, "--upstream", model_url)
    try:
        wait_for_socket(home.infer_sock, process)
        transport = httpx.HTTPTransport(uds=str(home.infer_sock))
        with httpx.Client(transport=transport, base_url="http://proxy") as client:
            health = client.get("/health")
            models = client.get("/v1/models")
        assert (health.status_code, health.json()) == (200, {"status": "ok"})
        assert models.status_code == 200
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=START_S)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr
    assert not home.infer_sock.exists()
    assert f"forwarding to {model_url}" in stderr
    assert "method=GET path=/health status=200" in stderr
    assert "SIGTERM: stopping" in stderr


def test_without_a_model_url_exits_2_saying_what_to_set(home: Home) -> None:
    process = proxy(home)
    _, stderr = process.communicate(timeout=START_S)
    assert process.returncode == 2
    assert "set [model] url in config.toml" in stderr
    assert not home.infer_sock.exists()


def test_a_bad_config_exits_2_pointing_at_the_runbook(home: Home) -> None:
    home.config_toml.write_text("[model]\nmax_tokens = 0\n")
    process = proxy(home, "--upstream", "http://127.0.0.1:9")
    _, stderr = process.communicate(timeout=START_S)
    assert process.returncode == 2
    assert "see docs/runbook.md#config" in stderr
