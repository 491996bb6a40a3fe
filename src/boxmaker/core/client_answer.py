"""When an answer from the MCP client's own prompt counts. Pure.

``bxctl mcp serve`` may ask the MCP client to prompt its user (MCP elicitation) while a
call waits for the owner, and send the answer back on broker.sock (``client_answer``,
docs/protocol.md). That answer is the client software's, not the owner's
(docs/threat-model.md): it counts only where the grant that asks names
``"mcp-client"`` among its ``approvers`` (docs/mcp.md, "Answering in the client"), both
the grant the call asked on and the grant that asks at the answer (grants.toml may have
changed meanwhile); anything else changes nothing, and the call keeps waiting for the
owner. A counted answer ends the call as an owner's approve or refuse does (the
re-decision, the last look, the approval record), and its record names the client
(``by`` ``mcp-client``, ``approver`` ``mcp-client:<name>``). It never writes a grant.

>>> client_approver("Claude Code")
'mcp-client:Claude Code'
"""

from __future__ import annotations

from typing import Final

from boxmaker.core.approvals import PendingEntry
from boxmaker.core.decide import Ask, Verdict
from boxmaker.core.grants import MCP_CLIENT

CLIENT_REFUSED: Final = "refused in the MCP client {client}"
"""The reason the model is told of a refusal from the client's prompt."""


def client_approver(client: str) -> str:
    """The approval record's ``approver`` for an answer from the client ``client``."""
    return f"{MCP_CLIENT}:{client}"


def client_refusal(client: str) -> str:
    """The refusal's reason, as the model is told it and the record keeps it."""
    return CLIENT_REFUSED.format(client=client)


def not_counted(entry: PendingEntry, approval: str, verdict: Verdict | None) -> str | None:
    """Why a client's answer to ``approval`` does not count for the waiting ``entry``
    (None: it counts). ``verdict`` is the re-decision with the grants and state as they
    are at the answer (None when it was not made: the answer was turned away before).

    >>> import datetime as dt
    >>> from boxmaker.core.vocabulary import GrantRef
    >>> from boxmaker.core.labels import Taint
    >>> entry = PendingEntry.create(
    ...     approval="a-00000001", call="c-0000000000000001", session="s-000000000001",
    ...     tool="read_file", arguments={"path": "notes.txt"},
    ...     grant=GrantRef(id="notes", mode="ask"), taint=Taint.PUBLIC, untrusted=False,
    ...     requested_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC), now=0.0, timeout=300.0)
    >>> not_counted(entry, "a-00000001", None)
    'grant notes does not let the MCP client answer (approvers = ["owner"])'
    """
    if approval != entry.approval:
        return f"approval {approval} is not this call's ({entry.approval})"
    if MCP_CLIENT not in entry.approvers:
        return f"grant {entry.grant.id} does not let the MCP client answer {_shown(entry)}"
    if isinstance(verdict, Ask) and MCP_CLIENT not in verdict.grant.approvers:
        # An approved ask runs on the answer's word: only where the grant asking now says
        # the client's word may count. (A re-decision that runs or denies does not rest
        # on it.)
        grant = verdict.grant
        return (
            f"grant {grant.id}, which asks now, does not let the MCP client answer "
            f"(approvers = {_listed(grant.approvers)})"
        )
    return None


def _shown(entry: PendingEntry) -> str:
    return f"(approvers = {_listed(entry.approvers)})"


def _listed(approvers: tuple[str, ...]) -> str:
    return "[" + ", ".join(f'"{approver}"' for approver in approvers) + "]"
