"""What the owner reads before approving: the block of one pending call.
The arguments are the model's; nothing in them may change how the block reads."""

from __future__ import annotations

import datetime as dt

from boxmaker.cli.owner import approval_block
from boxmaker.core.labels import Taint
from boxmaker.wire import ApprovalView, GrantRef

NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)


def view(arguments: dict[str, object]) -> ApprovalView:
    return ApprovalView(
        approval="a-0123abcd",
        call="c-0123456789abcdef",
        session="s-0123456789ab",
        tool="read_file",
        arguments=arguments,
        grant=GrantRef(id="notes", mode="ask", note="my notes"),
        requested_at=NOW,
        expires_at=NOW + dt.timedelta(seconds=90),
        taint=Taint.INTERNAL,
        untrusted=True,
    )


def test_the_block_names_everything_the_owner_decides_on() -> None:
    assert approval_block(view({"path": "notes.txt"}), NOW).splitlines() == [
        "a-0123abcd  read_file  (1m 30s left)",
        '  arguments  {"path":"notes.txt"}',
        "  grant      notes (mode ask): my notes",
        "  session    s-0123456789ab: taint internal, untrusted",
        "  call       c-0123456789abcdef, asked 2026-11-29T12:00:00.000Z",
        "  approve:   bxctl approve a-0123abcd",
        '  refuse:    bxctl refuse a-0123abcd --reason "…"',
    ]


def test_a_bidi_override_in_the_arguments_is_shown_not_obeyed() -> None:
    # "notes\u202etxt.exe" would display as "notesexe.txt" on a terminal.
    block = approval_block(view({"path": "notes\u202etxt.exe"}), NOW)
    assert "\u202e" not in block
    assert '  arguments  {"path":"notes\\u202etxt.exe"}' in block.splitlines()
