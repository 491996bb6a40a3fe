"""A scripted stand-in for llama.cpp's ``llama-server``.

It answers the OpenAI-compatible chat endpoint from a script of model turns, in the
shapes a real llama-server uses: ``tool_calls[i].function.arguments`` is a
JSON *string*, ``content`` may be ``""``, a streamed answer is SSE ``data:`` events ending
in ``data: [DONE]`` with the usage in the last event before it. ``GET /slots`` is a
list of slots with ``is_processing``; ``GET /health`` is 503 ``Loading model`` until
:attr:`FakeLlama.loading` is False; errors are ``{"error": {"code", "message",
"type"}}``. Every chat request body is kept in :attr:`FakeLlama.requests`.

In a test: ``await nursery.start(fake.serve)`` (127.0.0.1, a free port; the URL is
``fake.url``). As a program (tests/e2e): ``python tests/fakes/llama_server.py --script
turns.json [--port N] [--record requests.jsonl]`` prints ``listening URL`` when ready;
:func:`as_process` starts it so and yields the URL.

A turn is ``{"content": "text"}``, ``{"tool_calls": [{"name": …, "arguments": {…} or
"raw string"}]}``, or ``{"status": 400, "error": {...}}``; after the last turn every
request gets ``{"content": "(the script has ended)"}``.
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
                        "is_processing": self.processing,
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
            await self._chat(request, send)
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

    async def _chat(self, request: dict[str, Any], send: Send) -> None:
        turn = self._next_turn()
        if "status" in turn:
            await _json(send, turn["status"], {"error": turn["error"]})
            return
        message: dict[str, Any] = {"role": "assistant", "content": turn.get("content", "")}
        finish = "stop"
        if "tool_calls" in turn:
            message["tool_calls"] = [
                {
                    "type": "function",
                    "id": f"call-{index}",
                    "function": {
                        "name": call["name"],
                        "arguments": call["arguments"]
                        if isinstance(call["arguments"], str)
                        else orjson.dumps(call["arguments"]).decode(),
                    },
                }
                for index, call in enumerate(turn["tool_calls"])
            ]
            finish = turn.get("finish_reason", "tool_calls")
        usage = {"prompt_tokens": 42, "completion_tokens": 7, "total_tokens": 49}
        answer = {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "model": request.get("model", MODEL_ID),
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": usage,
        }
        if request.get("stream") is not True:
            await _json(send, 200, answer)
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        for word in str(message["content"]).split(" ") if message["content"] else []:
            delta = {"choices": [{"index": 0, "delta": {"content": word + " "}}]}
            await _event(send, delta)
        final = {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}], "usage": usage}
        await _event(send, final)
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


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
