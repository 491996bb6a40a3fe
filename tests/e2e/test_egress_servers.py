"""The hosts egress is tested against (tests/harness/tls_servers.py), each reached
directly by the real clients, with no proxy: curl, the system's pip and git, run as a
sandboxed command is (the sandbox's uid, the sandbox's environment, the CA read from the
workspace). A later failure through brokerd is then brokerd's, not the server's."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
import trustme
from tests.harness.sandbox import AS_ROOT, SANDBOX_UID, sandbox_workspace
from tests.harness.tls_servers import (
    GIT_NOTE,
    Served,
    https_server,
    publish_git_repository,
    publish_package,
    write_ca,
)

from boxmaker.broker.sandbox_plan import SANDBOX_ENV

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not all(map(shutil.which, ("curl", "git"))), reason="needs curl and git (.ci/run)"
    ),
]

SYSTEM_PYTHON: Final = "/usr/bin/python3"
HELLO: Final = "hello over https\n"
CURL_NO_TRUST: Final = 60
"""curl's exit status when the server's certificate does not verify."""


@pytest.fixture
def workspace() -> Iterator[Path]:
    with sandbox_workspace() as fresh:
        yield fresh


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """The server's files: one small text file."""
    (tmp_path / "hello.txt").write_text(HELLO)
    return tmp_path


def as_sandbox(workspace: Path, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``argv`` as a sandboxed command runs: the sandbox's uid (as root), its environment
    with the workspace as HOME, and no pip configuration of the host's (the sandbox sees
    no /etc/pip.conf)."""
    user = ["setpriv", f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups"]
    return subprocess.run(
        [*(user if AS_ROOT else []), *argv],
        env={**SANDBOX_ENV, "HOME": str(workspace), "PIP_CONFIG_FILE": os.devnull, **env},
        cwd=workspace,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def curl(workspace: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return as_sandbox(workspace, "curl", "--silent", "--show-error", "--max-time", "30", *args)


def one_request(served: Served) -> dict[str, object]:
    """The server's only request, without its client's port."""
    [request] = served.requests()
    assert request["peer"][0] == "127.0.0.1"
    return {key: value for key, value in request.items() if key != "peer"}


def test_curl_gets_a_file_and_the_server_logs_the_path_host_and_server_name(
    workspace: Path, ca: trustme.CA, site: Path
) -> None:
    ca_file = write_ca(ca, workspace / "ca.pem")
    with https_server(site, ca) as served:
        done = curl(workspace, "--cacert", str(ca_file), served.url("/hello.txt"))
        assert (done.returncode, done.stdout, done.stderr) == (0, HELLO, "")
        assert one_request(served) == {
            "event": "request",
            "method": "GET",
            "path": "/hello.txt",
            "host": f"localhost:{served.port}",
            "server_name": "localhost",
            "status": 200,
            "local": ["127.0.0.1", served.port],
        }
        [connection] = served.connections()
        assert (connection["event"], connection["server_name"]) == ("connection", "localhost")


def test_without_the_test_ca_curl_refuses_the_server_and_no_request_is_made(
    workspace: Path, ca: trustme.CA, site: Path
) -> None:
    # The system's CAs do not know the test CA: a client that trusts the server was given
    # the CA (no interception anywhere can pass for the server).
    with https_server(site, ca) as served:
        done = curl(workspace, served.url("/hello.txt"))
        assert done.returncode == CURL_NO_TRUST, done.stderr
        assert served.requests() == []
        [failed] = served.connections()
        assert (failed["event"], failed["server_name"]) == ("handshake_failed", "localhost")
        assert "unknown ca" in failed["error"]


def test_a_connection_that_never_speaks_tls_is_seen_all_the_same(
    ca: trustme.CA, site: Path
) -> None:
    # What a test that asserts "the server saw nothing" relies on: a connection opened
    # and closed at once, with no byte sent, is in the log once it settles.
    with https_server(site, ca) as served:
        assert served.connections() == []
        with socket.create_connection(("127.0.0.1", served.port), timeout=5) as silent:
            peer = list(silent.getsockname())
        [accepted, failed] = served.settled()
        assert (accepted["event"], accepted["peer"]) == ("accepted", peer)
        assert (failed["event"], failed["peer"], failed["server_name"]) == (
            "handshake_failed",
            peer,
            None,
        )
        assert served.connections() == [failed]


def test_the_server_name_logged_is_the_one_the_client_sent(
    workspace: Path, ca: trustme.CA, site: Path
) -> None:
    ca_file = write_ca(ca, workspace / "ca.pem")
    with https_server(site, ca, names=("localhost", "mirror.test")) as served:
        other = f"mirror.test:{served.port}"
        by_name = curl(
            workspace,
            "--cacert",
            str(ca_file),
            "--resolve",
            f"{other}:127.0.0.1",
            served.url("/hello.txt", host="mirror.test"),
        )
        assert (by_name.returncode, by_name.stdout) == (0, HELLO), by_name.stderr
        # curl sends no server name for an IP address (RFC 6066), and the certificate
        # names 127.0.0.1 too.
        by_address = curl(
            workspace, "--cacert", str(ca_file), served.url("/hello.txt", host="127.0.0.1")
        )
        assert (by_address.returncode, by_address.stdout) == (0, HELLO), by_address.stderr
        assert [(r["host"], r["server_name"]) for r in served.requests()] == [
            (other, "mirror.test"),
            (f"127.0.0.1:{served.port}", None),
        ]


def test_the_system_pip_installs_the_wheel_from_the_index(
    workspace: Path, ca: trustme.CA, site: Path
) -> None:
    package = publish_package(site)
    ca_file = write_ca(ca, workspace / "ca.pem")
    with https_server(site, ca) as served:
        done = as_sandbox(
            workspace,
            SYSTEM_PYTHON,
            "-m",
            "pip",
            "install",
            "--no-cache-dir",
            "--disable-pip-version-check",
            "--index-url",
            served.url("/simple/"),
            "--cert",
            str(ca_file),
            "--target",
            str(workspace / "site"),
            package.name,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert served.paths() == [
            f"/simple/{package.name}/",
            f"/files/{package.wheel.name}",
        ]
    imported = as_sandbox(
        workspace,
        SYSTEM_PYTHON,
        "-c",
        f"import {package.module}; print({package.module}.GREETING)",
        PYTHONPATH=str(workspace / "site"),
    )
    assert (imported.returncode, imported.stdout) == (0, f"{package.greeting}\n"), imported.stderr


def test_pip_checks_the_digest_the_index_gives(workspace: Path, ca: trustme.CA, site: Path) -> None:
    # The index's #sha256 fragment is what pip checks the wheel against: a wheel changed
    # on the way (or on the server) is refused.
    package = publish_package(site)
    with package.wheel.open("ab") as wheel:
        wheel.write(b"\0")
    ca_file = write_ca(ca, workspace / "ca.pem")
    with https_server(site, ca) as served:
        done = as_sandbox(
            workspace,
            SYSTEM_PYTHON,
            "-m",
            "pip",
            "install",
            "--no-cache-dir",
            "--index-url",
            served.url("/simple/"),
            "--cert",
            str(ca_file),
            "--target",
            str(workspace / "site"),
            package.name,
        )
    assert done.returncode == 1
    assert "THESE PACKAGES DO NOT MATCH THE HASHES" in done.stderr
    assert f"Expected sha256 {package.sha256}" in done.stderr


def test_git_clones_the_repository_over_dumb_http(
    workspace: Path, ca: trustme.CA, site: Path
) -> None:
    repository = publish_git_repository(site)
    ca_file = write_ca(ca, workspace / "ca.pem")
    clone = workspace / "clone"
    with https_server(site, ca) as served:
        done = as_sandbox(
            workspace,
            "git",
            "clone",
            "--quiet",
            served.url(repository.url_path),
            str(clone),
            GIT_SSL_CAINFO=str(ca_file),
        )
        assert done.returncode == 0, done.stderr
        paths = served.paths()
    assert (clone / "notes.txt").read_text() == GIT_NOTE
    head = as_sandbox(workspace, "git", "-C", str(clone), "rev-parse", "HEAD")
    assert head.stdout.strip() == repository.head
    # The dumb protocol: git asks for the smart service, gets a plain file, and walks the
    # objects one by one.
    assert paths[:2] == ["/repo.git/info/refs?service=git-upload-pack", "/repo.git/HEAD"]
    assert all(path.startswith("/repo.git/objects/") for path in paths[2:])
    assert len(paths) == 5  # commit, tree, blob


def test_the_server_is_gone_once_its_context_ends(ca: trustme.CA, site: Path) -> None:
    with https_server(site, ca) as served:
        pass
    assert served.process.returncode is not None
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", served.port), timeout=5).close()
