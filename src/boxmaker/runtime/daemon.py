"""What every daemon's command line shares: its log on stderr, the exit codes, a clean
stop on SIGINT/SIGTERM, and config.toml re-read on SIGHUP (docs/runbook.md#reload)."""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Final

import trio

from boxmaker.formats.printable import PrintableFormatter, printable
from boxmaker.home.config import Config, ConfigError, load_config
from boxmaker.home.paths import Home
from boxmaker.home.reload import reload_config

CONFIG_ANCHOR: Final = "docs/runbook.md#config"
RELOAD_ANCHOR: Final = "docs/runbook.md#reload"
RELOADED: Final = "SIGHUP: config.toml re-read"
NOT_RELOADED: Final = "SIGHUP: config.toml not applied"
"""The two lines that end a SIGHUP's re-read in a daemon's log."""


def setup_logging(name: str) -> None:
    """INFO and up to stderr, each line naming the daemon (``bxctl up`` keeps it in
    ``logs/<name>.log``). Each record is one line, its text escaped: the model's tool
    names and arguments cannot write controls or a line of their own into the log."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(PrintableFormatter(f"%(asctime)s {name} %(levelname)s %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    # httpx logs every request at INFO: a line per model turn or witness checkpoint
    # says nothing the daemon's own lines do not, and would drown them.
    logging.getLogger("httpx").setLevel(logging.WARNING)


def run_daemon(
    name: str,
    main: Callable[[], Awaitable[object]],
    *,
    usage: tuple[type[Exception], ...] = (),
    failures: tuple[type[Exception], ...] = (),
) -> int:
    """Run ``main`` under trio with the log set up; the exit code. 0 after a clean stop;
    2 for a problem in config.toml (pointing at the runbook) or one of ``usage``; 1 for
    one of ``failures`` or anything else (logged with its traceback)."""
    setup_logging(name)
    try:
        trio.run(main)
    except ConfigError as exc:
        # One line a problem: each names the file and the key.
        for problem in exc.problems:
            sys.stderr.write(f"{name}: {printable(problem)}\n")
        sys.stderr.write(f"{name}: see {CONFIG_ANCHOR}\n")
        return 2
    except usage as exc:
        sys.stderr.write(f"{name}: {printable(str(exc))}\n")
        return 2
    except failures as exc:
        sys.stderr.write(f"{name}: {printable(str(exc))}\n")
        return 1
    except Exception:
        logging.getLogger(f"boxmaker.{name}").exception("%s failed", name)
        return 1
    return 0


async def stop_on_signals(
    request_stop: Callable[[], None],
    log: logging.Logger,
    *,
    on_hangup: Callable[[], Awaitable[object]] | None = None,
) -> None:
    """Call ``request_stop`` on each SIGINT or SIGTERM; with ``on_hangup``, run it on
    each SIGHUP (without one, SIGHUP is left to brokerd's own loop or the default).

    Each SIGHUP's work is a task of its own: however long a re-read takes, the loop
    goes on receiving, so SIGINT/SIGTERM are always served."""
    signals = [signal.SIGINT, signal.SIGTERM]
    if on_hangup is not None:
        signals.append(signal.SIGHUP)
    async with trio.open_nursery() as reloads:
        with trio.open_signal_receiver(*signals) as received:
            async for signum in received:
                if signum == signal.SIGHUP and on_hangup is not None:
                    log.info("SIGHUP: re-reading config.toml")
                    reloads.start_soon(on_hangup)
                else:
                    log.info("%s: stopping", signal.Signals(signum).name)
                    request_stop()


async def reread_config(
    home: Home,
    current: Config,
    *,
    concern: frozenset[str],
    live: frozenset[str],
    log: logging.Logger,
) -> Config:
    """config.toml read again (SIGHUP): the config to run with from now on, each change
    logged: the live keys applied, the others named as needing a restart (they keep
    their old value). A file with a problem changes nothing: the problems are logged
    and the old config stays whole (:func:`boxmaker.home.reload.reload_config`)."""
    try:
        new = await trio.to_thread.run_sync(load_config, home)
    except ConfigError as exc:
        problems = exc.problems
    else:
        problems = ()
    if problems:
        # No traceback: each problem names the file and the key, which is all there is.
        for problem in problems:
            log.error("SIGHUP: %s", problem)
        log.error(
            "%s, every key keeps its old value; see %s",
            NOT_RELOADED,
            CONFIG_ANCHOR,
        )
        return current
    done = reload_config(current, new, concern=concern, live=live)
    for key in done.applied:
        log.info("SIGHUP: applied %s", key)
    for key in done.needs_restart:
        log.warning(
            "SIGHUP: needs a restart: %s (the old value is kept); see %s", key, RELOAD_ANCHOR
        )
    # The last line of every re-read: `bxctl reload` waits for it.
    log.info(
        "%s (%d applied, %d need a restart)",
        RELOADED,
        len(done.applied),
        len(done.needs_restart),
    )
    return done.config
