"""An owner's approve or refuse, step by step (core/owner_answer.py): the entry still
waiting, the approve-always grant to write or why there is none, a failed write, the
take (a grant written for an entry that ended meanwhile goes again), an unrecorded
answer; every case with its exact answer."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from tests.harness.grants import grant_set
from tests.harness.homes import grant

from boxmaker.core.approvals import GrantRef, PendingEntry
from boxmaker.core.call_events import ApprovedReply, NotRecorded, RefusedReply
from boxmaker.core.grant_parse import GrantsProblem
from boxmaker.core.grant_scope import Asked, Scope, always_grant, asked, grant_of
from boxmaker.core.labels import Taint
from boxmaker.core.owner_answer import (
    CALL_ENDED,
    AfterTake,
    EarlierEnd,
    Found,
    GrantToWrite,
    OwnerError,
    after_take,
    grant_to_write,
    late,
    late_owner_answer,
    not_written,
    unanswered,
)
from boxmaker.core.vocabulary import ApprovalOutcome

NOW = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)
APPROVAL = "a-1f2e3d4c"
WORKSPACE = "/home/owner/ws"
ASKING = grant("read-notes", "read_file", "ask", paths=["notes/**"]) + 'max_taint = "internal"\n'


def entry(
    tool: str = "read_file", arguments: dict[str, Any] | None = None, *, asking: str = "read-notes"
) -> PendingEntry:
    return PendingEntry.create(
        approval=APPROVAL,
        call="c-00000000000000c1",
        session="s-0123456789ab",
        tool=tool,
        arguments={"path": "notes/a.txt"} if arguments is None else arguments,
        grant=GrantRef(id=asking, mode="ask"),
        taint=Taint.PUBLIC,
        untrusted=False,
        requested_at=NOW,
        now=100.0,
        timeout=300.0,
    )


# --- 1. the entry must still wait ---------------------------------------------------------


def test_how_an_entry_is_found_by_the_tables_boundary() -> None:
    waiting = entry()
    assert waiting.deadline == 400.0
    assert Found.of(None, 0.0) is Found.GONE
    assert Found.of(waiting, 399.999) is Found.WAITING
    assert Found.of(waiting, 400.0) is Found.EXPIRED
    assert Found.of(waiting, 400.001) is Found.EXPIRED


@pytest.mark.parametrize("earlier", [None, EarlierEnd.EXPIRED, EarlierEnd.WITHDRAWN])
def test_a_waiting_entry_is_answered_by_its_call(earlier: EarlierEnd | None) -> None:
    assert late(APPROVAL, Found.WAITING, earlier) is None


@pytest.mark.parametrize(
    ("found", "earlier", "answer"),
    [
        # At its deadline: expired, whatever is remembered (the expiry takes it now).
        (Found.EXPIRED, None, OwnerError("expired", "approval a-1f2e3d4c expired")),
        (Found.EXPIRED, EarlierEnd.WITHDRAWN, OwnerError("expired", "approval a-1f2e3d4c expired")),
        # Gone: as brokerd remembers it ended.
        (Found.GONE, EarlierEnd.EXPIRED, OwnerError("expired", "approval a-1f2e3d4c expired")),
        (
            Found.GONE,
            EarlierEnd.WITHDRAWN,
            OwnerError(
                "no_such_approval",
                "approval a-1f2e3d4c was withdrawn: its requester left before anyone "
                "answered; nothing ran",
            ),
        ),
        (Found.GONE, None, OwnerError("no_such_approval", "no pending approval a-1f2e3d4c")),
    ],
)
def test_an_entry_that_no_longer_waits_hears_how_it_ended(
    found: Found, earlier: EarlierEnd | None, answer: OwnerError
) -> None:
    assert late(APPROVAL, found, earlier) == answer


# --- 2. the grant to write ------------------------------------------------------------------


def plan(
    waiting: PendingEntry,
    grants: str | GrantsProblem = ASKING,
    *,
    scope: Scope = Scope.EXACT,
    lasting: dt.timedelta | None = None,
) -> GrantToWrite | OwnerError:
    return grant_to_write(
        waiting,
        grants if isinstance(grants, GrantsProblem) else grant_set(grants),
        scope=scope,
        lasting=lasting,
        owner="owner",
        now=NOW,
        workspace=WORKSPACE,
    )


def test_the_grant_to_write_is_the_one_grant_scope_makes_of_the_asking_grant() -> None:
    waiting = entry()
    planned = plan(waiting, scope=Scope.DIR, lasting=dt.timedelta(hours=1))
    found = asked(
        grant_set(ASKING),
        grant="read-notes",
        tool="read_file",
        arguments=waiting.arguments,
        workspace=WORKSPACE,
    )
    assert isinstance(found, Asked)
    table = always_grant(
        approval=APPROVAL,
        call="c-00000000000000c1",
        arguments=found.arguments,
        asking=found.asking,
        scope=Scope.DIR,
        lasting=dt.timedelta(hours=1),
        owner="owner",
        now=NOW,
    )
    assert isinstance(table, dict)
    assert planned == GrantToWrite(table, grant_of(table))
    assert table["id"] == "always-a-1f2e3d4c"
    assert table["paths"] == ["notes/*"]
    assert table["max_taint"] == "internal"
    assert table["expires"] == dt.datetime(2026, 6, 1, 13, 0, tzinfo=dt.UTC)
    assert table["note"] == (
        "approved always by owner at 2026-06-01T12:00:00Z for approval a-1f2e3d4c "
        "(call c-00000000000000c1)"
    )


def test_an_absolute_path_in_the_workspace_is_checked_in_that_workspace() -> None:
    planned = plan(entry(arguments={"path": f"{WORKSPACE}/notes/a.txt"}))
    assert isinstance(planned, GrantToWrite)
    assert planned.table["paths"] == ["notes/a.txt"]


PREFIX = "no grant written, the call still waits: "


@pytest.mark.parametrize(
    ("waiting", "grants", "scope", "why"),
    [
        (
            entry(),
            GrantsProblem("grants.toml", "read-notes", "mode", "expected one of auto, ask, deny"),
            Scope.EXACT,
            "grants.toml is invalid: grants.toml, grant 'read-notes', key 'mode': "
            "expected one of auto, ask, deny",
        ),
        (
            entry(asking="read-docs"),
            ASKING,
            Scope.EXACT,
            "grant read-docs, which asked, is no longer in grants.toml",
        ),
        (
            entry(arguments={"path": "/elsewhere/notes/a.txt"}),
            ASKING,
            Scope.EXACT,
            "argument 'path': absolute path outside the workspace",
        ),
        (
            entry("shell", {"command": "git status"}, asking="git"),
            grant("git", "shell", "ask", commands=["git *"]),
            Scope.DIR,
            "--scope dir applies to file tools only, not shell",
        ),
        (
            entry(arguments={"path": "."}, asking="read-any"),
            grant("read-any", "read_file", "ask"),
            Scope.EXACT,
            "a glob cannot name the workspace root alone; approve it once",
        ),
        (
            entry(),
            ASKING + "expires = 2026-06-01T12:00:00Z\n",
            Scope.EXACT,
            "grant read-notes, which asked, has expired",
        ),
    ],
)
def test_no_grant_to_write_says_why_and_the_call_still_waits(
    waiting: PendingEntry, grants: str | GrantsProblem, scope: Scope, why: str
) -> None:
    assert plan(waiting, grants, scope=scope) == OwnerError("grant_not_written", PREFIX + why)


# --- 3. the write fails ---------------------------------------------------------------------


def test_a_failed_write_is_grant_not_written_with_the_writers_reason() -> None:
    assert not_written("grants.toml is locked by another writer") == OwnerError(
        "grant_not_written",
        "no grant written, the call still waits: grants.toml is locked by another writer",
    )


# --- 4. the take ----------------------------------------------------------------------------


@pytest.mark.parametrize("written", [None, "always-a-1f2e3d4c"])
@pytest.mark.parametrize("earlier", [None, EarlierEnd.EXPIRED, EarlierEnd.WITHDRAWN])
def test_an_answer_that_took_the_entry_waits_for_the_calls_reply_and_keeps_its_grant(
    written: str | None, earlier: EarlierEnd | None
) -> None:
    assert after_take(APPROVAL, Found.WAITING, written=written, earlier=earlier) == AfterTake(
        None, None
    )


@pytest.mark.parametrize(
    ("found", "earlier", "answer"),
    [
        (Found.EXPIRED, None, OwnerError("expired", "approval a-1f2e3d4c expired")),
        (Found.GONE, EarlierEnd.EXPIRED, OwnerError("expired", "approval a-1f2e3d4c expired")),
        (
            Found.GONE,
            EarlierEnd.WITHDRAWN,
            OwnerError(
                "no_such_approval",
                "approval a-1f2e3d4c was withdrawn: its requester left before anyone "
                "answered; nothing ran",
            ),
        ),
        # Another owner's answer took it first: not remembered.
        (Found.GONE, None, OwnerError("no_such_approval", "no pending approval a-1f2e3d4c")),
    ],
)
@pytest.mark.parametrize("written", [None, "always-a-1f2e3d4c"])
def test_an_entry_that_ended_meanwhile_answers_late_and_its_grant_goes_again(
    found: Found, earlier: EarlierEnd | None, answer: OwnerError, written: str | None
) -> None:
    assert after_take(APPROVAL, found, written=written, earlier=earlier) == AfterTake(
        answer, unwrite=written
    )


# --- the call's reply -----------------------------------------------------------------------


def test_an_answer_the_call_did_not_record_is_internal() -> None:
    assert CALL_ENDED == "the call ended before its approval was recorded (is brokerd stopping?)"
    assert unanswered(None) == OwnerError("internal", CALL_ENDED)
    assert unanswered(NotRecorded("the ledger refused the approval record")) == OwnerError(
        "internal", "the ledger refused the approval record"
    )


def test_a_recorded_answer_is_no_error() -> None:
    assert unanswered(RefusedReply()) is None
    assert unanswered(ApprovedReply(ApprovalOutcome.ALLOWED, None)) is None


def test_a_late_owner_answer_after_its_requester_left_hears_why() -> None:
    assert late_owner_answer("a-00000001", EarlierEnd.WITHDRAWN) == (
        "no_such_approval",
        "approval a-00000001 was withdrawn: its requester left before anyone answered; nothing ran",
    )


def test_a_late_owner_answer_hears_expired_only_after_an_expiry() -> None:
    assert late_owner_answer("a-00000001", EarlierEnd.EXPIRED) == (
        "expired",
        "approval a-00000001 expired",
    )
    assert late_owner_answer("a-00000001", None) == (
        "no_such_approval",
        "no pending approval a-00000001",
    )
