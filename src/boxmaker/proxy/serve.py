"""``inferproxy serve``: the proxy daemon (docs/decisions.md, "inferproxy").

It serves :class:`~boxmaker.proxy.app.InferProxy` with hypercorn (HTTP/1.1, on trio) on
``run/infer.sock`` — made like brokerd's sockets: mode 0600 in the 0700 ``run/``, a stale
socket file replaced only if nobody answers on it — and on ``127.0.0.1:[proxy]
tcp_port`` when that is set. The sockets are made here and handed to hypercorn as
``fd://`` binds, so hypercorn never removes a live socket nor binds beyond loopback.
Any local user can connect to a TCP port: with ``[proxy] token_file`` set, the TCP
listener answers only requests that carry that token (the file is read once, here,
and must be the owner's and private; the token is never logged).

The model is ``[model] url`` (or ``--upstream``): ``http(s)://…``, or
``unix:///path.sock`` for a llama-server on a Unix socket. Without one there is nothing
to forward to: the embedded model is started by ``bxctl up``, which then
passes its URL (``unix:///…/run/model.sock``) here.

Readiness is ``task_status.started(handle)``; SIGINT/SIGTERM (or
:meth:`ProxyHandle.request_stop`) stop accepting, give open requests 5 s, remove the
socket file and return (exit 0).
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import stat
from pathlib import Path
from typing import Annotated, Final

import attrs
import httpx
import hypercorn.config
import hypercorn.trio
import trio
from cyclopts import App, Parameter

from boxmaker import __version__
from boxmaker.home.config import Config, ConfigError, load_config
from boxmaker.home.paths import Home, HomeError, resolve_home
from boxmaker.proxy.app import InferProxy, ProxySettings, unix_socket_of
from boxmaker.runtime.daemon import reread_config, run_daemon, stop_on_signals
from boxmaker.runtime.unix_sockets import ListenerError, bind_unix_socket, remove_socket_path

log = logging.getLogger("boxmaker.inferproxy")

GRACE_S: Final = 5.0
"""Open requests get this long to finish on a stop."""
CONNECT_S: Final = 5.0
KEEPALIVE_S: Final = 2.0
"""How long an idle connection to the model is kept for the next request: well under
llama-server's own 5 s (cpp-httplib's keep-alive timeout). httpx's default, 5 s too,
let a request go out on a connection the server was closing at that moment: a 502
after a step that kept the model idle about that long (docs/decisions.md, "inferproxy")."""
"""Seconds to connect to the model; a generation itself may take as long as it takes."""
RUNBOOK_TCP: Final = "docs/runbook.md#proxy-token"
MIN_TOKEN: Final = 16
LIVE_KEYS: Final = frozenset({"model.name", "model.max_tokens"})
"""What SIGHUP applies (docs/runbook.md#reload): each request is pinned with the
settings of the moment it arrives. The model's URL (the one HTTP client), the TCP port
(bound at start) and the token (read once, checked at start) need a restart."""
"""Characters a TCP token has at least: `openssl rand -hex 32` gives 64."""


class NoUpstream(Exception):
    """No model to forward to."""


@attrs.define
class ProxyHandle:
    """A running inferproxy: where it listens, and how to stop it."""

    binds: list[str]
    """hypercorn's names of the sockets served (``http://…``)."""
    _stop: trio.Event = attrs.Factory(trio.Event)

    def request_stop(self) -> None:
        self._stop.set()

    async def wait_stop_requested(self) -> None:
        await self._stop.wait()


def _upstream(url: str | None) -> str:
    if url is None:
        raise NoUpstream(
            "no model to forward to: set [model] url in config.toml, or start the "
            "embedded model with `bxctl up`"
        )
    sock = unix_socket_of(url)
    if sock is not None:
        if not sock.startswith("/"):
            raise NoUpstream(f"[model] url {url!r}: a unix:// URL names an absolute path")
        return url
    parsed = httpx.URL(url)
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise NoUpstream(
            f"[model] url {url!r} is not an http://, https:// or unix:///path.sock URL"
        )
    return url


def read_token(home: Home, config: Config) -> str | None:
    """The TCP listener's token from ``[proxy] token_file`` (relative to the home), or
    None when none is set. The file must be a regular file of ours that nobody else can
    read or write, holding one line of at least :data:`MIN_TOKEN` characters. Raises
    ConfigError (whose message never holds the token). Blocking."""
    if config.proxy.token_file is None:
        return None
    path = home.root / Path(config.proxy.token_file).expanduser()
    where = f"config.toml: [proxy] token_file: {path}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise ConfigError(
            [f"{where}: cannot read it ({exc.strerror}); see {RUNBOOK_TCP}"]
        ) from None
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            raise ConfigError([f"{where}: not a file of yours; see {RUNBOOK_TCP}"])
        if stat.S_IMODE(info.st_mode) & 0o077:
            raise ConfigError([f"{where}: others may read it (chmod 600 it); see {RUNBOOK_TCP}"])
        data = file.read(4096)
    try:
        token = data.decode("ascii").strip()
    except UnicodeDecodeError:
        token = ""
    if len(token) < MIN_TOKEN or not token.isprintable() or any(c.isspace() for c in token):
        raise ConfigError(
            [
                f"{where}: expected one line of at least {MIN_TOKEN} printable ASCII "
                f"characters without spaces; see {RUNBOOK_TCP}"
            ]
        )
    return token


def _model_client(upstream: str) -> httpx.AsyncClient:
    timeout = httpx.Timeout(connect=CONNECT_S, read=None, write=30.0, pool=CONNECT_S)
    sock = unix_socket_of(upstream)
    limits = httpx.Limits(keepalive_expiry=KEEPALIVE_S)
    transport = httpx.AsyncHTTPTransport(uds=sock, limits=limits)
    # trust_env=False: proxy variables and .netrc of the environment are not the
    # model's way; the configured URL is.
    return httpx.AsyncClient(timeout=timeout, trust_env=False, transport=transport)


def _tcp_socket(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(hypercorn.config.Config().backlog)
    except OSError as exc:
        sock.close()
        raise ListenerError(f"127.0.0.1:{port}: cannot listen ({exc.strerror})") from exc
    return sock


def _hypercorn_config(sockets: list[socket.socket]) -> hypercorn.config.Config:
    config = hypercorn.config.Config()
    # hypercorn takes the descriptors over (socket.socket(fileno=...)); ours let go.
    config.bind = [f"fd://{sock.detach()}" for sock in sockets]
    config.accesslog = None  # the app logs its own line per request
    config.errorlog = logging.getLogger("boxmaker.inferproxy.http")
    config.graceful_timeout = GRACE_S
    config.include_server_header = False
    return config


async def serve_proxy(
    home: Home,
    *,
    upstream: str | None = None,
    handle_signals: bool = False,
    task_status: trio.TaskStatus[ProxyHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run inferproxy on ``home`` until a stop. Startup problems raise before
    ``started()``: ConfigError, HomeError, ListenerError, NoUpstream."""
    config = await trio.to_thread.run_sync(load_config, home)
    settings = ProxySettings(
        upstream=_upstream(upstream or config.model.url),
        model=config.model.name,
        max_tokens=config.model.max_tokens,
        token=await trio.to_thread.run_sync(read_token, home, config),
    )
    await trio.to_thread.run_sync(home.ensure_run_dir)
    unix, inode = await trio.to_thread.run_sync(bind_unix_socket, home.infer_sock)
    try:
        sockets = [unix]
        if config.proxy.tcp_port:
            sockets.append(_tcp_socket(config.proxy.tcp_port))
            if settings.token is None:
                log.warning(
                    "127.0.0.1:%d is open to every local user: set [proxy] token_file; see %s",
                    config.proxy.tcp_port,
                    RUNBOOK_TCP,
                )
        hypercorn_config = _hypercorn_config(sockets)
        async with _model_client(settings.upstream) as client:
            app = InferProxy(settings, client)
            handle = ProxyHandle(binds=[])
            serve = functools.partial(
                hypercorn.trio.serve,
                app,  # type: ignore[arg-type]  # an ASGI 3 callable, typed loosely
                hypercorn_config,
                shutdown_trigger=handle.wait_stop_requested,
            )
            async with trio.open_nursery() as signals:
                if handle_signals:
                    signals.start_soon(
                        functools.partial(
                            stop_on_signals,
                            handle.request_stop,
                            log,
                            on_hangup=_Reloader(home, config, app).reload,
                        )
                    )
                # hypercorn's serve returns after a stop, once its connections are done.
                async with trio.open_nursery() as server:
                    handle.binds = await server.start(serve)
                    log.info(
                        "inferproxy %s serving %s, forwarding to %s (model %s, max_tokens %d"
                        ", TCP token %s)",
                        __version__,
                        ", ".join(handle.binds),
                        settings.upstream,
                        settings.model,
                        settings.max_tokens,
                        "required" if settings.token else "not set",
                    )
                    task_status.started(handle)
                signals.cancel_scope.cancel()
    finally:
        remove_socket_path(home.infer_sock, inode)
    log.info("inferproxy stopped")


@attrs.define
class _Reloader:
    """SIGHUP's re-read of config.toml, applied to the app's settings."""

    home: Home
    config: Config
    app: InferProxy

    async def reload(self) -> None:
        self.config = await reread_config(
            self.home, self.config, concern=frozenset({"model", "proxy"}), live=LIVE_KEYS, log=log
        )
        self.app.settings = attrs.evolve(
            self.app.settings, model=self.config.model.name, max_tokens=self.config.model.max_tokens
        )


# ---------------------------------------------------------------------------------------
# The command line

app = App(
    name="inferproxy",
    help="The boxmaker inference proxy: loopd's only way to the model.",
    version=__version__,
)


@app.command
def serve(
    *,
    home: Annotated[str | None, Parameter(help="The boxmaker home.")] = None,
    upstream: Annotated[
        str | None, Parameter(help="The model server's URL (default: [model] url).")
    ] = None,
) -> int:
    """Serve run/infer.sock until SIGINT/SIGTERM (exit 0).

    Exit 2: config.toml has a problem, or there is no model URL. Exit 1: the home or a
    socket cannot be used, or inferproxy failed.
    """
    return run_daemon(
        "inferproxy",
        functools.partial(serve_proxy, resolve_home(home), upstream=upstream, handle_signals=True),
        usage=(NoUpstream,),
        failures=(HomeError, ListenerError),
    )


def main() -> None:
    """Console entry point (``inferproxy``): the command's return value is the exit code."""
    app()


if __name__ == "__main__":
    main()
