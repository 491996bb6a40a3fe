"""loopd as a real process: a turn with inferproxy down ends in an error that
says how to start it; SIGTERM stops it cleanly. Real time, every wait bounded."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import orjson
import pytest

from boxmaker.home.paths import Home

pytestmark = pytest.mark.slow

START_S = 30.0


def test_a_turn_without_inferproxy_says_how_to_start_it_and_sigterm_stops(home: Home) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "boxmaker.loop.serve", "serve", "--home", str(home.root)],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + START_S
        while not home.loop_sock.exists():
            assert process.poll() is None, process.communicate()[1]
            assert time.monotonic() < deadline, "loop.sock never appeared"
            time.sleep(0.02)
        assert home.loop_sock.stat().st_mode & 0o777 == 0o600
        with socket.socket(socket.AF_UNIX) as client:
            client.settimeout(START_S)
            client.connect(str(home.loop_sock))
            client.sendall(b'{"kind": "say", "text": "hello"}\n')
            data = b""
            while chunk := client.recv(65536):
                data += chunk
        events = [orjson.loads(line) for line in data.splitlines()]
        assert [event["kind"] for event in events] == ["session", "model", "model_done", "error"]
        assert events[-1]["code"] == "model_unreachable"
        assert events[-1]["detail"].endswith("; start the daemons with `bxctl up`")
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=START_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, stderr
    assert not home.loop_sock.exists()
    assert "SIGTERM: stopping" in stderr
