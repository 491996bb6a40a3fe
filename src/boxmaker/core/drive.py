"""The one loop that drives a call's machine: feed an event, carry out the effects it
gives through the driver's *ports*, feed what happened, until the call waits for its
owner or is over.

:class:`boxmaker.core.call.Call` says what to do; this loop is how: in what order the
effects are carried out, what each one's port answers with (the event fed back), and
the three rules of carrying out that are not the machine's: a ``pending`` frame that
cannot be sent ends its entry as the requester's leaving (unless someone else took the
entry first, whose ending then comes instead); an ending delivered before the wait
began is taken at once, without waiting; and a waiting call returns to its caller,
which waits and then carries on with :func:`resume`.

The ports (:class:`Ports`) are brokerd's I/O (:mod:`boxmaker.broker.connection`: the
ledger writer, the requester's socket, the runner, the state files, the approvals
table) or the stateful test's memory (tests/stateful/test_call_machine.py), so both run
this same loop. It is ``async`` because brokerd's ports await; a port that never
suspends makes the whole loop finish in one ``send(None)``, which is how the test, a
plain hypothesis state machine without trio, steps it. It returns at the wait instead
of waiting in a port, so that a waiting call's stack is its connection handler's frame
alone (docs/decisions.md, "The call as a state machine"). Pure: no I/O but its ports'.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, assert_never

from boxmaker.core.call import Call
from boxmaker.core.call_events import (
    AdminReply,
    AppendRecord,
    AwaitOwner,
    CallFrame,
    CallRecord,
    Close,
    Enqueue,
    Enqueued,
    Event,
    LastLook,
    Looked,
    RaiseState,
    Ran,
    Recorded,
    RecordFailed,
    ReplyAdmin,
    RequesterGone,
    RunVerdict,
    Send,
    StateRaised,
    StateUnrecordable,
)
from boxmaker.core.decide import Ask, Run
from boxmaker.core.labels import Label
from boxmaker.core.vocabulary import Pending

if TYPE_CHECKING:
    from boxmaker.core.approvals import PendingEntry


class Ports(Protocol):
    """What carrying out a call's effects needs. The ``async`` ports may suspend; the
    others answer at once."""

    async def record(self, body: CallRecord) -> bool:
        """Append ``body`` to the ledger; False when the ledger refused it."""
        ...

    async def send(self, frame: CallFrame) -> bool:
        """Send ``frame`` to the requester; False when the requester is gone. (Only a
        ``pending`` frame's answer matters: a port may raise instead for a final frame,
        after which nothing but the close follows.)"""
        ...

    def look(self) -> bool:
        """The last look: has the requester closed its end?"""
        ...

    async def run(self, verdict: Run | Ask, *, approved: bool) -> Ran | RequesterGone:
        """Run the call; :class:`RequesterGone` when its requester left while it ran and
        the run was stopped."""
        ...

    async def raise_state(self, session: str, label: Label) -> StateRaised | StateUnrecordable:
        """Raise the session's state by ``label``."""
        ...

    def enqueue(self, ask: Ask) -> Enqueued:
        """Make ``ask``'s pending entry and put it in the approvals table."""
        ...

    async def ending(self, entry: PendingEntry) -> Event | None:
        """How ``entry`` ended, once that was delivered (an approve comes back re-decided,
        :class:`~boxmaker.core.call_events.OwnerApproved`); None while nothing was."""
        ...

    def withdraw(self, approval: str) -> None:
        """The requester is gone before its wait began: end the entry as
        :class:`RequesterGone`, unless someone else took it first."""
        ...

    def reply(self, reply: AdminReply) -> None:
        """Tell the owner whose approve or refuse ended the wait how it was recorded."""
        ...

    def close(self) -> None:
        """The call is over: close the connection."""
        ...


async def drive(call: Call, event: Event, ports: Ports) -> AwaitOwner | None:
    """Feed ``event`` to ``call`` and carry out its effects through ``ports``, event after
    event. Returns the wait when the call waits for its owner and no ending was
    delivered yet (the caller waits, then calls :func:`resume` with its entry); None
    once it is over.

    An effect that gives an event back is the last of its list (core/call.py), so the
    next event is fed once the list is carried out.
    """
    next_event: Event | None = event
    while next_event is not None:
        effects = call.handle(next_event)
        next_event = None
        for effect in effects:
            match effect:
                case AppendRecord(body=body):
                    next_event = Recorded() if await ports.record(body) else RecordFailed()
                case Send(frame=frame):
                    if not await ports.send(frame) and isinstance(frame, Pending):
                        ports.withdraw(frame.approval)
                case LastLook():
                    next_event = Looked(ports.look())
                case RunVerdict(verdict=verdict, approved=approved):
                    next_event = await ports.run(verdict, approved=approved)
                case RaiseState(session=session, label=label):
                    next_event = await ports.raise_state(session, label)
                case Enqueue(ask=ask):
                    next_event = ports.enqueue(ask)
                case AwaitOwner(entry=entry):
                    next_event = await ports.ending(entry)
                    if next_event is None:
                        return effect
                case ReplyAdmin(reply=reply):
                    ports.reply(reply)
                case Close():
                    ports.close()
                case _:
                    assert_never(effect)  # pragma: no mutate - unreachable, mypy checks it
    return None


class NothingDelivered(RuntimeError):
    """:func:`resume` before the waiting call's ending was delivered: a driver bug."""


async def resume(call: Call, entry: PendingEntry, ports: Ports) -> AwaitOwner | None:
    """After the wait :func:`drive` returned (for ``entry``): carry on with the ending
    delivered."""
    ending = await ports.ending(entry)
    if ending is None:
        raise NothingDelivered(f"approval {entry.approval}: resumed with no ending")
    return await drive(call, ending, ports)
