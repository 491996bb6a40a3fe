"""What a waiting call hears from its own requester: a ``client_answer``, or nothing.

A call waits in its connection's task (broker/connection.py); until MCP elicitation,
whatever its requester sent after its request meant nothing and was read and dropped.
Now ``bxctl mcp serve`` may send one ``client_answer`` frame (docs/protocol.md) for the
call's approval, the MCP client's own prompt's answer. What the requester sends is
still read as it comes (so it never keeps the socket readable), but cut into lines,
bounded: a line of at most :data:`MAX_AFTER_REQUEST` bytes is decoded; a longer one is
dropped whole without being held, and anything that is not a ``client_answer`` is
dropped as before. Only the first :data:`MAX_LINES` lines of a call are decoded.

A ``client_answer`` counts only where :func:`boxmaker.core.client_answer.not_counted`
says so: for this call's approval, where the grant it asked on and the grant that asks
now (the re-decision with the current grants, state and catalogue, made here before
the entry is taken) let the MCP client answer. It then ends the entry as an owner's
approve or refuse does (:meth:`~boxmaker.broker.pending.PendingCalls.end` with the
table's expiry boundary), and the call's task records it with the client named.
Anything else changes nothing: it is logged (at info once a call, then at debug), and
the call keeps waiting for the owner.
"""

from __future__ import annotations

import logging
from typing import Final

import trio

from boxmaker.broker.decide_now import BrokerSources, decide_now
from boxmaker.broker.pending import ClientAnswered
from boxmaker.broker.state import Broker
from boxmaker.core.approvals import PendingEntry
from boxmaker.core.client_answer import not_counted
from boxmaker.core.decide import Ruling
from boxmaker.core.vocabulary import ToolRequest
from boxmaker.wire import BadFrame, ClientAnswer, decode_broker_request

log = logging.getLogger("boxmaker.brokerd")

MAX_AFTER_REQUEST: Final = 4096
"""Bytes of one line a waiting call's requester may send (a ``client_answer`` is about
a hundred); a longer line is dropped as it comes, never held."""
MAX_LINES: Final = 16
"""Lines of one waiting call that are decoded; what comes after is dropped unread, as
before answers existed, so a requester that floods lines costs brokerd no more than one
that floods bytes."""


class AfterRequest:
    """The lines a waiting call's requester sends after its request, cut as they come.

    Holds at most :data:`MAX_AFTER_REQUEST` bytes of a line not yet ended; a line that
    grows past it is dropped up to its end."""

    __slots__ = ("_lines_left", "_partial", "_skipping", "told")

    def __init__(self) -> None:
        self._partial = b""
        self._skipping = False
        self._lines_left = MAX_LINES
        self.told = False
        """An ignored frame of this call was logged at info already."""

    def feed(self, data: bytes) -> list[bytes]:
        """The whole lines ``data`` ends (without their newline), each at most
        :data:`MAX_AFTER_REQUEST` bytes.

        >>> after = AfterRequest()
        >>> after.feed(b'{"a"'), after.feed(b':1}\\n{"b"'), after.feed(b'x' * 5000 + b'\\nok\\n')
        ([], [b'{"a":1}'], [b'ok'])

        After :data:`MAX_LINES` lines (empty ones not counted), nothing more is cut.
        """
        if self._lines_left <= 0:
            return []
        lines: list[bytes] = []
        *ended, rest = data.split(b"\n")
        for piece in ended:
            line, self._partial = self._partial + piece, b""
            if line and not self._skipping and len(line) <= MAX_AFTER_REQUEST:
                lines.append(line)
            self._skipping = False
            if len(lines) == self._lines_left:
                break
        self._lines_left -= len(lines)
        if self._lines_left <= 0:
            self._partial = b""
            return lines
        if self._skipping:
            return lines
        if len(self._partial) + len(rest) > MAX_AFTER_REQUEST:
            self._partial, self._skipping = b"", True
        else:
            self._partial += rest
        return lines


async def heard(
    broker: Broker,
    request: ToolRequest,
    asked: Ruling | None,
    entry: PendingEntry,
    after: AfterRequest,
    data: bytes,
) -> None:
    """Act on what the requester of ``entry``'s call sent while it waits: each counted
    ``client_answer`` ends the entry (the first one does; the entry is gone for any
    later one). ``asked``: the call's first decision (the re-decision keeps its
    definition hash, as an owner's approve's does)."""
    for line in after.feed(data):
        try:
            frame = decode_broker_request(line)
        except BadFrame as exc:
            _ignored(after, entry, f"not a frame brokerd reads here ({exc.detail})")
            continue
        if not isinstance(frame, ClientAnswer):
            _ignored(after, entry, f"a {frame.KIND} frame while the call waits")
            continue
        why = not_counted(entry, frame.approval, None)
        if why is None:
            grants = await broker.grants.current()
            verdict = await decide_now(
                request, grants, BrokerSources(broker), look_before_asking=False, asked=asked
            )
            why = not_counted(entry, frame.approval, verdict)
        if why is not None:
            _ignored(after, entry, f"a client_answer from {frame.client!r} does not count: {why}")
            continue
        # No checkpoint between the re-decision and the take: it is as current as an
        # owner's approve's (made just after its take).
        command = ClientAnswered(frame.approve, frame.client, verdict)
        ended = broker.pending.end(entry.approval, command, now=trio.current_time())
        if ended is not None:
            answer = "approved" if frame.approve else "refused"
            log.info("call %s: %s in the MCP client %r", entry.call, answer, frame.client)
        return


def _ignored(after: AfterRequest, entry: PendingEntry, why: str) -> None:
    level = logging.DEBUG if after.told else logging.INFO
    after.told = True
    log.log(level, "call %s (approval %s): ignored %s", entry.call, entry.approval, why)
