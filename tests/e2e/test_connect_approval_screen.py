"""What the owner sees, in a real terminal (tmux), of a connection from the sandbox that
waits for them: `bxctl approvals` names the tool `connect`, the host and port, the
calling call and its command; `bxctl approve` says the tunnel is open (it is answered
as the tunnel opens, not at its end); the turn then
ends with what came through it. The real programs as processes (bxctl up) against the
scripted llama-server, a real shell call in bwrap with socat, an HTTPS server on
loopback (docs/egress.md)."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme
from tests.harness.cli import WAIT_S, bxctl, listed_approvals, scripted_home, start_bxctl
from tests.harness.sandbox import sandbox_workspace, use_sandbox_workspace
from tests.harness.screen import shell_pane
from tests.harness.tls_servers import Served, https_server, write_ca

from boxmaker.home.paths import Home

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux"),
    pytest.mark.skipif(
        shutil.which("socat") is None or shutil.which("curl") is None,
        reason="needs socat and curl (.ci/run installs both)",
    ),
]

HELLO = "hello through brokerd"


@pytest.fixture
def site(tmp_path: Path) -> Iterator[tuple[Served, trustme.CA]]:
    ca = trustme.CA()
    (tmp_path / "hello.txt").write_text(HELLO + "\n")
    with https_server(tmp_path, ca) as served:
        yield served, ca


@pytest.fixture
def home(site: tuple[Served, trustme.CA]) -> Iterator[tuple[Home, str]]:
    served, ca = site
    command = f"curl -sS --max-time 60 --cacert ca.pem {served.url('/hello.txt')}"
    script = [
        {"tool_calls": [{"name": "shell", "arguments": {"command": command}}]},
        {"content": "Fetched."},
    ]
    port = served.port
    grants = (
        '[[grant]]\nid = "shell"\ntool = "shell"\nmode = "auto"\n\n'
        '[[grant]]\nid = "local-site"\ntool = "connect"\nmode = "ask"\n'
        f'hosts = ["localhost:{port}", "127.0.0.1:{port}"]\nvia = ["shell"]\n'
        'note = "the test site"\n'
    )
    with (
        sandbox_workspace() as workspace,
        scripted_home(script, grants, prefix="bx-net-") as (home, _, _),
    ):
        use_sandbox_workspace(home, workspace)
        write_ca(ca, workspace / "ca.pem")
        bxctl(home, "up")
        yield home, command


def test_the_owner_sees_the_host_the_calling_command_and_that_the_tunnel_opened(
    home: tuple[Home, str], site: tuple[Served, trustme.CA]
) -> None:
    owner, command = home
    served, _ = site
    chat = start_bxctl(owner, "chat", "--say", "fetch the page")
    [entry] = listed_approvals(owner)
    approval, call = entry["approval"], entry["call"]
    assert entry["tool"] == "connect"
    via = entry["arguments"]["via"]
    # Nothing leaves before the owner's answer: the server has seen no connection.
    assert served.settled() == []
    bx = f"{sys.executable} -m boxmaker.cli.app"
    screen_command = (
        f"{bx} approvals --home {owner.root}; echo; {bx} approve {approval} "
        f"--home {owner.root}; echo END-OF-SCREEN; sleep 60"
    )
    with shell_pane(screen_command, width=250, height=60) as pane:
        screen = pane.wait_for("END-OF-SCREEN", WAIT_S)
    lines = [line.rstrip() for line in screen.splitlines()]
    start = lines.index(next(line for line in lines if line.startswith(str(approval))))
    shown = "\n".join(lines[start : start + 8])
    assert lines[start].startswith(f"{approval}  connect  expires ")
    arguments = lines[start + 1]
    assert arguments.startswith("  arguments  {"), shown
    for part in (
        '"host":"localhost"',
        f'"port":{served.port}',
        '"scheme":"https"',
        f'"via":"{via}"',
        f'"via_command":"{command}"',
        '"via_tool":"shell"',
    ):
        assert part in arguments, shown
    assert lines[start + 2] == "  grant      local-site (mode ask): the test site", shown
    assert lines[start + 4].startswith(f"  call       {call}, asked "), shown
    assert (
        f"approved {call}: connect: it runs: the tunnel is open; its end is recorded in the ledger"
    ) in lines, screen
    out, err = chat.communicate(timeout=WAIT_S)
    assert chat.returncode == 0, err
    assert "Fetched." in out
    [request] = served.requests()
    assert (request["path"], request["server_name"]) == ("/hello.txt", "localhost")
