"""A scripted stand-in for llama.cpp's ``llama-server``.

It answers the OpenAI-compatible chat endpoint from a script of model turns, in the
shapes a real llama-server uses: ``tool_calls[i].function.arguments`` is a
JSON *string*, ``content`` may be ``""``, a streamed answer is SSE ``data:`` events (one
a token: content deltas, or a tool call's name and then its arguments in pieces) ending
in ``data: [DONE]``. ``GET /slots`` is a list of slots with ``is_processing``; ``GET
/health`` is 503 ``Loading model`` until :attr:`FakeLlama.loading` is False; errors are
``{"error": {"code", "message", "type"}}``. Every chat request body is kept in
:attr:`FakeLlama.requests`.

In a test: ``await nursery.start(fake.serve)`` (127.0.0.1, a free port; the URL is
``fake.url``). As a program (tests/e2e): ``python tests/fakes/llama_server.py --script
turns.json [--port N] [--record requests.jsonl]`` prints ``listening URL`` when ready;
:func:`as_process` starts it so and yields the URL.

A turn is ``{"content": "text"}``, ``{"tool_calls": [{"name": …, "arguments": {…} or
"raw string"}]}``, or ``{"status": 400, "error": {...}}``; after the last turn every
request gets ``{"content": "(the script has ended)"}``. ``"cut_after": N`` in a turn
ends its stream after N tokens without its end, as a server that broke off.

Like llama-server it *writes* its answer token by token (a token here: up to
:data:`TOKEN_CHARS` characters), a tool call as ``<tool_call>\n{"name": …, "arguments":
…}\n</tool_call>``, and honours the request's ``stop`` strings (the answer ends before
the first one; the tokens up to its end count) and ``max_tokens``. A tool-call turn with
``"until_stopped": true`` is the built-in model under llama-server's tool grammar: it
never ends by itself, but writes its last call again and again until a stop string or
``max_tokens`` ends it (``finish_reason`` ``length``, every call it wrote in
``tool_calls``). ``usage.completion_tokens`` is the tokens written; a stream gives the
usage only when ``stream_options.include_usage`` asks, in an event of its own, as
llama-server does. :attr:`FakeLlama.token_delay` seconds pass per token; slot 0 reports
``is_processing`` while a generation runs, and a client that leaves ends it at once.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any

import attrs
import hypercorn.config
import hypercorn.trio
import orjson
import trio

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

MODEL_ID = "fake-model.gguf"
TOKEN_CHARS = 4
"""Characters of the answer a token of this model writes."""
PROMPT_TOKENS = 42
CALL_OPEN = "<tool_call>\n"
CALL_CLOSE = "\n</tool_call>"


@attrs.define
class FakeLlama:
    script: list[dict[str, Any]] = attrs.Factory(list)
    loading: bool = False
    processing: bool = False
    record: Path | None = None
    requests: list[dict[str, Any]] = attrs.Factory(list)
    paths: list[str] = attrs.Factory(list)
    """Every request's ``METHOD /path?query`` as it arrived."""
    headers: list[list[tuple[str, str]]] = attrs.Factory(list)
    """Every request's headers as they arrived (names lowercase), in the order of
    :attr:`paths`."""
    url: str = ""
    token_delay: float = 0.0
    """Seconds each token takes to write."""
    generations: int = 0
    """Chat answers being written now (slot 0 is processing while any is)."""
    usage: list[dict[str, int]] = attrs.Factory(list)
    """Every chat answer's usage, as written (even when a stream did not send it)."""
    hold_calls: trio.Event | None = None
    """When given, a streamed answer stops before its first tool call until it is set:
    the model still writing, for as long as a test needs (in process only)."""
    _turn: int = 0

    async def serve(
        self,
        port: int = 0,
        *,
        uds: Path | None = None,
        task_status: Any = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve on 127.0.0.1:``port``, or on the Unix socket ``uds`` (its URL then
        ``unix:///…``, as the built-in model's)."""
        config = hypercorn.config.Config()
        config.bind = [f"127.0.0.1:{port}" if uds is None else f"unix:{uds}"]
        config.accesslog = None
        config.errorlog = None
        async with trio.open_nursery() as nursery:
            serve = functools.partial(hypercorn.trio.serve, self, config)  # type: ignore[arg-type]
            binds = await nursery.start(serve)
            self.url = binds[0] if uds is None else f"unix://{uds}"
            task_status.started(self.url)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                kind = message["type"].rsplit(".", 1)[-1]
                await send({"type": f"lifespan.{kind}.complete"})
                if kind == "shutdown":
                    return
        if scope["type"] != "http":
            return
        method, path = scope["method"], scope["path"]
        query = scope.get("query_string", b"").decode()
        self.paths.append(f"{method} {path}" + (f"?{query}" if query else ""))
        self.headers.append(
            [(name.decode("latin-1"), value.decode("latin-1")) for name, value in scope["headers"]]
        )
        body = bytearray()
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if (method, path) == ("GET", "/health"):
            if self.loading:
                await _json(
                    send,
                    503,
                    {
                        "error": {
                            "code": 503,
                            "message": "Loading model",
                            "type": "unavailable_error",
                        }
                    },
                )
            else:
                await _json(send, 200, {"status": "ok"})
        elif (method, path) == ("GET", "/slots"):
            await _json(
                send,
                200,
                [
                    {
                        "id": 0,
                        "n_ctx": 8192,
                        "speculative": False,
                        "is_processing": self.processing or self.generations > 0,
                        "next_token": [{"has_next_token": True}],
                    }
                ],
            )
        elif (method, path) == ("GET", "/v1/models"):
            await _json(
                send, 200, {"object": "list", "data": [{"id": MODEL_ID, "object": "model"}]}
            )
        elif (method, path) == ("POST", "/v1/chat/completions"):
            request = orjson.loads(body)
            self.requests.append(request)
            if self.record is not None:
                with self.record.open("ab") as log:
                    log.write(orjson.dumps(request) + b"\n")
            self.generations += 1
            try:
                await self._chat(request, receive, send)
            finally:
                self.generations -= 1
        else:
            await _json(
                send,
                404,
                {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}},
            )

    def _next_turn(self) -> dict[str, Any]:
        if self._turn < len(self.script):
            turn = self.script[self._turn]
            self._turn += 1
            return turn
        return {"content": "(the script has ended)"}

    async def _chat(self, request: dict[str, Any], receive: Receive, send: Send) -> None:
        turn = self._next_turn()
        if "status" in turn:
            await _json(send, turn["status"], {"error": turn["error"]})
            return
        answer = _write(turn, request)
        self.usage.append(answer.usage())
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_end_on_disconnect, receive, nursery.cancel_scope)
            if request.get("stream") is True:
                await self._stream(answer, request, send, turn.get("cut_after"))
            else:
                await trio.sleep(self.token_delay * answer.tokens)
                await _json(send, 200, answer.body(request.get("model", MODEL_ID)))
            nursery.cancel_scope.cancel()

    async def _stream(
        self, answer: Answer, request: dict[str, Any], send: Send, cut_after: int | None
    ) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        for sent, delta in enumerate(answer.deltas()):
            if sent == cut_after:
                # The server broke off: the stream ends here, without its end.
                await send({"type": "http.response.body", "body": b""})
                return
            await trio.sleep(self.token_delay)
            if "tool_calls" in delta and self.hold_calls is not None:
                await self.hold_calls.wait()
            await _event(send, {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
        final = {"choices": [{"index": 0, "delta": {}, "finish_reason": answer.finish_reason}]}
        await _event(send, final)
        options = request.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage") is True:
            await _event(send, {"choices": [], "usage": answer.usage()})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


@attrs.frozen
class Answer:
    """What the model wrote for one request: its text and the calls in it."""

    content: str
    calls: list[tuple[str, str]]
    """(name, arguments as a JSON string) of each call written."""
    tokens: int
    finish_reason: str

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.calls:
            message["tool_calls"] = [
                {
                    "type": "function",
                    "id": f"call-{index}",
                    "function": {"name": name, "arguments": arguments},
                }
                for index, (name, arguments) in enumerate(self.calls)
            ]
        return message

    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": PROMPT_TOKENS,
            "completion_tokens": self.tokens,
            "total_tokens": PROMPT_TOKENS + self.tokens,
        }

    def body(self, model: str) -> dict[str, Any]:
        return {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "model": model,
            "choices": [
                {"index": 0, "message": self.message(), "finish_reason": self.finish_reason}
            ],
            "usage": self.usage(),
        }

    def deltas(self) -> Iterator[dict[str, Any]]:
        """One delta a token, as llama-server streams them: the content in pieces; a
        call's id, name and first piece of its arguments, then the rest in pieces."""
        for piece in _pieces(self.content):
            yield {"content": piece}
        for index, (name, arguments) in enumerate(self.calls):
            pieces = _pieces(arguments) or [""]
            yield {
                "tool_calls": [
                    {
                        "index": index,
                        "id": f"call-{index}",
                        "type": "function",
                        "function": {"name": name, "arguments": pieces[0]},
                    }
                ]
            }
            for piece in pieces[1:]:
                yield {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}


def _pieces(text: str) -> list[str]:
    return [text[at : at + TOKEN_CHARS] for at in range(0, len(text), TOKEN_CHARS)]


def _tokens(text: str) -> int:
    return -(-len(text) // TOKEN_CHARS)


def _write(turn: dict[str, Any], request: dict[str, Any]) -> Answer:
    """The answer the model writes for ``turn``, cut by the request's stop strings and
    ``max_tokens`` as llama-server cuts it."""
    calls = [
        (
            call["name"],
            call["arguments"]
            if isinstance(call["arguments"], str)
            else orjson.dumps(call["arguments"]).decode(),
        )
        for call in turn.get("tool_calls", [])
    ]
    blocks = [
        f'{CALL_OPEN}{{"name": "{name}", "arguments": {args}}}{CALL_CLOSE}' for name, args in calls
    ]
    limit = request.get("max_tokens")
    limit = limit if isinstance(limit, int) and limit > 0 else 1_000_000
    text = turn.get("content", "") + "\n".join(blocks)
    if turn.get("until_stopped") and blocks:
        # Enough repeats of the last call to run past any stop or the length cap.
        repeats = limit * TOKEN_CHARS // len(blocks[-1]) + 2
        text += ("\n" + blocks[-1]) * repeats
    finish = "tool_calls" if calls else "stop"
    stops = request.get("stop") or []
    stops = [stops] if isinstance(stops, str) else stops
    ends = [(text.find(stop), stop) for stop in stops if isinstance(stop, str) and stop in text]
    if ends:
        at, stop = min(ends)
        tokens = _tokens(text[: at + len(stop)])
        text = text[:at]
    else:
        tokens = _tokens(text)
    if tokens > limit:
        tokens, text, finish = limit, text[: limit * TOKEN_CHARS], "length"
    written = text.count(CALL_OPEN)
    written_calls = [calls[min(index, len(calls) - 1)] for index in range(written)]
    content = text if not calls else turn.get("content", "")
    return Answer(content, written_calls, tokens, finish)


async def _end_on_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


async def _event(send: Send, data: object) -> None:
    chunk = b"data: " + orjson.dumps(data) + b"\n\n"
    await send({"type": "http.response.body", "body": chunk, "more_body": True})


async def _json(send: Send, status: int, body: object) -> None:
    data = orjson.dumps(body)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": data})


@contextlib.contextmanager
def as_process(*arguments: str, stop_timeout: float = 30.0) -> Iterator[str]:
    """This server as a program with ``arguments``; yields its URL once it listens,
    and stops it on the way out."""
    fake = subprocess.Popen(
        [sys.executable, __file__, *arguments], stdout=subprocess.PIPE, text=True
    )
    try:
        assert fake.stdout is not None
        line = fake.stdout.readline()
        assert line.startswith("listening http://127.0.0.1:"), line
        yield line.split()[1]
    finally:
        fake.terminate()
        fake.communicate(timeout=stop_timeout)


def main() -> None:
    parser = argparse.ArgumentParser(description="A scripted llama-server for tests.")
    parser.add_argument("--script", type=Path)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--record", type=Path)
    parser.add_argument("--busy", action="store_true", help="slot 0 reports is_processing")
    options = parser.parse_args()
    script = orjson.loads(options.script.read_bytes()) if options.script else []
    fake = FakeLlama(script=script, record=options.record, processing=options.busy)

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            url = await nursery.start(fake.serve, options.port)
            print(f"listening {url}", flush=True)

    trio.run(run)


if __name__ == "__main__":
    sys.exit(main())
