"""The broker as a state machine: the real brokerd against the invariants of docs/testing.md
("The state machine"), the write order and the call's states of docs/protocol.md.

A hypothesis ``RuleBasedStateMachine`` drives the real brokerd — the real approvals
table, the real ledger on a temporary home, the real sockets — through tool requests,
approvals, refusals, expiry (the clock jumps), disconnects, grant changes and state
raises, and checks after every step that the ledger verifies, that every call has one
decision, that nothing ran without an auto verdict or an approval with outcome
``ask``/``allowed``, that no entry outlives its expiry, and that every entry in the
table is an asked call with no approval record yet.

How a synchronous machine drives a trio program: each machine runs one ``trio.run`` in
a thread of its own, with a *manual* MockClock (``autojump_threshold=inf``), so virtual
time moves only when a rule jumps it. A rule hands an async step to that loop with
``trio.from_thread.run`` and the step ends with ``wait_all_tasks_blocked()``: when it
returns, the broker has finished reacting (every frame it was going to send is sent,
every record written) and the invariants see a settled system. Worker threads would
break that (a loop waiting on a worker counts as blocked), so, as the broker tests'
``inline_threads`` fixture does, brokerd is started with ``to_thread=inline``: its
blocking steps run inline. Every connection the test opens gets a reader task in the loop,
which collects the frames the broker sends until it closes, so a rule never blocks on a
socket: a missing answer shows up as a failed assertion, not a hung test.
"""

from __future__ import annotations

import contextlib
import functools
import math
import shutil
import socket
import tempfile
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final, TypeVar

import attrs
import orjson
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
)
from tests.harness.broker import PENDING_TIMEOUT, Client, inline, tool_request
from tests.harness.homes import grant, write_config, write_grants

from boxmaker.broker.connection import CALL_ID_USED
from boxmaker.broker.serve import serve_broker
from boxmaker.broker.state import Broker
from boxmaker.core.approvals import PendingEntry
from boxmaker.core.labels import Label, Taint
from boxmaker.core.state import StateUnreadable, encode_state
from boxmaker.home.paths import Home
from boxmaker.home.state_files import read_state
from boxmaker.ledger.verify import Report
from boxmaker.ledger.verify_files import verify_file

pytestmark = pytest.mark.slow

T = TypeVar("T")

SESSIONS: Final = ("s-0000000000a1", "s-0000000000b2")
PATHS: Final = (
    "notes.txt",  # internal
    "notes.txt",
    ".env",  # secret (the default label rules)
    "missing.txt",  # runs, and fails (not_found)
    "../outside",  # bad_arguments: denied before any grant is looked at
)
GRANTS: Final = {
    "none": "",
    "ask": grant("ask-read", "read_file", "ask"),
    "auto": grant("auto-read", "read_file", "auto"),
    "deny": grant("no-read", "read_file", "deny"),
    "ask-internal": grant("ask-read", "read_file", "ask", max_taint="internal"),
    "ask-trusted": grant("ask-read", "read_file", "ask", if_untrusted="deny"),
    "auto-notes-ask-rest": grant("auto-notes", "read_file", "auto", paths=["notes.txt"])
    + grant("ask-read", "read_file", "ask"),
    "invalid": "[[grant]\n",
}
RAISES: Final = (
    Label(Taint.INTERNAL, False),
    Label(Taint.SECRET, False),
    Label(Taint.PUBLIC, True),
    Label(Taint.SECRET, True),
    None,  # an unreadable state file
)
NOTES: Final = st.none() | st.just("looks fine")
REASONS: Final = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=20).map(
    lambda text: f"no: {text}"
)
JOIN_S: Final = 60.0
"""Real seconds the machine's trio thread gets to stop before the test fails."""


@attrs.define(eq=False)
class Conn:
    """One connection the test opened, and every frame the broker sent on it."""

    client: Client | None
    """None: a requester that sent its request and left at once (no reader)."""
    frames: list[dict[str, Any]] = attrs.Factory(list)
    eof: bool = False
    """The broker closed its end (after its final frame)."""
    dropped: bool = False
    """We closed ours (a requester that left)."""
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)

    async def read_until_closed(self) -> None:
        assert self.client is not None
        with self.scope:
            # A socket closed with our unread bytes in it resets rather than ending
            # cleanly (Linux AF_UNIX): after the frames it sent, that is the same end.
            with contextlib.suppress(trio.BrokenResourceError):
                while (frame := await self.client.receive()) is not None:
                    self.frames.append(frame)
            self.eof = True
        await self.client.aclose()

    @property
    def final(self) -> dict[str, Any] | None:
        finals = [frame for frame in self.frames if frame.get("final")]
        assert len(finals) <= 1, f"more than one final frame: {self.frames}"
        return finals[0] if finals else None


@attrs.define(eq=False)
class CallModel:
    """What the test knows of one tool request it sent."""

    call: str
    conn: Conn
    session: str
    path: str
    approval: str | None = None
    requested_at: float | None = None
    """Virtual time of the request, for an asked call."""
    dropped_at: float | None = None

    @property
    def waiting(self) -> bool:
        """Pending, no final answer, and the requester still there."""
        return self.approval is not None and self.conn.final is None and not self.conn.dropped


@attrs.frozen
class Snapshot:
    """The settled system after a step: the clock, the table, the ledger."""

    now: float
    entries: list[PendingEntry]
    waiters: set[str]
    records: list[dict[str, Any]]
    report: Report

    def of(self, call: str, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r["kind"] == kind and r.get("call") == call]


class BrokerMachine(RuleBasedStateMachine):
    """brokerd driven over its sockets; see the module docstring."""

    approvals = Bundle("approvals")

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="bx-sm-", dir="/tmp"))
        self.home = Home(self.root)
        self.clock = trio.testing.MockClock(autojump_threshold=math.inf)
        self.calls: dict[str, CallModel] = {}
        self.by_approval: dict[str, str] = {}
        self.grants_now = "ask"
        self.unreadable: set[str] = set()
        """Sessions whose state file is unreadable now."""
        self._snapshot: Snapshot | None = None
        self._crash: BaseException | None = None
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        try:
            self.home.create()
            write_config(self.home, f"[broker]\npending_timeout = {PENDING_TIMEOUT}\n")
            write_grants(self.home, GRANTS["ask"])
            (self.home.default_workspace / "notes.txt").write_text("hello\n", encoding="utf-8")
            (self.home.default_workspace / ".env").write_text("TOKEN=x\n", encoding="utf-8")
            self._thread = threading.Thread(target=self._thread_main, name="brokerd", daemon=True)
            self._thread.start()
            if not self._ready.wait(JOIN_S) or self._token is None:
                raise RuntimeError(f"brokerd did not start: {self._crash!r}") from self._crash
        except BaseException:
            self._cleanup()
            raise

    # -- the trio side ----------------------------------------------------------------

    def _thread_main(self) -> None:
        try:
            trio.run(self._main, clock=self.clock)
        except BaseException as exc:  # reported by the rule or teardown that sees it
            self._crash = exc
        finally:
            self._ready.set()

    async def _main(self) -> None:
        async with trio.open_nursery() as nursery:
            self.broker: Broker = await nursery.start(
                functools.partial(serve_broker, self.home, to_thread=inline)
            )
            self._nursery = nursery
            self._stop = trio.Event()
            self._token = trio.lowlevel.current_trio_token()
            self._ready.set()
            await self._stop.wait()
            self.broker.request_stop()

    def _do(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``fn`` in the machine's loop and wait until the broker has settled."""

        async def step() -> T:
            value = await fn(*args)
            await trio.testing.wait_all_tasks_blocked()
            return value

        self._snapshot = None
        assert self._crash is None, f"brokerd crashed: {self._crash!r}"
        return trio.from_thread.run(step, trio_token=self._token)

    async def _connect(self, path: Path, frame: dict[str, Any]) -> Conn:
        conn = Conn(await Client.open(path))
        self._nursery.start_soon(conn.read_until_closed)
        assert conn.client is not None
        await conn.client.send(frame)
        return conn

    async def _send_and_leave(self, frame: dict[str, Any]) -> float:
        """Connect, send, close — without a checkpoint, so the broker sees the request
        only after its requester has gone."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(str(self.home.broker_sock))
            sock.sendall(orjson.dumps(frame) + b"\n")
        return trio.current_time()

    async def _admin(self, frame: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """One admin request on a fresh admin.sock connection: the answer, and whether
        the approval it names was in the table just before."""
        before = frame.get("approval") in self.broker.table
        conn = await self._connect(self.home.admin_sock, frame)
        await trio.testing.wait_all_tasks_blocked()
        conn.scope.cancel()
        assert len(conn.frames) == 1, f"admin.sock answered {conn.frames} to {frame}"
        return conn.frames[0], before

    async def _drop(self, conn: Conn) -> float:
        conn.dropped = True
        conn.scope.cancel()
        return trio.current_time()

    async def _jump(self, seconds: float) -> None:
        self.clock.jump(seconds)
        await trio.lowlevel.checkpoint()

    async def _run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        return fn(*args)

    async def _answer_at_the_deadline(self, entry: PendingEntry, frame: dict[str, Any]) -> Any:
        """Send ``frame`` on an admin connection at the entry's deadline, in the same
        instant the call's own expiry fires: the two race."""
        conn = await self._connect(self.home.admin_sock, {"kind": "status"})
        await trio.testing.wait_all_tasks_blocked()
        # Within 60 s of an answer the connection stays open (docs/protocol.md, admin.sock).
        assert [answer["kind"] for answer in conn.frames] == ["status"], conn.frames
        for _ in range(3):  # floating point: land on the deadline itself, not just below
            if trio.current_time() >= entry.deadline:
                break
            self.clock.jump(entry.deadline - trio.current_time())
        assert conn.client is not None
        await conn.client.send(frame)
        await trio.testing.wait_all_tasks_blocked()
        conn.scope.cancel()
        assert len(conn.frames) == 2, f"admin.sock answered {conn.frames}"
        return conn.frames[1]

    async def _next_deadline(self) -> float | None:
        deadlines = [entry.deadline for entry in self.broker.table.entries()]
        return min(deadlines) - trio.current_time() if deadlines else None

    async def _take_snapshot(self) -> Snapshot:
        lines = self.home.audit_log.read_bytes().splitlines()
        return Snapshot(
            now=trio.current_time(),
            entries=self.broker.table.entries(),
            waiters=set(self.broker.waiters),
            records=[orjson.loads(line) for line in lines],
            report=verify_file(self.home.audit_log),
        )

    @property
    def snapshot(self) -> Snapshot:
        if self._snapshot is None:
            self._snapshot = self._do(self._take_snapshot)
        return self._snapshot

    # -- rules ------------------------------------------------------------------------

    @initialize(which=st.sampled_from(sorted(GRANTS)))
    def first_grants(self, which: str) -> None:
        self.change_grants(which)

    @rule(
        target=approvals,
        session=st.sampled_from(SESSIONS),
        path=st.sampled_from(PATHS),
    )
    def request(self, session: str, path: str) -> Any:
        """A tool request; the connection stays open. Pending → the approvals bundle."""
        frame = tool_request("read_file", {"path": path}, session=session)
        call = frame["call"]
        conn = self._do(self._connect, self.home.broker_sock, frame)
        model = self.calls[call] = CallModel(call, conn, session, path)
        assert conn.frames, f"no answer to {frame}"
        first = conn.frames[0]
        assert first["call"] == call
        expected = self._expected_denial(session, path)
        if expected is not None:
            assert (first["kind"], first.get("reason")) == ("answer", expected), first
        if first["kind"] == "pending":
            assert conn.frames == [first], conn.frames
            assert not conn.eof
            model.approval = first["approval"]
            model.requested_at = self.snapshot.now
            self.by_approval[first["approval"]] = call
            return first["approval"]
        assert first["kind"] == "answer", first
        assert conn.frames == [first], conn.frames
        assert conn.eof, "the connection stays open after the final answer"
        return multiple()

    @rule(session=st.sampled_from(SESSIONS), path=st.sampled_from(PATHS))
    def request_and_leave(self, session: str, path: str) -> None:
        """A requester that leaves before its answer: nothing runs for it (the last
        look before an auto run), and a pending frame that cannot be sent withdraws the
        entry at once; a denial is recorded all the same."""
        frame = tool_request("read_file", {"path": path}, session=session)
        call = frame["call"]
        left_at = self._do(self._send_and_leave, frame)
        self.calls[call] = CallModel(
            call, Conn(None, dropped=True), session, path, dropped_at=left_at
        )
        snap = self.snapshot
        [decision] = snap.of(call, "decision")
        expected_denial = self._expected_denial(session, path)
        if expected_denial is not None:
            assert (decision["verdict"], decision["reason"]) == ("deny", expected_denial)
        after = [
            (r["kind"], r.get("outcome", r.get("status")), r["reason"])
            for r in snap.records
            if r.get("call") == call and r["kind"] != "decision"
        ]
        expected = {
            "deny": [],
            "run": [("result", "failed", "requester_gone")],
            "ask": [("approval", "withdrawn", "requester_gone")],
        }[decision["verdict"]]
        assert after == expected, (decision, after)

    @precondition(lambda self: bool(self.calls))
    @rule(data=st.data())
    def reuse_call_id(self, data: st.DataObject) -> None:
        """A call id already used in this boot is refused and not recorded."""
        call = data.draw(st.sampled_from(list(self.calls)), label="call")
        frame = tool_request("read_file", {"path": "notes.txt"}, call=call)
        conn = self._do(self._connect, self.home.broker_sock, frame)
        assert conn.eof
        assert conn.frames == [{"kind": "error", "code": "bad_frame", "detail": CALL_ID_USED}]

    @rule(approval=approvals, note=NOTES)
    def approve(self, approval: str, note: str | None) -> None:
        """Approve any approval ever pending (it may have ended: expired, refused…)."""
        frame: dict[str, Any] = {"kind": "approve", "approval": approval}
        if note is not None:
            frame["note"] = note
        answer, was_pending = self._do(self._admin, frame)
        model = self.calls[self.by_approval[approval]]
        if not was_pending:
            self._check_gone(approval, model, answer)
            return
        assert answer["kind"] == "approved", answer
        assert answer["call"] == model.call
        outcome = answer["outcome"]
        # The re-decision of an approve sees the grants and the state as they are now.
        expected = self._expected_denial(model.session, model.path)
        if expected is not None:
            assert (outcome, answer["reason"]) == ("denied", expected), answer
        [record] = self.snapshot.of(model.call, "approval")
        assert (record["outcome"], record["reason"], record["by"]) == (
            outcome,
            answer["reason"],
            "owner",
        )
        if model.conn.dropped:
            # The last look before the approval record: a gone requester runs nothing.
            assert outcome in ("withdrawn", "denied"), answer
            return
        assert outcome != "withdrawn", answer
        final = model.conn.final
        assert final is not None, "approved, and the requester heard nothing"
        if outcome == "denied":
            assert (final["outcome"], final["reason"]) == ("denied", answer["reason"]), final
        else:
            assert final["outcome"] in ("ok", "failed"), final

    @rule(approval=approvals, reason=REASONS)
    def refuse(self, approval: str, reason: str) -> None:
        """Refuse any approval ever pending, with the owner's reason."""
        answer, was_pending = self._do(
            self._admin, {"kind": "refuse", "approval": approval, "reason": reason}
        )
        model = self.calls[self.by_approval[approval]]
        if not was_pending:
            self._check_gone(approval, model, answer)
            return
        assert answer == {"kind": "refused", "call": model.call}, answer
        [record] = self.snapshot.of(model.call, "approval")
        assert (record["outcome"], record["reason"], record["by"]) == ("refused", reason, "owner")
        if not model.conn.dropped:
            final = model.conn.final
            assert final is not None
            assert (final["outcome"], final["reason"], final["detail"]) == (
                "denied",
                "refused",
                reason,
            )

    @precondition(lambda self: bool(self._waiting()))
    @rule(data=st.data(), approve=st.booleans(), note=NOTES, reason=REASONS)
    def answer_a_waiting_call(
        self, data: st.DataObject, approve: bool, note: str | None, reason: str
    ) -> None:
        """Approve or refuse a call that still waits (the bundle's are mostly over)."""
        waiting = self._waiting()
        approval = self.calls[data.draw(st.sampled_from(waiting), label="call")].approval
        assert approval is not None
        if approve:
            self.approve(approval, note)
        else:
            self.refuse(approval, reason)

    def _expected_denial(self, session: str, path: str) -> str | None:
        """The denial the pipeline gives whatever the labels: the steps before decide() and the
        grant sets that never let a read run. None: it depends on the labels (or runs)."""
        if path.startswith(".."):
            return "bad_arguments"
        if self.grants_now == "invalid":
            return "grants_invalid"
        if session in self.unreadable:
            return "state_unreadable"
        return {"none": "no_grant", "deny": "denied_by_grant"}.get(self.grants_now)

    def _waiting(self) -> list[str]:
        """The calls still waiting, in request order: call ids are random, so an order by
        id would make the same choices pick other calls (hypothesis replays choices)."""
        return [call for call, model in self.calls.items() if model.waiting]

    def _check_gone(self, approval: str, model: CallModel, answer: dict[str, Any]) -> None:
        """approve/refuse of an entry no longer in the table: ``expired`` if it expired,
        else ``no_such_approval``; nothing is recorded for it."""
        records = self.snapshot.of(model.call, "approval")
        assert len(records) == 1, f"{approval} left the table with {records}"
        expected = "expired" if records[0]["outcome"] == "expired" else "no_such_approval"
        assert (answer["kind"], answer.get("code")) == ("error", expected), answer

    @rule(
        seconds=st.floats(0.5, 5)
        | st.floats(0.5, 5)
        | st.sampled_from([1.0, PENDING_TIMEOUT - 0.001, PENDING_TIMEOUT])
        | st.floats(0.5, 400)
    )
    def advance(self, seconds: float) -> None:
        """Time passes: entries expire, the grants watcher runs."""
        self._do(self._jump, seconds)

    @precondition(
        lambda self: any(m.approval and m.conn.final is None for m in self.calls.values())
    )
    @rule(offset=st.sampled_from([-0.001, 0.0, 0.0, 0.001]))
    def advance_to_a_deadline(self, offset: float) -> None:
        """Land on (or just beside) the next expiry: the boundary is ``>=``."""
        gap = self._do(self._next_deadline)
        if gap is not None and gap + offset > 0:
            self._do(self._jump, gap + offset)

    @precondition(lambda self: bool(self._waiting()))
    @rule(data=st.data(), approve=st.booleans(), reason=REASONS)
    def answer_at_the_deadline(self, data: st.DataObject, approve: bool, reason: str) -> None:
        """approve/refuse arriving at expires_at races the call's own expiry; whichever
        takes the entry, the answer is ``error expired`` and the one approval record is
        ``expired`` (the boundary is ``>=`` everywhere)."""
        model = self.calls[data.draw(st.sampled_from(self._waiting()), label="call")]
        [entry] = [e for e in self.snapshot.entries if e.approval == model.approval]
        frame = {"kind": "approve", "approval": entry.approval}
        if not approve:
            frame = {"kind": "refuse", "approval": entry.approval, "reason": reason}
        answer = self._do(self._answer_at_the_deadline, entry, frame)
        assert (answer["kind"], answer.get("code")) == ("error", "expired"), answer
        [record] = self.snapshot.of(model.call, "approval")
        assert (record["outcome"], record["by"]) == ("expired", "expiry"), record
        final = model.conn.final
        assert final is not None
        assert (final["outcome"], final["reason"]) == ("denied", "expired"), final

    @precondition(lambda self: bool(self._waiting()))
    @rule(data=st.data())
    def disconnect(self, data: st.DataObject) -> None:
        """The requester leaves while pending (noticed at once: its socket becomes
        readable)."""
        waiting = self._waiting()
        model = self.calls[data.draw(st.sampled_from(waiting), label="call")]
        model.dropped_at = self._do(self._drop, model.conn)

    @rule(which=st.sampled_from(sorted(GRANTS)))
    def change_grants(self, which: str) -> None:
        self._do(self._run_sync, write_grants, self.home, GRANTS[which])
        self.grants_now = which

    @rule(session=st.sampled_from(SESSIONS), label=st.sampled_from(RAISES))
    def raise_state(self, session: str, label: Label | None) -> None:
        """The session's state rises, as a result with that label would raise it; or
        (``None``) the file becomes unreadable, and every decision of the session is
        ``state_unreadable`` until a raise replaces it."""

        def write() -> None:
            path = self.home.session_state(session)
            if label is None:
                _replace(path, b"not json")
                self.unreadable.add(session)
                return
            self.unreadable.discard(session)
            now = read_state(self.home.sessions_dir, session)
            _replace(
                path, encode_state(label if isinstance(now, StateUnreadable) else now.join(label))
            )

        self._do(self._run_sync, write)

    # -- invariants -------------------------------------------------------------------

    @invariant()
    def the_ledger_verifies(self) -> None:
        report = self.snapshot.report
        assert report.sound, [str(problem) for problem in report.problems]

    @invariant()
    def every_call_has_one_decision(self) -> None:
        snap = self.snapshot
        decided = [r["call"] for r in snap.records if r["kind"] == "decision"]
        assert sorted(decided) == sorted(self.calls), "decisions and calls differ"

    @invariant()
    def nothing_ran_without_an_auto_verdict_or_an_approval(self) -> None:
        snap = self.snapshot
        for result in (r for r in snap.records if r["kind"] == "result"):
            call = result["call"]
            [decision] = snap.of(call, "decision")
            outcomes = [r["outcome"] for r in snap.of(call, "approval")]
            let_run = decision["verdict"] == "run" or (
                decision["verdict"] == "ask" and outcomes in (["ask"], ["allowed"])
            )
            assert let_run, f"{call} has a result after {decision['verdict']}, {outcomes}"
        for call, model in self.calls.items():
            final = model.conn.final
            if final is not None and final["outcome"] == "ok":
                results = snap.of(call, "result")
                assert [r["status"] for r in results] == ["ok"], f"{call}: ok, {results}"

    @invariant()
    def no_entry_outlives_its_expiry(self) -> None:
        snap = self.snapshot
        for entry in snap.entries:
            requested_at = self.calls[entry.call].requested_at
            assert requested_at is not None
            assert entry.deadline == requested_at + PENDING_TIMEOUT
            assert entry.deadline > snap.now, f"{entry.approval} is expired and still waiting"

    @invariant()
    def every_entry_is_an_asked_call_with_no_approval_yet(self) -> None:
        snap = self.snapshot
        assert snap.waiters == {entry.approval for entry in snap.entries}
        for entry in snap.entries:
            verdicts = [r["verdict"] for r in snap.of(entry.call, "decision")]
            assert verdicts == ["ask"], f"{entry.call} is pending after {verdicts}"
            assert snap.of(entry.call, "approval") == [], f"{entry.call} is pending and ended"
            assert self.calls[entry.call].approval == entry.approval

    @invariant()
    def every_call_waits_or_has_ended(self) -> None:
        """Nothing is stuck: a pending call is in the table until its approval record,
        and its requester (if still there) has its final answer once it is recorded; a
        requester that left is noticed at once: its entry has ended by the next step."""
        snap = self.snapshot
        in_table = {entry.call for entry in snap.entries}
        for call, model in self.calls.items():
            if model.approval is None:
                continue
            ended = bool(snap.of(call, "approval"))
            assert ended != (call in in_table), f"{call}: ended={ended}, in table"
            if model.conn.dropped:
                assert model.dropped_at is not None
                assert ended, f"{call}: the requester left and the entry still waits"
            else:
                assert (model.conn.final is not None) == ended, (call, model.conn.frames)
                assert model.conn.eof == ended

    @invariant()
    def answers_match_the_records(self) -> None:
        snap = self.snapshot
        for call, model in self.calls.items():
            final = model.conn.final
            if final is None:
                continue
            approvals = [r["outcome"] for r in snap.of(call, "approval")]
            results = [r["status"] for r in snap.of(call, "result")]
            if final["outcome"] == "ok":
                assert results == ["ok"]
            elif final["outcome"] == "denied":
                assert results == []
                if final["reason"] in ("refused", "expired"):
                    assert approvals == [final["reason"]], (final, approvals)
            elif final["reason"] == "result_unrecorded":
                assert results == [], (final, results)  # unrecorded state: no result
            else:
                assert final["outcome"] == "failed", final
                assert results == ["failed"], (final, results)

    # -- the end ----------------------------------------------------------------------

    def teardown(self) -> None:
        """A clean stop: every waiting call is withdrawn (broker_stopping), every asked
        call has its one approval record, the ledger ends with ``stop`` and verifies."""
        try:
            waiting = [m for m in self.calls.values() if m.waiting]
            if self._token is not None and self._crash is None and self._thread.is_alive():
                trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
            self._thread.join(JOIN_S)
            assert not self._thread.is_alive(), "brokerd did not stop"
            assert self._crash is None, f"brokerd crashed: {self._crash!r}"
            report = verify_file(self.home.audit_log)
            assert report.sound, [str(problem) for problem in report.problems]
            lines = self.home.audit_log.read_bytes().splitlines()
            records = [orjson.loads(line) for line in lines]
            assert [record["kind"] for record in records[-2:]] == ["stop", "checkpoint"]
            for model in waiting:
                final = model.conn.final
                assert final is not None
                assert (final["outcome"], final["reason"]) == ("denied", "broker_stopping")
                outcomes = [
                    (r["outcome"], r["reason"])
                    for r in records
                    if r["kind"] == "approval" and r["call"] == model.call
                ]
                assert outcomes == [("withdrawn", "broker_stopping")]
            ended = [r["call"] for r in records if r["kind"] == "approval"]
            asked = [r["call"] for r in records if r.get("verdict") == "ask"]
            assert sorted(ended) == sorted(asked), "an asked call without one approval record"
        finally:
            self._cleanup()

    def _cleanup(self) -> None:
        if self._thread_alive():
            # A hung stop: let virtual time run so the loop can end, then give up on it.
            token = self._token
            assert token is not None
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(setattr, self.clock, "autojump_threshold", 0)
            self._thread.join(JOIN_S)
        shutil.rmtree(self.root, ignore_errors=True)

    def _thread_alive(self) -> bool:
        thread = getattr(self, "_thread", None)
        return thread is not None and thread.is_alive() and self._token is not None


def _replace(path: Path, data: bytes) -> None:
    """Write a file the way an atomic writer does (a new inode, renamed over)."""
    temp = path.with_name(f".{path.name}.test.tmp")
    temp.write_bytes(data)
    temp.replace(path)


BrokerMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestBrokerMachine = BrokerMachine.TestCase
