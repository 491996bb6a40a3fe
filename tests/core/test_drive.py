"""core/drive.py: the one loop that carries out a call's effects through its ports.

Each rule of the loop, pinned with ports that write down what they are asked (the
stateful test, tests/stateful/test_call_machine.py, drives the same loop over any
interleaving): the order of the ports, what each answer feeds back, a pending frame that
cannot be sent, an ending delivered before the wait, the return at the wait and the
resume after it. The ports never suspend, so one ``send(None)`` runs the loop (no trio).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Coroutine
from typing import Any, Final, TypeVar

import attrs
import pytest

from boxmaker.core import call_events as ev
from boxmaker.core.approvals import PendingEntry
from boxmaker.core.call import Call
from boxmaker.core.call_phases import Phase
from boxmaker.core.decide import Ask, Run, Verdict, evaluate
from boxmaker.core.drive import NothingDelivered, drive, resume
from boxmaker.core.grant_parse import parse_grants
from boxmaker.core.grants import GrantSet
from boxmaker.core.labels import FRESH, Label, Taint
from boxmaker.core.reasons import AUDIT_UNAVAILABLE_DETAIL, Reason
from boxmaker.core.vocabulary import Answer, Decision, Pending, ToolRequest

CALL: Final = "c-0000000000000001"
SESSION: Final = "s-0000000000a1"
BOOT: Final = "b-0000000000000001"
NOW: Final = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
LABEL: Final = Label(Taint.INTERNAL, False)
T = TypeVar("T")


def step(coroutine: Coroutine[Any, Any, T]) -> T:
    try:
        coroutine.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    coroutine.close()
    raise AssertionError("a port suspended")


def verdict(mode: str) -> Verdict:
    grants = parse_grants(f'[[grant]]\nid = "g"\ntool = "read_file"\nmode = "{mode}"\n')
    assert isinstance(grants, GrantSet)
    request = ToolRequest(
        call=CALL, session=SESSION, tool="read_file", arguments={"path": "notes.txt"}
    )
    return evaluate(request, ledger_usable=True, grants=grants, state=FRESH, now=NOW)


@attrs.define
class Ports:
    """Ports that answer as told and write down each use."""

    log: list[tuple[str, Any]] = attrs.Factory(list)
    recorded: bool = True
    sent: bool = True
    gone: bool = False
    endings: list[ev.Event | None] = attrs.Factory(list)
    """What each ``ending`` answers, in turn (then None)."""
    entry: PendingEntry | None = None

    async def record(self, body: ev.CallRecord) -> bool:
        self.log.append(("record", type(body).__name__))
        return self.recorded

    async def send(self, frame: ev.CallFrame) -> bool:
        self.log.append(("send", frame))
        return self.sent

    def look(self) -> bool:
        self.log.append(("look", self.gone))
        return self.gone

    async def run(self, verdict: Run | Ask, *, approved: bool) -> ev.Ran | ev.RequesterGone:
        self.log.append(("run", verdict, approved))
        return ev.Ran(ev.RunOutcome(True, None, None, "hi", LABEL))

    async def raise_state(self, session: str, label: Label) -> ev.StateRaised:
        self.log.append(("raise", session, label))
        return ev.StateRaised(label)

    def enqueue(self, ask: Ask) -> ev.Enqueued:
        self.entry = PendingEntry.for_ask(
            ask, approval="a-00000001", requested_at=NOW, now=100.0, timeout=300.0
        )
        self.log.append(("enqueue", self.entry.approval))
        return ev.Enqueued(self.entry)

    async def ending(self, entry: PendingEntry) -> ev.Event | None:
        assert entry == self.entry
        answer = self.endings.pop(0) if self.endings else None
        self.log.append(("ending", answer))
        return answer

    def withdraw(self, approval: str) -> None:
        self.log.append(("withdraw", approval))

    def reply(self, reply: ev.AdminReply) -> None:
        self.log.append(("reply", reply))

    def close(self) -> None:
        self.log.append(("close", None))


def new_call() -> Call:
    return Call(CALL, SESSION, boot=BOOT, pending_timeout=300.0)


def test_an_auto_run_is_carried_out_port_by_port_in_the_table_s_order() -> None:
    call, ports, run = new_call(), Ports(), verdict("auto")
    assert step(drive(call, ev.Decided(run), ports)) is None
    assert ports.log == [
        ("record", "Decision"),
        ("look", False),
        ("run", run, False),
        ("raise", SESSION, LABEL),
        ("record", "Result"),
        ("send", Answer.ok(CALL, "hi", LABEL)),
        ("close", None),
    ]
    assert call.phase is Phase.DONE


def test_a_record_the_ledger_refuses_is_fed_back_as_record_failed() -> None:
    call, ports = new_call(), Ports(recorded=False)
    assert step(drive(call, ev.Decided(verdict("auto")), ports)) is None
    denied = Answer.denied(CALL, Reason.AUDIT_UNAVAILABLE, AUDIT_UNAVAILABLE_DETAIL)
    assert ports.log == [("record", "Decision"), ("send", denied), ("close", None)]


def test_a_gone_requester_at_the_last_look_is_fed_back() -> None:
    call, ports = new_call(), Ports(gone=True)
    assert step(drive(call, ev.Decided(verdict("auto")), ports)) is None
    assert ports.log == [
        ("record", "Decision"),
        ("look", True),
        ("record", "Result"),
        ("close", None),
    ]


def test_an_ask_returns_at_the_wait_and_resumes_with_its_ending() -> None:
    call, ports = new_call(), Ports()
    ask = verdict("ask")
    waiting = step(drive(call, ev.Decided(ask), ports))
    assert ports.entry is not None
    assert waiting == ev.AwaitOwner(ports.entry)
    assert ports.log == [
        ("record", "Decision"),
        ("enqueue", "a-00000001"),
        ("send", Pending.of(ports.entry)),
        ("ending", None),
    ]
    assert call.phase is Phase.WAITING
    ports.log.clear()
    ports.endings = [ev.OwnerRefused("not now")]
    assert step(resume(call, waiting.entry, ports)) is None
    assert ports.log == [
        ("ending", ev.OwnerRefused("not now")),
        ("record", "Approval"),
        ("reply", ev.RefusedReply()),
        ("send", Answer.denied(CALL, Reason.REFUSED, "not now")),
        ("close", None),
    ]


def test_resuming_before_an_ending_was_delivered_is_a_driver_bug() -> None:
    call, ports = new_call(), Ports()
    waiting = step(drive(call, ev.Decided(verdict("ask")), ports))
    assert waiting is not None
    with pytest.raises(NothingDelivered) as raised:
        step(resume(call, waiting.entry, ports))
    assert str(raised.value) == "approval a-00000001: resumed with no ending"
    assert call.phase is Phase.WAITING


def test_an_ending_delivered_before_the_wait_is_taken_at_once() -> None:
    call, ports = new_call(), Ports(endings=[ev.Expired()])
    assert step(drive(call, ev.Decided(verdict("ask")), ports)) is None
    assert ports.log[-4:] == [
        ("ending", ev.Expired()),
        ("record", "Approval"),
        ("send", Answer.denied(CALL, Reason.EXPIRED, "no approval within 300 s")),
        ("close", None),
    ]


def test_a_pending_frame_that_cannot_be_sent_withdraws_its_entry() -> None:
    # The withdrawal is delivered as the entry's ending, which the wait then takes.
    call, ports = new_call(), Ports(sent=False, endings=[ev.RequesterGone()])
    assert step(drive(call, ev.Decided(verdict("ask")), ports)) is None
    assert ports.entry is not None
    assert ports.log == [
        ("record", "Decision"),
        ("enqueue", "a-00000001"),
        ("send", Pending.of(ports.entry)),
        ("withdraw", "a-00000001"),
        ("ending", ev.RequesterGone()),
        ("record", "Approval"),
        ("close", None),
    ]


def test_a_final_frame_that_cannot_be_sent_withdraws_nothing() -> None:
    call, ports = new_call(), Ports(sent=False)
    step(drive(call, ev.Decided(verdict("deny")), ports))
    assert [name for name, _ in ports.log] == ["record", "send", "close"]


def test_the_decision_record_is_the_ruling_s_in_this_boot() -> None:
    @attrs.define
    class Keeping(Ports):
        bodies: list[ev.CallRecord] = attrs.Factory(list)

        async def record(self, body: ev.CallRecord) -> bool:
            self.bodies.append(body)
            return True

    call, ports, run = new_call(), Keeping(), verdict("auto")
    step(drive(call, ev.Decided(run), ports))
    assert ports.bodies[0] == Decision.of(run.decision, BOOT)
    assert ports.bodies[0].boot == BOOT  # type: ignore[union-attr]
