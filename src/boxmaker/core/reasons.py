"""Reason codes (docs/protocol.md lists them). The strings are the contract: records, answers
and docs use them. :data:`REASON_WORDS` says each in words, for the owner (``bxctl why``,
an approve's answer): one table, every code in it (tests/core/test_reasons.py)."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Final


class Reason(enum.StrEnum):
    # denials: a call that was not run
    UNKNOWN_TOOL = "unknown_tool"
    BAD_ARGUMENTS = "bad_arguments"
    GRANTS_INVALID = "grants_invalid"
    STATE_UNREADABLE = "state_unreadable"
    NO_GRANT = "no_grant"
    DENIED_BY_GRANT = "denied_by_grant"
    TAINT_EXCEEDED = "taint_exceeded"
    UNTRUSTED = "untrusted"
    REFUSED = "refused"
    EXPIRED = "expired"
    WITHDRAWN = "withdrawn"
    AUDIT_UNAVAILABLE = "audit_unavailable"
    BROKER_STOPPING = "broker_stopping"
    TOO_MANY_PENDING = "too_many_pending"
    """An ask while ``[broker] max_pending`` calls already wait for the owner."""
    TOOL_NOT_PINNED = "tool_not_pinned"
    """An MCP server's tool the owner has not accepted (``bxctl mcp pin``)."""
    TOOL_CHANGED = "tool_changed"
    """An MCP server's tool whose definition is not the one pinned, or not the one an
    ask was decided on (an approval binds the definition)."""
    WITNESS_LAGGING = "witness_lagging"
    """A risky call while a witness lags and ``[ledger] witness_lag = "deny_risky"``."""
    # failures: a call that was decided to run and did not succeed (a ``failed`` answer)
    TOOL_ERROR = "tool_error"
    TIMEOUT = "timeout"
    NOT_FOUND = "not_found"
    TOO_LARGE = "too_large"
    PATH_ESCAPE = "path_escape"
    SANDBOX_UNAVAILABLE = "sandbox_unavailable"
    REQUESTER_GONE = "requester_gone"
    RESULT_UNRECORDED = "result_unrecorded"
    MCP_SERVER_FAILED = "mcp_server_failed"
    """An MCP server died, timed out or answered with an error while running a call."""


REASON_WORDS: Final[Mapping[Reason, str]] = {
    Reason.UNKNOWN_TOOL: "the model asked for a tool that does not exist",
    Reason.BAD_ARGUMENTS: "its arguments did not fit the tool",
    Reason.GRANTS_INVALID: "grants.toml was invalid",
    Reason.STATE_UNREADABLE: "the session's state could not be read",
    Reason.NO_GRANT: "no grant allows it",
    Reason.DENIED_BY_GRANT: "a deny grant matches it",
    Reason.TAINT_EXCEEDED: "the session's taint was above the grant's max_taint",
    Reason.UNTRUSTED: "the session was untrusted and the grant says if_untrusted = deny",
    Reason.REFUSED: "the owner refused it",
    Reason.EXPIRED: "nobody answered in time",
    Reason.WITHDRAWN: "it was withdrawn before it ran",
    Reason.AUDIT_UNAVAILABLE: "the ledger could not be written",
    Reason.BROKER_STOPPING: "brokerd was stopping",
    Reason.TOO_MANY_PENDING: "too many calls already waited for the owner",
    Reason.TOOL_NOT_PINNED: "the MCP tool was not pinned (accepted) by the owner",
    Reason.TOOL_CHANGED: "the MCP tool's definition changed since it was pinned or asked about",
    Reason.WITNESS_LAGGING: (
        "a witness was too far behind the ledger and risky calls were stopped until it cosigns"
    ),
    Reason.TOOL_ERROR: "the tool failed",
    Reason.TIMEOUT: "it ran past its time limit",
    Reason.NOT_FOUND: "the file or directory does not exist",
    Reason.TOO_LARGE: "it was over the size limit",
    Reason.PATH_ESCAPE: "the path leads outside the workspace or the grant",
    Reason.SANDBOX_UNAVAILABLE: "the sandbox could not be set up",
    Reason.REQUESTER_GONE: "the requester left (its chat or turn ended)",
    Reason.RESULT_UNRECORDED: "its result could not be recorded",
    Reason.MCP_SERVER_FAILED: "the MCP server failed while running it",
}
"""Each reason code in words, for the owner."""


def reason_words(code: object) -> str | None:
    """The words of ``code`` when it is a reason code (a record's reason may also be the
    owner's own text: an approval's ``refused``), else None.

    >>> reason_words("no_grant"), reason_words("not today")
    ('no grant allows it', None)
    """
    if not isinstance(code, str):
        return None
    try:
        return REASON_WORDS[Reason(code)]
    except ValueError:
        return None


RUNBOOK_TOO_MANY_PENDING = "docs/runbook.md#too-many-pending"
AUDIT_UNAVAILABLE_DETAIL = "an earlier write failed; see docs/runbook.md#audit-unavailable"
