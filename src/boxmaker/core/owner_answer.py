"""What an owner's approve or refuse does and answers, step by step. Pure.

admin.sock's approve and refuse (broker/admin.py) carry these decisions out; the
approvals table, grants.toml and the waiting call are theirs (the I/O). An approve with
``always`` goes:

1. the entry must still wait (:func:`late`): gone, or at or after its deadline, the
   owner hears the late answer (``expired``, or ``no_such_approval`` saying how it
   ended) and nothing is written;
2. the grant to write (:func:`grant_to_write`), made from the grant that asked as
   grants.toml says it now (:func:`boxmaker.core.grant_scope.asked`, then
   ``always_grant``): when there can be none, ``grant_not_written`` says why and the
   call still waits;
3. writing it may fail: ``grant_not_written`` with the writer's reason
   (:func:`not_written`), and the call still waits;
4. the entry is taken, as for every approve and refuse (:func:`after_take`): taken by
   this answer, the call's task records it and replies (:func:`unanswered` says the
   error when it could not); ended meanwhile (it expired, someone else answered, its
   requester left), a grant written for it is removed again and the owner hears the
   late answer.

The codes are those of docs/protocol.md's ``error`` frame.
"""

from __future__ import annotations

import datetime as dt
import enum
from typing import Any, Final

import attrs

from boxmaker.core.approvals import PendingEntry
from boxmaker.core.call_events import AdminReply, NotRecorded
from boxmaker.core.external_tools import EMPTY_CATALOGUE, ExternalCatalogue
from boxmaker.core.grant_parse import GrantsProblem
from boxmaker.core.grant_scope import Scope, ScopeProblem, always_grant, asked, grant_of
from boxmaker.core.grants import Grant, GrantSet

CALL_ENDED: Final = "the call ended before its approval was recorded (is brokerd stopping?)"


class Found(enum.Enum):
    """The entry as an owner's answer finds it, before its grant is written and when it
    takes the entry."""

    WAITING = "waiting"
    """In the table before its deadline (taking it delivers this answer)."""
    EXPIRED = "expired"
    """In the table at or after its deadline (taking it delivers the expiry instead)."""
    GONE = "gone"
    """Not in the table: it ended before, or never was."""

    @classmethod
    def of(cls, entry: PendingEntry | None, now: float) -> Found:
        """How ``entry`` (the table's, None when there is none) stands at ``now``
        (monotonic seconds), by the table's expiry boundary."""
        if entry is None:
            return cls.GONE
        return cls.EXPIRED if entry.is_expired(now) else cls.WAITING


class EarlierEnd(enum.Enum):
    """How an entry ended before an owner's answer came, as brokerd remembers it."""

    EXPIRED = "expired"
    WITHDRAWN = "withdrawn"


def late_owner_answer(approval: str, earlier: EarlierEnd | None) -> tuple[str, str]:
    """What an approve or refuse of an entry no longer in the table hears: ``expired``
    when it expired (so one racing the expiry hears the same whichever took the entry
    first); ``no_such_approval`` otherwise, saying so when its requester left first (a
    chat ended with Ctrl-C). (error code, detail).

    >>> late_owner_answer("a-00000001", EarlierEnd.WITHDRAWN)[1]
    'approval a-00000001 was withdrawn: its requester left before anyone answered; nothing ran'
    """
    if earlier is EarlierEnd.EXPIRED:
        return "expired", f"approval {approval} expired"
    if earlier is EarlierEnd.WITHDRAWN:
        return "no_such_approval", (
            f"approval {approval} was withdrawn: its requester left before anyone answered; "
            "nothing ran"
        )
    return "no_such_approval", f"no pending approval {approval}"


@attrs.frozen
class OwnerError:
    """An ``error`` answer to the owner."""

    code: str
    detail: str


@attrs.frozen
class GrantToWrite:
    """The approve-always grant to write: its ``[[grant]]`` table's keys in the order
    they are written, and the grant as brokerd will read it."""

    table: dict[str, Any]
    grant: Grant


@attrs.frozen
class AfterTake:
    """What an owner's answer does once it took the entry or found it ended: wait for
    the call's reply (``error`` None), or answer ``error``; ``unwrite`` is the grant
    written for an entry that ended meanwhile, to remove again."""

    error: OwnerError | None
    unwrite: str | None = None


def late(approval: str, found: Found, earlier: EarlierEnd | None) -> OwnerError | None:
    """None while the entry waits; else what the owner hears: ``expired`` when it is at
    its deadline or is remembered as expired (``earlier``: how brokerd remembers it
    ended), ``no_such_approval`` otherwise, saying so when its requester left first."""
    if found is Found.WAITING:
        return None
    code, detail = late_owner_answer(
        approval, EarlierEnd.EXPIRED if found is Found.EXPIRED else earlier
    )
    return OwnerError(code, detail)


def not_written(detail: str) -> OwnerError:
    """No grant could be written (``detail`` says why); the call still waits."""
    return OwnerError("grant_not_written", f"no grant written, the call still waits: {detail}")


def grant_to_write(
    entry: PendingEntry,
    grants: GrantSet | GrantsProblem,
    *,
    scope: Scope,
    lasting: dt.timedelta | None,
    owner: str,
    now: dt.datetime,
    workspace: str,
    external: ExternalCatalogue = EMPTY_CATALOGUE,
) -> GrantToWrite | OwnerError:
    """The grant an approve-always of the waiting ``entry`` writes, made from the grant
    that asked as ``grants`` (grants.toml now) says it and the entry's arguments checked
    again in ``workspace`` (a real path); or ``grant_not_written`` saying why there is
    none (grants.toml invalid, the asking grant gone or expired, arguments that no
    longer fit, a call no grant can name). ``lasting`` is ``--for``; ``now`` is aware;
    ``external`` the external tools' catalogue now."""
    found = asked(
        grants,
        grant=entry.grant.id,
        tool=entry.tool,
        arguments=entry.arguments,
        workspace=workspace,
        external=external,
    )
    if isinstance(found, ScopeProblem):
        return not_written(found.message)
    table = always_grant(
        approval=entry.approval,
        call=entry.call,
        arguments=found.arguments,
        asking=found.asking,
        scope=scope,
        lasting=lasting,
        owner=owner,
        now=now,
    )
    if isinstance(table, ScopeProblem):
        return not_written(table.message)
    return GrantToWrite(table, grant_of(table))


def after_take(
    approval: str, found: Found, *, written: str | None, earlier: EarlierEnd | None
) -> AfterTake:
    """What an approve or refuse does once it tried to take the entry: ``found``
    WAITING, it took it, and the call's task records the answer (with the grant
    ``written``, if any) and replies; otherwise the entry ended before this answer came,
    the grant written for it goes again, and the owner hears the late answer."""
    if found is Found.WAITING:
        return AfterTake(None)
    return AfterTake(late(approval, found, earlier), unwrite=written)


def unanswered(reply: AdminReply | None) -> OwnerError | None:
    """The ``internal`` error the owner hears when the call's task did not record their
    answer: it ended without replying (``reply`` None), or the record failed; None for
    a recorded answer."""
    if reply is None:
        return OwnerError("internal", CALL_ENDED)
    if isinstance(reply, NotRecorded):
        return OwnerError("internal", reply.detail)
    return None
