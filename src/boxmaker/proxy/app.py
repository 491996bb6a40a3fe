"""inferproxy's ASGI app (docs/decisions.md, "inferproxy"): the one way to the model,
and a narrow one.

It forwards only ``POST /v1/chat/completions`` (a streamed answer passes through as it
comes), ``GET /v1/models`` (answered with ``[model] name``, the one model a request can
get here, never the server's own id: llama-server's is the weights' file path), ``GET
/health`` and ``GET /slots``; everything else is a 404
JSON error, and nothing is forwarded but the body (no query string, no client headers:
a caller cannot smuggle options or credentials past the proxy). A chat request is pinned
to the configured model and its ``max_tokens`` capped, and may carry only the keys
loopd and OpenAI clients use (:data:`CHAT_KEYS`; loopd's slot keys only on
``infer.sock``): any other key is 400 ``invalid_request`` naming it, so no llama-server
option (``n_probs``, ``lora``, ``ignore_eos``, …) gets past the proxy. On the optional
TCP listener, a configured token is required (``Authorization: Bearer``; 401
``unauthorized`` otherwise). A body over 4 MiB is 413; an unreachable model is 502
``upstream_unreachable`` pointing at the runbook. One log line a request: id, method,
path, status, upstream ms, prompt and completion tokens. A client that leaves before its
answer is complete ends the upstream request at once (the model's slot is free again).

The app holds no socket of its own: serve.py gives it an ``httpx.AsyncClient`` (which
ignores proxy settings of the environment; for a ``unix://`` model, one bound to that
socket) and runs it under hypercorn.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

import attrs
import httpx
import orjson
import trio

log = logging.getLogger("boxmaker.inferproxy")

MAX_BODY: Final = 4 * 1024 * 1024
"""A request body over 4 MiB is refused with 413."""
CHAT_PATH: Final = "/v1/chat/completions"
MODELS_PATH: Final = "/v1/models"
GET_PATHS: Final = frozenset({MODELS_PATH, "/health", "/slots"})
RUNBOOK_MODEL: Final = "docs/runbook.md#model-unreachable"
TOKEN_CAPS: Final = ("max_tokens", "max_completion_tokens")
"""The request keys that bound a completion's length (OpenAI's two)."""
CHAT_KEYS: Final = frozenset(
    {
        "model",
        "messages",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        *TOKEN_CAPS,
        "temperature",
        "top_p",
        "stop",
        "stream",
        "stream_options",
        "seed",
        "response_format",
    }
)
"""The chat request keys forwarded from anyone: those of OpenAI's API that clients use.
llama-server reads many more from the same body (``n_probs``, ``lora``, ``ignore_eos``,
``t_max_predict_ms``, ``n_predict``, …), none of which a caller needs."""
STREAM_OPTION_KEYS: Final = frozenset({"include_usage"})
"""What ``stream_options`` may hold: nothing hides inside it either."""
LOOPD_KEYS: Final = CHAT_KEYS | {"id_slot", "cache_prompt"}
"""What loopd sends on infer.sock besides (its slot and prompt cache: loop/turn.py);
never from the TCP listener, whose callers must not take or read loopd's slot."""
UNIX_MODEL_HOST: Final = "http://model"
"""The base URL requests carry when the model is a Unix socket (the host is unused)."""
USAGE_TAIL: Final = 16 * 1024
"""Bytes of a streamed answer kept to find its usage, which comes in the last event."""
_PASSED_HEADERS: Final = (b"content-type", b"cache-control")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


@attrs.frozen
class ProxySettings:
    upstream: str
    """The model server's URL, e.g. ``http://127.0.0.1:8080`` or
    ``unix:///home/me/.local/state/boxmaker/run/model.sock``."""
    model: str
    max_tokens: int
    token: str | None = attrs.field(default=None, repr=False)
    """Required on the TCP listener when set (``[proxy] token_file``); never logged."""


def unix_socket_of(url: str) -> str | None:
    """The socket path of a ``unix://`` model URL, else None.

    >>> unix_socket_of("unix:///bx/run/model.sock"), unix_socket_of("http://m:80")
    ('/bx/run/model.sock', None)
    """
    prefix = "unix://"
    return url[len(prefix) :] if url.startswith(prefix) else None


class BodyTooLarge(Exception):
    """The request body is over its limit (:data:`MAX_BODY` here)."""


@attrs.define
class _Exchange:
    """What one request's log line says."""

    id: str
    method: str
    path: str
    status: int = 0
    upstream_ms: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None

    def log(self) -> None:
        upstream = "-" if self.upstream_ms is None else f"{self.upstream_ms:.0f}"
        log.info(
            "request id=%s method=%s path=%s status=%d upstream_ms=%s "
            "prompt_tokens=%s completion_tokens=%s",
            self.id,
            self.method,
            self.path[:200],
            self.status,
            upstream,
            "-" if self.prompt_tokens is None else self.prompt_tokens,
            "-" if self.completion_tokens is None else self.completion_tokens,
        )

    def note_usage(self, answer: object) -> None:
        if isinstance(answer, dict) and isinstance(answer.get("usage"), dict):
            usage = answer["usage"]
            prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
            self.prompt_tokens = prompt if isinstance(prompt, int) else None
            self.completion_tokens = completion if isinstance(completion, int) else None


def pin_request(
    body: object, settings: ProxySettings, *, allowed: frozenset[str] = CHAT_KEYS
) -> dict[str, Any] | str:
    """The chat request as it goes upstream: the configured model, and every length cap
    at most the configured ``max_tokens`` (an absent ``max_tokens`` is set to it). A
    problem with the body (not an object, a key outside ``allowed``) is returned as its
    message: a key is refused rather than dropped, so a caller never believes an
    option it sent was applied.

    >>> s = ProxySettings("http://m", "default", 100)
    >>> pin_request({"model": "other", "max_tokens": 5000, "messages": []}, s)
    {'model': 'default', 'max_tokens': 100, 'messages': []}
    >>> pin_request({"messages": [], "max_completion_tokens": 7}, s)
    {'messages': [], 'max_completion_tokens': 7, 'model': 'default', 'max_tokens': 100}
    >>> pin_request({"messages": [], "n_probs": 5, "lora": []}, s)
    'inferproxy does not forward these keys: lora, n_probs'
    >>> pin_request([1], s)
    'the body must be a JSON object'
    >>> pin_request({"messages": [], "stream_options": {"include_usage": True, "n_probs": 5}}, s)
    'stream_options may hold only "include_usage"'
    """
    if not isinstance(body, dict):
        return "the body must be a JSON object"
    refused = sorted(str(key)[:64] for key in body if key not in allowed)
    if refused:
        return "inferproxy does not forward these keys: " + ", ".join(refused[:20])
    options = body.get("stream_options", {})
    if not isinstance(options, dict) or not options.keys() <= STREAM_OPTION_KEYS:
        return 'stream_options may hold only "include_usage"'
    pinned = dict(body)
    pinned["model"] = settings.model
    pinned.setdefault("max_tokens", settings.max_tokens)
    for key in TOKEN_CAPS:
        if key in pinned:
            value = pinned[key]
            # bool is an int to Python, not to a JSON reader: true is not a length.
            within = type(value) is int and 0 < value <= settings.max_tokens
            pinned[key] = value if within else settings.max_tokens
    return pinned


def _error_body(kind: str, message: str) -> bytes:
    return orjson.dumps({"error": {"type": kind, "message": message}})


def _passed_headers(response: httpx.Response) -> list[tuple[bytes, bytes]]:
    return [
        (name, value) for name, value in response.headers.raw if name.lower() in _PASSED_HEADERS
    ]


class InferProxy:
    """The ASGI app. ``client`` is the proxy's one HTTP client to the model."""

    def __init__(self, settings: ProxySettings, client: httpx.AsyncClient) -> None:
        self.settings = settings
        self.client = client
        self._upstream = settings.upstream.rstrip("/")
        self._base = UNIX_MODEL_HOST if unix_socket_of(self._upstream) else self._upstream
        self._token = None if settings.token is None else settings.token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        exchange = _Exchange(
            id="r-" + secrets.token_hex(6), method=scope["method"], path=scope["path"]
        )
        try:
            await self._route(exchange, scope, receive, send)
        finally:
            exchange.log()

    async def _route(self, exchange: _Exchange, scope: Scope, receive: Receive, send: Send) -> None:
        method, path = exchange.method, exchange.path
        if _on_tcp(scope) and not self._authorized(scope):
            message = "the TCP listener needs the token of [proxy] token_file "
            message += "(Authorization: Bearer …); see docs/runbook.md#proxy-token"
            await self._reply(
                exchange,
                send,
                401,
                _error_body("unauthorized", message),
                extra=[(b"www-authenticate", b"Bearer")],
            )
        elif method == "POST" and path == CHAT_PATH:
            await self._chat(exchange, scope, receive, send)
        elif method in ("GET", "HEAD") and path in GET_PATHS:
            await self._forward_get(exchange, receive, send)
        else:
            message = f"{method} {path[:200]} is not served here; inferproxy forwards only "
            message += "POST /v1/chat/completions and GET /v1/models, /health, /slots"
            await self._reply(exchange, send, 404, _error_body("not_found", message))

    def _authorized(self, scope: Scope) -> bool:
        if self._token is None:
            return True
        given = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                given = bytes(value)
        # Constant time: how much of a guess was right must not show in the timing.
        return hmac.compare_digest(given, b"Bearer " + self._token)

    async def _chat(self, exchange: _Exchange, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            raw = await read_body(scope, receive)
        except BodyTooLarge:
            message = f"the request body is over {MAX_BODY} bytes"
            await self._reply(exchange, send, 413, _error_body("request_too_large", message))
            return
        try:
            body: object = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = None
            problem: str | None = "the body is not valid JSON"
        else:
            problem = None
        allowed = CHAT_KEYS if _on_tcp(scope) else LOOPD_KEYS
        pinned = pin_request(body, self.settings, allowed=allowed) if problem is None else problem
        if isinstance(pinned, str):
            await self._reply(exchange, send, 400, _error_body("invalid_request", pinned))
            return
        request = self.client.build_request(
            "POST",
            self._base + CHAT_PATH,
            content=orjson.dumps(pinned),
            headers={"content-type": "application/json"},
        )
        streamed = pinned.get("stream") is True
        await self._exchange(exchange, receive, send, request, streamed=streamed)

    async def _forward_get(self, exchange: _Exchange, receive: Receive, send: Send) -> None:
        request = self.client.build_request(exchange.method, self._base + exchange.path)
        await self._exchange(exchange, receive, send, request, streamed=False)

    async def _exchange(
        self,
        exchange: _Exchange,
        receive: Receive,
        send: Send,
        request: httpx.Request,
        *,
        streamed: bool,
    ) -> None:
        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            # A client that leaves stops the model's work: the upstream request is
            # closed when this is cancelled, from the first moment (llama-server sends
            # a whole answer's status only at its end), and llama-server frees the slot.
            nursery.start_soon(_cancel_on_disconnect, receive, nursery.cancel_scope)
            await self._pass_answer(exchange, send, request, started, streamed=streamed)
            nursery.cancel_scope.cancel()

    async def _pass_answer(
        self,
        exchange: _Exchange,
        send: Send,
        request: httpx.Request,
        started: float,
        *,
        streamed: bool,
    ) -> None:
        try:
            response = await self._send(exchange, request)
        except httpx.TransportError as exc:
            exchange.upstream_ms = (time.perf_counter() - started) * 1000
            cause = causes(exc)
            log.warning("request %s: the model server cannot be reached: %s", exchange.id, cause)
            message = (
                f"the model server at {self._upstream} cannot be reached "
                f"({type(exc).__name__}: {exc}); see {RUNBOOK_MODEL}"
            )
            await self._reply(exchange, send, 502, _error_body("upstream_unreachable", message))
            return
        exchange.status = response.status_code
        headers = [*_passed_headers(response), (b"x-request-id", exchange.id.encode())]
        last = bytearray()
        try:
            if streamed:
                await _pass_stream(response, send, headers, last)
            else:
                last += await response.aread()
                if exchange.path == MODELS_PATH and exchange.status == 200:
                    last[:] = _models_answer(self.settings.model)
                headers.append((b"content-length", str(len(last)).encode()))
                await send(
                    {"type": "http.response.start", "status": exchange.status, "headers": headers}
                )
                await send({"type": "http.response.body", "body": bytes(last)})
        except httpx.TransportError as exc:
            # The answer had begun: its status is sent, so the stream just ends.
            log.warning("request %s: the model server broke off: %s", exchange.id, exc)
        finally:
            # Here, not after the last send: the client's end may cancel this right then.
            exchange.note_usage(_last_usage(bytes(last), streamed=streamed))
            exchange.upstream_ms = (time.perf_counter() - started) * 1000
            await response.aclose()

    async def _send(self, exchange: _Exchange, request: httpx.Request) -> httpx.Response:
        """``request`` sent, its answer's head read. Once more on another connection when
        a kept one was closed before any byte of the answer: the server closed it idle
        as it was taken (docs/decisions.md, "inferproxy")."""
        try:
            return await self.client.send(request, stream=True)
        except CLOSED_BEFORE_ANSWER as exc:
            log.warning(
                "request %s: the model server closed the connection before answering (%s); "
                "sending it once more",
                exchange.id,
                causes(exc),
            )
        return await self.client.send(request, stream=True)

    async def _reply(
        self,
        exchange: _Exchange,
        send: Send,
        status: int,
        body: bytes,
        *,
        extra: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        exchange.status = status
        headers = [(b"content-type", b"application/json"), (b"x-request-id", exchange.id.encode())]
        headers += extra or []
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


CLOSED_BEFORE_ANSWER: Final = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)
"""What a connection closed under a request raises before the answer's first byte (the
answer's head is read inside ``send``; a break after it is another path)."""


def causes(exc: BaseException) -> str:
    """An exception and what it came from, for the log: httpx's words alone ("Server
    disconnected") do not say which socket call failed.

    >>> try:
    ...     try:
    ...         raise ConnectionResetError(104, "Connection reset by peer")
    ...     except OSError as inner:
    ...         raise httpx.ReadError("read failed") from inner
    ... except httpx.ReadError as outer:
    ...     print(causes(outer))
    ReadError: read failed <- ConnectionResetError: [Errno 104] Connection reset by peer
    """
    chain: list[str] = []
    seen: BaseException | None = exc
    while seen is not None and len(chain) < 8:
        said = f"{type(seen).__name__}: {seen}"
        if not chain or chain[-1] != said:  # httpx repeats httpcore's words
            chain.append(said)
        if isinstance(seen, BaseExceptionGroup):  # trio's connect: one error an address
            seen = seen.exceptions[0]
        else:
            seen = seen.__cause__ or seen.__context__
    return " <- ".join(chain)


def _models_answer(model: str) -> bytes:
    """``GET /v1/models`` as inferproxy serves it: the configured model only.

    >>> _models_answer("default")
    b'{"object":"list","data":[{"id":"default","object":"model","owned_by":"boxmaker"}]}'
    """
    entry = {"id": model, "object": "model", "owned_by": "boxmaker"}
    return orjson.dumps({"object": "list", "data": [entry]})


def _on_tcp(scope: Scope) -> bool:
    """Did the request come on the TCP listener? hypercorn gives a Unix socket's
    requests no server address."""
    return scope.get("server") is not None


async def _pass_stream(
    response: httpx.Response, send: Send, headers: list[tuple[bytes, bytes]], tail: bytearray
) -> None:
    """Send a streamed answer on as it comes, keeping its last bytes in ``tail`` (for the
    usage; kept as it goes, since the client's leaving may cut this short)."""
    await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
    async for chunk in response.aiter_bytes():
        tail += chunk
        del tail[:-USAGE_TAIL]
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def _cancel_on_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    # The request body was read whole before: what receive() gives now is the end.
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


async def read_body(scope: Scope, receive: Receive, limit: int = MAX_BODY) -> bytes:
    """The whole request body; :class:`BodyTooLarge` as soon as it is known to be over
    ``limit`` (its Content-Length, or what has come)."""
    if _declared_length(scope) > limit:
        raise BodyTooLarge
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        body += message.get("body", b"")
        if len(body) > limit:
            raise BodyTooLarge
        if not message.get("more_body", False):
            break
    return bytes(body)


def _declared_length(scope: Scope) -> int:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return 0  # h11 refuses such a request before it gets here
    return 0


def _last_usage(data: bytes, *, streamed: bool) -> object:
    """The answer that carries the usage: the body, or a stream's last event with one."""
    if not streamed:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            return None
    for line in reversed(data.splitlines()):
        if line.startswith(b"data:") and b'"usage"' in line:
            try:
                return orjson.loads(line[5:])
            except orjson.JSONDecodeError:
                return None
    return None


async def lifespan(receive: Receive, send: Send) -> None:
    """ASGI's lifespan protocol, for an app with nothing to start or stop."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
