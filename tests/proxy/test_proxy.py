"""inferproxy in process: the real app under hypercorn on a real
``run/infer.sock``, in front of the scripted llama-server of tests/fakes."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import socket
import stat
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import trio
from tests.fakes.llama_server import MODEL_ID, FakeLlama
from tests.harness.homes import short_home

from boxmaker.home.config import ConfigError, load_config
from boxmaker.home.paths import Home
from boxmaker.proxy.app import MAX_BODY
from boxmaker.proxy.serve import NoUpstream, ProxyHandle, read_token, serve_proxy

GUARD = 20.0
"""Real seconds a test may take before it fails instead of hanging the suite."""
MESSAGES = [{"role": "user", "content": "read notes.txt"}]


@pytest.fixture
def home() -> Iterator[Home]:
    with short_home("bx-proxy-") as fresh:
        fresh.config_toml.write_text('[model]\nname = "default"\nmax_tokens = 64\n')
        yield fresh


@asynccontextmanager
async def proxy_on(
    home: Home, fake: FakeLlama | None = None, *, upstream: str | None = None
) -> AsyncIterator[httpx.AsyncClient]:
    """The fake model (unless ``upstream`` names another), inferproxy in front of it,
    and an HTTP client on infer.sock."""
    with trio.fail_after(GUARD):
        async with trio.open_nursery() as model:
            if upstream is None:
                assert fake is not None
                upstream = await model.start(fake.serve)
            async with trio.open_nursery() as proxy:
                handle: ProxyHandle = await proxy.start(
                    lambda task_status: serve_proxy(
                        home, upstream=upstream, task_status=task_status
                    )
                )
                transport = httpx.AsyncHTTPTransport(uds=str(home.infer_sock))
                async with httpx.AsyncClient(
                    transport=transport, base_url="http://proxy"
                ) as client:
                    yield client
                handle.request_stop()
            model.cancel_scope.cancel()


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "whatever", "messages": MESSAGES, **extra}


def error_of(response: httpx.Response) -> dict[str, str]:
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == {"type", "message"}
    return error  # type: ignore[no-any-return]


async def test_a_chat_request_is_pinned_to_the_model_and_its_length_capped(
    home: Home, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="boxmaker.inferproxy")
    fake = FakeLlama(script=[{"tool_calls": [{"name": "read_file", "arguments": {"path": "n"}}]}])
    async with proxy_on(home, fake) as client:
        response = await client.post(
            "/v1/chat/completions",
            json=chat(max_tokens=100_000, max_completion_tokens=True),
            headers={"authorization": "Bearer leak", "x-extra": "1"},
        )
    assert response.status_code == 200
    request_id = response.headers["x-request-id"]
    assert request_id.startswith("r-")
    call = response.json()["choices"][0]["message"]["tool_calls"][0]
    assert call["function"] == {"name": "read_file", "arguments": '{"path":"n"}'}
    sent = fake.requests[-1]
    assert sent == {
        "model": "default",
        "messages": MESSAGES,
        "max_tokens": 64,
        "max_completion_tokens": 64,
    }
    line = next(r.getMessage() for r in caplog.records if request_id in r.getMessage())
    assert "method=POST path=/v1/chat/completions status=200" in line
    assert fake.usage == [{"prompt_tokens": 42, "completion_tokens": 19, "total_tokens": 61}]
    assert "prompt_tokens=42 completion_tokens=19" in line
    assert "upstream_ms=" in line
    assert "upstream_ms=-" not in line


async def test_a_missing_max_tokens_is_set_to_the_cap(home: Home) -> None:
    fake = FakeLlama(script=[{"content": "hi"}])
    async with proxy_on(home, fake) as client:
        response = await client.post("/v1/chat/completions", json={"messages": MESSAGES})
    assert response.status_code == 200
    assert (fake.requests[-1]["max_tokens"], fake.requests[-1]["model"]) == (64, "default")


async def test_a_streamed_answer_passes_through_as_events(
    home: Home, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="boxmaker.inferproxy")
    fake = FakeLlama(script=[{"content": "the notes say hello"}])
    async with (
        proxy_on(home, fake) as client,
        client.stream(
            "POST",
            "/v1/chat/completions",
            json=chat(stream=True, stream_options={"include_usage": True}),
        ) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream"
        events = [line async for line in response.aiter_lines() if line]
    assert events[-1] == "data: [DONE]"
    chunks = [orjson.loads(e[5:])["choices"] for e in events[:-1]]
    words = [choices[0]["delta"].get("content") for choices in chunks if choices]
    assert "".join(w for w in words if w) == "the notes say hello"
    assert fake.requests[-1]["stream"] is True
    line = next(r.getMessage() for r in caplog.records if "status=200" in r.getMessage())
    assert "prompt_tokens=42 completion_tokens=5" in line


@pytest.mark.parametrize("path", ["/v1/models", "/slots", "/health"])
async def test_the_three_gets_are_forwarded(home: Home, path: str) -> None:
    fake = FakeLlama()
    async with proxy_on(home, fake) as client:
        response = await client.get(path)
    assert response.status_code == 200
    assert fake.paths == [f"GET {path}"]
    if path == "/v1/models":
        # [model] name, the one model a request gets here; never the server's own id
        # (llama-server's is the path of the weights' file).
        assert response.json() == {
            "object": "list",
            "data": [{"id": "default", "object": "model", "owned_by": "boxmaker"}],
        }
        assert MODEL_ID not in response.text
    if path == "/slots":
        assert response.json()[0]["is_processing"] is False


async def test_the_models_own_status_and_error_pass_through(home: Home) -> None:
    too_long = {"code": 400, "message": "too long", "type": "exceed_context_size_error"}
    fake = FakeLlama(loading=True, script=[{"status": 400, "error": too_long}])
    async with proxy_on(home, fake) as client:
        health = await client.get("/health")
        chatted = await client.post("/v1/chat/completions", json=chat())
    assert health.status_code == 503
    assert health.json()["error"]["message"] == "Loading model"
    assert chatted.status_code == 400
    assert chatted.json() == {"error": too_long}


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/props"),
        ("POST", "/completion"),
        ("GET", "/v1/chat/completions"),
        ("POST", "/slots"),
        ("DELETE", "/health"),
        ("GET", "/health/../props"),
        ("POST", "/v1/chat/completions/"),
    ],
)
async def test_everything_else_is_a_404_and_never_forwarded(
    home: Home, method: str, path: str
) -> None:
    fake = FakeLlama()
    async with proxy_on(home, fake) as client:
        response = await client.request(method, httpx.URL(path=path), content=b"{}")
    assert response.status_code == 404
    error = error_of(response)
    assert error["type"] == "not_found"
    assert "forwards only" in error["message"]
    assert fake.paths == []


async def test_a_query_string_is_not_forwarded(home: Home) -> None:
    fake = FakeLlama()
    async with proxy_on(home, fake) as client:
        response = await client.get("/slots", params={"fail_on_no_slot": "1"})
    assert response.status_code == 200
    assert fake.paths == ["GET /slots"]


async def test_a_body_over_4_mib_is_413_declared_or_not(home: Home) -> None:
    fake = FakeLlama()
    big = b'{"messages": "' + b"x" * MAX_BODY + b'"}'

    async with proxy_on(home, fake) as client:
        declared = await post_raw(home.infer_sock, big, chunked=False)
        streamed = await post_raw(home.infer_sock, big, chunked=True)
        # The control: just under the limit goes through.
        fits = b'{"messages": []' + b" " * (MAX_BODY - 16) + b"}"
        assert len(fits) == MAX_BODY
        ok = await client.post("/v1/chat/completions", content=fits)
    for answer in (declared, streamed):
        assert answer.startswith(b"HTTP/1.1 413 "), answer[:100]
        assert b'"type":"request_too_large"' in answer
    assert ok.status_code == 200
    assert len(fake.requests) == 1


async def post_raw(path: Path, body: bytes, *, chunked: bool) -> bytes:
    """POST ``body`` on a raw connection — with its Content-Length, or chunked as a
    client that does not say how much is coming — and return the raw response. Stops
    sending once an answer arrives, as the proxy answers a body too large at once."""
    stream = await trio.open_unix_socket(str(path))
    async with stream:
        head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\n"
        if chunked:
            head += b"Transfer-Encoding: chunked\r\n\r\n"
        else:
            head += b"Content-Length: %d\r\n\r\n" % len(body)
        await stream.send_all(head)
        answer = b""
        with contextlib.suppress(trio.BrokenResourceError):
            for start in range(0, len(body), 65536):
                chunk = body[start : start + 65536]
                await stream.send_all(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
                with trio.move_on_after(0):
                    answer += await stream.receive_some()
                if answer:
                    break
        while not answer.endswith(b"}"):
            data = await stream.receive_some()
            if not data:
                break
            answer += data
        return answer


@pytest.mark.parametrize("body", [b"not json", b"[1, 2]", b'"text"'])
async def test_a_body_that_is_not_a_json_object_is_400(home: Home, body: bytes) -> None:
    fake = FakeLlama()
    async with proxy_on(home, fake) as client:
        response = await client.post("/v1/chat/completions", content=body)
    assert response.status_code == 400
    assert error_of(response)["type"] == "invalid_request"
    assert fake.requests == []


async def test_an_unreachable_model_is_502_pointing_at_the_runbook(
    home: Home, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="boxmaker.proxy")
    # Port 9 (discard) on loopback: nothing listens there on a test machine.
    async with proxy_on(home, upstream="http://127.0.0.1:9") as client:
        chatted = await client.post("/v1/chat/completions", json=chat())
        health = await client.get("/health")
    for response in (chatted, health):
        assert response.status_code == 502
        error = error_of(response)
        assert error["type"] == "upstream_unreachable"
        assert error["message"].startswith("the model server at http://127.0.0.1:9 cannot be")
        assert error["message"].endswith("see docs/runbook.md#model-unreachable")
    # The log says why, down to the socket call's error.
    logged = [r.getMessage() for r in caplog.records if "cannot be reached" in r.getMessage()]
    assert len(logged) == 2
    assert re.fullmatch(
        r"request \S+: the model server cannot be reached: ConnectError: .* <- .*"
        r"ConnectionRefusedError: .*",
        logged[0],
    )


async def test_infer_sock_is_private_and_removed_on_stop(home: Home) -> None:
    async with proxy_on(home, FakeLlama()) as client:
        assert stat.S_IMODE(home.infer_sock.lstat().st_mode) == 0o600
        assert (await client.get("/health")).status_code == 200
    assert not home.infer_sock.exists()


async def test_without_a_model_url_it_does_not_start(home: Home) -> None:
    with pytest.raises(NoUpstream, match=r"set \[model\] url"):
        await serve_proxy(home)
    with pytest.raises(NoUpstream, match="not an http"):
        await serve_proxy(home, upstream="unix:/tmp/model.sock")
    assert not home.infer_sock.exists()


@pytest.mark.parametrize(
    "extra",
    [
        {"n_probs": 5},
        {"lora": [{"id": 0, "scale": 1.0}]},
        {"ignore_eos": True},
        {"t_max_predict_ms": 1},
        {"n_predict": 5},
        {"grammar": "root ::= x"},
        {"MESSAGES": []},
    ],
)
async def test_a_chat_key_outside_the_allow_list_is_400_naming_it(
    home: Home, extra: dict[str, Any]
) -> None:
    fake = FakeLlama(script=[{"content": "hi"}])
    async with proxy_on(home, fake) as client:
        response = await client.post("/v1/chat/completions", json=chat(**extra))
    assert response.status_code == 400
    error = error_of(response)
    assert error["type"] == "invalid_request"
    assert error["message"] == f"inferproxy does not forward these keys: {next(iter(extra))}"
    assert fake.requests == []


async def test_what_loopd_and_openai_clients_send_is_forwarded_on_infer_sock(home: Home) -> None:
    fake = FakeLlama(script=[{"content": "hi"}])
    body = chat(
        tools=[],
        tool_choice="required",
        parallel_tool_calls=False,
        id_slot=0,
        cache_prompt=True,
        temperature=0.5,
        top_p=0.9,
        stop=["\n"],
        seed=1,
        response_format={"type": "text"},
        stream=False,
    )
    async with proxy_on(home, fake) as client:
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    assert fake.requests[-1] == {**body, "model": "default", "max_tokens": 64}


async def test_a_unix_socket_model_is_forwarded_to(home: Home) -> None:
    fake = FakeLlama(script=[{"content": "hi"}])
    sock = home.run_dir / "fake-model.sock"
    with trio.fail_after(GUARD):
        async with trio.open_nursery() as model:
            upstream = await model.start(
                lambda task_status: fake.serve(uds=sock, task_status=task_status)
            )
            assert upstream == f"unix://{sock}"
            async with proxy_on(home, upstream=upstream) as client:
                response = await client.post("/v1/chat/completions", json=chat())
                health = await client.get("/health")
            model.cancel_scope.cancel()
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "hi"
    assert health.status_code == 200
    assert fake.paths[-1] == "GET /health"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


TOKEN = "0123456789abcdef0123456789abcdef"


def with_tcp(home: Home, *, token: str | None) -> int:
    port = free_port()
    text = f'[model]\nname = "default"\nmax_tokens = 64\n[proxy]\ntcp_port = {port}\n'
    if token is not None:
        fd = os.open(home.root / "proxy.token", os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, f"{token}\n".encode())
        os.close(fd)
        text += 'token_file = "proxy.token"\n'
    home.config_toml.write_text(text)
    return port


async def test_the_tcp_listener_requires_the_token_and_infer_sock_does_not(
    home: Home, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    port = with_tcp(home, token=TOKEN)
    fake = FakeLlama(script=[{"content": "one"}, {"content": "two"}])
    async with proxy_on(home, fake) as unix_client:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as tcp:
            missing = await tcp.post("/v1/chat/completions", json=chat())
            wrong = await tcp.get("/health", headers={"authorization": f"Bearer {TOKEN[:-1]}x"})
            prefix = await tcp.get("/health", headers={"authorization": f"Bearer {TOKEN[:-1]}"})
            bare = await tcp.get("/health", headers={"authorization": TOKEN})
            right = await tcp.post(
                "/v1/chat/completions", json=chat(), headers={"authorization": f"Bearer {TOKEN}"}
            )
        local = await unix_client.post("/v1/chat/completions", json=chat())
    for refused in (missing, wrong, prefix, bare):
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"] == "Bearer"
        error = error_of(refused)
        assert error["type"] == "unauthorized"
        assert error["message"].endswith("see docs/runbook.md#proxy-token")
    assert right.status_code == 200
    assert right.json()["choices"][0]["message"]["content"] == "one"
    assert local.status_code == 200
    assert fake.paths == ["POST /v1/chat/completions", "POST /v1/chat/completions"]
    assert all(TOKEN not in record.getMessage() for record in caplog.records)


async def test_loopds_slot_keys_are_refused_on_the_tcp_listener(
    home: Home, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="boxmaker.inferproxy")
    port = with_tcp(home, token=None)
    fake = FakeLlama(script=[{"content": "hi"}])
    tcp = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}")
    async with proxy_on(home, fake), tcp:
        slot = await tcp.post("/v1/chat/completions", json=chat(id_slot=0, cache_prompt=True))
        plain = await tcp.post("/v1/chat/completions", json=chat())
    assert slot.status_code == 400
    assert error_of(slot)["message"] == (
        "inferproxy does not forward these keys: cache_prompt, id_slot"
    )
    assert plain.status_code == 200
    assert len(fake.requests) == 1
    warning = f"127.0.0.1:{port} is open to every local user: set [proxy] token_file; "
    assert warning + "see docs/runbook.md#proxy-token" in caplog.messages


@pytest.mark.parametrize(
    ("mode", "text", "problem"),
    [
        (0o644, TOKEN, "others may read it (chmod 600 it)"),
        (0o600, "short", "expected one line of at least 16 printable ASCII"),
        (0o600, "two words " + TOKEN, "expected one line of at least 16 printable ASCII"),
        (None, TOKEN, "cannot read it (No such file or directory)"),
    ],
)
def test_a_token_file_that_cannot_be_trusted_is_a_config_error(
    home: Home, mode: int | None, text: str, problem: str
) -> None:
    with_tcp(home, token=TOKEN)
    path = home.root / "proxy.token"
    if mode is None:
        path.unlink()
    else:
        path.write_text(text)
        path.chmod(mode)
    with pytest.raises(ConfigError) as caught:
        read_token(home, load_config(home))
    message = str(caught.value)
    assert message.startswith(f"config.toml: [proxy] token_file: {path}: {problem}")
    assert message.endswith("see docs/runbook.md#proxy-token")
    assert TOKEN not in message


def test_the_token_is_read_from_its_file(home: Home) -> None:
    with_tcp(home, token=TOKEN)
    assert read_token(home, load_config(home)) == TOKEN
    home.config_toml.write_text("")
    assert read_token(home, load_config(home)) is None


CLIENT_HEADERS = {
    "authorization": "Bearer client-secret",
    "proxy-authorization": "Basic Y2xpZW50OnNlY3JldA==",
    "cookie": "session=client-cookie",
    "x-forwarded-for": "203.0.113.7",
    "forwarded": "for=203.0.113.7",
    "x-custom-header": "client-custom",
    "user-agent": "client-agent/1.0",
}


async def test_the_clients_headers_never_reach_the_model(home: Home) -> None:
    fake = FakeLlama(script=[{"content": "one"}, {"content": "two"}])
    async with proxy_on(home, fake) as client:
        answers = [
            await client.post("/v1/chat/completions", json=chat(), headers=CLIENT_HEADERS),
            await client.post(
                "/v1/chat/completions", json=chat(stream=True), headers=CLIENT_HEADERS
            ),
            *[
                await client.get(path, headers=CLIENT_HEADERS)
                for path in ("/health", "/v1/models", "/slots")
            ],
        ]
    assert [answer.status_code for answer in answers] == [200] * 5
    assert fake.paths == [
        "POST /v1/chat/completions",
        "POST /v1/chat/completions",
        "GET /health",
        "GET /v1/models",
        "GET /slots",
    ]
    for path, received in zip(fake.paths, fake.headers, strict=True):
        names = {name for name, _ in received}
        assert names.isdisjoint(CLIENT_HEADERS.keys() - {"user-agent"}), (path, received)
        for name, value in received:
            assert value not in CLIENT_HEADERS.values(), (path, name, value)
        assert dict(received)["host"] == fake.url.removeprefix("http://")  # not "proxy"
        # Only what the proxy's own HTTP client writes.
        assert names <= {
            "host",
            "accept",
            "accept-encoding",
            "connection",
            "user-agent",
            "content-length",
            "content-type",
        }, (path, received)


async def slot_busy(client: httpx.AsyncClient) -> bool:
    answer = await client.get("/slots")
    return bool(answer.json()[0]["is_processing"])


async def wait_slot_free(client: httpx.AsyncClient, within: float) -> float:
    """Seconds until the model's slot 0 is free again; fails after ``within``."""
    started = trio.current_time()
    with trio.fail_after(within):
        # The slot is the model server's state: polled, there is no event to wait on.
        while await slot_busy(client):  # noqa: ASYNC110
            await trio.sleep(0.01)
    return trio.current_time() - started


@pytest.mark.parametrize("stream", [True, False])
async def test_a_client_that_leaves_frees_the_models_slot_at_once(home: Home, stream: bool) -> None:
    # 64 tokens of a second each: the answer would take a minute.
    fake = FakeLlama(script=[{"content": "x" * 256}], token_delay=1.0)
    async with proxy_on(home, fake) as client:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                functools.partial(client.post, "/v1/chat/completions", json=chat(stream=stream))
            )
            with trio.fail_after(5):
                while not await slot_busy(client):  # noqa: ASYNC110
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()  # the client goes: its connection is closed
        assert await wait_slot_free(client, within=2.0) < 1.0
    assert fake.generations == 0


async def test_it_follows_a_model_that_restarts_on_the_same_socket(home: Home) -> None:
    """The built-in model restarted (same run/model.sock): no 502 once it is back."""
    sock = home.run_dir / "model.sock"
    first = FakeLlama(script=[{"content": "one"}, {"content": "one again"}])
    second = FakeLlama(script=[{"content": "two"}])

    async def serving(fake: FakeLlama, task_status: Any) -> None:
        await fake.serve(uds=sock, task_status=task_status)

    async with proxy_on(home, upstream=f"unix://{sock}") as client:
        async with trio.open_nursery() as model:
            await model.start(serving, first)
            before = await client.post("/v1/chat/completions", json=chat())
            model.cancel_scope.cancel()
        # Back before inferproxy noticed: its kept connection is to the old server.
        async with trio.open_nursery() as model:
            await model.start(serving, first)
            restarted = await client.post("/v1/chat/completions", json=chat())
            model.cancel_scope.cancel()
        gone = await client.post("/v1/chat/completions", json=chat())
        async with trio.open_nursery() as model:
            await model.start(serving, second)
            after = [
                await client.post("/v1/chat/completions", json=chat()),
                await client.get("/health"),
                await client.post("/v1/chat/completions", json=chat(stream=True)),
            ]
            model.cancel_scope.cancel()
    assert before.json()["choices"][0]["message"]["content"] == "one"
    assert restarted.json()["choices"][0]["message"]["content"] == "one again"
    assert gone.status_code == 502
    assert error_of(gone)["type"] == "upstream_unreachable"
    assert [answer.status_code for answer in after] == [200, 200, 200]
    assert after[0].json()["choices"][0]["message"]["content"] == "two"


async def serve_closing_kept_connections(sock: Path, task_status: Any) -> None:
    """An HTTP server on ``sock`` that answers the first request of each connection and
    closes the connection, unanswered, when a second comes on it: what a server closing
    an idle connection does to a request sent on it that very moment."""
    answer = orjson.dumps({"choices": [{"message": {"role": "assistant", "content": "hi"}}]})

    async def one_connection(stream: trio.SocketStream) -> None:
        async with stream:
            received = b""
            answered = False
            while chunk := await stream.receive_some(65536):
                received += chunk
                head, ended, rest = received.partition(b"\r\n\r\n")
                length = re.search(rb"(?i)content-length: *(\d+)", head)
                if not ended or len(rest) < (int(length[1]) if length else 0):
                    continue
                if answered:
                    return  # closed under the request, before any byte of an answer
                received = b""
                answered = True
                await stream.send_all(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(answer), answer)
                )

    listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await listener.bind(str(sock))
    listener.listen()
    await trio.serve_listeners(
        one_connection, [trio.SocketListener(listener)], task_status=task_status
    )


async def test_a_kept_connection_closed_under_a_request_is_retried_once_and_logged(
    home: Home, caplog: pytest.LogCaptureFixture
) -> None:
    sock = home.run_dir / "model.sock"
    caplog.set_level(logging.WARNING, logger="boxmaker.proxy")
    async with proxy_on(home, upstream=f"unix://{sock}") as client, trio.open_nursery() as model:
        await model.start(serve_closing_kept_connections, sock)
        answers = [await client.post("/v1/chat/completions", json=chat()) for _ in range(3)]
        model.cancel_scope.cancel()
    assert [answer.status_code for answer in answers] == [200, 200, 200]
    assert [answer.json()["choices"][0]["message"]["content"] for answer in answers] == ["hi"] * 3
    retried = [r.getMessage() for r in caplog.records if "sending it once more" in r.getMessage()]
    assert len(retried) == 2
    assert re.fullmatch(
        r"request \S+: the model server closed the connection before answering "
        r"\(RemoteProtocolError: Server disconnected without sending a response\..*\); "
        r"sending it once more",
        retried[0],
    )
