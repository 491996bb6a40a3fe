"""What the owner reads before approving: the block of one pending call.
The arguments are the model's; nothing in them may change how the block reads."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator

import attrs
import pytest

from boxmaker.cli.owner import approval_block, describe_approved
from boxmaker.core.labels import Taint
from boxmaker.core.reasons import REASON_WORDS, Reason
from boxmaker.wire import ApprovalView, Approved, ChangePreview, GrantRef, RunEnd

NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)
CALL = "c-0123456789abcdef"


@pytest.fixture(autouse=True)
def berlin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The owner's zone is not UTC: every time shown is theirs (CET in November)."""
    monkeypatch.setenv("TZ", "Europe/Berlin")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def view(
    arguments: dict[str, object], tool: str = "read_file", preview: ChangePreview | None = None
) -> ApprovalView:
    return ApprovalView(
        approval="a-0123abcd",
        call=CALL,
        session="s-0123456789ab",
        tool=tool,
        arguments=arguments,
        grant=GrantRef(id="notes", mode="ask", note="my notes"),
        requested_at=NOW - dt.timedelta(seconds=130),
        expires_at=NOW + dt.timedelta(seconds=299),
        taint=Taint.INTERNAL,
        untrusted=True,
        preview=preview,
    )


def test_the_block_names_everything_the_owner_decides_on() -> None:
    assert approval_block(view({"path": "notes.txt"}), NOW).splitlines() == [
        "a-0123abcd  read_file  expires 13:04:59 (in 4m 59s)",
        '  arguments  {"path":"notes.txt"}',
        "  grant      notes (mode ask): my notes",
        "  session    s-0123456789ab: taint internal, untrusted",
        "  call       c-0123456789abcdef, asked 12:57:50 (2m 10s ago)",
        "  approve:   bxctl approve a-0123abcd",
        '  refuse:    bxctl refuse a-0123abcd --reason "…"',
    ]


def test_a_past_day_shows_its_date() -> None:
    later = NOW + dt.timedelta(days=1)
    block = approval_block(view({"path": "notes.txt"}), later)
    assert block.splitlines()[0] == (
        "a-0123abcd  read_file  expires 2026-11-29 13:04:59 (23h 55m 01s ago)"
    )


def test_a_write_shows_the_change_as_lines_not_its_content_as_json() -> None:
    preview = ChangePreview(
        summary="replaces 6 bytes with 12",
        lines=[
            "--- notes.txt (now)",
            "+++ notes.txt (written)",
            "@@ -1 +1,2 @@",
            "-hello",
            "+hello",
            "+\x1b[2Jworld",
        ],
        lines_left_out=3,
    )
    arguments = {"path": "notes.txt", "content": "hello\nworld\n"}
    block = approval_block(view(arguments, "write_file", preview), NOW).splitlines()
    assert block[1:10] == [
        '  arguments  {"path":"notes.txt"}',
        "  change     replaces 6 bytes with 12",
        "    --- notes.txt (now)",
        "    +++ notes.txt (written)",
        "    @@ -1 +1,2 @@",
        "    -hello",
        "    +hello",
        "    +\\u001b[2Jworld",
        "    … 3 more lines",
    ]


def test_a_bidi_override_in_the_arguments_is_shown_not_obeyed() -> None:
    # "notes\u202etxt.exe" would display as "notesexe.txt" on a terminal.
    block = approval_block(view({"path": "notes\u202etxt.exe"}), NOW)
    assert "\u202e" not in block
    assert '  arguments  {"path":"notes\\u202etxt.exe"}' in block.splitlines()


def approved(outcome: str, **fields: object) -> Approved:
    return Approved(outcome=outcome, call=CALL, tool="read_file", **fields)  # type: ignore[arg-type]


def test_approve_says_in_words_what_happened() -> None:
    ran = approved("ask", reason=None, ran=RunEnd(outcome="ok"))
    assert describe_approved(ran) == f"approved {CALL}: read_file ran (ok)"
    failed = RunEnd(outcome="failed", reason=Reason.NOT_FOUND, detail="notes.txt: no such file")
    assert describe_approved(approved("ask", reason=None, ran=failed)) == (
        f"approved {CALL}: read_file ran and failed: not_found — notes.txt: no such file"
    )
    allowed = approved("allowed", reason=None, ran=RunEnd(outcome="ok"))
    assert describe_approved(allowed) == (
        f"approved {CALL}: read_file ran (ok) (a grant now lets it run without asking)"
    )
    denied = approved("denied", reason=Reason.TAINT_EXCEEDED, detail="the session's taint …")
    assert describe_approved(denied) == (
        f"approved {CALL}, but brokerd decided again and denied it: "
        "taint_exceeded — the session's taint …"
    )
    gone = approved("withdrawn", reason=Reason.REQUESTER_GONE)
    assert describe_approved(gone) == (
        f"withdrawn {CALL}: the requester left (its chat or turn ended) before it could run; "
        "nothing ran"
    )


def test_a_withdrawal_says_its_reason_in_the_one_table_of_words() -> None:
    stopping = approved("withdrawn", reason=Reason.BROKER_STOPPING)
    assert describe_approved(stopping) == (
        f"withdrawn {CALL}: {REASON_WORDS[Reason.BROKER_STOPPING]} before it could run; nothing ran"
    )


def test_the_block_says_when_the_mcp_client_may_answer_too() -> None:
    owner_only = approval_block(view({"path": "notes.txt"}), NOW).splitlines()
    both = attrs.evolve(view({"path": "notes.txt"}), approvers=("owner", "mcp-client"))
    lines = approval_block(both, NOW).splitlines()
    assert lines == [
        *owner_only[:3],
        "  answers    yours, or the MCP client's own prompt (the grant's approvers)",
        *owner_only[3:],
    ]
