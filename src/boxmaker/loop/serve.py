"""``loopd serve``: the agent loop daemon (docs/protocol.md).

``run/loop.sock`` (0600 in the 0700 ``run/``; only the home's owner may connect, by
SO_PEERCRED) takes one ``say`` a connection and streams the turn's events back:
``session`` first, then ``model``, ``tool_call``, ``waiting``, ``tool_result``, and at
the end ``reply`` or ``error``; then it closes. Turns of one session run one at a time;
a client that leaves mid-turn ends the turn at once: loopd watches the connection for
its end while the turn runs, so the model request is dropped and a pending call
withdrawn (brokerd sees its requester gone).

loopd holds no authority: its only ways out are inferproxy (``run/infer.sock``) and
brokerd (``run/broker.sock``).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
from typing import Annotated, Any, Final

import attrs
import trio
from cyclopts import App, Parameter

from boxmaker import __version__
from boxmaker.formats.convert import new_session_id
from boxmaker.home.config import Config, load_config
from boxmaker.home.paths import Home, HomeError, resolve_home
from boxmaker.loop.broker_port import BrokerPort
from boxmaker.loop.conversations import append_history, load_history
from boxmaker.loop.model_client import ModelClient
from boxmaker.loop.turn import Model, ToolCaller, run_turn
from boxmaker.runtime.daemon import reread_config, run_daemon, stop_on_signals
from boxmaker.runtime.ndjson import FrameError, FrameReader, receive_frame_within
from boxmaker.runtime.unix_sockets import DISCONNECTS, ListenerError, check_peer, open_unix_listener
from boxmaker.wire import (
    BadFrame,
    ErrorCode,
    ErrorFrame,
    LoopEvent,
    SessionEvent,
    decode_loop_request,
    encode_frame,
)

log = logging.getLogger("boxmaker.loopd")

FIRST_FRAME_S: Final = 5.0
GRACE_S: Final = 5.0
"""Turns still running at a stop get this long before they are cancelled."""
RUNBOOK_STATE: Final = "docs/runbook.md#state"
LIVE_KEYS: Final = frozenset({"loop.max_steps", "loop.first_step", "loop.max_step_tokens"})
"""What SIGHUP applies (docs/runbook.md#reload): each turn reads them as it starts, so
a turn under way keeps what it began with. ``reply_timeout`` is the broker client's,
made once at start: it needs a restart."""


@attrs.define
class Loop:
    """What every loop.sock connection of one loopd shares."""

    home: Home
    config: Config
    owner_uid: int
    broker: ToolCaller
    model: Model
    _locks: collections.defaultdict[str, trio.Lock] = attrs.Factory(
        lambda: collections.defaultdict(trio.Lock)
    )
    _stop: trio.Event = attrs.Factory(trio.Event)

    def request_stop(self) -> None:
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    async def wait_stop_requested(self) -> None:
        await self._stop.wait()

    def session_lock(self, session: str) -> trio.Lock:
        return self._locks[session]


async def handle_loop_connection(loop: Loop, stream: trio.SocketStream) -> None:
    """One ``say``, one turn, its events; then close. Never takes loopd down."""
    try:
        if not await check_peer(stream, allowed=loop.owner_uid, name="loop.sock"):
            return
        reader = FrameReader(stream)
        try:
            line = await receive_frame_within(reader, FIRST_FRAME_S)
            if line is None:
                return
            say = decode_loop_request(line)
        except (FrameError, BadFrame) as exc:
            detail = exc.detail if isinstance(exc, BadFrame) else str(exc)
            await stream.send_all(encode_frame(ErrorFrame(code=ErrorCode.BAD_FRAME, detail=detail)))
            return

        async def emit(event: LoopEvent) -> None:
            await stream.send_all(encode_frame(event))

        ended = False
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_end_turn_on_hangup, stream, nursery.cancel_scope)
                try:
                    await _turn(loop, say.session or new_session_id(), say.text, emit)
                    ended = True
                except DISCONNECTS as exc:
                    log.info("loop.sock: the client left (%s); the turn ended", type(exc).__name__)
                nursery.cancel_scope.cancel()
        finally:
            if not ended and loop.stopping:
                await _say_stopping(stream)
    except DISCONNECTS as exc:
        log.info("loop.sock: the client left (%s); the turn ended", type(exc).__name__)
    except Exception:
        log.exception("loop.sock: a connection failed")


async def _say_stopping(stream: trio.SocketStream) -> None:
    """Tell the client why its turn ends without a reply: loopd's stop cut it short."""
    detail = (
        "loopd is stopping (bxctl down, or SIGTERM): the turn was cut short, and a call "
        "waiting for the owner was withdrawn"
    )
    deadline = trio.current_time() + FIRST_FRAME_S
    with trio.CancelScope(shield=True, deadline=deadline), contextlib.suppress(*DISCONNECTS):
        await stream.send_all(encode_frame(ErrorFrame(code=ErrorCode.STOPPING, detail=detail)))


async def _end_turn_on_hangup(stream: trio.SocketStream, turn: trio.CancelScope) -> None:
    """Cancel the turn the moment its client leaves (Ctrl-C in ``bxctl chat``): the model
    request is dropped, and closing the broker.sock connection withdraws a pending call.
    Bytes after the ``say`` are read and dropped; only the end of the stream counts."""
    with contextlib.suppress(*DISCONNECTS):
        while await stream.receive_some():
            pass
    log.info("loop.sock: the client left; its turn is cancelled")
    turn.cancel()


async def _turn(loop: Loop, session: str, text: str, emit: Any) -> None:
    async with loop.session_lock(session):
        try:
            history = await trio.to_thread.run_sync(load_history, loop.home, session)
        except OSError as exc:
            log.warning("session %s: its history cannot be read: %s", session, exc)
            detail = f"the session's history cannot be read ({exc}); see {RUNBOOK_STATE}"
            await emit(ErrorFrame(code=ErrorCode.INTERNAL, detail=detail))
            return
        await emit(SessionEvent(session=session))
        added: list[dict[str, Any]] = []
        try:
            await run_turn(
                session=session,
                text=text,
                history=history,
                broker=loop.broker,
                model=loop.model,
                config=loop.config.loop,
                emit=emit,
                added=added,
            )
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(append_history, loop.home, session, added)
        log.info("session %s: a turn of %d message(s)", session, len(added))


async def serve_loop(
    home: Home,
    *,
    handle_signals: bool = False,
    task_status: trio.TaskStatus[Loop] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run loopd on ``home`` until a stop. Startup problems raise before ``started()``:
    ConfigError, HomeError, ListenerError."""
    config = await trio.to_thread.run_sync(load_config, home)
    await trio.to_thread.run_sync(home.create)
    owner_uid = (await trio.to_thread.run_sync(home.root.stat)).st_uid
    listener = await open_unix_listener(home.loop_sock)
    model = ModelClient(home.infer_sock)
    loop = Loop(
        home=home,
        config=config,
        owner_uid=owner_uid,
        broker=BrokerPort(home.broker_sock, reply_timeout=config.loop.reply_timeout),
        model=model,
    )
    try:
        async with trio.open_nursery() as turns:
            async with trio.open_nursery() as accept:
                await accept.start(
                    functools.partial(
                        trio.serve_listeners,
                        functools.partial(handle_loop_connection, loop),
                        [listener.listener],
                        handler_nursery=turns,
                    )
                )
                if handle_signals:
                    accept.start_soon(
                        functools.partial(
                            stop_on_signals,
                            loop.request_stop,
                            log,
                            on_hangup=functools.partial(_reload, loop),
                        )
                    )
                log.info("loopd %s serving %s", __version__, listener.path)
                task_status.started(loop)
                await loop.wait_stop_requested()
                log.info("stopping: no new turns; running turns get %g s", GRACE_S)
                accept.cancel_scope.cancel()
            listener.remove_path()
            turns.cancel_scope.deadline = trio.current_time() + GRACE_S
    finally:
        listener.remove_path()
        await model.aclose()
    log.info("loopd stopped")


async def _reload(loop: Loop) -> None:
    loop.config = await reread_config(
        loop.home, loop.config, concern=frozenset({"loop"}), live=LIVE_KEYS, log=log
    )


# ---------------------------------------------------------------------------------------
# The command line

app = App(
    name="loopd",
    help="The boxmaker agent loop: the model asks, brokerd decides.",
    version=__version__,
)


@app.command
def serve(*, home: Annotated[str | None, Parameter(help="The boxmaker home.")] = None) -> int:
    """Serve run/loop.sock until SIGINT/SIGTERM (exit 0).

    Exit 2: config.toml has a problem. Exit 1: the home or the socket cannot be used,
    or loopd failed.
    """
    return run_daemon(
        "loopd",
        functools.partial(serve_loop, resolve_home(home), handle_signals=True),
        failures=(HomeError, ListenerError),
    )


def main() -> None:
    """Console entry point (``loopd``): the command's return value is the exit code."""
    app()


if __name__ == "__main__":
    main()
