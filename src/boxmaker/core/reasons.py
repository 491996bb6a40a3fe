"""Reason codes (docs/protocol.md lists them). The strings are the contract: records, answers
and docs use them."""

from __future__ import annotations

import enum


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
    # failures: a call that was decided to run and did not succeed (a ``failed`` answer)
    TOOL_ERROR = "tool_error"
    TIMEOUT = "timeout"
    NOT_FOUND = "not_found"
    TOO_LARGE = "too_large"
    PATH_ESCAPE = "path_escape"
    SANDBOX_UNAVAILABLE = "sandbox_unavailable"
    REQUESTER_GONE = "requester_gone"
    RESULT_UNRECORDED = "result_unrecorded"


RUNBOOK_TOO_MANY_PENDING = "docs/runbook.md#too-many-pending"
AUDIT_UNAVAILABLE_DETAIL = "an earlier write failed; see docs/runbook.md#audit-unavailable"
