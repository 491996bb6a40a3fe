"""Hosts on this machine's loopback that egress is tested against (docs/egress.md): a test
CA (trustme), an HTTPS server of static files that logs who asked it for what, a PEP 503
package index holding a wheel built in the test, and a git repository served by git's
dumb HTTP protocol (plain files).

The server is a process of its own (this file run as a program), as a real host is: what
it knows is what came over the network, and a test reads that from its log
(:meth:`Served.requests`, :meth:`Served.connections`). Python's http.server answers the
requests; the TLS handshake runs in each connection's own thread, so a client that stalls
holds only its own. Every wait is bounded.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import html
import http.server
import os
import re
import select
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any, Final

import attrs
import orjson
import trustme
from hatchling.builders.wheel import WheelBuilder


def _whole_lines(log: Path) -> list[bytes]:
    # Imported here: this file also runs as the server's script, without the tests
    # package on its path.
    from tests.harness.lines import whole_lines

    return whole_lines(log)


START_S: Final = 30.0
"""Real seconds for the server to listen or stop: generous for a loaded 2-core machine."""
HANDSHAKE_S: Final = 10.0
IDLE_S: Final = 30.0
"""How long a kept-alive connection may sit without a request before the server ends it."""
LOOPBACK: Final = "127.0.0.1"
PROBE_PACKAGE: Final = "bx-egress-probe"
PROBE_MODULE: Final = "bx_egress_probe"
GIT_NOTE: Final = "fetched over https\n"
HANDSHAKE_EVENTS: Final = ("connection", "handshake_failed")


# ---------------------------------------------------------------------------------------
# The test's side


def write_ca(ca: trustme.CA, path: Path) -> Path:
    """``ca``'s certificate (PEM) at ``path``, readable by everyone and owned as its
    directory is: in a sandbox workspace, the sandbox's uid reads it (``--cacert``,
    ``--cert``, ``GIT_SSL_CAINFO``)."""
    ca.cert_pem.write_to_path(str(path))
    path.chmod(0o644)
    owner = path.parent.stat()
    os.chown(path, owner.st_uid, owner.st_gid)
    return path


@attrs.frozen
class Served:
    """A running HTTPS server: its port and what it logged."""

    port: int
    log: Path
    process: subprocess.Popen[str] = attrs.field(repr=False)
    probes: list[list[Any]] = attrs.field(factory=list, repr=False)
    """The client addresses of :meth:`settled`'s own connections, left out of its log."""

    def url(self, path: str = "/", host: str = "localhost") -> str:
        return f"https://{host}:{self.port}{path}"

    def events(self) -> list[dict[str, Any]]:
        """What it logged so far, in order: ``accepted`` (a TCP connection taken),
        ``connection`` (its TLS handshake done, with the ``server_name`` the client sent
        or None) or ``handshake_failed`` (with the ``error``), and ``request``
        (``method``, ``path``, ``host``: the Host header, ``server_name``, ``status``),
        each with the client's ``peer`` and the ``local`` address it reached. A request is
        logged before its answer is sent, so a client that got its answer finds it here."""
        lines = _whole_lines(self.log)
        return [event for event in map(orjson.loads, lines) if event["peer"] not in self.probes]

    def settled(self) -> list[dict[str, Any]]:
        """:meth:`events` once every connection made before this call is logged with the
        outcome of its handshake (START_S at most). The server takes connections one by
        one and logs each as it takes it, so once a probe connection made now is logged,
        every earlier one is; each handshake is logged by its connection's own thread,
        and waited for here. A test that asserts the server saw nothing asks this."""
        with socket.create_connection((LOOPBACK, self.port), timeout=START_S) as probe:
            mark = probe.getsockname()
        self.probes.append(list(mark))
        deadline = time.monotonic() + START_S
        while True:
            lines = _whole_lines(self.log)
            seen = [(event["event"], tuple(event["peer"])) for event in map(orjson.loads, lines)]
            accepted = [peer for kind, peer in seen if kind == "accepted"]
            shaken = {peer for kind, peer in seen if kind in HANDSHAKE_EVENTS}
            if mark in accepted and shaken.issuperset(accepted[: accepted.index(mark)]):
                return self.events()
            assert time.monotonic() < deadline, f"the server's log did not settle: {seen}"
            time.sleep(0.02)

    def connections(self) -> list[dict[str, Any]]:
        """The handshakes of every connection that reached the server, successful or
        not (:meth:`settled`)."""
        return [event for event in self.settled() if event["event"] in HANDSHAKE_EVENTS]

    def requests(self) -> list[dict[str, Any]]:
        return [event for event in self.events() if event["event"] == "request"]

    def paths(self) -> list[str]:
        return [event["path"] for event in self.requests()]


@contextlib.contextmanager
def https_server(
    root: Path, ca: trustme.CA, names: Sequence[str] = ("localhost",)
) -> Iterator[Served]:
    """An HTTPS server on 127.0.0.1 (a port of its own) serving the files under ``root``
    with a certificate from ``ca`` for ``names`` and 127.0.0.1; stopped on the way out.
    Its key and log are in a private directory, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="bx-tls-") as private:
        chain = Path(private) / "server.pem"
        ca.issue_cert(*names, LOOPBACK).private_key_and_cert_chain_pem.write_to_path(str(chain))
        log = Path(private) / "events.jsonl"
        log.touch()
        argv = [sys.executable, __file__, "--root", str(root), "--chain", str(chain)]
        process = subprocess.Popen(
            [*argv, "--log", str(log)], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True
        )
        try:
            yield Served(port=_listening_port(process), log=log, process=process)
        finally:
            process.terminate()
            process.communicate(timeout=START_S)


def _listening_port(process: subprocess.Popen[str]) -> int:
    """The port the server prints once it listens (START_S at most)."""
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], START_S)
    line = process.stdout.readline() if ready else ""
    found = re.fullmatch(r"listening 127\.0\.0\.1:(\d+)\n", line)
    assert found, f"the HTTPS server did not start (exit {process.poll()}): {line!r}"
    return int(found[1])


@attrs.frozen
class Package:
    """A wheel published in a PEP 503 index under the server's ``/simple/``."""

    name: str
    module: str
    greeting: str
    """What ``import <module>; <module>.GREETING`` gives once installed."""
    wheel: Path
    sha256: str


def publish_package(root: Path, greeting: str = "hello from the local index") -> Package:
    """Build a one-module project's wheel with hatchling (the PEP 517 backend boxmaker's
    own build uses; offline) and publish it as a PEP 503 "simple" index under
    ``root``: ``/simple/`` lists the project, ``/simple/<name>/`` links
    ``/files/<wheel>#sha256=<digest>``."""
    with tempfile.TemporaryDirectory(prefix="bx-pkg-") as source:
        project = Path(source)
        (project / "pyproject.toml").write_text(
            '[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n'
            f'[project]\nname = "{PROBE_PACKAGE}"\nversion = "0.1.0"\n'
        )
        (project / PROBE_MODULE).mkdir()
        (project / PROBE_MODULE / "__init__.py").write_text(f"GREETING = {greeting!r}\n")
        files = root / "files"
        [built] = WheelBuilder(str(project)).build(directory=str(files))
    wheel = Path(built)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    _page(root / "simple", PROBE_PACKAGE, f"{PROBE_PACKAGE}/")
    _page(root / "simple" / PROBE_PACKAGE, wheel.name, f"/files/{wheel.name}#sha256={digest}")
    return Package(PROBE_PACKAGE, PROBE_MODULE, greeting, wheel, digest)


def _page(directory: Path, text: str, href: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    link = f'<a href="{html.escape(href)}">{html.escape(text)}</a>'
    (directory / "index.html").write_text(
        f"<!DOCTYPE html>\n<html><body>\n{link}<br/>\n</body></html>\n"
    )


@attrs.frozen
class GitRepository:
    """A bare repository under the server's root, ready for a dumb-HTTP clone."""

    path: Path
    """Its URL path: ``/<name>``."""
    url_path: str
    head: str
    """The commit its ``main`` points at."""


def publish_git_repository(root: Path, name: str = "repo.git") -> GitRepository:
    """A bare repository ``root/name`` with one commit (``notes.txt`` holding
    GIT_NOTE), its ``info/refs`` and ``objects/info/packs`` written by
    ``git update-server-info``: git's dumb HTTP protocol needs nothing but these files."""
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    with tempfile.TemporaryDirectory(prefix="bx-git-") as scratch:
        work = Path(scratch) / "work"
        subprocess.run([*git, "init", "-q", "-b", "main", str(work)], check=True)
        (work / "notes.txt").write_text(GIT_NOTE)
        subprocess.run([*git, "-C", str(work), "add", "notes.txt"], check=True)
        subprocess.run([*git, "-C", str(work), "commit", "-q", "-m", "a note"], check=True)
        bare = root / name
        subprocess.run([*git, "clone", "-q", "--bare", str(work), str(bare)], check=True)
    subprocess.run([*git, "-C", str(bare), "update-server-info"], check=True)
    head = subprocess.run(
        [*git, "-C", str(bare), "rev-parse", "main"], check=True, capture_output=True, text=True
    ).stdout.strip()
    return GitRepository(bare, f"/{name}", head)


# ---------------------------------------------------------------------------------------
# The server's side (this file as a program)

_handshake = threading.local()
"""The connection this thread serves: ``server_name`` (set by the SNI callback) and
``where`` (its peer's and its own address)."""


def _remember_server_name(_sock: Any, server_name: str | None, _context: Any) -> None:
    _handshake.server_name = server_name


class _Handler(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = IDLE_S
    # A response's head and body are two writes: with Nagle's algorithm the body would
    # wait for the client's delayed ACK (40 ms), as no real server makes it.
    disable_nagle_algorithm = True
    server: _TlsServer

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        headers = getattr(self, "headers", None)
        self.server.record(
            _handshake.where,
            event="request",
            method=self.command,
            path=self.path,
            host=None if headers is None else headers.get("Host"),
            server_name=_handshake.server_name,
            status=int(code) if str(code).isdigit() else None,
        )

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the log file says what happened."""


class _TlsServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: Path, context: ssl.SSLContext, log: IO[bytes]) -> None:
        self.context = context
        self.log = log
        self.log_lock = threading.Lock()
        super().__init__((LOOPBACK, 0), functools.partial(_Handler, directory=str(root)))

    def record(self, where: dict[str, Any], **event: Any) -> None:
        line = orjson.dumps({**event, **where}) + b"\n"
        with self.log_lock:
            self.log.write(line)
            self.log.flush()

    def process_request(self, request: Any, client_address: Any) -> None:
        """Logged here, in the one thread that takes connections: in the order taken."""
        self.record({"peer": client_address, "local": request.getsockname()}, event="accepted")
        super().process_request(request, client_address)

    def finish_request(self, request: Any, client_address: Any) -> None:
        """The TLS handshake here, in the connection's own thread, then its requests."""
        _handshake.server_name = None
        _handshake.where = {"peer": client_address, "local": request.getsockname()}
        request.settimeout(HANDSHAKE_S)
        try:
            tls = self.context.wrap_socket(request, server_side=True)
        except OSError as error:
            self.record(
                _handshake.where,
                event="handshake_failed",
                server_name=_handshake.server_name,
                error=str(error),
            )
            return
        with tls:
            self.record(_handshake.where, event="connection", server_name=_handshake.server_name)
            self.RequestHandlerClass(tls, client_address, self)


def main() -> None:
    parser = argparse.ArgumentParser(description="A static HTTPS server for egress tests.")
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--chain", type=Path, required=True, help="key and certificate chain")
    parser.add_argument("--log", type=Path, required=True)
    options = parser.parse_args()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(options.chain)
    context.sni_callback = _remember_server_name
    with options.log.open("ab") as log, _TlsServer(options.root, context, log) as server:
        print(f"listening {LOOPBACK}:{server.server_address[1]}", flush=True)
        server.serve_forever()


if __name__ == "__main__":
    main()
