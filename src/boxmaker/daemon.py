"""What every daemon's command line shares: its log on stderr, the exit codes, and a
clean stop on SIGINT/SIGTERM."""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Final

import trio

from boxmaker.home import ConfigError

CONFIG_ANCHOR: Final = "docs/runbook.md#config"


def setup_logging(name: str) -> None:
    """INFO and up to stderr, each line naming the daemon (``bxctl up`` keeps it in
    ``logs/<name>.log``)."""
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format=f"%(asctime)s {name} %(levelname)s %(message)s",
    )


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
        sys.stderr.write(f"{name}: {exc}\n{name}: see {CONFIG_ANCHOR}\n")
        return 2
    except usage as exc:
        sys.stderr.write(f"{name}: {exc}\n")
        return 2
    except failures as exc:
        sys.stderr.write(f"{name}: {exc}\n")
        return 1
    except Exception:
        logging.getLogger(f"boxmaker.{name}").exception("%s failed", name)
        return 1
    return 0


async def stop_on_signals(request_stop: Callable[[], None], log: logging.Logger) -> None:
    """Call ``request_stop`` on each SIGINT or SIGTERM."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as received:
        async for signum in received:
            log.info("%s: stopping", signal.Signals(signum).name)
            request_stop()
