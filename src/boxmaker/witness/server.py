"""``bxctl witness serve``: a C2SP tlog-witness over HTTP (hypercorn on trio), for the
owner's ledgers (docs/operations.md, "A witness for one owner").

It answers ``POST /add-checkpoint`` only (docs/protocol.md, "Witnesses"): the decision
is :func:`boxmaker.ledger.witness_protocol.decide_add_checkpoint`; a cosigned head is
written to the state file before the cosignature goes out, and decide-write-answer runs
under one lock, so two requests can never roll the state back (the race the spec
describes). Each answer is one log line (origin, old size, size, status, reason): a
refused fork stays on record. Requests are not authenticated; only a checkpoint signed
by a configured log key can change anything, and only forward along a proof.

It is meant to run as another user than the owner's brokerd, or on another machine:
its key and state are then out of reach of whoever takes over the owner's account.
"""

from __future__ import annotations

import functools
import logging
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

import attrs
import hypercorn.config
import hypercorn.trio
import trio

from boxmaker import __version__
from boxmaker.ledger.ledger_key import load_private_key
from boxmaker.ledger.signed_note import NoteSigner, NoteVerifier, cosign
from boxmaker.ledger.witness_protocol import (
    ADD_CHECKPOINT_PATH,
    MAX_BODY,
    Refusal,
    TreeHead,
    decide_add_checkpoint,
)
from boxmaker.proxy.app import BodyTooLarge, Receive, Scope, Send, lifespan, read_body
from boxmaker.runtime.daemon import stop_on_signals
from boxmaker.witness.state import (
    RUNBOOK_KEY,
    WitnessSetupError,
    load_state,
    save_state,
    state_lock,
)

log = logging.getLogger("boxmaker.witness")

GRACE_S: Final = 5.0
READ_TIMEOUT_S: Final = 10.0
"""A client that sends nothing for this long is disconnected (hypercorn's read timeout)."""
TEXT: Final = "text/plain; charset=utf-8"


@attrs.define
class Witness:
    """The witness's state and its one operation. ``heads`` is the state file's content;
    ``clock`` gives the cosignatures' time (POSIX seconds)."""

    signer: NoteSigner
    logs: Mapping[str, list[NoteVerifier]]
    state_path: Path
    heads: dict[str, TreeHead]
    clock: Callable[[], float] = time.time
    _lock: trio.Lock = attrs.Factory(trio.Lock)

    @property
    def vkey(self) -> str:
        """The witness's public key as a cosignature (0x04) vkey."""
        return self.signer.cosignature_verifier.vkey

    async def add_checkpoint(self, body: bytes) -> tuple[int, str, bytes]:
        """(status, content type, body) for one ``add-checkpoint`` request body."""
        async with self._lock:
            decision = decide_add_checkpoint(body, self.logs, self.heads)
            if isinstance(decision, Refusal):
                log.warning(
                    "add-checkpoint refused: %d %s (origin %s): %s",
                    decision.status,
                    decision.problem,
                    decision.origin,
                    decision.detail,
                )
                return decision.status, decision.content_type, decision.body
            heads = {**self.heads, decision.origin: decision.head}
            # Shielded: a write that went through while the request was cancelled must
            # not leave the state in memory behind the state on disk.
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(save_state, self.state_path, heads)
                self.heads = heads
            line = cosign(decision.text, self.signer, int(self.clock()))
            log.info(
                "cosigned %s: size %d (old %d)",
                decision.origin,
                decision.checkpoint.size,
                decision.old_size,
            )
            return 200, TEXT, line.encode()


class WitnessApp:
    """The ASGI app around a :class:`Witness`."""

    def __init__(self, witness: Witness) -> None:
        self.witness = witness

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        status, content_type, body = await self._answer(scope, receive)
        headers = [(b"content-type", content_type.encode()), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _answer(self, scope: Scope, receive: Receive) -> tuple[int, str, bytes]:
        if scope["path"] != ADD_CHECKPOINT_PATH:
            return 404, TEXT, b"not_found: this witness answers POST /add-checkpoint only\n"
        if scope["method"] != "POST":
            return 405, TEXT, b"method_not_allowed: POST /add-checkpoint\n"
        try:
            body = await read_body(scope, receive, MAX_BODY)
        except BodyTooLarge:
            return 413, TEXT, f"too_large: a request body is at most {MAX_BODY} bytes\n".encode()
        try:
            return await self.witness.add_checkpoint(body)
        except OSError as exc:
            log.error("the state file could not be written: %s", exc)  # noqa: TRY400
            return 500, TEXT, b"state_unwritable: the witness could not save its state\n"


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for an IPv6 address)."""
    host, colon, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not colon or not host or not port.isdigit() or int(port) > 65535:
        raise WitnessSetupError(f"--listen {text!r}: expected HOST:PORT")
    return host, int(port)


def _listen_socket(host: str, port: int) -> socket.socket:
    try:
        return socket.create_server((host, port), backlog=hypercorn.config.Config().backlog)
    except OSError as exc:
        raise WitnessSetupError(f"--listen {host}:{port}: cannot listen ({exc.strerror})") from exc


@attrs.frozen
class WitnessSettings:
    """What ``bxctl witness serve`` is given."""

    listen: str
    key: Path
    name: str
    state: Path
    logs: Mapping[str, list[NoteVerifier]]


def load_signer(key: Path, name: str) -> NoteSigner:
    try:
        return NoteSigner(name, load_private_key(key, what="the witness key", anchor=RUNBOOK_KEY))
    except ValueError as exc:
        raise WitnessSetupError(f"--name {name!r}: {exc}") from None


async def serve_witness(
    settings: WitnessSettings,
    *,
    handle_signals: bool = False,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until SIGINT/SIGTERM (with ``handle_signals``) or a cancel. Startup
    problems raise :class:`WitnessSetupError` (or LedgerKeyError for the key) before
    ``started(binds)``."""
    signer = await trio.to_thread.run_sync(load_signer, settings.key, settings.name)
    host, port = parse_listen(settings.listen)
    with state_lock(settings.state):
        heads = await trio.to_thread.run_sync(load_state, settings.state)
        witness = Witness(signer, settings.logs, settings.state, heads)
        sock = _listen_socket(host, port)
        config = hypercorn.config.Config()
        config.bind = [f"fd://{sock.detach()}"]
        config.accesslog = None
        config.errorlog = logging.getLogger("boxmaker.witness.http")
        config.graceful_timeout = GRACE_S
        config.read_timeout = int(READ_TIMEOUT_S)
        config.include_server_header = False
        stop = trio.Event()
        serve = functools.partial(
            hypercorn.trio.serve,
            WitnessApp(witness),  # type: ignore[arg-type]  # an ASGI 3 callable, typed loosely
            config,
            shutdown_trigger=stop.wait,
        )
        async with trio.open_nursery() as signals:
            if handle_signals:
                signals.start_soon(stop_on_signals, stop.set, log)
            async with trio.open_nursery() as server:
                binds: list[str] = await server.start(serve)
                log.info(
                    "witness %s (boxmaker %s) serving %s for %d log(s), state %s; vkey %s",
                    settings.name,
                    __version__,
                    ", ".join(binds),
                    len(settings.logs),
                    settings.state,
                    witness.vkey,
                )
                task_status.started(binds)
            signals.cancel_scope.cancel()
    log.info("witness stopped")
