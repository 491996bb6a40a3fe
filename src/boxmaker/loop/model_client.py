"""loopd's one way to the model: inferproxy on ``run/infer.sock`` (docs/egress.md).

:meth:`ModelClient.complete` POSTs one chat request and returns the assistant message,
or a :class:`ModelFailure` saying why there is none (inferproxy not running, the model
unreachable behind it, an error from the model, an answer without a message). It never
raises for those.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final

import attrs
import httpx
import orjson

from boxmaker.wire import ErrorCode

CONNECT_S: Final = 5.0
ANSWER_S: Final = 600.0
"""How long one model call may take: a small model on two cores answers in seconds, a
big one on a slow machine in minutes."""
START_PROXY: Final = "start it with `inferproxy serve` (or `bxctl up`)"


@attrs.frozen
class ModelFailure:
    code: ErrorCode
    detail: str


@attrs.frozen
class ModelProgress:
    """How far one model call has come, heard while the model generates."""

    tokens: int
    """Completion tokens generated so far in this model call."""
    content: str
    """This chunk's text delta of the reply ("" when none)."""


OnProgress = Callable[[ModelProgress], Awaitable[None]]


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
        """The first choice's assistant message (with ``finish_reason`` added).
        ``on_progress`` hears the model's progress where it streams (not yet)."""
        try:
            response = await self._client.post(
                "/v1/chat/completions", content=orjson.dumps(payload)
            )
        except httpx.ConnectError as exc:
            detail = f"inferproxy is not running on {self.infer_sock} ({exc}); {START_PROXY}"
            return ModelFailure(ErrorCode.MODEL_UNREACHABLE, detail)
        except httpx.TransportError as exc:
            detail = f"the model call failed: {type(exc).__name__}: {exc}"
            return ModelFailure(ErrorCode.MODEL_UNREACHABLE, detail)
        try:
            body = orjson.loads(response.content)
        except orjson.JSONDecodeError:
            body = None
        if response.status_code != 200:
            error = body.get("error") if isinstance(body, dict) else None
            message = error.get("message") if isinstance(error, dict) else None
            code = (
                ErrorCode.MODEL_UNREACHABLE
                if response.status_code == 502
                else ErrorCode.MODEL_ERROR
            )
            return ModelFailure(
                code, f"HTTP {response.status_code}: {message or 'no error message'}"
            )
        try:
            choice = body["choices"][0]
            message = dict(choice["message"])
        except (TypeError, KeyError, IndexError):
            return ModelFailure(ErrorCode.MODEL_ERROR, "the model's answer has no message")
        message["finish_reason"] = choice.get("finish_reason")
        return message
