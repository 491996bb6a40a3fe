"""Starting, stopping and finding things (README.md, docs/runbook.md#up and #reload):
``bxctl up``'s checks and rollback, ``logs``, ``restart``, ``reload`` (SIGHUP) and
``demo --home``, each through real processes: bxctl, the daemons and the scripted
llama-server. What the owner sees is asserted as printed."""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from tests.fakes.llama_server import as_process
from tests.harness.cli import WAIT_S, alive, bxctl, pid_of, scripted_home, start_bxctl
from tests.harness.homes import short_home
from tests.harness.process import wait_for
from tests.harness.sandbox import sandbox_workspace, use_sandbox_workspace

from boxmaker.home.paths import Home
from boxmaker.model.serve import ModelUnavailable, check_installed

pytestmark = pytest.mark.slow

READ_NOTES = {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]}
ASK = '[[grant]]\nid = "notes"\ntool = "read_file"\nmode = "ask"\nnote = "my notes"\n'
NOTHING = "bxctl: nothing was started or stopped"
PYTHON_WORDS = re.compile(r"\b(True|False|None)\b")


@pytest.fixture
def no_bwrap(tmp_path: Path) -> dict[str, str]:
    """An environment whose PATH has no bwrap."""
    empty = tmp_path / "bin"
    empty.mkdir()
    return {"PATH": str(empty)}


def _run_dir_is_empty(home: Home) -> bool:
    return not home.run_dir.exists() or not any(home.run_dir.iterdir())


# ---------------------------------------------------------------------------------------
# up: checks first


def test_up_in_a_home_never_initialised_says_so_and_creates_nothing() -> None:
    root = Path(tempfile.mkdtemp(prefix="bx-ops-", dir="/tmp")) / "never"
    try:
        done = bxctl(root, "up", check=False)
        assert done.returncode == 2, done.stderr
        assert done.stderr.splitlines() == [
            f"bxctl: {root}: not a boxmaker home yet; run `bxctl init --home {root}`; "
            "see docs/runbook.md#up",
            NOTHING,
        ]
        assert done.stdout == ""
        assert not root.exists()
    finally:
        root.parent.rmdir()


def test_up_reports_every_problem_and_starts_nothing(no_bwrap: dict[str, str]) -> None:
    with short_home() as home, socket.socket() as taken:
        bxctl(home, "init")
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        home.config_toml.write_text(
            f'[model]\nurl = "http://127.0.0.1:9"\n[proxy]\ntcp_port = {port}\n'
        )
        home.grants_toml.write_text('[[grant]]\nid = "x"\ntool = "read_file"\nmode = "often"\n')
        done = bxctl(home, "up", check=False, env=no_bwrap)
        assert done.returncode == 2  # the worst: grants.toml is the owner's to fix
        assert done.stderr.splitlines() == [
            "bxctl: bubblewrap (bwrap) is not installed: the shell tool runs only in its "
            "sandbox (Debian/Ubuntu: sudo apt-get install bubblewrap); "
            "see docs/runbook.md#sandbox",
            f"bxctl: grants.toml is invalid: {home.grants_toml}, grant 'x', key 'mode': "
            "expected one of auto, ask, deny, got 'often'; see docs/runbook.md#grants",
            f"bxctl: [proxy] tcp_port {port}: 127.0.0.1:{port} cannot be used (Address "
            "already in use); see docs/runbook.md#up",
            NOTHING,
        ]
        assert done.stdout == ""
        assert _run_dir_is_empty(home)
        assert list(home.logs_dir.iterdir()) == []


def test_up_names_a_bad_config_and_a_bwrap_that_cannot_sandbox(tmp_path: Path) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "bwrap").write_text(
        "#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n"
    )
    (fake / "bwrap").chmod(0o755)
    with short_home() as home:
        bxctl(home, "init")
        home.config_toml.write_text("[broker]\npending_timeout = 'soon'\n")
        home.grants_toml.write_text("[[grant]\n")
        done = bxctl(home, "up", check=False, env={"PATH": str(fake)})
        assert done.returncode == 2
        lines = done.stderr.splitlines()
        assert lines[0] == (
            f"bxctl: bubblewrap ({fake}/bwrap) cannot create its sandbox here: bwrap: No "
            "permissions to create new namespace; see docs/runbook.md#sandbox"
        )
        assert lines[1] == (
            "bxctl: config.toml: [broker] pending_timeout: expected a number; "
            "see docs/runbook.md#config"
        )
        assert lines[2].startswith(f"bxctl: grants.toml is invalid: {home.grants_toml}: ")
        assert lines[2].endswith("; see docs/runbook.md#grants")
        assert lines[3:] == [NOTHING]
        assert _run_dir_is_empty(home)


def test_a_daemon_that_fails_to_start_rolls_back_what_up_started() -> None:
    with short_home() as home:
        bxctl(home, "init")
        home.config_toml.write_text('[model]\nurl = "ftp://nowhere"\n')
        done = bxctl(home, "up", check=False)
        assert done.returncode == 1
        lines = done.stdout.splitlines()
        assert re.fullmatch(r"brokerd: started \(pid \d+\)", lines[0]), lines
        assert lines[1:] == ["inferproxy: failed to start", "brokerd: stopped (rolled back)"]
        log = home.log_file("inferproxy")
        assert done.stderr.startswith(
            f"bxctl: inferproxy exited with 2 while starting; the end of {log}:\n"
        )
        assert "inferproxy: [model] url 'ftp://nowhere' is not an http://" in done.stderr
        brokerd = int(lines[0].split("pid ")[1].rstrip(")"))
        assert not alive(brokerd)
        assert _run_dir_is_empty(home)
        kinds = [orjson.loads(line)["kind"] for line in home.audit_log.read_bytes().splitlines()]
        assert kinds[-4:] == ["start", "policy", "stop", "checkpoint"]  # brokerd stopped cleanly


def test_a_failed_restart_leaves_running_what_it_did_not_start() -> None:
    with scripted_home([]) as (home, _url, _record):
        bxctl(home, "up")
        brokerd, loopd = pid_of(home, "brokerd"), pid_of(home, "loopd")
        home.config_toml.write_text('[model]\nurl = "ftp://nowhere"\n')
        done = bxctl(home, "restart", "inferproxy", check=False)
        assert done.returncode == 1
        assert done.stdout.splitlines() == [
            "inferproxy: stopped",
            "brokerd: already running",
            "inferproxy: failed to start",
        ]
        assert alive(brokerd)
        assert alive(loopd)
        assert (pid_of(home, "brokerd"), pid_of(home, "loopd")) == (brokerd, loopd)


# ---------------------------------------------------------------------------------------
# up: what it prints


def test_up_prints_the_sockets_the_logs_and_the_models_url() -> None:
    with scripted_home([]) as (home, url, _record):
        data = orjson.loads(bxctl(home, "up", "--json").stdout)
        assert data == {
            "daemons": [
                {"daemon": name, "state": "started", "pid": pid_of(home, name)}
                for name in ("brokerd", "inferproxy", "loopd")
            ],
            "sockets": {
                "broker": str(home.broker_sock),
                "admin": str(home.admin_sock),
                "infer": str(home.infer_sock),
                "loop": str(home.loop_sock),
            },
            "logs": str(home.logs_dir),
            "model": url,
        }
        again = bxctl(home, "up").stdout
        assert again.splitlines() == [
            "brokerd: already running",
            "inferproxy: already running",
            "loopd: already running",
            f"broker socket:  {home.broker_sock}",
            f"admin socket:   {home.admin_sock}",
            f"infer socket:   {home.infer_sock}",
            f"loop socket:    {home.loop_sock}",
            f"logs:           {home.logs_dir} (bxctl logs [-f] [DAEMON])",
            f"model:          {url}",
        ]


def test_an_external_model_that_does_not_answer_is_told_by_up_and_fails_status() -> None:
    # A workspace the sandbox can use: as root the shell's own warning would come first.
    with scripted_home([]) as (home, url, _record), sandbox_workspace() as workspace:
        use_sandbox_workspace(home, workspace)
        live = home.config_toml.read_text()
        # Port 9 (discard) on loopback: nothing listens there on a test machine.
        home.config_toml.write_text(
            f'workspace = {str(workspace)!r}\n[model]\nurl = "http://127.0.0.1:9"\n'
        )
        up = bxctl(home, "up")  # the daemons run without it: inferproxy tries it each time
        # inferproxy's words: it is the one process that connects to the model.
        problem = "the model server at http://127.0.0.1:9 cannot be reached (ConnectError: "
        assert up.stderr.startswith(f"bxctl: warning: {problem}"), up.stderr
        assert up.stderr.rstrip().endswith("; see docs/runbook.md#model-unreachable")
        status = bxctl(home, "status", check=False)
        assert status.returncode == 1
        assert status.stdout.splitlines()[0] == (
            "daemons        model down, brokerd up, inferproxy up, loopd up"
        )
        assert status.stderr.startswith(f"bxctl: {problem}")
        as_json = orjson.loads(bxctl(home, "status", "--json", check=False).stdout)
        assert as_json["model_problem"].startswith(problem)
        assert (as_json["daemons"]["model"], as_json["down"]) == (False, [])
        # The server that answers, which inferproxy takes at its restart: up, exit 0.
        home.config_toml.write_text(live)
        assert bxctl(home, "restart", "inferproxy").stderr == ""
        status = bxctl(home, "status")
        assert status.stdout.splitlines()[0].startswith("daemons        model up, brokerd up")
        assert url in live


# ---------------------------------------------------------------------------------------
# logs


def _reader(process: subprocess.Popen[str]) -> queue.Queue[str]:
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line.rstrip("\n"))

    threading.Thread(target=read, daemon=True).start()
    return lines


def _await_line(lines: queue.Queue[str], pattern: str) -> str:
    while True:
        line = lines.get(timeout=WAIT_S)
        if re.search(pattern, line):
            return line


STARTED_LINES: dict[str, re.Pattern[str]] = {
    "brokerd": re.compile(r" brokerd INFO brokerd limits: "),
    "inferproxy": re.compile(r" inferproxy INFO inferproxy \S+ serving "),
    "loopd": re.compile(r" loopd INFO loopd \S+ serving "),
}
"""The last line each daemon logs as it starts. `up` returns once each socket accepts,
which is a moment before: on a loaded machine a log's last lines were still to come."""


def _started(home: Home) -> bool:
    logs = {name: home.log_file(name).read_text() for name in STARTED_LINES}
    return all(pattern.search(logs[name]) for name, pattern in STARTED_LINES.items())


def test_logs_show_the_last_lines_escaped_and_follow_until_ctrl_c() -> None:
    with scripted_home([]) as (home, _url, _record):
        bxctl(home, "up")
        wait_for(lambda: _started(home), "each daemon's last line of starting")
        brokerd_log = home.log_file("brokerd").read_text().splitlines()
        assert bxctl(home, "logs", "brokerd", "-n", "2").stdout.splitlines() == brokerd_log[-2:]
        with home.log_file("loopd").open("a") as log:
            log.write("forged \x1b[2J\u202eline\n")
        shown = bxctl(home, "logs", "--lines", "1").stdout.splitlines()
        assert shown == [
            f"brokerd    | {brokerd_log[-1]}",
            f"inferproxy | {home.log_file('inferproxy').read_text().splitlines()[-1]}",
            "loopd      | forged \\u001b[2J\\u202eline",
        ]
        assert orjson.loads(bxctl(home, "logs", "loopd", "-n", "1", "--json").stdout) == {
            "loopd": ["forged \x1b[2J\u202eline"]
        }

        with start_bxctl(home, "logs", "-f", "-n", "0") as follow:
            try:
                lines = _reader(follow)

                # Written until seen: the follower may not be watching yet at the first.
                # Each try reads every line that comes within its second, not only the
                # first: a late line must not hide the marker behind it.
                def marked() -> bool:
                    with home.log_file("loopd").open("a") as log:
                        log.write("marker\n")
                    deadline = time.monotonic() + 1.0
                    while (left := deadline - time.monotonic()) > 0:
                        try:
                            if lines.get(timeout=left) == "loopd      | marker":
                                return True
                        except queue.Empty:
                            return False
                    return False

                wait_for(marked, "the follower to print a new line")
                bxctl(home, "reload")
                _await_line(lines, r"^brokerd    \| .* SIGHUP: config\.toml re-read")
                follow.send_signal(signal.SIGINT)
                assert follow.wait(timeout=WAIT_S) == 0
                assert follow.stderr is not None
                assert follow.stderr.read() == ""  # quietly: no traceback
            finally:
                follow.kill()


def test_logs_of_a_home_without_logs_says_where_it_looked() -> None:
    with short_home() as home:
        done = bxctl(home, "logs", check=False)
        assert done.returncode == 1
        assert done.stderr == f"bxctl: no logs in {home.logs_dir} yet (`bxctl up` writes them)\n"
        assert bxctl(home, "logs", "sshd", check=False).returncode == 2


# ---------------------------------------------------------------------------------------
# restart


def test_restart_one_daemon_then_all() -> None:
    with scripted_home([]) as (home, _url, _record):
        bxctl(home, "up")
        before = {name: pid_of(home, name) for name in ("brokerd", "inferproxy", "loopd")}
        lines = bxctl(home, "restart", "loopd").stdout.splitlines()
        assert lines[:3] == [
            "loopd: stopped",
            "brokerd: already running",
            "inferproxy: already running",
        ]
        assert lines[3] == f"loopd: started (pid {pid_of(home, 'loopd')})"
        assert not alive(before["loopd"])
        assert pid_of(home, "loopd") != before["loopd"]
        assert pid_of(home, "brokerd") == before["brokerd"]

        middle = {name: pid_of(home, name) for name in ("brokerd", "inferproxy", "loopd")}
        lines = bxctl(home, "restart").stdout.splitlines()
        assert lines[:4] == [
            "loopd: stopped",
            "inferproxy: stopped",
            "brokerd: stopped",
            "model: not running",
        ]
        assert [line.split(" (pid")[0] for line in lines[4:7]] == [
            "brokerd: started",
            "inferproxy: started",
            "loopd: started",
        ]
        for name, pid in middle.items():
            assert not alive(pid)
            assert pid_of(home, name) != pid
        assert bxctl(home, "restart", "sshd", check=False).returncode == 2


# ---------------------------------------------------------------------------------------
# reload: SIGHUP re-reads config.toml


def _chat_events(home: Home, text: str) -> list[dict[str, object]]:
    done = bxctl(home, "chat", "--say", text, "--json")
    return [orjson.loads(line) for line in done.stdout.splitlines()]


def test_sighup_applies_the_live_keys_names_the_others_and_survives_a_broken_file() -> None:
    script = [READ_NOTES, {"content": "Nobody answered."}]
    with scripted_home(script, grants=ASK) as (home, url, record):
        (home.default_workspace / "notes.txt").write_text("Buy milk.\n")
        bxctl(home, "up")
        pids = {name: pid_of(home, name) for name in ("brokerd", "inferproxy", "loopd")}
        home.config_toml.write_text(
            f'[model]\nurl = "{url}"\nname = "renamed"\n'
            "[broker]\npending_timeout = 1\nmax_pending = 5\n"
            "[loop]\nmax_steps = 3\nreply_timeout = 4\n"
            '[notify]\ncommand = ["true"]\n'
        )
        done = bxctl(home, "reload")
        assert done.stdout.splitlines() == [
            "brokerd: re-reading grants.toml and config.toml",
            "brokerd: applied [broker] pending_timeout",
            "brokerd: needs a restart: [broker] max_pending (the old value is kept); "
            "see docs/runbook.md#reload",
            "brokerd: needs a restart: [notify] command (the old value is kept); "
            "see docs/runbook.md#reload",
            "brokerd: config.toml re-read (1 applied, 2 need a restart)",
            "brokerd: grants.toml valid: it decides with 1 grant(s)",
            "inferproxy: re-reading config.toml",
            "inferproxy: applied [model] name",
            "inferproxy: config.toml re-read (1 applied, 0 need a restart)",
            "loopd: re-reading config.toml",
            "loopd: applied [loop] max_steps",
            "loopd: needs a restart: [loop] reply_timeout (the old value is kept); "
            "see docs/runbook.md#reload",
            "loopd: config.toml re-read (1 applied, 1 need a restart)",
        ]
        # Applied: an ask now expires after 1 s (it was 300), and the model is asked
        # under its new name.
        events = _chat_events(home, "read my notes")
        result = next(e for e in events if e["kind"] == "tool_result")
        assert (result["outcome"], result["reason"]) == ("denied", "expired")
        first = orjson.loads(record.read_bytes().splitlines()[0])
        assert first["model"] == "renamed"

        home.config_toml.write_text("[broker]\npending_timeout = 'soon'\n")
        done = bxctl(home, "reload")
        problem = "config.toml: [broker] pending_timeout: expected a number"
        kept = "config.toml not applied, every key keeps its old value; see docs/runbook.md#config"
        assert done.stdout.splitlines() == [
            "brokerd: re-reading grants.toml and config.toml",
            f"brokerd: {problem}",
            f"brokerd: {kept}",
            "brokerd: grants.toml valid: it decides with 1 grant(s)",
            "inferproxy: re-reading config.toml",
            f"inferproxy: {problem}",
            f"inferproxy: {kept}",
            "loopd: re-reading config.toml",
            f"loopd: {problem}",
            f"loopd: {kept}",
        ]
        # Every daemon still runs, the same processes (SIGHUP once ended loopd and
        # inferproxy: its default action).
        for name, pid in pids.items():
            assert alive(pid), name
        assert bxctl(home, "status", check=False).returncode == 0
        outputs = [done.stdout, bxctl(home, "audit", "show").stdout]
        assert not any(PYTHON_WORDS.search(text) for text in outputs), outputs

        # A typo in grants.toml: brokerd denies every call from now on, and reload says
        # so (it once printed only the config lines and exited 0).
        home.grants_toml.write_text(ASK.replace("mode =", "mdoe ="))
        done = bxctl(home, "reload", check=False)
        assert done.returncode == 1
        [grants_line] = [line for line in done.stdout.splitlines() if "invalid" in line]
        assert grants_line.startswith(
            "brokerd: grants.toml is invalid, so every call is denied grants_invalid: "
        )
        assert "'mdoe'" in grants_line
        assert grants_line.endswith("; see docs/runbook.md#grants")


def test_reload_with_nothing_running_says_so() -> None:
    with short_home() as home:
        done = bxctl(home, "reload")
        assert done.stdout.splitlines() == [
            f"{name}: not running (not started by bxctl up)"
            for name in ("brokerd", "inferproxy", "loopd")
        ]


# ---------------------------------------------------------------------------------------
# demo --home


@pytest.fixture
def demo_root() -> Iterator[Path]:
    parent = Path(tempfile.mkdtemp(prefix="bx-ops-", dir="/tmp"))
    try:
        yield parent / "demo"
    finally:
        subprocess.run(["rm", "-rf", str(parent)], check=False)


def test_demo_home_is_created_and_kept(demo_root: Path, no_bwrap: dict[str, str]) -> None:
    # Without bwrap, up refuses: the demo stops there, and the home it made stays.
    done = bxctl(demo_root, "demo", "--yes", check=False, env=no_bwrap)
    try:
        check_installed()
    except ModelUnavailable:
        assert done.returncode == 2  # the model is missing too: the owner's to install
    else:
        assert done.returncode == 1
    assert "bxctl: bubblewrap (bwrap) is not installed" in done.stderr
    assert done.stdout.startswith(f"The home: {demo_root}\n")
    assert f"the demo's home is kept: {demo_root}" in done.stdout
    home = Home(demo_root)
    assert (home.default_workspace / "notes.txt").read_text().startswith("Buy milk.")
    assert 'id = "read-notes"' in home.grants_toml.read_text()
    assert stat.S_IMODE(home.root.stat().st_mode) == 0o700
    assert _run_dir_is_empty(home)


def test_demo_in_an_owners_home_uses_its_files_and_keeps_it(demo_root: Path) -> None:
    script_file = demo_root.parent / "script.json"
    script_file.write_bytes(orjson.dumps([READ_NOTES, {"content": "Your notes: milk."}]))
    with as_process("--script", str(script_file)) as url:
        demo_root.mkdir(mode=0o700)
        config = f'# mine\n[model]\nurl = "{url}"\n'
        (demo_root / "config.toml").write_text(config)
        done = bxctl(demo_root, "demo", "--yes")
    out = done.stdout
    assert "approving (--yes): bxctl approve a-" in out
    assert "Your notes: milk." in out
    assert "ledger: sound" in out
    assert out.rstrip().endswith(
        "loopd: stopped\ninferproxy: stopped\nbrokerd: stopped\nmodel: not running\n"
        f"the demo's home is kept: {demo_root} (try: bxctl audit show --home {demo_root})"
    )
    home = Home(demo_root)
    assert home.config_toml.read_text() == config  # the owner's file, untouched
    kinds = [orjson.loads(line)["kind"] for line in home.audit_log.read_bytes().splitlines()]
    assert [k for k in kinds if k in ("decision", "approval", "result")] == [
        "decision",
        "approval",
        "result",
    ]
    assert not any(home.pid_file(name).exists() for name in ("brokerd", "inferproxy", "loopd"))
    assert not PYTHON_WORDS.search(out), out
    assert os.path.isdir(demo_root)
