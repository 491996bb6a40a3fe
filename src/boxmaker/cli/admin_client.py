"""The owner's side of admin.sock (docs/protocol.md): one request, one answer."""

from __future__ import annotations

import trio

from boxmaker.home.config import ConfigError, RunnerConfig, load_config
from boxmaker.home.paths import Home, HomeError
from boxmaker.runtime.ndjson import FrameError, FrameReader
from boxmaker.wire import (
    AdminAnswer,
    AdminRequest,
    Approve,
    BadFrame,
    Refuse,
    decode_admin_answer,
    encode_frame,
)

# approve waits for the re-decision, the last look and an fsynced record; generous,
# because a loaded 2-core machine is still a machine we must answer on.
REPLY_TIMEOUT = 30.0
HTTP_GET_S = 10.0
"""http_get's own limit (the runner's); the file tools are not timed but quick."""


def approve_timeout(home: Home) -> float:
    """How long an approve may wait: brokerd answers it once the approved call has run
    (docs/protocol.md), so the longest run, the shell's time limit, comes on top."""
    try:
        shell = load_config(home).runner.shell_timeout
    except (ConfigError, HomeError):
        shell = RunnerConfig().shell_timeout
    return REPLY_TIMEOUT + max(shell, HTTP_GET_S)


class DaemonUnreachable(Exception):
    """brokerd did not answer on admin.sock (bxctl exits 3)."""

    def __init__(self, home: Home, why: str) -> None:
        super().__init__(
            f"brokerd is unreachable at {home.admin_sock} ({why}); "
            f"start the daemons with `bxctl up --home {home.root}`"
        )


async def ask_broker(
    home: Home, request: AdminRequest, *, timeout: float = REPLY_TIMEOUT
) -> AdminAnswer:
    """Send one admin request and read its answer (an ``ErrorFrame`` is an answer too)
    within ``timeout`` seconds (:func:`approve_timeout` for an approve)."""
    try:
        stream = await trio.open_unix_socket(str(home.admin_sock))
    except OSError as exc:
        raise DaemonUnreachable(home, exc.strerror or type(exc).__name__) from None
    async with stream:
        try:
            await stream.send_all(encode_frame(request))
            with trio.fail_after(timeout):
                line = await FrameReader(stream).receive_line()
        except (trio.BrokenResourceError, trio.ClosedResourceError, FrameError) as exc:
            raise DaemonUnreachable(home, f"the connection broke: {exc}") from None
        except trio.TooSlowError:
            raise DaemonUnreachable(home, f"no answer within {timeout:g} s") from None
    if line is None:
        raise DaemonUnreachable(home, "it closed the connection without answering")
    try:
        return decode_admin_answer(line)
    except BadFrame as exc:
        raise DaemonUnreachable(home, f"it answered something else: {exc.detail}") from None


async def answer_waiting_call(home: Home, decision: Approve | Refuse) -> AdminAnswer:
    """The owner's answer to a waiting call, from any screen (bxctl approve/refuse, the
    chat's prompt, the approvals view): an approve may wait for the call's run."""
    timeout = approve_timeout(home) if isinstance(decision, Approve) else REPLY_TIMEOUT
    return await ask_broker(home, decision, timeout=timeout)
