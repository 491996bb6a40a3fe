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
from boxmaker.printable import PrintableFormatter, printable

CONFIG_ANCHOR: Final = "docs/runbook.md#config"


def setup_logging(name: str) -> None:
    """INFO and up to stderr, each line naming the daemon (``bxctl up`` keeps it in
    ``logs/<name>.log``). Each record is one line, its text escaped: the model's tool
    names and arguments cannot write controls or a line of their own into the log."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(PrintableFormatter(f"%(asctime)s {name} %(levelname)s %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])


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


async def stop_on_signals(request_stop: Callable[[], None], log: logging.Logger) -> None:
    """Call ``request_stop`` on each SIGINT or SIGTERM."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as received:
        async for signum in received:
            log.info("%s: stopping", signal.Signals(signum).name)
            request_stop()
