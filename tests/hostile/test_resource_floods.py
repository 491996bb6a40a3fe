"""Resource floods against the real brokerd process (docs/threat-model.md, "Flood brokerd").

A process of loopd's uid (a compromised loopd, or anything running as it) floods
broker.sock: connections that send 1 MiB without a newline, asks beyond what the owner
can ever answer, more connections than brokerd has descriptors. brokerd must keep its
memory bounded and return it, deny the extra asks with a recorded reason, refuse the
extra connections at once, and keep admin.sock answering the owner throughout.

Real time, real processes; every wait bounded. RSS is ``VmRSS`` of brokerd's
/proc/<pid>/status.
"""

from __future__ import annotations

import contextlib
import os
import resource
import selectors
import shutil
import socket
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import orjson
import pytest
from tests.harness.broker import records, records_of, tool_request
from tests.harness.homes import grant, write_config, write_grants
from tests.harness.process import Daemon, read_frame, send, start, wait_for

from boxmaker.home.paths import Home
from boxmaker.ledger.verify_files import verify_file

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc"),
]

MIB: Final = 1024 * 1024
CONNECT_S: Final = 5.0
FLOOD_S: Final = 60.0
"""Real seconds for one flood to be written: generous for a loaded 2-core machine."""
TOO_MANY_PENDING_DETAIL: Final = "docs/runbook.md#too-many-pending"
BUSY_DETAIL: Final = "docs/runbook.md#too-many-connections"


def rss_mb(pid: int) -> float:
    """brokerd's resident set, in MB (2**20 bytes)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    raise AssertionError(f"no VmRSS for pid {pid}")


def open_socket(path: Path) -> socket.socket:
    """A connection; a full backlog (EAGAIN on a Unix socket) is retried for a while."""
    deadline = time.monotonic() + CONNECT_S
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(CONNECT_S)
        try:
            sock.connect(str(path))
        except BlockingIOError:
            sock.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)
            continue
        except OSError:
            sock.close()
            raise
        return sock


def admin(home: Home, frame: dict[str, Any]) -> dict[str, Any]:
    """One admin.sock request; brokerd must answer within a second or two."""
    with open_socket(home.admin_sock) as sock:
        sock.settimeout(2.0)
        send(sock, frame)
        return read_frame(sock)


def status_pending(home: Home) -> int:
    answer = admin(home, {"kind": "status"})
    assert answer["kind"] == "status", answer
    pending: int = answer["pending"]
    return pending


def flood_unterminated(daemon: Daemon, count: int) -> tuple[list[socket.socket], float]:
    """``count`` connections, each writing 1 MiB with no newline (a frame that never ends,
    just within the 1 MiB frame limit). Returns the sockets, still open, and the peak RSS
    seen while writing. A connection brokerd closes stops being written to."""
    home = daemon.home
    socks = [open_socket(home.broker_sock) for _ in range(count)]
    left = {}
    selector = selectors.DefaultSelector()
    for sock in socks:
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_WRITE)
        left[sock] = MIB
    chunk = b"x" * 65536
    peak = 0.0
    deadline = time.monotonic() + FLOOD_S
    while left:
        assert time.monotonic() < deadline, f"{len(left)} connections not written in time"
        for key, _ in selector.select(0.05):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            try:
                left[sock] -= sock.send(chunk[: left[sock]])
            except BlockingIOError:
                continue
            except (BrokenPipeError, ConnectionResetError):  # brokerd closed it
                left[sock] = 0
            if left[sock] == 0:
                selector.unregister(sock)
                del left[sock]
        peak = max(peak, rss_mb(daemon.process.pid))
    selector.close()
    return socks, peak


def error_frames(socks: list[socket.socket]) -> Counter[str]:
    """What each flooded connection was answered before it was closed."""
    seen: Counter[str] = Counter()
    for sock in socks:
        sock.setblocking(True)
        sock.settimeout(0.2)
        try:
            data = sock.recv(4096)
        except (TimeoutError, OSError):
            data = b""
        if data.endswith(b"\n"):
            frame = orjson.loads(data)
            seen[f"{frame['kind']} {frame.get('code')} {frame.get('detail')}"] += 1
        else:
            seen["nothing"] += 1
    return seen


def close_all(socks: list[socket.socket]) -> None:
    for sock in socks:
        sock.close()


def settled_rss_mb(daemon: Daemon, below: float) -> float:
    """brokerd's RSS once it has dropped below ``below``, or after 10 s of trying."""
    deadline = time.monotonic() + 10.0
    rss = rss_mb(daemon.process.pid)
    while rss >= below and time.monotonic() < deadline:
        time.sleep(0.2)
        rss = rss_mb(daemon.process.pid)
    return rss


@contextlib.contextmanager
def held(socks: list[socket.socket]) -> Iterator[list[socket.socket]]:
    try:
        yield socks
    finally:
        close_all(socks)


# ---------------------------------------------------------------------------------------
# (a) unterminated 1 MiB frames


def test_a_flood_of_unterminated_frames_stays_within_the_buffer_budget(
    home: Home, daemons: list[Daemon]
) -> None:
    write_config(home, "[broker]\npending_timeout = 30.0\nmax_buffered_bytes = 16777216\n")
    daemon = start(daemons, home)
    idle = rss_mb(daemon.process.pid)
    socks, peak = flood_unterminated(daemon, 300)
    with held(socks):
        # 300 MiB were sent; brokerd held at most its 16 MiB budget of them, and closed
        # every connection that would have taken more, answering why.
        assert peak < idle + 64, f"RSS {peak:.0f} MB while flooded (idle {idle:.0f} MB)"
        seen = error_frames(socks)
        budget = [what for what in seen if what.startswith("error bad_frame")]
        assert budget, seen
        assert all("max_buffered_bytes" in what for what in budget), seen
        assert sum(seen[what] for what in budget) >= 300 - 16, seen
        assert status_pending(home) == 0
    assert settled_rss_mb(daemon, 100) < 100
    # Still serving: an ordinary call is answered.
    with open_socket(home.broker_sock) as sock:
        send(sock, {"kind": "catalogue", "v": 1})
        assert read_frame(sock)["kind"] == "catalogue"


@pytest.fixture
def fd_room() -> Iterator[None]:
    """This process holds a thousand sockets: its soft open-file limit raised for it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4096 if hard == resource.RLIM_INFINITY else min(hard, 4096)
    if want < 1100:
        pytest.skip(f"the open-file limit ({hard}) is too low for 1,000 connections")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.usefixtures("fd_room")
def test_the_defaults_hold_a_flood_of_1000_unterminated_frames_under_256_mb(
    home: Home, daemons: list[Daemon]
) -> None:
    daemon = start(daemons, home)
    socks, peak = flood_unterminated(daemon, 1000)
    with held(socks):
        during = rss_mb(daemon.process.pid)
        assert max(peak, during) < 256, f"RSS {peak:.0f} MB at its peak, {during:.0f} MB after"
        assert status_pending(home) == 0
    after = settled_rss_mb(daemon, 100)
    assert after < 100, f"RSS {after:.0f} MB after the connections closed"


# ---------------------------------------------------------------------------------------
# (b) pending asks beyond max_pending


def test_asks_beyond_max_pending_are_denied_with_a_recorded_reason(
    home: Home, daemons: list[Daemon]
) -> None:
    write_config(home, "[broker]\npending_timeout = 30.0\nmax_pending = 20\n")
    write_grants(home, grant("notes", "read_file", "ask"))
    start(daemons, home)
    pending: list[socket.socket] = []
    denied: list[tuple[dict[str, Any], dict[str, Any]]] = []
    with held(pending):
        for index in range(50):
            frame = tool_request("read_file", {"path": "notes.txt"})
            sock = open_socket(home.broker_sock)
            send(sock, frame)
            answer = read_frame(sock)
            if answer["kind"] == "pending":
                pending.append(sock)
            else:
                sock.close()
                denied.append((frame, answer))
            if index % 10 == 0:  # the owner can look at any moment
                assert status_pending(home) == len(pending)
        assert len(pending) == 20
        assert len(denied) == 30
        for frame, answer in denied:
            assert (answer["kind"], answer["outcome"], answer["reason"]) == (
                "answer",
                "denied",
                "too_many_pending",
            )
            assert answer["detail"] == (
                f"20 calls already wait for the owner ([broker] max_pending); "
                f"see {TOO_MANY_PENDING_DETAIL}"
            )
            (decision,) = records_of(home, frame["call"])
            assert decision["kind"] == "decision"
            assert (decision["verdict"], decision["reason"], decision["grant"]) == (
                "deny",
                "too_many_pending",
                "notes",
            )
        assert status_pending(home) == 20
        listing = admin(home, {"kind": "approvals"})
        assert len(listing["entries"]) == 20
        # A slot freed by the owner is a slot for the next ask.
        refused = admin(
            home, {"kind": "refuse", "approval": listing["entries"][0]["approval"], "reason": "no"}
        )
        assert refused["kind"] == "refused"
        wait_for(lambda: status_pending(home) == 19, "the refused call to leave the table")
        with open_socket(home.broker_sock) as sock:
            send(sock, tool_request("read_file", {"path": "notes.txt"}))
            assert read_frame(sock)["kind"] == "pending"
    assert verify_file(home.audit_log).sound


def test_large_asks_beyond_max_pending_bytes_are_denied_with_a_recorded_reason(
    home: Home, daemons: list[Daemon]
) -> None:
    # Each waiting ask keeps its arguments: 600 kB of content each, 2 MiB for all.
    write_config(home, "[broker]\npending_timeout = 30.0\nmax_pending_bytes = 2097152\n")
    write_grants(home, grant("drafts", "write_file", "ask"))
    start(daemons, home)
    content = "x" * 600_000
    pending: list[socket.socket] = []
    with held(pending):
        for index in range(3):
            sock = open_socket(home.broker_sock)
            pending.append(sock)
            send(sock, tool_request("write_file", {"path": f"d{index}.txt", "content": content}))
            assert read_frame(sock)["kind"] == "pending"
        frame = tool_request("write_file", {"path": "d3.txt", "content": content})
        with open_socket(home.broker_sock) as sock:
            send(sock, frame)
            answer = read_frame(sock)
        assert (answer["outcome"], answer["reason"]) == ("denied", "too_many_pending")
        held_bytes = 3 * len(orjson.dumps(frame))  # the same size as each pending one
        assert answer["detail"] == (
            f"the calls waiting for the owner already hold {held_bytes} bytes of requests "
            f"([broker] max_pending_bytes); see {TOO_MANY_PENDING_DETAIL}"
        )
        (decision,) = records_of(home, frame["call"])
        assert (decision["verdict"], decision["reason"], decision["grant"]) == (
            "deny",
            "too_many_pending",
            "drafts",
        )
        assert status_pending(home) == 3
        # A small ask still fits.
        with open_socket(home.broker_sock) as sock:
            send(sock, tool_request("write_file", {"path": "d4.txt", "content": "short"}))
            assert read_frame(sock)["kind"] == "pending"
    assert verify_file(home.audit_log).sound


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs prlimit (util-linux)")
def test_an_ask_flood_up_to_the_fd_limit_leaves_admin_sock_answering(
    home: Home, daemons: list[Daemon]
) -> None:
    # 128 descriptors for brokerd and the default caps: brokerd must keep its own
    # reserve rather than spend its last descriptors on broker.sock.
    write_grants(home, grant("notes", "read_file", "ask"))
    daemon = start(daemons, home, nofile=128)
    socks: list[socket.socket] = []
    outcomes: Counter[str] = Counter()
    with held(socks):
        for index in range(200):
            if index % 25 == 0:  # the owner can look at any moment
                assert status_pending(home) == outcomes["pending None"]
            sock = open_socket(home.broker_sock)
            socks.append(sock)
            try:
                send(sock, tool_request("read_file", {"path": "notes.txt"}))
                answer = read_frame(sock)
            except (EOFError, OSError) as exc:
                outcomes[f"closed {type(exc).__name__}"] += 1
                continue
            outcomes[f"{answer['kind']} {answer.get('reason') or answer.get('code')}"] += 1
        # Throughout and after, the owner sees and answers.
        assert status_pending(home) == outcomes["pending None"]
        assert set(outcomes) <= {"pending None", "answer too_many_pending", "error busy"}
        assert outcomes["answer too_many_pending"] > 0, outcomes
        assert outcomes["pending None"] >= 16, outcomes
        listing = admin(home, {"kind": "approvals"})
        assert len(listing["entries"]) == outcomes["pending None"]
    assert daemon.process.poll() is None
    assert verify_file(home.audit_log).sound
    denied = [r for r in records(home) if r.get("reason") == "too_many_pending"]
    assert len(denied) == outcomes["answer too_many_pending"]


# ---------------------------------------------------------------------------------------
# (c) connections beyond max_connections


def test_connections_beyond_max_connections_are_refused_at_once(
    home: Home, daemons: list[Daemon]
) -> None:
    write_config(home, "[broker]\npending_timeout = 30.0\nmax_connections = 8\n")
    start(daemons, home)
    idle = [open_socket(home.broker_sock) for _ in range(8)]
    with held(idle):
        for _ in range(3):
            with open_socket(home.broker_sock) as extra:
                # Refused before any frame is read: nothing was sent on it.
                extra.settimeout(1.0)
                started = time.monotonic()
                frame = read_frame(extra)
                assert time.monotonic() - started < 1.0
                assert frame == {
                    "kind": "error",
                    "code": "busy",
                    "detail": (
                        "brokerd already serves 8 connections ([broker] max_connections); "
                        f"see {BUSY_DETAIL}"
                    ),
                }
                assert extra.recv(1) == b""
        assert status_pending(home) == 0

    # The idle ones gone, a call is served again.
    def served() -> bool:
        with open_socket(home.broker_sock) as sock:
            send(sock, {"kind": "catalogue", "v": 1})
            return read_frame(sock)["kind"] == "catalogue"

    wait_for(served, "a connection slot to free up")
    assert os.path.exists(home.broker_sock)
