"""brokerd as a real process, for tests: started on a home, waited for (real time,
every wait bounded), and spoken to over plain blocking sockets."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from boxmaker.home.paths import Home

START_S = 30.0
"""Real seconds for a process to start or stop: generous for a loaded 2-core machine."""


class Daemon:
    def __init__(self, home: Home, *extra: str, nofile: int | None = None) -> None:
        """``nofile``: brokerd's RLIMIT_NOFILE, soft and hard (``prlimit``)."""
        self.home = home
        self.log = home.root / f"brokerd-{time.monotonic_ns()}.log"
        limit = [] if nofile is None else ["prlimit", f"--nofile={nofile}:{nofile}", "--"]
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [
                    *limit,
                    sys.executable,
                    "-m",
                    "boxmaker.broker.serve",
                    "serve",
                    "--home",
                    str(home.root),
                    *extra,
                ],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"brokerd exited {self.process.returncode}: {self.stderr()}")
            try:
                with connect(self.home.admin_sock) as sock:
                    sock.sendall(b'{"kind":"status"}\n')
                    if read_frame(sock)["kind"] == "status":
                        return
            except OSError:
                time.sleep(0.05)
        pytest.fail(f"brokerd did not become ready: {self.stderr()}")

    def wait(self) -> int:
        return self.process.wait(timeout=START_S)

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=START_S)


def start(
    daemons: list[Daemon], home: Home, *extra: str, ready: bool = True, nofile: int | None = None
) -> Daemon:
    daemon = Daemon(home, *extra, nofile=nofile)
    daemons.append(daemon)
    if ready:
        daemon.wait_ready()
    return daemon


def connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(START_S)
    try:
        sock.connect(str(path))
    except OSError:
        sock.close()
        raise
    return sock


def read_frame(sock: socket.socket) -> dict[str, Any]:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            raise EOFError(f"closed after {data!r}")
        data += chunk
    value: dict[str, Any] = orjson.loads(data)
    return value


def send(sock: socket.socket, frame: dict[str, Any]) -> None:
    sock.sendall(orjson.dumps(frame) + b"\n")


def wait_for(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + START_S
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)
