"""bxctl as the owner runs it, for tests: a separate process per command, and a home
whose model is the scripted llama-server (a process too). Real time, every wait bounded.
And bxctl in the test's own trio run (:func:`bxctl_in_process`), for tests whose daemons
run in process."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
from tests.fakes.llama_server import as_process
from tests.harness.homes import short_home

from boxmaker.cli.app import app
from boxmaker.home.paths import Home

WAIT_S = 60.0


def bxctl(
    home: Home | Path,
    *args: str,
    check: bool = True,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``bxctl ARGS --home HOME``; with ``check``, it must exit 0."""
    root = home.root if isinstance(home, Home) else home
    done = subprocess.run(
        [sys.executable, "-m", "boxmaker.cli.app", *args, "--home", str(root)],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
        env=None if env is None else {**os.environ, **env},
    )
    if check:
        assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done


async def bxctl_in_process(home: Home, *args: str) -> int:
    """``bxctl ARGS --home HOME`` run in this process: its exit code."""
    result = await app.run_async([*args, "--home", str(home.root)], result_action="return_value")
    return int(result)


def start_bxctl(home: Home | Path, *args: str) -> subprocess.Popen[str]:
    """``bxctl ARGS --home HOME`` started, its output piped (``communicate``)."""
    root = home.root if isinstance(home, Home) else home
    return subprocess.Popen(
        [sys.executable, "-m", "boxmaker.cli.app", *args, "--home", str(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def listed_approvals(home: Home, besides: Collection[str] = ()) -> list[dict[str, Any]]:
    """The entries of ``bxctl approvals --json`` but the approvals ``besides``, once
    there is one (WAIT_S at most)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        entries = orjson.loads(bxctl(home, "approvals", "--json").stdout)
        if fresh := [entry for entry in entries if entry["approval"] not in besides]:
            return fresh
        assert time.monotonic() < deadline, "no approval appeared"
        time.sleep(0.05)


@contextlib.contextmanager
def scripted_home(
    script: Sequence[object], grants: str = "", config: str = "", prefix: str = "bx-ops-"
) -> Iterator[tuple[Home, str, Path]]:
    """A home made by ``bxctl init`` whose ``[model] url`` is a scripted llama-server:
    (the home, the model's URL, the file where the model records each request). Any
    daemon still running at the end is stopped (``bxctl down``)."""
    with short_home(prefix) as home:
        bxctl(home, "init")
        script_file, record = home.root / "script.json", home.root / "requests.jsonl"
        script_file.write_bytes(orjson.dumps(script))
        with as_process("--script", str(script_file), "--record", str(record)) as url:
            home.config_toml.write_text(f'[model]\nurl = "{url}"\n{config}')
            home.grants_toml.write_text(grants)
            try:
                yield home, url, record
            finally:
                bxctl(home, "down", check=False)


def pid_of(home: Home, daemon: str) -> int:
    return int(home.pid_file(daemon).read_text())


def alive(pid: int) -> bool:
    """Is ``pid`` a process that has not ended (a zombie counts as ended)?"""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
