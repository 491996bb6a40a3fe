"""Hostile: ``[broker] loopd_uid`` promised a loopd under its own uid, and could not
keep it (docs/runbook.md#loopd-uid).

run/ is 0700 and its sockets 0600, so a loopd of another uid got EACCES on broker.sock
and infer.sock (and could write neither its loop.sock nor its conversations in the
owner's home), while the key made the owner believe the separation was in place.
Opening run/ to a group would let that uid squat the owner's socket names (a fake
admin.sock before brokerd starts). So the key is now refused by name, by every daemon,
pointing at the runbook; and broker.sock's peer check accepts the owner only, even
where another uid can reach the socket file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import orjson
import pytest
from tests.harness.broker import records, tool_request
from tests.harness.homes import write_config
from tests.harness.process import START_S, Daemon, start

from boxmaker.home.paths import Home

pytestmark = pytest.mark.slow

OTHER = 65534
GONE = (
    "config.toml: [broker] loopd_uid: no longer supported: loopd runs as the owner, the "
    "only uid that can reach broker.sock and infer.sock; remove the key (see "
    "docs/runbook.md#loopd-uid)"
)


@pytest.mark.parametrize("module", ["boxmaker.broker.serve", "boxmaker.loop.serve"])
def test_a_configured_loopd_uid_stops_the_daemons_naming_the_runbook(
    home: Home, module: str
) -> None:
    write_config(home, f"[broker]\nloopd_uid = {OTHER}\n")
    process = subprocess.Popen(
        [sys.executable, "-m", module, "serve", "--home", str(home.root)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _, stderr = process.communicate(timeout=START_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 2, stderr
    assert GONE in stderr
    assert not home.broker_sock.exists()
    assert not home.loop_sock.exists()


PROBE = """
import socket, sys
sock = socket.socket(socket.AF_UNIX)
sock.settimeout(30)
sock.connect(sys.argv[1])
try:
    sock.sendall(sys.argv[2].encode() + b"\\n")
except OSError:
    pass  # a refused peer's connection is closed at once, the refusal already sent
data = b""
while not data.endswith(b"\\n"):
    chunk = sock.recv(65536)
    if not chunk:
        break
    data += chunk
sys.stdout.write(data.decode())
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root")
def test_broker_sock_refuses_another_uid_that_reaches_the_socket(
    home: Home, daemons: list[Daemon]
) -> None:
    daemon = start(daemons, home)
    # The first wall (run/ 0700, the socket 0600) taken down, as a group-shared run/
    # would: the peer check is what must refuse.
    for directory in (home.root, home.run_dir):
        directory.chmod(0o711)
    home.broker_sock.chmod(0o666)
    request = orjson.dumps(tool_request("read_file", {"path": "notes.txt"})).decode()
    setpriv = ["setpriv", f"--reuid={OTHER}", f"--regid={OTHER}", "--clear-groups"]
    done = subprocess.run(
        [*setpriv, sys.executable, "-I", "-c", PROBE, str(home.broker_sock), request],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert orjson.loads(done.stdout) == {
        "kind": "error",
        "code": "peer_refused",
        "detail": f"uid {OTHER} may not use broker.sock",
    }
    daemon.process.terminate()
    assert daemon.wait() == 0
    assert f"broker.sock: refused a peer with uid {OTHER}" in daemon.stderr()
    kinds = [record["kind"] for record in records(home)]
    assert kinds == ["genesis", "start", "policy", "stop", "checkpoint"]
