"""The frames of broker.sock (docs/protocol.md): loopd asks, brokerd answers. The frames of
a call (``tool_request``, ``pending``, ``answer``, ``error``) are the call's vocabulary
(:mod:`boxmaker.core.vocabulary`); the catalogue's and the unions are here."""

from __future__ import annotations

from typing import Any, ClassVar, Literal, TypeAlias

import attrs

from boxmaker.core.vocabulary import Answer, ErrorFrame, Pending, ToolRequest


@attrs.frozen(kw_only=True)
class CatalogueRequest:
    KIND: ClassVar[str] = "catalogue"
    v: Literal[1] = 1


@attrs.frozen(kw_only=True)
class CatalogueAnswer:
    KIND: ClassVar[str] = "catalogue"
    final: Literal[True] = True
    tools: list[dict[str, Any]]


BrokerRequest: TypeAlias = ToolRequest | CatalogueRequest
"""What a broker.sock client may send."""
BrokerAnswer: TypeAlias = Pending | Answer | CatalogueAnswer | ErrorFrame
"""What brokerd sends back on broker.sock."""
