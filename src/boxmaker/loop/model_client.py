"""loopd's one way to the model: inferproxy on ``run/infer.sock`` (docs/egress.md).

:meth:`ModelClient.complete` POSTs one chat request, streamed (``"stream": true``, the
answer as server-sent events), and returns the assistant message assembled from it, or a
:class:`ModelFailure` saying why there is none (inferproxy not running, the model
unreachable behind it, an error from the model, an answer without a message). It never
raises for those. While the model writes, each event is reported to ``on_progress``
(:class:`ModelProgress`: the tokens so far, the text that came), so the owner can see
the work and read a reply as it is written. Cancelling it closes the request at once:
inferproxy then closes its own, and the model's slot is free again. A reply whose tail
repeats (loop/runaway.py) is closed so too, as soon as the repeat is seen: the message
then holds the text up to the repeat, and ``finish_reason`` is :data:`REPEATED`.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final

import attrs
import httpx
import orjson
import trio
from httpx_sse import SSEError, aconnect_sse

from boxmaker.loop.runaway import RepetitionGuard, find_cut
from boxmaker.wire import ErrorCode

CONNECT_S: Final = 5.0
ANSWER_S: Final = 600.0
"""How long the model may be silent within one call (the time to the first token
included): a small model on two cores answers in seconds, a big one on a slow machine in
minutes."""
START_PROXY: Final = "start the daemons with `bxctl up`"
STREAM_OPTIONS: Final = {"include_usage": True}
"""Asks for the usage in a last event of its own (OpenAI's ``stream_options``)."""
DONE: Final = "[DONE]"
REPEATED: Final = "repeated"
"""The ``finish_reason`` of a reply the repetition guard cut (beside the model's own
``stop``, ``length``, ``tool_calls``)."""


@attrs.frozen
class ModelFailure:
    code: ErrorCode
    detail: str


@attrs.frozen
class ModelProgress:
    tokens: int
    """Completion tokens generated so far in this model call (the events that carried a
    token: llama-server sends one a token)."""
    content: str
    """This event's text of the reply ("" when none, e.g. a piece of a tool call)."""


OnProgress = Callable[[ModelProgress], Awaitable[None]]


@attrs.define
class StreamedMessage:
    """The assistant message, put together from a stream's chunks as they come.

    >>> message = StreamedMessage()
    >>> message.add({"choices": [{"delta": {"role": "assistant", "content": None}}]})
    >>> message.add({"choices": [{"delta": {"content": "Hel"}}]})
    ModelProgress(tokens=1, content='Hel')
    >>> message.add({"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "c",
    ...     "type": "function", "function": {"name": "read_file", "arguments": "{"}}]}}]})
    ModelProgress(tokens=2, content='')
    >>> message.add({"choices": [{"delta": {"tool_calls": [{"index": 0,
    ...     "function": {"arguments": "}"}}]}, "finish_reason": "tool_calls"}]})
    ModelProgress(tokens=3, content='')
    >>> message.add({"choices": [], "usage": {"completion_tokens": 3}})
    >>> message.message()  # doctest: +NORMALIZE_WHITESPACE
    {'role': 'assistant', 'content': 'Hel', 'tool_calls': [{'id': 'c', 'type': 'function',
     'function': {'name': 'read_file', 'arguments': '{}'}}],
     'finish_reason': 'tool_calls', 'usage': {'completion_tokens': 3}}
    """

    content: list[str] = attrs.Factory(list)
    calls: dict[int, dict[str, Any]] = attrs.Factory(dict)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    tokens: int = 0
    choices: int = 0
    """Chunks that carried a choice: none means the stream held no message."""
    guard: RepetitionGuard = attrs.Factory(RepetitionGuard)

    def add(self, chunk: dict[str, Any]) -> ModelProgress | None:
        """Take one chunk; the progress it makes when it carries a token."""
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        choices = chunk.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices else None
        if not isinstance(choice, dict):
            return None
        self.choices += 1
        if isinstance(choice.get("finish_reason"), str):
            self.finish_reason = choice["finish_reason"]
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return None
        text = delta.get("content")
        text = text if isinstance(text, str) else ""
        pieces = delta.get("tool_calls")
        pieces = pieces if isinstance(pieces, list) else []
        if not text and not pieces:
            return None
        self.content.append(text)
        if text and self.guard.feed(text) is not None:
            self.finish_reason = REPEATED
        for piece in pieces:
            if isinstance(piece, dict):
                self._add_call_piece(piece)
        self.tokens += 1
        return ModelProgress(tokens=self.tokens, content=text)

    def _add_call_piece(self, piece: dict[str, Any]) -> None:
        index = piece.get("index")
        index = index if isinstance(index, int) else len(self.calls)
        call = self.calls.setdefault(
            index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
        )
        if isinstance(piece.get("id"), str) and piece["id"]:
            call["id"] = piece["id"]
        function = piece.get("function")
        if isinstance(function, dict):
            if isinstance(function.get("name"), str):
                call["function"]["name"] += function["name"]
            if isinstance(function.get("arguments"), str):
                call["function"]["arguments"] += function["arguments"]

    @property
    def repeated(self) -> bool:
        return self.guard.cut is not None

    def message(self) -> dict[str, Any]:
        """The message as a non-streamed answer has it, with ``finish_reason`` (and
        ``usage`` when the stream gave it) added; a reply cut for repeating itself ends
        at the repeat, without the calls it broke off."""
        if self.guard.cut is not None:
            return _repeated(self.guard.text, self.guard.cut.keep, self.usage)
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.content)}
        if self.calls:
            message["tool_calls"] = [self.calls[index] for index in sorted(self.calls)]
        message["finish_reason"] = self.finish_reason
        if self.usage is not None:
            message["usage"] = self.usage
        return message


def _repeated(text: str, keep: int, usage: dict[str, Any] | None) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": text[:keep],
        "finish_reason": REPEATED,
    }
    if usage is not None:
        message["usage"] = usage
    return message


class ModelClient:
    def __init__(self, infer_sock: Path) -> None:
        self.infer_sock = infer_sock
        timeout = httpx.Timeout(connect=CONNECT_S, read=ANSWER_S, write=30.0, pool=CONNECT_S)
        transport = httpx.AsyncHTTPTransport(uds=str(infer_sock))
        self._client = httpx.AsyncClient(
            transport=transport, base_url="http://inferproxy", timeout=timeout, trust_env=False
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def complete(
        self, payload: dict[str, Any], *, on_progress: OnProgress | None = None
    ) -> dict[str, Any] | ModelFailure:
        """The first choice's assistant message (with ``finish_reason``, and ``usage``
        when given), streamed; ``on_progress`` is awaited for each event that carries a
        token, in order, in a task of its own (so a cancel always finds the stream's
        reader inside httpx's own read, and no half-read stream is left behind)."""
        body = {**payload, "stream": True, "stream_options": STREAM_OPTIONS}
        progress_in, progress_out = trio.open_memory_channel[ModelProgress](math.inf)
        try:
            async with trio.open_nursery() as nursery:
                if on_progress is not None:
                    nursery.start_soon(_report, progress_out, on_progress)
                with progress_in:
                    return await self._read(body, progress_in)
        except BaseExceptionGroup as group:
            # on_progress's own failure, or a cancel: as if there were no task.
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise

    async def _read(
        self, body: dict[str, Any], progress: trio.MemorySendChannel[ModelProgress]
    ) -> dict[str, Any] | ModelFailure:
        streamed = StreamedMessage()
        failure: ModelFailure | None = None
        done = False
        # Cancelled when the reply repeats itself: the cancel finds the reader inside
        # httpx's own read and closes the request, as an owner's cancel does.
        with trio.CancelScope() as reading:
            try:
                async with aconnect_sse(
                    self._client, "POST", "/v1/chat/completions", content=orjson.dumps(body)
                ) as source:
                    response = source.response
                    if response.status_code != 200 or not _is_event_stream(response):
                        return _whole_answer(response.status_code, await response.aread())
                    # Read to the end, awaiting nothing else (the end comes right after
                    # [DONE]): httpx's reading is async generators inside each other, and
                    # one left half-read is a leak trio warns about.
                    async for event in source.aiter_sse():
                        if done or failure is not None or streamed.repeated:
                            continue
                        done = event.data == DONE
                        chunk = _chunk(event.data) if not done else {}
                        if isinstance(chunk, ModelFailure):
                            failure = chunk
                            continue
                        step = streamed.add(chunk)
                        if step is not None:
                            progress.send_nowait(step)
                        if streamed.repeated:
                            reading.cancel()
            except httpx.ConnectError as exc:
                detail = f"inferproxy is not running on {self.infer_sock} ({exc}); {START_PROXY}"
                return ModelFailure(ErrorCode.MODEL_UNREACHABLE, detail)
            except httpx.TransportError as exc:
                detail = f"the model call failed: {type(exc).__name__}: {exc}"
                return ModelFailure(ErrorCode.MODEL_UNREACHABLE, detail)
            except SSEError as exc:
                return ModelFailure(ErrorCode.MODEL_ERROR, f"the model's stream is broken: {exc}")
        if streamed.repeated:
            return streamed.message()
        if failure is not None:
            return failure
        if not done:
            detail = "the model's answer broke off before its end"
            return ModelFailure(ErrorCode.MODEL_UNREACHABLE, detail)
        if streamed.choices == 0:
            return ModelFailure(ErrorCode.MODEL_ERROR, "the model's answer has no message")
        return streamed.message()


async def _report(
    progress: trio.MemoryReceiveChannel[ModelProgress], on_progress: OnProgress
) -> None:
    async with progress:
        async for step in progress:
            await on_progress(step)


def _is_event_stream(response: httpx.Response) -> bool:
    kind: str = response.headers.get("content-type", "")
    return kind.partition(";")[0].strip() == "text/event-stream"


def _chunk(data: str) -> dict[str, Any] | ModelFailure:
    """One event's JSON; an error event (llama-server sends one when it fails mid-way)
    or an unreadable one is a failure."""
    try:
        chunk = orjson.loads(data)
    except orjson.JSONDecodeError:
        return ModelFailure(ErrorCode.MODEL_ERROR, "the model sent an event that is not JSON")
    if not isinstance(chunk, dict):
        return ModelFailure(ErrorCode.MODEL_ERROR, "the model sent an event that is not an object")
    if "error" in chunk:
        return ModelFailure(ErrorCode.MODEL_ERROR, f"the model failed: {_error_message(chunk)}")
    return chunk


def _error_message(body: object) -> str:
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return str(message) if message else "no error message"


def _whole_answer(status: int, data: bytes) -> dict[str, Any] | ModelFailure:
    """An answer that is not a stream: an error (inferproxy's or the model's), or a
    server that does not stream and answered whole."""
    try:
        body: Any = orjson.loads(data)
    except orjson.JSONDecodeError:
        body = None
    if status != 200:
        code = ErrorCode.MODEL_UNREACHABLE if status == 502 else ErrorCode.MODEL_ERROR
        return ModelFailure(code, f"HTTP {status}: {_error_message(body)}")
    try:
        choice = body["choices"][0]
        message = dict(choice["message"])
    except (TypeError, KeyError, IndexError):
        return ModelFailure(ErrorCode.MODEL_ERROR, "the model's answer has no message")
    usage = body["usage"] if isinstance(body.get("usage"), dict) else None
    content = message.get("content")
    if isinstance(content, str) and (cut := find_cut(content)) is not None:
        return _repeated(content, cut.keep, usage)
    message["finish_reason"] = choice.get("finish_reason")
    if usage is not None:
        message["usage"] = usage
    return message
