"""Hostile: an ``http_get`` grant bound the host but not the port or the address.

The attack: the owner grants ``hosts = ["localhost"]`` (or any name); the model asks for
``http://localhost:PORT/`` and reaches whatever listens on any port of the loopback
interface (a database's HTTP admin, a dev server, a cloud metadata service behind a
name that resolves to 169.254.169.254). Now an entry without a port allows only 80/443
(another port is ``no_grant`` before anything runs), and an address that is loopback,
private, link-local or otherwise special is refused at run time unless the grant names
that very address: brokerd resolves once, checks every address, and connects to the
address it checked.

The real brokerd process, real Unix sockets, and a local HTTP server on 127.0.0.1: no
test here sends a packet anywhere else (``localhost`` and ``2130706433`` resolve from
/etc/hosts and inet_aton, without a DNS query).
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from tests.harness.broker import records_of, tool_request
from tests.harness.homes import grant, write_grants
from tests.harness.process import Daemon, connect, read_frame, send, start

from boxmaker.home.paths import Home

pytestmark = pytest.mark.slow

RUNBOOK = "see docs/runbook.md#http-get"


class _Handler(http.server.BaseHTTPRequestHandler):
    seen: list[tuple[str, str]]

    def do_GET(self) -> None:
        self.seen.append((self.path, self.headers.get("Host", "")))
        body = b"the local service answered"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class LocalService:
    """An HTTP server on 127.0.0.1 only, recording every request it gets."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        handler = type("Handler", (_Handler,), {"seen": self.seen})
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def service() -> Iterator[LocalService]:
    local = LocalService()
    try:
        yield local
    finally:
        local.close()


@pytest.fixture
def brokerd(home: Home, daemons: list[Daemon]) -> Daemon:
    return start(daemons, home)


def fetch(home: Home, hosts: list[str], url: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Grant ``hosts`` (auto), ask for ``url``: the final frame and the call's records."""
    write_grants(home, grant("web", "http_get", "auto", hosts=hosts))
    frame = tool_request("http_get", {"url": url})
    with connect(home.broker_sock) as sock:
        send(sock, frame)
        answer = read_frame(sock)
    return answer, records_of(home, frame["call"])


def test_a_grant_for_a_name_does_not_reach_another_port_of_it(
    home: Home, brokerd: Daemon, service: LocalService
) -> None:
    answer, records = fetch(home, ["localhost"], f"http://localhost:{service.port}/")
    assert (answer["outcome"], answer["reason"]) == ("denied", "no_grant"), answer
    (decision,) = records
    assert (decision["verdict"], decision["reason"], decision["grant"]) == (
        "deny",
        "no_grant",
        None,
    )
    assert service.seen == []


def test_a_name_on_a_granted_port_still_does_not_reach_loopback(
    home: Home, brokerd: Daemon, service: LocalService
) -> None:
    answer, records = fetch(
        home, [f"localhost:{service.port}"], f"http://localhost:{service.port}/secret"
    )
    assert (answer["outcome"], answer["reason"]) == ("failed", "tool_error"), answer
    detail = answer["detail"]
    # /etc/hosts may list ::1 before 127.0.0.1; either is loopback and refused.
    assert detail.startswith("localhost resolves to "), detail
    assert detail.endswith(f", a loopback address, which the grant does not name; {RUNBOOK}")
    decision, result = records
    assert (decision["verdict"], decision["grant"]) == ("run", "web")
    assert (result["kind"], result["status"], result["reason"]) == (
        "result",
        "failed",
        "tool_error",
    )
    assert service.seen == []


def test_a_numeric_spelling_of_loopback_is_judged_by_its_address(
    home: Home, brokerd: Daemon, service: LocalService
) -> None:
    url = f"http://2130706433:{service.port}/"
    answer, _ = fetch(home, [f"2130706433:{service.port}"], url)
    assert (answer["outcome"], answer["reason"], answer["detail"]) == (
        "failed",
        "tool_error",
        f"2130706433 resolves to 127.0.0.1, a loopback address, which the grant does not "
        f"name; {RUNBOOK}",
    )
    assert service.seen == []


def test_a_grant_naming_the_address_and_port_reaches_it(
    home: Home, brokerd: Daemon, service: LocalService
) -> None:
    answer, records = fetch(
        home, [f"127.0.0.1:{service.port}"], f"http://127.0.0.1:{service.port}/hello"
    )
    assert (answer["outcome"], answer["content"]) == ("ok", "the local service answered"), answer
    decision, result = records
    assert (decision["verdict"], decision["grant"]) == ("run", "web")
    assert (result["status"], result["reason"]) == ("ok", None)
    assert service.seen == [("/hello", f"127.0.0.1:{service.port}")]


def test_the_address_without_the_port_is_no_grant(
    home: Home, brokerd: Daemon, service: LocalService
) -> None:
    answer, _ = fetch(home, ["127.0.0.1"], f"http://127.0.0.1:{service.port}/")
    assert (answer["outcome"], answer["reason"]) == ("denied", "no_grant"), answer
    assert service.seen == []
