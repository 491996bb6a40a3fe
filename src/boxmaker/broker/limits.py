"""brokerd's resource caps: connections, pending asks, buffered bytes, descriptors.

Without them a process of loopd's uid could make brokerd hold a gigabyte (a thousand
connections each sending 1 MiB without a newline) or spend every file descriptor on
pending asks, so that the owner could no longer reach admin.sock to see or refuse them.

- **Buffered bytes**: every broker.sock reader shares one
  :class:`boxmaker.runtime.ndjson.BufferBudget` of ``[broker] max_buffered_bytes``; a connection
  whose unfinished frame would take more is answered ``error bad_frame`` and closed.
- **Connections**: at ``max_connections`` open broker.sock connections, or when the
  descriptor just accepted is within :data:`FD_RESERVE` of the open-file limit, a new
  connection is answered ``error busy`` at once and closed, before any frame is read
  (nothing was asked, so nothing is recorded). ``max_connections`` is lowered at start
  to what the open-file limit leaves after the reserve. admin.sock has no cap: it is
  the owner's, and the reserve is what keeps it reachable.
- **Pending asks**: at ``max_pending`` asks waiting for the owner, or when the waiting
  asks' request frames add up to ``max_pending_bytes`` (their arguments are held as
  long as they wait), one more ask is denied ``too_many_pending`` with a decision
  record (connection.py). ``max_pending`` is lowered at start to seven eighths of the
  connections, so calls that need no owner still get through while the asks wait.

:func:`release_freed_memory` hands freed heap pages back to the system when a flood's
buffers are gone (glibc keeps them otherwise).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import resource
from pathlib import Path
from typing import Final

import attrs

from boxmaker.core.reasons import RUNBOOK_TOO_MANY_PENDING
from boxmaker.home.config import BrokerConfig
from boxmaker.runtime.ndjson import BufferBudget

log = logging.getLogger("boxmaker.brokerd")

FD_RESERVE: Final = 256
"""Descriptors broker.sock never takes: admin.sock clients, the ledger, state and grants
files (through up to 40 worker threads), grants reloads, sandbox pipes of running calls.
On a small open-file limit, a quarter of it instead."""
RUNBOOK_BUSY: Final = "docs/runbook.md#too-many-connections"
TRIM_AFTER_CONNECTIONS: Final = 1000
"""Once this many connections were open at once and three quarters have closed, freed
memory is handed back (not after every call: a trim costs more than a call)."""


def open_file_limit() -> int | None:
    """The soft RLIMIT_NOFILE in force, or None when unlimited."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def count_open_fds() -> int:
    """How many descriptors this process has open now (0 when /proc cannot say)."""
    try:
        return sum(1 for _ in Path("/proc/self/fd").iterdir())
    except OSError:
        return 0


@attrs.frozen
class Limits:
    """The caps in force for one boot (config.toml's, lowered to what the system allows)."""

    max_connections: int
    max_pending: int
    max_pending_bytes: int
    max_buffered_bytes: int
    fd_limit: int | None
    fd_reserve: int

    @classmethod
    def derive(cls, config: BrokerConfig, *, fd_limit: int | None, fds_open: int) -> Limits:
        """``fds_open``: descriptors already in use at start (stdio, the listeners, the
        ledger, trio's own).

        >>> config = BrokerConfig(max_pending=10_000, max_connections=12_000)
        >>> Limits.derive(config, fd_limit=1024, fds_open=20)
        Limits(max_connections=748, max_pending=655, max_pending_bytes=33554432, max_buffered_bytes=33554432, fd_limit=1024, fd_reserve=256)
        >>> Limits.derive(config, fd_limit=None, fds_open=20).max_pending
        10000
        """  # noqa: E501
        connections = config.max_connections
        reserve = FD_RESERVE
        if fd_limit is not None:
            reserve = min(FD_RESERVE, fd_limit // 4)
            connections = max(1, min(connections, fd_limit - fds_open - reserve))
        pending = max(1, min(config.max_pending, connections - connections // 8))
        return cls(
            max_connections=connections,
            max_pending=pending,
            max_pending_bytes=config.max_pending_bytes,
            max_buffered_bytes=config.max_buffered_bytes,
            fd_limit=fd_limit,
            fd_reserve=reserve,
        )

    def describe(self) -> str:
        fds = "unlimited" if self.fd_limit is None else str(self.fd_limit)
        return (
            f"max_connections {self.max_connections}, max_pending {self.max_pending}, "
            f"max_pending_bytes {self.max_pending_bytes}, "
            f"max_buffered_bytes {self.max_buffered_bytes}, open-file limit {fds} "
            f"({self.fd_reserve} kept from broker.sock)"
        )


class Capacity:
    """What broker.sock uses of the caps now. One thread's trio tasks only: no lock."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.budget = BufferBudget(limits.max_buffered_bytes, name="[broker] max_buffered_bytes")
        self.connections = 0
        self.pending = 0
        """Asks holding a pending slot: from their decision until their call ends."""
        self.pending_bytes = 0
        """The sizes of their request frames (their arguments live as long)."""
        self.refused = 0
        self._refusing = False
        self._connections_peak = 0

    @classmethod
    def for_config(cls, config: BrokerConfig) -> Capacity:
        return cls(Limits.derive(config, fd_limit=open_file_limit(), fds_open=count_open_fds()))

    # -- connections ------------------------------------------------------------------

    def refusal(self, fd: int) -> str | None:
        """Why a just-accepted broker.sock connection (descriptor ``fd``) is refused, or
        None to serve it. The kernel hands out the lowest free descriptor, so ``fd``
        close to the limit means almost none are left."""
        limits = self.limits
        if self.connections >= limits.max_connections:
            why = (
                f"brokerd already serves {self.connections} connections "
                f"([broker] max_connections); see {RUNBOOK_BUSY}"
            )
        elif limits.fd_limit is not None and fd >= limits.fd_limit - limits.fd_reserve:
            why = (
                f"brokerd is short of file descriptors ({fd + 1} of {limits.fd_limit} "
                f"in use, {limits.fd_reserve} kept for admin.sock); see {RUNBOOK_BUSY}"
            )
        else:
            if self._refusing:
                log.info("broker.sock: accepting again (%d connections refused)", self.refused)
                self._refusing = False
                self.refused = 0
            return None
        if not self._refusing:
            log.warning("broker.sock: refusing new connections: %s", why)
            self._refusing = True
        self.refused += 1
        return why

    def opened(self) -> None:
        self.connections += 1
        self._connections_peak = max(self._connections_peak, self.connections)

    def closed(self) -> None:
        self.connections -= 1
        budget = self.budget
        buffers_gone = budget.used == 0 and budget.peak > budget.limit // 4
        connections_gone = (
            self._connections_peak >= TRIM_AFTER_CONNECTIONS
            and self.connections <= self._connections_peak // 4
        )
        if buffers_gone or connections_gone:
            # A flood has passed: hand the pages it freed back to the system. Measured:
            # 1,000 connections of 1 MiB left 44 MB resident without this, 39 MB with.
            budget.peak = budget.used
            self._connections_peak = self.connections
            release_freed_memory()

    # -- pending asks -----------------------------------------------------------------

    def reserve_pending(self, size: int) -> str | None:
        """Take a pending slot for an ask whose request is ``size`` bytes; None when
        taken, else why not (the detail of its ``too_many_pending`` denial)."""
        limits = self.limits
        if self.pending >= limits.max_pending:
            return (
                f"{self.pending} calls already wait for the owner ([broker] max_pending); "
                f"see {RUNBOOK_TOO_MANY_PENDING}"
            )
        if self.pending_bytes + size > limits.max_pending_bytes:
            return (
                f"the calls waiting for the owner already hold {self.pending_bytes} bytes "
                f"of requests ([broker] max_pending_bytes); see {RUNBOOK_TOO_MANY_PENDING}"
            )
        self.pending += 1
        self.pending_bytes += size
        return None

    def release_pending(self, size: int) -> None:
        self.pending -= 1
        self.pending_bytes -= size


_libc: ctypes.CDLL | None = None


def release_freed_memory() -> None:
    """glibc's ``malloc_trim(0)``: return free heap pages to the system. Without it the
    pages of a flood's freed buffers stay resident (glibc trims only the top of a heap).
    A no-op where there is no glibc."""
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c")
        if name is None:
            return
        with contextlib.suppress(OSError):
            _libc = ctypes.CDLL(name)
    trim = getattr(_libc, "malloc_trim", None)
    if trim is not None:
        trim(0)
