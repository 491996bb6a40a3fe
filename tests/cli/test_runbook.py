"""``bxctl runbook`` (every anchor a message cites is a topic, from the copy inside
the wheel) and ``bxctl completion`` (the script names every command)."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import orjson
import pytest
from hatchling.builders.wheel import WheelBuilder

from boxmaker.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
RUNBOOK = ROOT / "docs" / "runbook.md"
CITED = re.compile(r"docs/runbook\.md#([a-z0-9-]+)")
COMMANDS = [
    "approvals",
    "approve",
    "audit",
    "chat",
    "completion",
    "demo",
    "down",
    "grants",
    "init",
    "logs",
    "mcp",
    "refuse",
    "reload",
    "restart",
    "runbook",
    "sessions",
    "status",
    "up",
]


def bxctl(*args: str) -> int:
    return int(app(list(args), result_action="return_value"))


def cited_anchors() -> set[str]:
    return {
        anchor
        for path in (ROOT / "src" / "boxmaker").rglob("*.py")
        for anchor in CITED.findall(path.read_text(encoding="utf-8"))
    }


def test_the_list_names_every_entry_of_the_runbook(capsys: pytest.CaptureFixture[str]) -> None:
    assert bxctl("runbook") == 0
    shown = capsys.readouterr().out.splitlines()
    assert shown[0] == "The runbook's topics (bxctl runbook TOPIC shows one):"
    headings = re.findall(r"^## (\S+)$", RUNBOOK.read_text(encoding="utf-8"), re.MULTILINE)
    assert [line.split()[0] for line in shown[2:]] == headings
    assert "  up " in "\n".join(shown)
    assert bxctl("runbook", "--json") == 0
    topics = orjson.loads(capsys.readouterr().out)
    assert [entry["topic"] for entry in topics] == headings


def test_every_anchor_a_message_cites_is_a_topic(capsys: pytest.CaptureFixture[str]) -> None:
    anchors = cited_anchors()
    assert {"config", "grants", "sandbox", "up", "reload"} <= anchors
    for anchor in sorted(anchors):
        assert bxctl("runbook", anchor) == 0, anchor
        assert capsys.readouterr().out.startswith(f"## {anchor}\n\nMessages that point here")
    # As the message writes it, too.
    assert bxctl("runbook", "docs/runbook.md#reload") == 0
    entry = capsys.readouterr().out
    assert entry.startswith("## reload\n")
    assert "## " not in entry.removeprefix("## reload")  # that entry, and only it


def test_an_unknown_topic_is_a_usage_error_that_reads_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for topic in ("nonsense", "../../etc/passwd", "/etc/passwd", "docs/runbook.md#../x"):
        assert bxctl("runbook", topic) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err == (f"bxctl: no runbook topic {topic!r}; `bxctl runbook` lists them\n")


def test_the_wheel_carries_the_runbook_and_bxctl_reads_it_there(tmp_path: Path) -> None:
    [wheel] = WheelBuilder(str(ROOT)).build(directory=str(tmp_path / "dist"))
    with zipfile.ZipFile(wheel) as archive:
        assert archive.read("boxmaker/runbook.md") == RUNBOOK.read_bytes()
        archive.extractall(tmp_path / "installed")
    # The unpacked wheel first on the path, away from any source checkout: its own copy.
    done = subprocess.run(
        [sys.executable, "-c", "from boxmaker.cli.app import main; main()", "runbook", "up"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path / "installed"), "PATH": "/usr/bin:/bin"},
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("## up\n")
    done = subprocess.run(
        [sys.executable, "-c", "import boxmaker.cli.runbook as r; print(r.__file__)"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(tmp_path / "installed")},
        timeout=60,
        check=True,
    )
    assert done.stdout.strip().startswith(str(tmp_path / "installed"))


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_names_every_command(shell: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert bxctl("completion", shell) == 0
    script = capsys.readouterr().out
    assert "bxctl" in script
    for command in COMMANDS:
        assert re.search(rf"\b{command}\b", script), (shell, command)
    assert re.search(r"\bfollow\b", script)  # and the options of the new commands
