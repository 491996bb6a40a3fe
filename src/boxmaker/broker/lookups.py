"""The lookups of one call's connections (docs/egress.md, "Per call, one lookup a name").

A call that opens many connections to one host (``pip install`` asks its index for each
package) looks the name up once, not once a connection: the lookup is a hop to a worker
thread and a query, the largest step of a connection's opening after its record
(docs/performance.md, "Egress through brokerd"). What is kept is only what a decision
already allowed to be looked up (the name is decided before any lookup); each
connection still checks the addresses against its own grant and dials one of them, and
an answer is kept :data:`KEPT_S` at most, so a long call follows a name that moves.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final

import attrs
import trio

KEPT_S: Final = 30.0
"""How long an answer serves a call's later connections."""
NAMES_KEPT: Final = 64
"""Names kept at most for one call; past it the oldest answers go."""


@attrs.define
class CallLookups:
    """``resolve(host, port)`` through :attr:`lookup`, each answer kept for the call."""

    lookup: Callable[[str, int], Awaitable[list[str]]]
    _kept: dict[tuple[str, int], tuple[float, list[str]]] = attrs.field(factory=dict, init=False)

    async def resolve(self, host: str, port: int) -> list[str]:
        """``host``'s addresses: a kept answer younger than :data:`KEPT_S`, or a new
        lookup (kept when it found any address; a failure or an empty answer is not)."""
        key = (host, port)
        now = trio.current_time()
        kept = self._kept.get(key)
        if kept is not None and now - kept[0] < KEPT_S:
            return list(kept[1])
        addresses = await self.lookup(host, port)
        if addresses:
            self._kept.pop(key, None)
            if len(self._kept) >= NAMES_KEPT:
                del self._kept[next(iter(self._kept))]
            self._kept[key] = (now, list(addresses))
        return addresses
