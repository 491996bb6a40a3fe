"""The frames of broker.sock (docs/protocol.md): loopd asks, brokerd answers. The frames of
a call (``tool_request``, ``pending``, ``answer``, ``error``) are the call's vocabulary
(:mod:`boxmaker.core.vocabulary`); the catalogue's, the MCP client's answer and the
unions are here."""

from __future__ import annotations

from typing import Any, ClassVar, Final, Literal, TypeAlias

import attrs

from boxmaker.core.vocabulary import (
    Answer,
    ErrorFrame,
    Pending,
    ToolRequest,
    valid_approval_id,
)
from boxmaker.formats.convert import InvalidField

MAX_CLIENT: Final = 64
"""Characters of a ``client_answer``'s client name."""


def is_client_name(text: str) -> bool:
    """1 to :data:`MAX_CLIENT` printable characters (no controls, no format characters,
    no separators but the space): a name that shows as it is in a record and a log.

    >>> is_client_name("Claude Code"), is_client_name("a\u202eb"), is_client_name("")
    (True, False, False)
    """
    return 0 < len(text) <= MAX_CLIENT and text.isprintable() and bool(text.strip())


def _valid_client(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, str) or not is_client_name(value):
        raise InvalidField(attribute.name, f"expected 1 to {MAX_CLIENT} printable characters")


@attrs.frozen(kw_only=True)
class CatalogueRequest:
    KIND: ClassVar[str] = "catalogue"
    v: Literal[1] = 1


@attrs.frozen(kw_only=True)
class CatalogueAnswer:
    KIND: ClassVar[str] = "catalogue"
    final: Literal[True] = True
    tools: list[dict[str, Any]]


@attrs.frozen(kw_only=True)
class ClientAnswer:
    """``client_answer``: the MCP client's own prompt answered a waiting call
    (``bxctl mcp serve``'s elicitation). Meaningful only after a ``pending`` frame on
    the same connection, for that frame's approval; it counts only where the asking
    grant's ``approvers`` name ``"mcp-client"`` (:mod:`boxmaker.core.client_answer`).
    ``client``: the client's name from its ``clientInfo``."""

    KIND: ClassVar[str] = "client_answer"
    v: Literal[1] = 1
    approval: str = attrs.field(validator=valid_approval_id)
    approve: bool
    client: str = attrs.field(validator=_valid_client)


BrokerRequest: TypeAlias = ToolRequest | CatalogueRequest | ClientAnswer
"""What a broker.sock client may send (a ``client_answer`` only while its call waits)."""
BrokerAnswer: TypeAlias = Pending | Answer | CatalogueAnswer | ErrorFrame
"""What brokerd sends back on broker.sock."""
