"""One turn of the agent loop (docs/decisions.md, "loopd"): the model asks, the broker decides.

A turn sends the session's history to the model with the catalogue's tools (and
``call_tool(name, arguments)``, which loopd unwraps into the same request); every tool
call the model makes becomes a ``tool_request`` on broker.sock, and the broker's answer
— the content, or ``denied: reason — detail`` — goes back to the model as the tool
message. It ends when the model answers without tool calls, or after ``[loop]
max_steps`` model calls. loopd has no authority of its own: it can only ask.

The message shaping is pure (:func:`request_payload`, :func:`parse_tool_calls`,
:func:`tool_message`); :func:`run_turn` is the thin async loop around it.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol

import attrs
import orjson
import trio

from boxmaker.core.catalogue import catalogue_tools
from boxmaker.core.reasons import reason_words
from boxmaker.core.vocabulary import AnswerOutcome
from boxmaker.formats.convert import new_call_id
from boxmaker.home.config import LoopConfig
from boxmaker.loop.broker_port import OnPending, PortAnswer
from boxmaker.loop.model_client import REPEATED, ModelFailure, ModelProgress, OnProgress
from boxmaker.loop.results import result_event
from boxmaker.wire import (
    ErrorCode,
    ErrorFrame,
    LoopEvent,
    ModelDoneEvent,
    ModelEvent,
    Pending,
    ProgressEvent,
    ReplyDeltaEvent,
    ReplyEvent,
    ToolCallEvent,
    ToolRequest,
    WaitingEvent,
)
from boxmaker.wire.loop import MAX_DELTA, StepCut

SYSTEM_PROMPT: Final = (
    "You work on the owner's machine, in their workspace, only through the tools given. "
    "Every tool call is checked against the owner's rules: it may be denied, or wait for "
    "the owner's approval, and the tool's answer tells you which. Use a tool when the "
    "owner asks for something it can do; answer in plain words when you are done."
)
CALL_TOOL: Final[dict[str, Any]] = {
    "type": "function",
    "function": {
        "name": "call_tool",
        "description": "Call one of the tools by its name, with its arguments.",
        "parameters": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "The tool's name."},
                "arguments": {"type": "object", "description": "The tool's arguments."},
            },
            "required": ["name", "arguments"],
        },
    },
}
TOOL_CALL_PREFILL: Final = "<tool_call>\n"
"""What a first step with ``first_step = "tool"`` puts in the model's mouth (README.md):
llama-server continues a trailing assistant message, and a tiny model then writes a
tool call instead of prose."""
TOOL_CALL_END: Final = "</tool_call>"
"""Where a step's generation stops (the request's ``stop``): a step makes one call, and
the built-in model never ends a turn by itself after its call. llama-server's grammar
for a ``<tool_call>`` template allows one call after another whatever
``parallel_tool_calls`` says, so the model wrote its call again and again until
``max_tokens`` (1,024 tokens, 34 s on two cores); stopped here it writes the call's own
few dozen tokens, and llama-server still parses the call (docs/performance.md)."""
TEMPLATE_ENDS: Final = ("</tool_response>", "<|im_start|>", "<|im_end|>", "</tools>")
"""The chat template's own tags (model/chatml_tools.jinja) that end a part of it or
start the next message: the request's ``stop`` holds them too. A reply that writes one
has left its own message, and a small model then repeats it until ``max_tokens``; so
the step ends before it. The opening ``<tool_response>`` is no stop: after a tool's
answer the built-in model starts its reply with one, then answers in a sentence, then
closes it (docs/performance.md); its reply is read without the tag
(:func:`reply_text`)."""
TEMPLATE_TAGS: Final = ("<tool_response>", "<tools>", *TEMPLATE_ENDS)
STOP: Final = (TOOL_CALL_END, *TEMPLATE_ENDS)
INVALID_ARGUMENTS: Final = "invalid_arguments"
PROGRESS_S: Final = 0.5
"""At most one ``progress`` event this often while the model works."""
DELTA_S: Final = 0.05
"""The reply's pieces that come within this long go to the owner in one ``reply_delta``."""


@attrs.frozen
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]


@attrs.frozen
class BadToolCall:
    id: str
    name: str
    problem: str


def model_tools() -> list[dict[str, Any]]:
    """The tools the model is offered: the catalogue's and ``call_tool``."""
    return [*catalogue_tools(), CALL_TOOL]


_TARGET: Final = re.compile(
    r"""
      "[^"\n]{1,200}"                      # a quoted name: "notes.txt"
    | (?<!\w)'[^'\s][^'\n]{0,199}'(?!\w)   # 'notes.txt' (not the ' of what's)
    | `[^`\n]{1,200}`                      # `ls -l`
    | \bhttps?://                           # a URL
    | [\w.~-]*/[\w.~/-]*                    # a path: src/main.py, ./x, /etc
    | \b[\w-]+\.[A-Za-z][A-Za-z0-9]{0,7}\b  # a file name: notes.txt, README.md
    """,
    re.VERBOSE,
)


def names_a_target(text: str) -> bool:
    """Do the owner's words name something a tool works on: a quoted name, a path, a
    file name or a URL? (``first_step = "named"``: only then is the first step asked
    for a tool call; a tiny model asked so invents a call for "hello".)

    >>> [names_a_target(t) for t in ('Read the file at path "notes.txt".', "read notes.txt",
    ...  "list src/", "get https://example.com", "run `ls`", "list the folder 'docs'")]
    [True, True, True, True, True, True]
    >>> [names_a_target(t) for t in ("hello", "hi, who are you?", "what's 2+2?", "thanks!")]
    [False, False, False, False]
    """
    return _TARGET.search(text) is not None


def forces_tool_step(first_step: str, step: int, text: str) -> bool:
    """Is step ``step`` of a turn on the owner's ``text`` asked for a tool call
    (``[loop] first_step``)?

    >>> forces_tool_step("named", 1, "read notes.txt"), forces_tool_step("named", 1, "hi")
    (True, False)
    >>> forces_tool_step("tool", 1, "hi"), forces_tool_step("tool", 2, "hi")
    (True, False)
    >>> forces_tool_step("auto", 1, "read notes.txt")
    False
    """
    if step != 1:
        return False
    return first_step == "tool" or (first_step == "named" and names_a_target(text))


def request_payload(
    history: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    *,
    force_tool: bool,
    max_tokens: int | None = None,
) -> dict[str, Any]:
    """The chat request of one step. The model is inferproxy's to set, and the length
    cap too unless ``max_tokens`` (``[loop] max_step_tokens``) asks for less.

    >>> p = request_payload([{"role": "user", "content": "hi"}], [], force_tool=True)
    >>> p["tool_choice"], p["messages"][-1], p["id_slot"], p["cache_prompt"]
    ('required', {'role': 'assistant', 'content': '<tool_call>\\n'}, 0, True)
    >>> p["stop"][:3], "max_tokens" in p
    (['</tool_call>', '</tool_response>', '<|im_start|>'], False)
    >>> request_payload([], [], force_tool=False, max_tokens=256)["max_tokens"]
    256
    """
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, *history]
    payload: dict[str, Any] = {
        "messages": messages,
        "tools": tools,
        "id_slot": 0,
        "cache_prompt": True,
        "parallel_tool_calls": False,
        "stop": list(STOP),
    }
    if max_tokens is not None:
        payload["max_tokens"] = max_tokens
    if force_tool:
        payload["tool_choice"] = "required"
        messages.append({"role": "assistant", "content": TOOL_CALL_PREFILL})
    return payload


def _arguments(raw: object) -> dict[str, Any] | None:
    if isinstance(raw, str):
        try:
            raw = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
    return raw if isinstance(raw, dict) else None


def parse_tool_calls(message: dict[str, Any]) -> list[ToolCall | BadToolCall]:
    """The assistant message's tool calls, ``call_tool`` unwrapped. A call whose name
    or arguments cannot be read is a :class:`BadToolCall` (never an exception): a small
    model may add a second call cut off mid-way.

    >>> parse_tool_calls({"tool_calls": [
    ...     {"id": "a", "function": {"name": "read_file", "arguments": '{"path": "n"}'}},
    ...     {"id": "b", "function": {"name": "call_tool",
    ...                              "arguments": '{"name": "list_dir", "arguments": {}}'}},
    ...     {"id": "c", "function": {"name": "shell", "arguments": '{"comm'}}]})
    ... # doctest: +NORMALIZE_WHITESPACE
    [ToolCall(id='a', name='read_file', arguments={'path': 'n'}),
     ToolCall(id='b', name='list_dir', arguments={}),
     BadToolCall(id='c', name='shell', problem='the arguments are not a JSON object')]
    """
    calls: list[ToolCall | BadToolCall] = []
    raw_calls = message.get("tool_calls") or []
    for index, raw in enumerate(raw_calls if isinstance(raw_calls, list) else []):
        fields: dict[str, Any] = raw if isinstance(raw, dict) else {}
        given_id = fields.get("id")
        call_id = given_id if isinstance(given_id, str) and given_id else f"call-{index}"
        given_function = fields.get("function")
        function: dict[str, Any] = given_function if isinstance(given_function, dict) else {}
        name, arguments = function.get("name"), _arguments(function.get("arguments"))
        if name == "call_tool" and arguments is not None:
            name, arguments = arguments.get("name"), _arguments(arguments.get("arguments", {}))
        if not isinstance(name, str) or not name:
            calls.append(BadToolCall(call_id, "?", "the call names no tool"))
        elif arguments is None:
            calls.append(BadToolCall(call_id, name, "the arguments are not a JSON object"))
        else:
            calls.append(ToolCall(call_id, name, arguments))
    return calls


def assistant_message(
    message: dict[str, Any], calls: list[ToolCall | BadToolCall]
) -> dict[str, Any]:
    """The model's message as the history keeps it: its text (a reply's without the
    template's tags: :func:`reply_text`), and its calls as loopd
    read them (``call_tool`` unwrapped; an unreadable call with empty arguments), under
    the ids their tool messages answer."""
    content = message.get("content") or ""
    kept: dict[str, Any] = {
        "role": "assistant",
        "content": content if calls else reply_text(content),
    }
    if calls:
        kept["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {
                    "name": call.name,
                    "arguments": orjson.dumps(
                        call.arguments if isinstance(call, ToolCall) else {}
                    ).decode(),
                },
            }
            for call in calls
        ]
    return kept


_TAG: Final = re.compile(r"<\|?(/?\w{1,40})\|?>")
NOTHING_RETURNED: Final = "The tool ran and returned nothing."
NOT_RUN: Final = "I could not do that: the call was denied"
DID_NOT_WORK: Final = "I could not do that: the call failed"


def reply_text(content: str) -> str:
    """The model's reply without the template's tags it wrote (:data:`TEMPLATE_TAGS`),
    and then without the blank space around them; a reply without them as it is.

    >>> reply_text("<tool_response>\\nThe call was denied.\\n")
    'The call was denied.'
    >>> reply_text("Use <b>bold</b>.")
    'Use <b>bold</b>.'
    """
    if not any(tag in content for tag in TEMPLATE_TAGS):
        return content
    for tag in TEMPLATE_TAGS:
        content = content.replace(tag, "")
    return content.strip()


def untagged(text: str) -> str:
    """``text`` without tag-like marks (a small model echoes them, and may then repeat
    them: docs/decisions.md, "A turn always ends").

    >>> untagged("bad key <error> near <|im_end|>, a < b")
    'bad key error near im_end, a < b'
    """
    return _TAG.sub(r"\1", text)


def tool_message(call_id: str, answer: PortAnswer) -> dict[str, Any]:
    """The tool message for the model: the content, or what happened in plain
    sentences, the reason code and its words, and the detail. A small model echoes
    what it is told (``denied: reason — detail`` it echoed, and then repeated the tags
    it made up), so the text is one the owner can read as the reply: an echo of it
    answers them (docs/performance.md, "Turns that end").

    >>> answer = PortAnswer(AnswerOutcome.DENIED, reason="no_grant", detail="no grant for x")
    >>> print(tool_message("a", answer)["content"])
    I could not do that: the call was denied (no_grant: no grant allows it). Detail: no grant for x.
    """
    if answer.outcome is AnswerOutcome.OK:
        content = answer.content or NOTHING_RETURNED
    else:
        lead = NOT_RUN if answer.outcome is AnswerOutcome.DENIED else DID_NOT_WORK
        reason = answer.reason or "no reason given"
        words = reason_words(reason)
        content = f"{lead} ({reason}: {words})." if words else f"{lead} ({reason})."
        if answer.detail:
            detail = untagged(answer.detail).rstrip()
            content += f" Detail: {detail}" + ("" if detail.endswith((".", "!", "?")) else ".")
    return {"role": "tool", "tool_call_id": call_id, "content": content}


class ToolCaller(Protocol):
    """What a turn needs of the broker: ask for one tool call and hear its answer
    (:class:`~boxmaker.loop.broker_port.BrokerPort` over broker.sock; a test's fake)."""

    async def call(
        self, request: ToolRequest, on_pending: OnPending | None = None
    ) -> PortAnswer: ...


class Model(Protocol):
    async def complete(
        self, payload: dict[str, Any], *, on_progress: OnProgress | None = None
    ) -> dict[str, Any] | ModelFailure: ...


Emit = Callable[[LoopEvent], Awaitable[None]]


@attrs.define
class _StepReport:
    """What the owner hears while the model works on one step: a ``progress`` event at
    most each :data:`PROGRESS_S` (the step, its seconds, its tokens so far, even before
    the first token), and the text as it comes in ``reply_delta`` events, coalesced over
    :data:`DELTA_S`. One task sends them all, so sends never interleave, and a slow
    owner slows the sending, never the model's stream."""

    step: int
    emit: Emit
    started: float = attrs.Factory(trio.current_time)
    tokens: int = 0
    text: list[str] = attrs.Factory(list)
    finished: bool = False
    _wake: trio.Event = attrs.Factory(trio.Event)

    async def heard(self, progress: ModelProgress) -> None:
        self.tokens = progress.tokens
        if progress.content:
            self.text.append(progress.content)
            self._wake.set()

    def finish(self) -> None:
        self.finished = True
        self._wake.set()

    def elapsed_ms(self) -> int:
        return round((trio.current_time() - self.started) * 1000)

    async def send(self) -> None:
        """Run until :meth:`finish`; the text heard by then is all sent."""
        next_progress = self.started + PROGRESS_S
        while True:
            with trio.move_on_at(next_progress):
                await self._wake.wait()
            self._wake = trio.Event()
            if self.text:
                text, self.text = "".join(self.text), []
                for start in range(0, len(text), MAX_DELTA):
                    await self.emit(ReplyDeltaEvent(text=text[start : start + MAX_DELTA]))
            if self.finished:
                return
            if trio.current_time() >= next_progress:
                await self.emit(
                    ProgressEvent(step=self.step, elapsed_ms=self.elapsed_ms(), tokens=self.tokens)
                )
                next_progress = trio.current_time() + PROGRESS_S
            await trio.sleep(DELTA_S)


def step_cut(message: dict[str, Any]) -> StepCut | None:
    """Why the step's text was cut short, from its ``finish_reason`` (None: it was not).

    >>> step_cut({"finish_reason": "repeated"}), step_cut({"finish_reason": "length"})
    ('repeated', 'max_tokens')
    >>> step_cut({"finish_reason": "stop"}) is None
    True
    """
    match message.get("finish_reason"):
        case "length":
            return "max_tokens"
        case reason if reason == REPEATED:
            return "repeated"
        case _:
            return None


async def _model_step(
    model: Model, payload: dict[str, Any], step: int, emit: Emit
) -> dict[str, Any] | ModelFailure:
    """One model call with its ``model``, ``progress``, ``reply_delta`` and
    ``model_done`` events."""
    await emit(ModelEvent(step=step))
    report = _StepReport(step, emit)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(report.send)
        try:
            message = await model.complete(payload, on_progress=report.heard)
        finally:
            report.finish()
    tokens = report.tokens or None
    cut = None if isinstance(message, ModelFailure) else step_cut(message)
    await emit(ModelDoneEvent(step=step, elapsed_ms=report.elapsed_ms(), tokens=tokens, cut=cut))
    return message


async def run_turn(
    *,
    session: str,
    text: str,
    history: list[dict[str, Any]],
    broker: ToolCaller,
    model: Model,
    config: LoopConfig,
    emit: Emit,
    added: list[dict[str, Any]],
) -> None:
    """Run one turn, appending the messages it adds to the history to ``added`` as they
    come (so whatever way the turn ends — a reply, an error, a cancel — what happened
    can be kept). Emits every event but ``session``."""
    added.append({"role": "user", "content": text})
    tools = model_tools()
    for step in range(1, config.max_steps + 1):
        force_tool = forces_tool_step(config.first_step, step, text)
        payload = request_payload(
            [*history, *added], tools, force_tool=force_tool, max_tokens=config.max_step_tokens
        )
        message = await _model_step(model, payload, step, emit)
        if isinstance(message, ModelFailure):
            await emit(ErrorFrame(code=message.code, detail=message.detail))
            return
        # One call a step: the request says parallel_tool_calls false, and a small model
        # still repeats its call or adds a cut-off one; the rest are dropped unseen.
        calls = parse_tool_calls(message)[:1]
        added.append(assistant_message(message, calls))
        if not calls:
            await emit(ReplyEvent(text=added[-1]["content"]))
            return
        added.append(await _tool(calls[0], session, broker, emit))
    detail = f"the model made {config.max_steps} calls without a reply ([loop] max_steps)"
    await emit(ErrorFrame(code=ErrorCode.MAX_STEPS, detail=detail))


async def _tool(
    call: ToolCall | BadToolCall, session: str, broker: ToolCaller, emit: Emit
) -> dict[str, Any]:
    call_id = new_call_id()
    started = trio.current_time()
    if isinstance(call, BadToolCall):
        answer = PortAnswer(AnswerOutcome.DENIED, reason=INVALID_ARGUMENTS, detail=call.problem)
        await emit(ToolCallEvent(call=call_id, tool=call.name, arguments={}))
    else:
        await emit(ToolCallEvent(call=call_id, tool=call.name, arguments=call.arguments))

        async def waiting(pending: Pending) -> None:
            await emit(
                WaitingEvent(
                    call=call_id,
                    approval=pending.approval,
                    grant=pending.grant,
                    expires_at=pending.expires_at,
                )
            )

        request = ToolRequest(
            call=call_id, session=session, tool=call.name, arguments=call.arguments
        )
        answer = await broker.call(request, waiting)
    elapsed_s = trio.current_time() - started
    await emit(result_event(call_id, call.name, answer, elapsed_s=elapsed_s))
    return tool_message(call.id, answer)
