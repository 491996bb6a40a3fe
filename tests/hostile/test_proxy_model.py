"""Hostile: what issue 9 opened on inferproxy's way to the model.

- ``stream_options`` is now forwarded (loopd asks for the usage of a stream with it): a
  caller must not hide llama-server's own options inside it. Anything but
  ``include_usage`` is refused (400) before it reaches the model, on infer.sock and on
  the TCP listener.
- ``GET /v1/models`` tells a caller (on the TCP listener: any local user holding the
  token) only ``[model] name``: llama-server's own answer names the weights' file by its
  path (the owner's home, the virtual environment) and carries the model's metadata. The
  built-in model's chat answers, whole or streamed, name it ``[model] name`` too.
- A caller that starts a long generation and goes away does not keep the model's one
  slot (loopd's): inferproxy closes the upstream request at once, whole answer or
  stream, and the slot is free again.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import trio
from tests.fakes.llama_server import FakeLlama
from tests.harness.homes import short_home
from tests.harness.model import MISSING, builtin_model
from tests.harness.stack import cancel_once_generating, served

from boxmaker.home.paths import Home
from boxmaker.proxy.serve import ProxyHandle, serve_proxy

GUARD = 60.0
TOKEN = "f00dfeedf00dfeedf00dfeedf00dfeed"
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture
def home() -> Iterator[Home]:
    with short_home("bx-hostile-") as fresh:
        token_file = fresh.root / "proxy.token"
        token_file.write_text(TOKEN + "\n")
        token_file.chmod(0o600)
        yield fresh


@asynccontextmanager
async def proxy(home: Home, upstream: str) -> AsyncIterator[dict[str, httpx.AsyncClient]]:
    """inferproxy on ``upstream`` with a TCP listener; a client on each way in (the
    TCP one with the token)."""
    with trio.socket.socket() as probe:
        await probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    home.config_toml.write_text(
        f'[model]\nname = "default"\nmax_tokens = 64\n'
        f'[proxy]\ntcp_port = {port}\ntoken_file = "proxy.token"\n'
    )
    async with trio.open_nursery() as nursery:
        handle: ProxyHandle = await nursery.start(
            functools.partial(serve_proxy, home, upstream=upstream)
        )
        transport = httpx.AsyncHTTPTransport(uds=str(home.infer_sock))
        async with (
            httpx.AsyncClient(transport=transport, base_url="http://proxy") as unix,
            httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{port}",
                headers={"authorization": f"Bearer {TOKEN}"},
            ) as tcp,
        ):
            yield {"infer.sock": unix, "tcp": tcp}
        handle.request_stop()


@pytest.mark.parametrize(
    "options",
    [
        {"include_usage": True, "n_probs": 5},
        {"ignore_eos": True},
        {"include_usage": True, "id_slot": 0},
        ["include_usage"],
    ],
)
async def test_nothing_hides_inside_stream_options(home: Home, options: Any) -> None:
    fake = FakeLlama()
    with trio.fail_after(GUARD):
        async with served(fake) as url, proxy(home, url) as clients:
            answers = {
                way: await client.post(
                    "/v1/chat/completions",
                    json={"messages": MESSAGES, "stream": True, "stream_options": options},
                )
                for way, client in clients.items()
            }
            allowed = await clients["tcp"].post(
                "/v1/chat/completions",
                json={
                    "messages": MESSAGES,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                },
            )
    for answer in answers.values():
        assert answer.status_code == 400
        assert answer.json()["error"] == {
            "type": "invalid_request",
            "message": 'stream_options may hold only "include_usage"',
        }
    assert allowed.status_code == 200
    assert len(fake.requests) == 1  # only the allowed one reached the model
    assert fake.requests[0]["stream_options"] == {"include_usage": True}


@pytest.mark.slow
@pytest.mark.skipif(bool(MISSING), reason=f"the built-in model is not installed: {MISSING}")
async def test_the_model_is_named_by_its_configured_name_never_the_weights_path(home: Home) -> None:
    home.config_toml.write_text('[model]\nname = "default"\n')
    with builtin_model(home), trio.fail_after(GUARD):
        async with proxy(home, f"unix://{home.model_sock}") as clients:
            answers = [await client.get("/v1/models") for client in clients.values()]
            chats = [
                await clients["tcp"].post(
                    "/v1/chat/completions",
                    json={"messages": MESSAGES, "max_tokens": 2, "stream": stream},
                )
                for stream in (False, True)
            ]
    assert chats[0].json()["model"] == "default"
    assert '"model":"default"' in chats[1].text
    for chat in chats:
        assert "gguf" not in chat.text.lower()
    for answer in answers:
        assert answer.status_code == 200
        assert answer.json() == {
            "object": "list",
            "data": [{"id": "default", "object": "model", "owned_by": "boxmaker"}],
        }
        assert "gguf" not in answer.text.lower()


@pytest.mark.parametrize("stream", [True, False])
async def test_a_caller_that_leaves_does_not_keep_the_models_slot(home: Home, stream: bool) -> None:
    fake = FakeLlama(script=[{"content": "x" * 256}], token_delay=1.0)
    with trio.fail_after(GUARD):
        async with served(fake) as url, proxy(home, url) as clients:
            request = functools.partial(
                clients["tcp"].post,
                "/v1/chat/completions",
                json={"messages": MESSAGES, "stream": stream},
            )
            left = await cancel_once_generating(fake, request)
            freed_after = trio.current_time() - left
            slots = (await clients["infer.sock"].get("/slots")).json()
    assert freed_after < 1.0
    assert slots[0]["is_processing"] is False
