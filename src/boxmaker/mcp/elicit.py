"""Answering a waiting call in the MCP client: elicitation as a second prompt channel
(docs/mcp.md, "Answering in the client").

Where a waiting call's grant lets the MCP client answer (its ``pending`` frame's
``approvers`` name ``mcp-client``) and the client declared form elicitation at
``initialize``, the serve asks the client to prompt its user: a form with one boolean,
whose message names the tool, its arguments (escaped, whole) and the grant. ``accept``
with true approves, ``accept`` with false refuses; ``decline``, ``cancel``, an error or
anything else sends nothing, and the owner can still answer. The answer goes to brokerd
as a ``client_answer`` on the call's own connection, named with the client's own name
from its ``clientInfo``; brokerd decides whether it counts
(:mod:`boxmaker.broker.client_answers`) and the record says it came from the client. The
serve never asks where the grant does not opt in, so an owner-only call is never shown
as if the client could answer it.
"""

from __future__ import annotations

import logging
from typing import Any, Final

import orjson
import trio
from mcp.server.context import ServerRequestContext

from boxmaker.core.grants import MCP_CLIENT
from boxmaker.core.vocabulary import Pending
from boxmaker.formats.printable import printable, printable_exactly
from boxmaker.wire import MAX_CLIENT, ClientAnswer, is_client_name

log = logging.getLogger("boxmaker.mcp")

Context = ServerRequestContext[Any, Any]

MAX_SHOWN: Final = 4000
"""Characters of escaped arguments the prompt may show. A call whose arguments are
longer is not asked in the client (only the owner answers it, with ``bxctl approvals``
showing them whole): an approval must not rest on a part of what runs."""
UNNAMED: Final = "unnamed"
"""The client's name in the record when its ``clientInfo`` gives none that shows."""
FIELD: Final = "approve"
SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        FIELD: {
            "type": "boolean",
            "title": "Approve this call",
            "description": "true runs it; false refuses it",
        }
    },
    "required": [FIELD],
}


def can_elicit(ctx: Context) -> bool:
    """Whether the client declared form elicitation (a bare ``elicitation: {}``, the
    only form before modes existed, counts; URL mode alone does not)."""
    declared = ctx.session.client_capabilities
    elicitation = declared.elicitation if declared is not None else None
    return elicitation is not None and (elicitation.form is not None or elicitation.url is None)


def client_name(ctx: Context) -> str:
    """The client's name from ``clientInfo``, made one that shows as it is (escaped,
    at most :data:`~boxmaker.wire.MAX_CLIENT` characters). The client chose it: it says
    which software answered, not who.

    The escape is :func:`printable_exactly`'s (ASCII), so two names that differ are
    recorded differently."""
    params = ctx.session.client_params
    name = params.client_info.name if params is not None else ""
    shown = printable_exactly(name)[:MAX_CLIENT].strip()
    return shown if is_client_name(shown) else UNNAMED


def message(tool: str, arguments: dict[str, Any], frame: Pending) -> str | None:
    """The prompt's text, or None when the arguments are too long to show whole."""
    shown = printable(orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS).decode())
    if len(shown) > MAX_SHOWN:
        return None
    return (
        f"boxmaker: the model asks to run {printable(tool)} with {shown} "
        f"(grant {printable(frame.grant)}, approval {frame.approval}). "
        "The grant lets your answer here count: approve to run it, or refuse it. "
        f"The owner may also answer with bxctl approve {frame.approval}."
    )


def wanted(frame: Pending) -> bool:
    """Whether the call's grant lets the client answer."""
    return MCP_CLIENT in frame.approvers


async def ask_client(
    ctx: Context,
    tool: str,
    arguments: dict[str, Any],
    frame: Pending,
    answers: trio.MemorySendChannel[ClientAnswer],
) -> None:
    """Prompt the client's user for ``frame``'s call; send a counted-or-not answer on
    ``answers``. Cancelled when the call ends otherwise."""
    text = message(tool, arguments, frame)
    if text is None:
        log.info("call %s: arguments too long to show in the client; the owner answers", frame.call)
        return
    try:
        result = await ctx.session.elicit_form(text, SCHEMA, related_request_id=ctx.request_id)
    except Exception as exc:
        # An error, a client that cannot, a malformed result: the owner answers.
        log.info("call %s: the client's prompt failed (%s)", frame.call, type(exc).__name__)
        return
    choice = (result.content or {}).get(FIELD) if result.action == "accept" else None
    if not isinstance(choice, bool):
        log.info("call %s: the client's prompt gave no answer (%s)", frame.call, result.action)
        return
    answer = ClientAnswer(approval=frame.approval, approve=choice, client=client_name(ctx))
    async with answers:
        await answers.send(answer)
