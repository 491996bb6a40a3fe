"""grants_edit.py: one grant added or removed, the rest of grants.toml byte for byte as
it was; a broken file never rewritten; writers at once all land, and no reader ever
sees a torn or invalid file."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from tests.harness.grants import checked, exact_always

from boxmaker.core.grant_parse import parse_grants
from boxmaker.core.grant_scope import ScopeProblem, grant_of
from boxmaker.core.grants import Grant, GrantSet, Mode
from boxmaker.home.grants_edit import GrantsEditError, add_grant, locked, remove_grant
from boxmaker.home.grants_file import load_grants

NOW = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)

OWNERS_FILE = """\
# My grants. Keep this comment.
#   (and this indented one)

[[grant]]   # notes: reading is fine
id = "read-notes"
tool = "read_file"
mode = "ask"      # ask, for now
paths = [ "notes/**",   "todo.txt" ]

# git, but ask
[[grant]]
id = "git"
tool = "shell"
mode = "ask"
commands = ['git *']
# end of git
"""

WRITTEN = """
[[grant]]
id = "always-a-1f2e3d4c"
tool = "shell"
mode = "auto"
wins_over_ask = true
commands = ["git log --oneline [[]1-9][*] \\"x\\""]
max_taint = "secret"
if_untrusted = "ask"
note = "approved always by alice at 2026-06-01T12:00:00Z for approval a-1f2e3d4c \
(call c-00000000000000c1)"
"""


def _always(command: str, approval: str = "a-1f2e3d4c") -> tuple[dict[str, object], Grant]:
    fields = exact_always(
        checked("shell", {"command": command}),
        Grant("git", "shell", Mode.ASK),
        approval=approval,
        call="c-00000000000000c1",
        owner="alice",
        now=NOW,
    )
    assert not isinstance(fields, ScopeProblem)
    return fields, grant_of(fields)


@pytest.fixture
def grants_toml(tmp_path: Path) -> Path:
    path = tmp_path / "grants.toml"
    path.write_text(OWNERS_FILE, encoding="utf-8")
    path.chmod(0o600)
    return path


def test_a_grant_is_appended_and_every_byte_before_it_stays(grants_toml: Path) -> None:
    fields, grant = _always('git log --oneline [1-9]* "x"')
    add_grant(grants_toml, fields, grant)
    assert grants_toml.read_text(encoding="utf-8") == OWNERS_FILE + WRITTEN
    assert grants_toml.stat().st_mode & 0o777 == 0o600
    grants = load_grants(grants_toml)
    assert isinstance(grants, GrantSet)
    assert [g.id for g in grants.grants] == ["read-notes", "git", "always-a-1f2e3d4c"]


def test_an_external_tools_arguments_are_written_inline_and_read_back(grants_toml: Path) -> None:
    arguments = {"a.b": ["x"], "": ["y"], "\u00e9": ["[[]z"], 'q"': ["\\"]}
    fields: dict[str, object] = {
        "id": "always-a-1f2e3d4c",
        "tool": "mcp.git.git_log",
        "mode": "auto",
        "wins_over_ask": True,
        "arguments": arguments,
        "other_arguments": False,
    }
    grant = grant_of(fields)
    add_grant(grants_toml, fields, grant)
    text = grants_toml.read_text(encoding="utf-8")
    assert text == OWNERS_FILE + (
        '\n[[grant]]\nid = "always-a-1f2e3d4c"\ntool = "mcp.git.git_log"\nmode = "auto"\n'
        'wins_over_ask = true\narguments = {"a.b" = ["x"], "" = ["y"], "\u00e9" = ["[[]z"], '
        '"q\\"" = ["\\\\"]}\nother_arguments = false\n'
    )
    grants = load_grants(grants_toml)
    assert isinstance(grants, GrantSet)
    assert grants.grants[-1] == grant
    assert grant.arguments == tuple((name, tuple(p)) for name, p in arguments.items())


def test_revoke_removes_one_grant_and_keeps_the_comments_elsewhere(grants_toml: Path) -> None:
    removed = remove_grant(grants_toml, "read-notes")
    assert removed.id == "read-notes"
    # The table went with its keys and the comments among them; the comment after its
    # last key (about the next grant) stayed, above that grant.
    assert grants_toml.read_text(encoding="utf-8") == OWNERS_FILE.replace(
        textwrap.dedent("""\
        [[grant]]   # notes: reading is fine
        id = "read-notes"
        tool = "read_file"
        mode = "ask"      # ask, for now
        paths = [ "notes/**",   "todo.txt" ]

        """),
        "",
    )


def test_approve_always_then_revoke_gives_back_the_same_bytes(grants_toml: Path) -> None:
    before = load_grants(grants_toml)
    fields, grant = _always("make test")
    add_grant(grants_toml, fields, grant)
    remove_grant(grants_toml, grant.id)
    assert load_grants(grants_toml) == before
    assert grants_toml.read_text(encoding="utf-8") == OWNERS_FILE


def test_the_first_grant_in_a_file_of_comments_only(tmp_path: Path) -> None:
    path = tmp_path / "grants.toml"
    path.write_text("# nothing granted yet\n", encoding="utf-8")
    fields, grant = _always("ls")
    add_grant(path, fields, grant)
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# nothing granted yet\n\n[[grant]]\n")
    remove_grant(path, grant.id)
    assert load_grants(path) == GrantSet()
    assert "grant" not in path.read_text(encoding="utf-8").replace("granted", "")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('[[grant]]\nid = "x"\ntool = "shel"\nmode = "ask"\n', "key 'tool'"),
        ("[[grant]\n", "TOML syntax"),
        ('grant = [{id = "x", tool = "shell", mode = "ask"}]\n', "other than as [[grant]]"),
    ],
)
def test_a_file_that_cannot_be_edited_is_never_rewritten(
    tmp_path: Path, text: str, problem: str
) -> None:
    path = tmp_path / "grants.toml"
    path.write_text(text, encoding="utf-8")
    fields, grant = _always("ls")
    with pytest.raises(GrantsEditError, match="grants-edit") as raised:
        add_grant(path, fields, grant)
    assert problem in str(raised.value)
    assert path.read_text(encoding="utf-8") == text


def test_a_duplicate_id_and_an_unknown_one_are_refused(grants_toml: Path) -> None:
    fields, grant = _always("ls")
    add_grant(grants_toml, fields, grant)
    written = grants_toml.read_bytes()
    with pytest.raises(GrantsEditError, match="already has a grant always-a-1f2e3d4c"):
        add_grant(grants_toml, fields, grant)
    with pytest.raises(GrantsEditError, match="has no grant 'nope'"):
        remove_grant(grants_toml, "nope")
    assert grants_toml.read_bytes() == written


def test_a_held_lock_is_waited_for_only_so_long(grants_toml: Path) -> None:
    fields, grant = _always("ls")
    with locked(grants_toml):
        began = time.monotonic()
        with pytest.raises(GrantsEditError, match=r"held the lock for 0\.3 s; nothing changed"):
            add_grant(grants_toml, fields, grant, wait=0.3)
        assert time.monotonic() - began < 3
    assert grants_toml.read_text(encoding="utf-8") == OWNERS_FILE
    add_grant(grants_toml, fields, grant)  # released: it goes through


WRITER = """
import sys
from pathlib import Path
from boxmaker.core.grant_scope import grant_of
from boxmaker.home.grants_edit import add_grant
path, prefix, count = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
for n in range(count):
    fields = {{"id": f"{{prefix}}-{{n}}", "tool": "shell", "mode": "auto",
              "commands": [f"echo {{prefix}} {{n}}"], "note": "x" * 300}}
    add_grant(path, fields, grant_of(fields))
"""


def test_two_writers_at_once_both_land_and_no_reader_sees_a_torn_file(grants_toml: Path) -> None:
    count = 15
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER.format(), str(grants_toml), prefix, str(count)]
        )
        for prefix in ("one", "two")
    ]
    reads = 0
    while any(writer.poll() is None for writer in writers):
        # A reader never takes the lock (brokerd does not): it sees the old file or the
        # new, whole and valid.
        assert isinstance(parse_grants(grants_toml.read_text(encoding="utf-8")), GrantSet)
        reads += 1
    assert [writer.wait(60) for writer in writers] == [0, 0]
    grants = load_grants(grants_toml)
    assert isinstance(grants, GrantSet)
    ids = {grant.id for grant in grants.grants}
    assert ids == {"read-notes", "git"} | {f"{p}-{n}" for p in ("one", "two") for n in range(count)}
    assert grants_toml.read_text(encoding="utf-8").startswith(OWNERS_FILE)
    assert reads > 0
    assert not list(grants_toml.parent.glob(".grants.toml.*.tmp"))
