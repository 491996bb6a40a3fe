"""One turn of the loop against an in-memory model and broker: what the model
is sent, what the broker is asked, which events come out, what the history keeps."""

from __future__ import annotations

import datetime as dt
import itertools
from typing import Any

import attrs
import orjson
import pytest
import trio
import trio.testing

from boxmaker.core.reasons import REASON_WORDS, Reason
from boxmaker.core.vocabulary import AnswerOutcome
from boxmaker.home.config import LoopConfig
from boxmaker.loop.broker_port import OnPending, PortAnswer
from boxmaker.loop.model_client import ModelFailure, ModelProgress, OnProgress
from boxmaker.loop.turn import (
    CALL_TOOL,
    SYSTEM_PROMPT,
    TOOL_CALL_PREFILL,
    BadToolCall,
    ToolCall,
    assistant_message,
    parse_tool_calls,
    run_turn,
    tool_message,
)
from boxmaker.wire import (
    ErrorCode,
    ErrorFrame,
    LoopEvent,
    ModelDoneEvent,
    ModelEvent,
    OutputHead,
    Pending,
    ProgressEvent,
    ReplyDeltaEvent,
    ReplyEvent,
    ToolCallEvent,
    ToolRequest,
    ToolResultEvent,
    WaitingEvent,
)
from boxmaker.wire.loop import MAX_DELTA

SESSION = "s-0123456789ab"


def calls(*specs: tuple[str, object]) -> dict[str, Any]:
    """An assistant message with tool calls, arguments as llama-server sends them."""
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": f"id-{index}",
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": arguments
                    if isinstance(arguments, str)
                    else orjson.dumps(arguments).decode(),
                },
            }
            for index, (name, arguments) in enumerate(specs)
        ],
    }


def text(words: str) -> dict[str, Any]:
    return {"role": "assistant", "content": words}


@attrs.define
class ScriptedModel:
    replies: list[dict[str, Any] | ModelFailure]
    payloads: list[dict[str, Any]] = attrs.Factory(list)

    progress: list[list[ModelProgress]] = attrs.Factory(list)
    """What each call reports while it "generates", in order, before its answer."""

    async def complete(
        self, payload: dict[str, Any], *, on_progress: OnProgress | None = None
    ) -> dict[str, Any] | ModelFailure:
        self.payloads.append(orjson.loads(orjson.dumps(payload)))
        for progress in self.progress.pop(0) if self.progress else []:
            assert on_progress is not None
            await on_progress(progress)
        return self.replies.pop(0)


@attrs.define
class ScriptedBroker:
    answers: dict[str, PortAnswer]
    pending: Pending | None = None
    requests: list[ToolRequest] = attrs.Factory(list)

    async def call(self, request: ToolRequest, on_pending: OnPending | None = None) -> PortAnswer:
        self.requests.append(request)
        if self.pending is not None and on_pending is not None:
            await on_pending(attrs.evolve(self.pending, call=request.call))
        return self.answers[request.tool]


async def turn(
    model: ScriptedModel,
    broker: ScriptedBroker,
    *,
    history: list[dict[str, Any]] | None = None,
    config: LoopConfig | None = None,
    text: str = "what do my notes say?",
) -> tuple[list[LoopEvent], list[dict[str, Any]]]:
    events: list[LoopEvent] = []

    async def emit(event: LoopEvent) -> None:
        events.append(event)

    added: list[dict[str, Any]] = []
    await run_turn(
        session=SESSION,
        text=text,
        history=history or [],
        broker=broker,
        model=model,
        config=config or LoopConfig(),
        emit=emit,
        added=added,
    )
    return events, added


OK_NOTES = PortAnswer(AnswerOutcome.OK, content="Buy milk.\n")


async def test_a_tool_call_goes_to_the_broker_and_its_answer_to_the_model() -> None:
    model = ScriptedModel([calls(("read_file", {"path": "notes.txt"})), text("Buy milk.")])
    broker = ScriptedBroker({"read_file": OK_NOTES})
    events, added = await turn(model, broker)
    [request] = broker.requests
    assert (request.session, request.tool, request.arguments) == (
        SESSION,
        "read_file",
        {"path": "notes.txt"},
    )
    assert [type(e) for e in events] == [
        ModelEvent,
        ModelDoneEvent,
        ToolCallEvent,
        ToolResultEvent,
        ModelEvent,
        ModelDoneEvent,
        ReplyEvent,
    ]
    assert events[2] == ToolCallEvent(
        call=request.call, tool="read_file", arguments={"path": "notes.txt"}
    )
    assert attrs.evolve(events[3], elapsed_ms=0) == ToolResultEvent(
        call=request.call,
        outcome=AnswerOutcome.OK,
        output=OutputHead(lines=["Buy milk."], total_lines=1),
        elapsed_ms=0,
    )
    assert events[-1] == ReplyEvent(text="Buy milk.")
    first, second = model.payloads
    assert first["messages"] == [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "what do my notes say?"},
    ]
    assert (first["id_slot"], first["cache_prompt"], first["parallel_tool_calls"]) == (
        0,
        True,
        False,
    )
    assert [tool["function"]["name"] for tool in first["tools"]] == [
        "read_file",
        "list_dir",
        "write_file",
        "shell",
        "http_get",
        "call_tool",
    ]
    assert first["tools"][-1] == CALL_TOOL
    assert "tool_choice" not in first
    assert second["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "id-0",
        "content": "Buy milk.\n",
    }
    assert added == [*second["messages"][1:], {"role": "assistant", "content": "Buy milk."}]


async def test_a_denied_call_tells_the_model_why() -> None:
    denied = PortAnswer(AnswerOutcome.DENIED, reason="no_grant", detail="no grant for read_file")
    model = ScriptedModel([calls(("read_file", {"path": "x"})), text("I may not.")])
    events, _ = await turn(model, ScriptedBroker({"read_file": denied}))
    assert model.payloads[1]["messages"][-1]["content"] == (
        "I could not do that: the call was denied (no_grant: no grant allows it)."
        " Detail: no grant for read_file."
    )
    result = next(e for e in events if isinstance(e, ToolResultEvent))
    assert (result.outcome, result.reason) == (AnswerOutcome.DENIED, "no_grant")


async def test_a_waiting_call_is_reported_with_its_approval() -> None:
    expires = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)
    pending = Pending(
        call="c-0000000000000000", approval="a-0123abcd", grant="notes", expires_at=expires
    )
    model = ScriptedModel([calls(("read_file", {"path": "n"})), text("done")])
    broker = ScriptedBroker({"read_file": OK_NOTES}, pending=pending)
    events, _ = await turn(model, broker)
    waiting = next(e for e in events if isinstance(e, WaitingEvent))
    assert waiting == WaitingEvent(
        call=broker.requests[0].call, approval="a-0123abcd", grant="notes", expires_at=expires
    )


async def test_call_tool_is_unwrapped_into_the_same_request() -> None:
    wrapped = calls(("call_tool", {"name": "read_file", "arguments": {"path": "n"}}))
    model = ScriptedModel([wrapped, text("ok")])
    broker = ScriptedBroker({"read_file": OK_NOTES})
    _, added = await turn(model, broker)
    assert (broker.requests[0].tool, broker.requests[0].arguments) == ("read_file", {"path": "n"})
    assert added[1]["tool_calls"][0]["function"] == {
        "name": "read_file",
        "arguments": '{"path":"n"}',
    }


async def test_only_the_first_call_of_a_step_runs() -> None:
    # What the embedded model does: the same call three times, or one and a cut-off one.
    repeated = calls(("read_file", {"path": "n"}), ("read_file", {"path": "n"}), ("x", '{"p'))
    model = ScriptedModel([repeated, text("ok")])
    broker = ScriptedBroker({"read_file": OK_NOTES})
    events, added = await turn(model, broker)
    assert len(broker.requests) == 1
    assert sum(isinstance(e, ToolCallEvent) for e in events) == 1
    assert [call["id"] for call in added[1]["tool_calls"]] == ["id-0"]
    assert added[2] == {"role": "tool", "tool_call_id": "id-0", "content": "Buy milk.\n"}


async def test_a_call_with_unreadable_arguments_is_answered_and_never_sent() -> None:
    model = ScriptedModel([calls(("read_file", '{"path": "no')), text("ok")])
    broker = ScriptedBroker({"read_file": OK_NOTES})
    events, _ = await turn(model, broker)
    assert broker.requests == []
    result = next(e for e in events if isinstance(e, ToolResultEvent))
    assert (result.outcome, result.reason) == (AnswerOutcome.DENIED, "invalid_arguments")
    assert model.payloads[1]["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "id-0",
        "content": "I could not do that: the call was denied (invalid_arguments)."
        " Detail: the arguments are not a JSON object.",
    }


async def test_first_step_tool_asks_for_a_tool_with_a_prefill_on_the_first_call_only() -> None:
    model = ScriptedModel([calls(("list_dir", {"path": "."})), text("two files")])
    broker = ScriptedBroker({"list_dir": PortAnswer(AnswerOutcome.OK, content="a\nb\n")})
    _, added = await turn(model, broker, config=LoopConfig(first_step="tool"))
    first, second = model.payloads
    assert first["tool_choice"] == "required"
    assert first["messages"][-1] == {"role": "assistant", "content": TOOL_CALL_PREFILL}
    assert "tool_choice" not in second
    assert TOOL_CALL_PREFILL not in [m.get("content") for m in added]


@pytest.mark.parametrize(
    ("said", "forced"),
    [("read notes.txt", True), ('what is in "notes"?', True), ("hello", False)],
)
async def test_first_step_named_asks_for_a_tool_only_when_the_owner_names_a_target(
    said: str, forced: bool
) -> None:
    model = ScriptedModel([text("fine")])
    await turn(model, ScriptedBroker({}), config=LoopConfig(first_step="named"), text=said)
    [first] = model.payloads
    assert (first.get("tool_choice") == "required") is forced
    assert (first["messages"][-1].get("content") == TOOL_CALL_PREFILL) is forced


async def test_the_turn_stops_at_max_steps() -> None:
    model = ScriptedModel([calls(("list_dir", {"path": "."}))] * 3)
    broker = ScriptedBroker({"list_dir": PortAnswer(AnswerOutcome.OK, content="")})
    events, _ = await turn(model, broker, config=LoopConfig(max_steps=3))
    assert len(model.payloads) == 3
    assert events[-1] == ErrorFrame(
        code=ErrorCode.MAX_STEPS,
        detail="the model made 3 calls without a reply ([loop] max_steps)",
    )


async def test_a_model_failure_ends_the_turn_with_its_error() -> None:
    failure = ModelFailure(ErrorCode.MODEL_UNREACHABLE, "HTTP 502: see docs/runbook.md#x")
    events, added = await turn(ScriptedModel([failure]), ScriptedBroker({}))
    assert [
        attrs.evolve(e, elapsed_ms=0) if isinstance(e, ModelDoneEvent) else e for e in events
    ] == [
        ModelEvent(step=1),
        ModelDoneEvent(step=1, elapsed_ms=0),
        ErrorFrame(code=failure.code, detail=failure.detail),
    ]
    assert added == [{"role": "user", "content": "what do my notes say?"}]


async def test_the_history_comes_before_the_new_message() -> None:
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    model = ScriptedModel([text("again")])
    await turn(model, ScriptedBroker({}), history=history)
    assert model.payloads[0]["messages"][1:] == [
        *history,
        {"role": "user", "content": "what do my notes say?"},
    ]


@pytest.mark.parametrize(
    "raw",
    [
        {"tool_calls": [{"function": {"arguments": "{}"}}]},
        {"tool_calls": ["not an object"]},
        {"tool_calls": [{"id": 5, "function": {"name": "", "arguments": "{}"}}]},
        {"tool_calls": [{"function": {"name": "call_tool", "arguments": '{"arguments": {}}'}}]},
    ],
)
def test_a_call_without_a_tool_name_is_bad_never_an_exception(raw: dict[str, Any]) -> None:
    [call] = parse_tool_calls(raw)
    assert (call.id, call.name) == ("call-0", "?")
    kept = assistant_message({"content": None}, [call])
    assert kept["tool_calls"][0]["function"] == {"name": "?", "arguments": "{}"}


@pytest.mark.parametrize("arguments", ["[1, 2]", "7", '"text"', "null"])
def test_arguments_that_are_json_but_no_object_are_bad(arguments: str) -> None:
    [call] = parse_tool_calls(calls(("read_file", arguments)))
    assert call == BadToolCall("id-0", "read_file", "the arguments are not a JSON object")


def test_tool_calls_that_are_no_list_are_no_calls() -> None:
    assert parse_tool_calls({"tool_calls": {"id": "a", "function": {"name": "x"}}}) == []
    assert parse_tool_calls({"content": "hi"}) == []


def test_call_tool_without_inner_arguments_calls_with_none() -> None:
    wrapped = calls(("call_tool", {"name": "list_dir"}))
    assert parse_tool_calls(wrapped) == [ToolCall("id-0", "list_dir", {})]


def test_a_call_without_a_name_says_so() -> None:
    [call] = parse_tool_calls({"tool_calls": [{"id": "q", "function": {"arguments": "{}"}}]})
    assert call == BadToolCall("q", "?", "the call names no tool")


def test_the_kept_assistant_message_is_in_openais_shape() -> None:
    kept = assistant_message({"content": None}, [ToolCall("id-7", "read_file", {"path": "n"})])
    assert kept == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "id-7",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path":"n"}'},
            }
        ],
    }
    assert assistant_message({}, []) == {"role": "assistant", "content": ""}


def test_an_ok_answer_without_content_says_the_tool_returned_nothing() -> None:
    assert tool_message("t", PortAnswer(AnswerOutcome.OK)) == {
        "role": "tool",
        "tool_call_id": "t",
        "content": "The tool ran and returned nothing.",
    }
    assert tool_message("t", PortAnswer(AnswerOutcome.DENIED, reason="expired"))["content"] == (
        "I could not do that: the call was denied (expired: nobody answered in time)."
    )


async def test_a_bad_call_is_still_shown_as_a_tool_call() -> None:
    model = ScriptedModel([calls(("shell", "{nope")), text("ok")])
    events, _ = await turn(model, ScriptedBroker({}))
    call_event = next(e for e in events if isinstance(e, ToolCallEvent))
    result = next(e for e in events if isinstance(e, ToolResultEvent))
    assert (call_event.tool, call_event.arguments) == ("shell", {})
    assert call_event.call == result.call


@attrs.define
class SlowModel:
    """Streams ``pieces`` one each ``every`` seconds, then answers with their text."""

    pieces: list[str]
    every: float

    async def complete(
        self, payload: dict[str, Any], *, on_progress: OnProgress | None = None
    ) -> dict[str, Any] | ModelFailure:
        assert on_progress is not None
        for tokens, piece in enumerate(self.pieces, start=1):
            await trio.sleep(self.every)
            await on_progress(ModelProgress(tokens=tokens, content=piece))
        return text("".join(self.pieces))


async def test_the_reply_streams_in_pieces_and_progress_is_reported_at_most_each_half_second(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pieces = [f"word{n} " for n in range(20)]
    events, _ = await turn(SlowModel(pieces, every=0.1), ScriptedBroker({}))  # type: ignore[arg-type]
    deltas = [e.text for e in events if isinstance(e, ReplyDeltaEvent)]
    progress = [e for e in events if isinstance(e, ProgressEvent)]
    assert "".join(deltas) == "".join(pieces)
    assert 1 < len(deltas) <= len(pieces)
    # 2 s of generating: a progress event each half second, never more often.
    times = [p.elapsed_ms for p in progress]
    assert len(times) == 3
    assert times[0] == 500
    assert all(later - earlier >= 500 for earlier, later in itertools.pairwise(times))
    # A token each 100 ms: the count heard by then (the one due that instant, or not yet).
    assert all(t // 100 - 1 <= p.tokens <= t // 100 for p, t in zip(progress, times, strict=True))
    assert isinstance(events[-2], ModelDoneEvent)
    assert (events[-2].elapsed_ms, events[-2].tokens) == (2000, 20)
    assert events[-1] == ReplyEvent(text="".join(pieces))


async def test_progress_comes_before_the_first_token_too(
    autojump_clock: trio.testing.MockClock,
) -> None:
    events, _ = await turn(SlowModel(["Hi."], every=1.2), ScriptedBroker({}))  # type: ignore[arg-type]
    assert [e for e in events if isinstance(e, ProgressEvent)] == [
        ProgressEvent(step=1, elapsed_ms=500, tokens=0),
        ProgressEvent(step=1, elapsed_ms=1000, tokens=0),
    ]
    assert [e for e in events if isinstance(e, ReplyDeltaEvent)] == [ReplyDeltaEvent(text="Hi.")]


async def test_a_long_piece_of_text_goes_in_several_deltas() -> None:
    long = "x" * (MAX_DELTA * 2 + 5)
    model = ScriptedModel([text(long)], progress=[[ModelProgress(tokens=1, content=long)]])
    events, _ = await turn(model, ScriptedBroker({}))
    deltas = [e.text for e in events if isinstance(e, ReplyDeltaEvent)]
    assert [len(d) for d in deltas] == [MAX_DELTA, MAX_DELTA, 5]


async def test_a_shell_result_carries_its_exit_status_output_and_time() -> None:
    failing = PortAnswer(
        AnswerOutcome.FAILED, reason="tool_error", detail="exit status 2: ls: cannot access"
    )
    model = ScriptedModel([calls(("shell", {"command": "ls nope"})), text("It failed.")])
    events, _ = await turn(model, ScriptedBroker({"shell": failing}))
    result = next(e for e in events if isinstance(e, ToolResultEvent))
    assert (result.outcome, result.reason, result.exit_code) == ("failed", "tool_error", 2)
    assert result.detail == "exit status 2: ls: cannot access"
    assert (result.output, result.stderr) == (None, None)
    assert result.elapsed_ms is not None


# --- a turn always ends (docs/decisions.md, "A turn always ends") -------------------
async def test_each_step_stops_at_the_templates_own_tags_and_asks_for_its_token_limit() -> None:
    model = ScriptedModel([text("Done.")])
    await turn(model, ScriptedBroker({}), config=LoopConfig(max_step_tokens=200))
    sent = model.payloads[0]
    assert sent["stop"] == [
        "</tool_call>",
        "</tool_response>",
        "<|im_start|>",
        "<|im_end|>",
        "</tools>",
    ]
    assert sent["max_tokens"] == 200
    assert LoopConfig().max_step_tokens == 512


@pytest.mark.parametrize(
    ("finish_reason", "cut"), [("repeated", "repeated"), ("length", "max_tokens"), ("stop", None)]
)
async def test_a_step_cut_short_says_why_and_its_text_is_the_reply(
    finish_reason: str, cut: str | None
) -> None:
    reply = {**text("I could not read it.\n<error>"), "finish_reason": finish_reason}
    events, _ = await turn(ScriptedModel([reply]), ScriptedBroker({}))
    [done] = [event for event in events if isinstance(event, ModelDoneEvent)]
    assert done.cut == cut
    assert events[-1] == ReplyEvent(text="I could not read it.\n<error>")


@pytest.mark.parametrize("reason", list(Reason))
def test_every_denial_and_failure_reads_as_plain_sentences_without_tags(reason: Reason) -> None:
    failures = list(Reason)[list(Reason).index(Reason.TOOL_ERROR) :]
    outcome = AnswerOutcome.FAILED if reason in failures else AnswerOutcome.DENIED
    detail = "grants.toml line 3: <error> near <|im_end|>"
    content = tool_message("t", PortAnswer(outcome, reason=reason, detail=detail))["content"]
    lead = "failed" if outcome is AnswerOutcome.FAILED else "was denied"
    assert content == (
        f"I could not do that: the call {lead} ({reason}: {REASON_WORDS[reason]})."
        " Detail: grants.toml line 3: error near im_end."
    )
    assert "<" not in content
    assert ">" not in content


async def test_a_reply_is_kept_without_the_templates_tags_the_model_wrote() -> None:
    reply = text("<tool_response>\nThe call was denied: no grant allows it.\n")
    model = ScriptedModel([calls(("read_file", {"path": "x"})), reply, text("Hello.")])
    denied = PortAnswer(AnswerOutcome.DENIED, reason="no_grant")
    events, added = await turn(model, ScriptedBroker({"read_file": denied}))
    assert events[-1] == ReplyEvent(text="The call was denied: no grant allows it.")
    assert added[-1] == {"role": "assistant", "content": "The call was denied: no grant allows it."}
