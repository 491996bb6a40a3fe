"""write_file approvals show the change (docs/protocol.md, ``approvals``' ``preview``),
and a write into a directory that does not exist is denied before anyone is asked."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio.testing
from hypothesis import given
from hypothesis import strategies as st
from tests.fakes.llama_server import FakeLlama
from tests.harness.broker import Brokerd, Client, records_of, tool_request
from tests.harness.cli import bxctl_in_process
from tests.harness.homes import grant, write_grants
from tests.harness.stack import say, stack

from boxmaker.broker.preview import MAX_LINE, MAX_SHOWN_LINES, NO_NEWLINE, preview_write
from boxmaker.cli.change import change_lines
from boxmaker.core.labels import LabelRules
from boxmaker.home.paths import Home
from boxmaker.wire import ChangePreview

pytestmark = pytest.mark.usefixtures("inline_threads")

Clock = trio.testing.MockClock
RULES = LabelRules()


@pytest.fixture
async def writing_home(home: Home, brokerd: Brokerd) -> Home:
    """brokerd running on a home where notes.txt holds three lines and every
    write_file asks the owner."""
    (home.default_workspace / "notes.txt").write_text("one\ntwo\nthree\n")
    write_grants(home, grant("write-any", "write_file", "ask"))
    await brokerd.start()
    return home


async def pending_write(home: Home, path: str, content: str) -> tuple[Client, dict[str, Any]]:
    client = await Client.open(home.broker_sock)
    frame = await client.ask(tool_request("write_file", {"path": path, "content": content}))
    return client, frame


def test_a_change_is_a_unified_diff_against_the_file_as_it_is(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("one\ntwo\nthree\n")
    preview = preview_write(tmp_path, RULES, "notes.txt", "one\n2\nthree\nfour\n")
    assert preview == ChangePreview(
        summary="replaces 14 bytes with 17 bytes",
        lines=[
            "--- notes.txt (now)",
            "+++ notes.txt (written)",
            "@@ -1,3 +1,4 @@",
            " one",
            "-two",
            "+2",
            " three",
            "+four",
        ],
    )


def test_a_new_file_shows_its_lines_and_size(tmp_path: Path) -> None:
    preview = preview_write(tmp_path, RULES, "new.txt", "a\nb\n")
    assert preview == ChangePreview(summary="creates 4 bytes", lines=["+a", "+b"])
    same = (tmp_path / "same.txt", "x\n")
    same[0].write_text(same[1])
    assert preview_write(tmp_path, RULES, "same.txt", "x\n").summary == (
        "no change: same.txt already holds these 2 bytes"
    )


def test_what_is_shown_is_bounded(tmp_path: Path) -> None:
    content = "".join(f"line {n}\n" for n in range(1000))
    preview = preview_write(tmp_path, RULES, "long.txt", content)
    assert len(preview.lines) == MAX_SHOWN_LINES
    assert preview.lines_left_out == 1000 - MAX_SHOWN_LINES
    wide = preview_write(tmp_path, RULES, "wide.txt", "x" * 5000)
    assert wide.lines == ["+" + "x" * 399 + "… (5001 characters)", NO_NEWLINE]


def test_binary_content_is_described_not_dumped(tmp_path: Path) -> None:
    (tmp_path / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\xff")
    assert preview_write(tmp_path, RULES, "image.png", "text\n").summary == (
        "replaces 11 bytes with 5 bytes; binary content (not shown)"
    )
    # Not UTF-8 is binary; a NUL is text, shown escaped (below).
    assert preview_write(tmp_path, RULES, "nul.txt", "a\0b\n") == ChangePreview(
        summary="creates 4 bytes", lines=["+a\0b"]
    )


def test_a_secret_file_is_not_shown_only_the_new_content(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("TOKEN=hunter2\n")
    preview = preview_write(tmp_path, RULES, ".env", "TOKEN=new\n")
    assert preview == ChangePreview(
        summary="replaces 14 bytes with 10 bytes; "
        "the file is secret ([labels]), only the new content",
        lines=["+TOKEN=new"],
    )


async def test_bxctl_approvals_shows_the_diff_and_json_carries_it(
    writing_home: Home, autojump_clock: Clock, capsys: pytest.CaptureFixture[str]
) -> None:
    home = writing_home
    client, frame = await pending_write(home, "notes.txt", "one\n2\nthree\n")
    assert frame["kind"] == "pending", frame
    assert await bxctl_in_process(home, "approvals") == 0
    block = capsys.readouterr().out.splitlines()
    assert block[1:10] == [
        '  arguments  {"path":"notes.txt"}',
        "  change     replaces 14 bytes with 12 bytes",
        "    --- notes.txt (now)",
        "    +++ notes.txt (written)",
        "    @@ -1,3 +1,3 @@",
        "     one",
        "    -two",
        "    +2",
        "     three",
    ]
    # Fresh: the file as it is when the list is asked for, not when the model asked.
    (home.default_workspace / "notes.txt").write_text("one\n2\nthree\n")
    assert await bxctl_in_process(home, "approvals", "--json") == 0
    [entry] = orjson.loads(capsys.readouterr().out)
    assert entry["preview"] == {
        "summary": "no change: notes.txt already holds these 12 bytes",
        "lines": [],
        "lines_left_out": 0,
    }
    await client.aclose()


async def test_a_write_into_a_missing_directory_is_denied_before_anyone_is_asked(
    writing_home: Home, autojump_clock: Clock, capsys: pytest.CaptureFixture[str]
) -> None:
    home = writing_home
    client, answer = await pending_write(home, "drafts/2026/plan.md", "# plan\n")
    # Not pending: the model hears why at once.
    assert answer == {
        "kind": "answer",
        "final": True,
        "call": answer["call"],
        "outcome": "denied",
        "reason": "not_found",
        "detail": "drafts/2026/plan.md: the directory drafts does not exist "
        "(write_file does not create directories)",
    }
    assert await bxctl_in_process(home, "approvals") == 0
    assert capsys.readouterr().out.strip() == "no pending approvals"
    [decision] = records_of(home, answer["call"])
    assert (decision["kind"], decision["verdict"], decision["reason"], decision["grant"]) == (
        "decision",
        "deny",
        "not_found",
        "write-any",
    )
    await client.aclose()
    (home.default_workspace / "drafts").mkdir()
    client, answer = await pending_write(home, "drafts/2026/plan.md", "# plan\n")
    assert answer["detail"].startswith("drafts/2026/plan.md: the directory drafts/2026 does")
    await client.aclose()
    (home.default_workspace / "drafts" / "2026").mkdir()
    client, frame = await pending_write(home, "drafts/2026/plan.md", "# plan\n")
    assert frame["kind"] == "pending"
    await client.aclose()


async def test_the_model_is_told_which_directory_is_missing(home: Home) -> None:
    write_grants(home, grant("write-any", "write_file", "ask"))
    write = {
        "tool_calls": [
            {"name": "write_file", "arguments": {"path": "drafts/plan.md", "content": "x"}}
        ]
    }
    fake = FakeLlama(script=[write, {"content": "The folder is missing."}])
    async with stack(home, fake):
        events = await say(home, "save my plan")
    assert events[-1]["text"] == "The folder is missing."
    assert fake.requests[1]["messages"][-1]["content"] == (
        "I could not do that: the call was denied (not_found: the file or directory does not"
        " exist). Detail: drafts/plan.md: the directory drafts does not exist "
        "(write_file does not create directories)."
    )


# --- every byte change is visible ---------------------------------------------------
#
# Each case: the file as it is, what the model writes, the preview's lines as brokerd
# sends them (--json), and as the owner reads them (every screen: cli/change.py).

HEAD = ["--- f.txt (now)", "+++ f.txt (written)"]


def shown(tmp_path: Path, before: str | bytes, after: str) -> tuple[list[str], list[str]]:
    """(the preview's lines, the lines as the owner reads them) of writing ``after`` over
    a file holding ``before``."""
    target = tmp_path / "f.txt"
    if isinstance(before, bytes):
        target.write_bytes(before)
    else:
        target.write_bytes(before.encode("utf-8", "surrogatepass"))
    preview = preview_write(tmp_path, RULES, "f.txt", after)
    assert preview.lines_left_out == 0
    return preview.lines, change_lines(preview.lines)


def test_line_endings_that_change_are_changed_lines(tmp_path: Path) -> None:
    lines, seen = shown(tmp_path, "one\ntwo\n", "one\r\ntwo\r\n")
    assert lines == [*HEAD, "@@ -1,2 +1,2 @@", "-one", "-two", "+one\r", "+two\r"]
    assert seen[3:] == ["-one", "-two", "+one\\u000d", "+two\\u000d"]
    # And back: a file with \r\n written with \n.
    _, seen = shown(tmp_path, "one\r\n", "one\n")
    assert seen[3:] == ["-one\\u000d", "+one"]


def test_a_lone_carriage_return_inside_a_line_shows(tmp_path: Path) -> None:
    # On a terminal "safe\rrm -rf ~" would print over itself.
    _, seen = shown(tmp_path, "rm -rf ~\n", "safe\rrm -rf ~\n")
    assert seen[3:] == ["-rm -rf ~", "+safe\\u000drm -rf ~"]


@pytest.mark.parametrize(
    ("after", "line"),
    [
        ("a \n", "+a\\u0020"),
        ("a  \n", "+a\\u0020\\u0020"),
        ("a\t\n", "+a\\u0009"),
        ("a \t \n", "+a\\u0020\\u0009\\u0020"),
        (" \n", "+\\u0020"),
        ("a \r\n", "+a \\u000d"),
    ],
)
def test_trailing_spaces_and_tabs_show(tmp_path: Path, after: str, line: str) -> None:
    lines, seen = shown(tmp_path, "a\n", after)
    assert lines[3] == "-a"
    assert lines[4] == "+" + after[:-1]
    assert seen[3:] == ["-a", line]


def test_spaces_inside_a_line_stay_spaces(tmp_path: Path) -> None:
    _, seen = shown(tmp_path, "a b\n", "a  b\n")
    assert seen[3:] == ["-a b", "+a  b"]
    # An empty context line is a lone prefix, not a trailing space.
    _, seen = shown(tmp_path, "x\n\ny\n", "x\n\nz\n")
    assert seen[3:] == [" x", " ", "-y", "+z"]


def test_a_missing_final_newline_is_said(tmp_path: Path) -> None:
    lines, seen = shown(tmp_path, "a\nb\n", "a\nb")
    assert lines == [*HEAD, "@@ -1,2 +1,2 @@", " a", "-b", "+b", NO_NEWLINE]
    assert seen == lines
    lines, _ = shown(tmp_path, "a\nb", "a\nb\n")
    assert lines == [*HEAD, "@@ -1,2 +1,2 @@", " a", "-b", NO_NEWLINE, "+b"]
    # Unchanged, the last line is context and still says so.
    lines, _ = shown(tmp_path, "a\nb", "A\nb")
    assert lines == [*HEAD, "@@ -1,2 +1,2 @@", "-a", "+A", " b", NO_NEWLINE]


def test_a_new_file_without_a_final_newline_says_so(tmp_path: Path) -> None:
    preview = preview_write(tmp_path, RULES, "new.txt", "a\nb")
    assert preview == ChangePreview(summary="creates 3 bytes", lines=["+a", "+b", NO_NEWLINE])
    assert preview_write(tmp_path, RULES, "empty.txt", "").lines == []


@pytest.mark.parametrize(
    ("char", "escaped"),
    [
        ("\u200b", "\\u200b"),  # zero-width space
        ("\u200d", "\\u200d"),  # zero-width joiner
        ("\u2060", "\\u2060"),  # word joiner
        ("\ufeff", "\\ufeff"),  # byte-order mark
        ("\u202e", "\\u202e"),  # right-to-left override
        ("\u2067", "\\u2067"),  # right-to-left isolate
        ("\u061c", "\\u061c"),  # Arabic letter mark
        ("\x00", "\\u0000"),
        ("\x07", "\\u0007"),
        ("\x1b", "\\u001b"),
        ("\x7f", "\\u007f"),
        ("\x85", "\\u0085"),  # C1 next line
        ("\x0c", "\\u000c"),  # form feed
        ("\x0b", "\\u000b"),  # vertical tab
        ("\u2028", "\\u2028"),  # line separator
        ("\u00a0", "\\u00a0"),  # no-break space
        ("\u2007", "\\u2007"),  # figure space
        ("\u202f", "\\u202f"),  # narrow no-break space
        ("\u3000", "\\u3000"),  # ideographic space
        ("\u00ad", "\\u00ad"),  # soft hyphen
        ("\u034f", "\\u034f"),  # combining grapheme joiner
        ("\ufe0f", "\\ufe0f"),  # variation selector
        ("\u3164", "\\u3164"),  # Hangul filler
        ("\u2800", "\\u2800"),  # blank braille pattern
        ("\ue000", "\\ue000"),  # private use
        ("\u0378", "\\u0378"),  # unassigned
        ("\U000e0041", "\\udb40\\udc41"),  # tag letter
        ("\U000e0100", "\\udb40\\udd00"),  # variation selector 17
    ],
)
def test_an_invisible_character_shows_escaped(tmp_path: Path, char: str, escaped: str) -> None:
    lines, seen = shown(tmp_path, "pay alice\n", f"pay {char}alice\n")
    assert lines[3:] == ["-pay alice", f"+pay {char}alice"]
    assert seen[3:] == ["-pay alice", f"+pay {escaped}alice"]


def test_visible_characters_are_shown_as_they_are(tmp_path: Path) -> None:
    _, seen = shown(tmp_path, "café\n", "café — naïve 日本 🙂\n")
    assert seen[3:] == ["-café", "+café — naïve 日本 🙂"]


def test_two_lines_shown_alike_are_shown_exactly(tmp_path: Path) -> None:
    # The escape typed as text and the character it names would read the same.
    _, seen = shown(tmp_path, "x = '\\u00a0'\n", "x = '\u00a0'\n")
    assert seen[3:] == ["-x = '\\\\u00a0'", "+x = '\\u00a0'"]
    _, seen = shown(tmp_path, "a\\u000d\n", "a\r\n")
    assert seen[3:] == ["-a\\\\u000d", "+a\\u000d"]


def test_a_change_far_into_a_long_line_is_shown(tmp_path: Path) -> None:
    before = "x" * 450 + "safe" + "y" * 100 + "\n"
    after = "x" * 450 + "evil" + "y" * 100 + "\n"
    lines, _ = shown(tmp_path, before, after)
    window = "x" * 40 + "{}" + "y" * 100
    note = "… (555 characters, shown from character 412)"
    assert lines[3:] == ["-…" + window.format("safe") + note, "+…" + window.format("evil") + note]
    # Within what a cut from the start shows: cut from the start.
    before = "x" * 300 + "safe" + "y" * 300 + "\n"
    lines, _ = shown(tmp_path, before, before.replace("safe", "evil"))
    assert lines[3] == "-" + "x" * 300 + "safe" + "y" * 95 + "… (605 characters)"
    assert lines[4] == "+" + "x" * 300 + "evil" + "y" * 95 + "… (605 characters)"


@pytest.mark.parametrize("at", [MAX_LINE - 3, MAX_LINE - 2, MAX_LINE - 1, MAX_LINE])
def test_the_window_starts_where_a_cut_from_the_start_would_hide_the_change(
    tmp_path: Path, at: int
) -> None:
    before = "x" * at + "a" + "x" * 100
    lines, _ = shown(tmp_path, before + "\n", before[:at] + "b" + before[at + 1 :] + "\n")
    removed, added = lines[3], lines[4]
    assert removed != added
    if at < MAX_LINE - 1:  # the head shows content[:MAX_LINE - 1]
        assert removed == "-" + before[: MAX_LINE - 1] + f"… ({len(before) + 1} characters)"
    else:
        start = at - 40
        assert added == (
            f"+…{'x' * 40}b{'x' * 100}… "
            f"({len(before) + 1} characters, shown from character {start + 2})"
        )


def test_long_lines_pair_within_each_change(tmp_path: Path) -> None:
    """The n-th removed line is shown against the n-th added one of the same change; a
    later change pairs its own lines."""
    long = ["a" * 500 + str(n) for n in range(3)]
    before = f"{long[0]}\n{long[1]}\nkeep\n{long[2]}\n"
    after = f"{long[0]}X\n{long[1]}Y\nkeep\n{long[2]}Z\n"
    lines, _ = shown(tmp_path, before, after)
    changed = [line for line in lines[3:] if line[0] in "-+"]
    assert [line[:2] for line in changed] == ["-…", "-…", "+…", "+…", "-…", "+…"]
    assert [line.split("… (")[0][-3:] for line in changed] == [
        "aa0",
        "aa1",
        "a0X",
        "a1Y",
        "aa2",
        "a2Z",
    ]


def test_a_binary_file_is_still_described(tmp_path: Path) -> None:
    lines, _ = shown(tmp_path, b"\xff\xfe", "text\n")
    assert lines == []


_CHARS = st.sampled_from(
    ["a", "b", " ", "\t", "\r", "\n", "\n", "\u00a0", "\u200b", "\\", "u", "0", "\x00", "é"]
)
_TEXT = st.lists(_CHARS, max_size=24).map("".join)


@given(before=_TEXT, after=_TEXT)
def test_the_owner_always_sees_a_difference(before: str, after: str) -> None:
    """Whatever changed, what the owner reads of the file before and after differs: the
    context and removed lines (and diff's notes) against the context and added ones."""
    if before == after:
        return
    with tempfile.TemporaryDirectory() as scratch:
        lines, seen = shown(Path(scratch), before, after)
    sides: dict[str, list[str]] = {"-": [], "+": []}
    last = " "
    for raw, read in zip(lines[2:], seen[2:], strict=True):
        kind = raw[0]
        if kind == "\\":
            kind = last  # the note belongs to the line before it
        last = kind
        for side in sides:
            if kind in (" ", "@", side):
                sides[side].append(read[1:] if kind != "@" else "@@")
    assert seen, (before, after)
    assert sides["-"] != sides["+"], (before, after, seen)
