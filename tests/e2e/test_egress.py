"""A sandboxed shell reaches allowed hosts through brokerd and nothing else gets out
(docs/egress.md), with the real programs: brokerd as a process, the shell call in its
bubblewrap sandbox with socat bridging 127.0.0.1:3128 to the call's own socket, and curl,
the system's pip and git against HTTPS servers on this machine's loopback
(tests/harness/tls_servers.py; tests/e2e/test_egress_servers.py shows each reaching them
directly). Every connection is in the ledger with the grant that allowed it; the ledger
verifies at the end of every test. Real time, every wait bounded."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import attrs
import orjson
import pytest
import trustme
from tests.harness.broker import SESSION, records, tool_request
from tests.harness.cli import bxctl, listed_approvals
from tests.harness.homes import grant, grant_table, write_grants
from tests.harness.process import Daemon, connect, read_frame, send, start
from tests.harness.sandbox import sandbox_workspace, use_sandbox_workspace
from tests.harness.tls_servers import (
    GIT_NOTE,
    GitRepository,
    Package,
    Served,
    https_server,
    publish_git_repository,
    publish_package,
    write_ca,
)

from boxmaker.broker.sandbox_plan import WORKSPACE
from boxmaker.home.paths import Home

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not all(map(shutil.which, ("bwrap", "socat", "curl", "git"))),
        reason="needs bubblewrap, socat, curl and git (.ci/run)",
    ),
]

HELLO: Final = "hello through brokerd\n"
CA_IN_SANDBOX: Final = f"{WORKSPACE}/ca.pem"
CURL: Final = f"curl --silent --show-error --max-time 60 --cacert {CA_IN_SANDBOX}"
REFUSED_BY_PROXY: Final = "exit 56\n\n[stderr]\ncurl: (56) CONNECT tunnel failed, response 403\n"
"""What ``curl ...; echo exit $?`` prints when brokerd answers its CONNECT 403: the shell
call's output, stdout then stderr (curl's exit status 56)."""
SHELL_GRANT: Final = grant("sh", "shell", "auto")
UNTRUSTED_TOO: Final = 'if_untrusted = "auto"\n'
"""Written right after a grant: it holds in an untrusted session too."""
FIGURES: Final = ("bytes_up", "bytes_down", "duration_ms")
"""The fields of a connection record that are measured, not known in advance."""


@attrs.frozen
class Egress:
    """A home whose shell can run in ``workspace`` (the test CA in it), an HTTPS server
    with a file, a package index and a git repository, and a second server no grant
    names."""

    home: Home
    workspace: Path
    served: Served
    other: Served
    package: Package
    repository: GitRepository
    daemons: list[Daemon]

    def hosts(self, served: Served | None = None) -> str:
        """A connect grant's ``hosts`` for ``served``: its name and the address the name
        resolves to (loopback is refused unless the grant names the address)."""
        port = (served or self.served).port
        return orjson.dumps([f"localhost:{port}", f"127.0.0.1:{port}"]).decode()

    def start(self, *grants: str) -> Daemon:
        """brokerd on the home, with the shell grant and ``grants``, the shell grant's
        conditions first (``UNTRUSTED_TOO``)."""
        write_grants(self.home, SHELL_GRANT + "".join(grants))
        return start(self.daemons, self.home)


@pytest.fixture
def egress(home: Home, daemons: list[Daemon], tmp_path: Path) -> Iterator[Egress]:
    ca = trustme.CA()
    site, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
    site.mkdir()
    elsewhere.mkdir()
    (site / "hello.txt").write_text(HELLO)
    (elsewhere / "hello.txt").write_text("nobody may read this\n")
    package = publish_package(site)
    repository = publish_git_repository(site)
    with (
        sandbox_workspace() as workspace,
        https_server(site, ca) as served,
        https_server(elsewhere, ca) as other,
    ):
        use_sandbox_workspace(home, workspace)
        write_ca(ca, workspace / "ca.pem")
        yield Egress(home, workspace, served, other, package, repository, daemons)
        bxctl(home, "audit", "verify")


def connect_grant(egress: Egress, gid: str = "local", mode: str = "auto", **extra: str) -> str:
    return grant_table(gid, "connect", mode, hosts=egress.hosts(), via='["shell"]', **extra)


def send_shell(home: Home, command: str) -> tuple[str, Any]:
    """Send a shell call on broker.sock: its id and the open socket (read its answer
    with ``read_frame``)."""
    frame = tool_request("shell", {"command": command})
    sock = connect(home.broker_sock)
    send(sock, frame)
    return frame["call"], sock


def shell(home: Home, command: str) -> tuple[str, dict[str, Any]]:
    """A shell call on broker.sock: its id and final answer."""
    call, sock = send_shell(home, command)
    with sock:
        return call, read_frame(sock)


def connects_of(home: Home, via: str) -> dict[str, list[dict[str, Any]]]:
    """The records of each connect call made by the call ``via``, by connect call."""
    calls: dict[str, list[dict[str, Any]]] = {}
    for record in records(home):
        decided = record["kind"] == "decision" and record["tool"] == "connect"
        if decided and record["arguments"]["via"] == via:
            calls[record["call"]] = []
        if record.get("call") in calls:
            calls[record["call"]].append(record)
    return calls


def without_common(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k not in ("seq", "at", "prev", "boot")}


def ok_content(answer: dict[str, Any]) -> str:
    assert answer["outcome"] == "ok", orjson.dumps(answer).decode()
    content: str = answer["content"]
    return content


# ---------------------------------------------------------------------------------------
# curl


def test_curl_reaches_an_allowed_host_and_the_connection_is_recorded_with_its_grant(
    egress: Egress,
) -> None:
    egress.start(connect_grant(egress))
    command = f"{CURL} {egress.served.url('/hello.txt')}"
    call, answer = shell(egress.home, command)
    assert ok_content(answer) == HELLO
    # The server saw one connection, by brokerd, with the name curl asked for.
    [request] = egress.served.requests()
    assert (request["path"], request["host"], request["server_name"]) == (
        "/hello.txt",
        f"localhost:{egress.served.port}",
        "localhost",
    )
    [connection] = egress.served.connections()
    [(connect_call, kept)] = connects_of(egress.home, call).items()
    decision, recorded, result = kept
    assert without_common(decision) == {
        "kind": "decision",
        "call": connect_call,
        "session": SESSION,
        "tool": "connect",
        "arguments": {
            "host": "localhost",
            "port": egress.served.port,
            "scheme": "https",
            "via": call,
            "via_tool": "shell",
            "via_command": command,
        },
        "verdict": "run",
        "reason": None,
        "grant": "local",
        "taint": "public",
        "untrusted": False,
    }
    assert {k: v for k, v in without_common(recorded).items() if k not in FIGURES} == {
        "kind": "connection",
        "call": connect_call,
        "via": call,
        "session": SESSION,
        "host": "localhost",
        "port": egress.served.port,
        "address": "127.0.0.1",
        "server_name": "localhost",
        "ended": "closed",
    }
    # Each way at least the TLS handshake's bytes, and down the file too.
    assert recorded["bytes_up"] > 200
    assert recorded["bytes_down"] > len(HELLO) + 500
    assert recorded["duration_ms"] >= 0
    # The tunnel's own result raises nothing; what came in reaches the model in curl's
    # output, so the shell call's result is untrusted, and the session after it.
    assert (result["kind"], result["status"], result["label"], result["untrusted_after"]) == (
        "result",
        "ok",
        {"taint": "public", "untrusted": False},
        False,
    )
    # brokerd dialled from this machine's loopback: the server's peer is brokerd's socket.
    assert connection["peer"][0] == "127.0.0.1"
    # The connect's records come before the shell call's own result.
    shell_result = next(
        r for r in records(egress.home) if r["kind"] == "result" and r["call"] == call
    )
    assert result["seq"] < shell_result["seq"]
    assert shell_result["label"]["untrusted"] is True
    assert shell_result["untrusted_after"] is True


def test_after_a_connection_a_default_grant_opens_no_more_in_that_session(
    egress: Egress,
) -> None:
    # A call whose tunnel carried bytes makes the session untrusted (its output may hold
    # what came in),
    # and a connect grant's if_untrusted is deny unless it says otherwise
    # (docs/decisions.md, "Network"). The shell grant holds when untrusted here, so the
    # second call runs and only its tunnel is refused.
    egress.start(UNTRUSTED_TOO, connect_grant(egress))
    url = egress.served.url("/hello.txt")
    first, answer = shell(egress.home, f"{CURL} {url}")
    assert ok_content(answer) == HELLO
    second, answer = shell(egress.home, f"{CURL} {url}; echo exit $?")
    assert ok_content(answer) == REFUSED_BY_PROXY
    assert egress.served.paths() == ["/hello.txt"]
    decided = [
        (kept[0]["verdict"], kept[0]["reason"], kept[0]["untrusted"])
        for via in (first, second)
        for kept in connects_of(egress.home, via).values()
    ]
    assert decided == [("run", None, False), ("deny", "untrusted", True)]


def test_a_grant_that_holds_when_untrusted_connects_again_and_in_the_next_call(
    egress: Egress,
) -> None:
    # What the owner writes for an agent that fetches more than once (pip and git open
    # more than one connection, and its next command needs the same index).
    egress.start(UNTRUSTED_TOO, connect_grant(egress) + 'if_untrusted = "auto"\n')
    url = egress.served.url("/hello.txt")
    first, answer = shell(egress.home, f"{CURL} {url} && {CURL} {url}")
    assert ok_content(answer) == HELLO * 2
    second, answer = shell(egress.home, f"{CURL} {url}")
    assert ok_content(answer) == HELLO
    assert egress.served.paths() == ["/hello.txt"] * 3
    decided = [
        [(r["verdict"], r["untrusted"]) for r in kept if r["kind"] == "decision"]
        for via in (first, second)
        for kept in connects_of(egress.home, via).values()
    ]
    # Every tunnel of the first call is decided on the state the call began with; the
    # next call on the state its predecessor's result raised.
    assert decided == [[("run", False)], [("run", False)], [("run", True)]]


def test_one_call_connects_as_often_as_it_needs_on_the_state_it_began_with(
    egress: Egress,
) -> None:
    # A default grant (if_untrusted deny): pip and git open several connections in one
    # command; none is refused because an earlier one of the same call carried bytes.
    egress.start(connect_grant(egress))
    url = egress.served.url("/hello.txt")
    call, answer = shell(egress.home, f"{CURL} {url} && {CURL} {url} && {CURL} {url}")
    assert ok_content(answer) == HELLO * 3
    assert egress.served.paths() == ["/hello.txt"] * 3
    decided = [
        (r["verdict"], r["untrusted"])
        for kept in connects_of(egress.home, call).values()
        for r in kept
        if r["kind"] == "decision"
    ]
    assert decided == [("run", False)] * 3


def test_a_host_no_grant_names_is_refused_and_its_server_sees_nothing(egress: Egress) -> None:
    egress.start(connect_grant(egress))
    command = f"{CURL} {egress.other.url('/hello.txt')}; echo exit $?"
    call, answer = shell(egress.home, command)
    assert ok_content(answer) == REFUSED_BY_PROXY
    assert egress.other.connections() == []
    [kept] = connects_of(egress.home, call).values()
    decision = kept[0]
    assert (decision["verdict"], decision["reason"], decision["grant"]) == (
        "deny",
        "no_grant",
        None,
    )
    assert decision["arguments"]["port"] == egress.other.port
    assert [r["kind"] for r in kept] == ["decision"]


def test_a_grant_naming_the_host_but_not_its_loopback_address_dials_nothing(
    egress: Egress,
) -> None:
    # localhost resolves to 127.0.0.1, a loopback address: brokerd resolves the name once
    # the grant allows it, and refuses an address the grant does not name.
    only_name = orjson.dumps([f"localhost:{egress.served.port}"]).decode()
    egress.start(grant_table("local", "connect", "auto", hosts=only_name, via='["shell"]'))
    call, answer = shell(egress.home, f"{CURL} {egress.served.url('/hello.txt')}; echo exit $?")
    # Allowed, so not a 403: the run failed before it dialled (502 Bad Gateway).
    assert ok_content(answer) == REFUSED_BY_PROXY.replace("403", "502")
    assert egress.served.connections() == []
    [kept] = connects_of(egress.home, call).values()
    assert [(r["kind"], r.get("verdict") or r.get("status")) for r in kept] == [
        ("decision", "run"),
        ("result", "failed"),
    ]
    assert kept[1]["reason"] == "tool_error"


def test_plain_http_is_refused_and_the_server_sees_nothing(egress: Egress) -> None:
    egress.start(connect_grant(egress))
    url = f"http://localhost:{egress.served.port}/hello.txt"
    command = f"curl --silent --show-error --max-time 60 -o /dev/null -w '%{{http_code}}' {url}"
    call, answer = shell(egress.home, command)
    assert ok_content(answer) == "403"
    assert egress.served.connections() == []
    [kept] = connects_of(egress.home, call).values()
    decision = kept[0]
    assert decision["arguments"]["scheme"] == "http"
    assert (decision["verdict"], decision["reason"]) == ("deny", "no_grant")


def test_a_call_with_no_network_grant_has_no_way_out(egress: Egress) -> None:
    # No connect grant: today's sandbox, with no proxy variables and no socket at all.
    egress.start()
    command = f"env | grep -ci proxy; {CURL} {egress.served.url('/hello.txt')}; echo exit $?"
    call, answer = shell(egress.home, command)
    content = ok_content(answer)
    assert content.startswith("0\n"), content
    assert "exit 7\n" in content  # couldn't connect: no network in the namespace
    assert connects_of(egress.home, call) == {}
    assert egress.served.connections() == []


# ---------------------------------------------------------------------------------------
# pip and git


def test_pip_installs_the_wheel_from_the_local_index_through_brokerd(egress: Egress) -> None:
    egress.start(connect_grant(egress))
    package = egress.package
    target = f"{WORKSPACE}/site"
    greet = f"import {package.module}; print({package.module}.GREETING)"
    command = (
        "python3 -m pip install --quiet --no-cache-dir --disable-pip-version-check "
        f"--index-url {egress.served.url('/simple/')} --cert {CA_IN_SANDBOX} "
        f"--target {target} {package.name} && "
        f"PYTHONPATH={target} python3 -c '{greet}'"
    )
    call, answer = shell(egress.home, command)
    assert ok_content(answer) == f"{package.greeting}\n"
    assert (egress.workspace / "site" / package.module / "__init__.py").is_file()
    assert egress.served.paths() == [f"/simple/{package.name}/", f"/files/{package.wheel.name}"]
    connections = [
        record
        for kept in connects_of(egress.home, call).values()
        for record in kept
        if record["kind"] == "connection"
    ]
    assert connections, "pip's connections are recorded"
    assert {(r["host"], r["server_name"], r["ended"]) for r in connections} == {
        ("localhost", "localhost", "closed")
    }


def test_git_clones_over_https_through_brokerd(egress: Egress) -> None:
    egress.start(connect_grant(egress))
    url = egress.served.url(egress.repository.url_path)
    command = (
        f"GIT_SSL_CAINFO={CA_IN_SANDBOX} git clone --quiet {url} clone && "
        "cat clone/notes.txt && git -C clone rev-parse HEAD"
    )
    _, answer = shell(egress.home, command)
    assert ok_content(answer) == f"{GIT_NOTE}{egress.repository.head}\n"
    assert egress.served.paths()[0] == "/repo.git/info/refs?service=git-upload-pack"


# ---------------------------------------------------------------------------------------
# The owner asked


def test_an_ask_holds_the_connection_until_the_owner_approves(egress: Egress) -> None:
    egress.start(connect_grant(egress, mode="ask"))
    call, sock = send_shell(egress.home, f"{CURL} {egress.served.url('/hello.txt')}")
    with sock:
        [waiting] = listed_approvals(egress.home)
        assert (waiting["tool"], waiting["arguments"]["host"], waiting["arguments"]["via"]) == (
            "connect",
            "localhost",
            call,
        )
        assert egress.served.connections() == []  # nothing reached the host yet
        bxctl(egress.home, "approve", waiting["approval"])
        answer = read_frame(sock)
    assert ok_content(answer) == HELLO
    [kept] = connects_of(egress.home, call).values()
    assert [r["kind"] for r in kept] == ["decision", "approval", "connection", "result"]
    assert (kept[1]["outcome"], kept[1]["by"]) == ("ask", "owner")


def test_an_ask_the_owner_refuses_is_answered_403_and_the_server_sees_nothing(
    egress: Egress,
) -> None:
    egress.start(connect_grant(egress, mode="ask"))
    command = f"{CURL} {egress.served.url('/hello.txt')}; echo exit $?"
    call, sock = send_shell(egress.home, command)
    with sock:
        [waiting] = listed_approvals(egress.home)
        bxctl(egress.home, "refuse", waiting["approval"], "--reason", "not today")
        answer = read_frame(sock)
    assert ok_content(answer) == REFUSED_BY_PROXY
    assert egress.served.connections() == []
    [kept] = connects_of(egress.home, call).values()
    assert [r["kind"] for r in kept] == ["decision", "approval"]
    assert (kept[1]["outcome"], kept[1]["reason"], kept[1]["by"]) == (
        "refused",
        "not today",
        "owner",
    )
