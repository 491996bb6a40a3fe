"""The worker processes a process started (``multiprocessing``'s spawned children, as
``trio-parallel`` starts them for ``bxctl audit export``), found in /proc: to show a
test's batches were made in them, and to kill them mid-export."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import attrs
import trio


def _state(pid: int) -> str:
    """A process's state letter (R running, S sleeping...), "" once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[0]


def worker_processes(parent: int) -> set[int]:
    """The pids of ``parent``'s children that are spawned worker processes."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue  # gone meanwhile
        # The name in parentheses may hold spaces; the parent's pid is the second field after.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == parent and b"spawn_main" in cmdline:
            found.add(int(entry.name))
    return found


@attrs.define
class WorkerWatch:
    """Watches ``parent``'s worker processes until cancelled: every one ``seen``; with
    ``kills`` above 0, that many of them killed (SIGKILL) while busy: a worker that was
    seen waiting (asleep once its start was done) is killed when it runs again, which
    is while it makes a batch."""

    parent: int
    kills: int = 0
    seen: set[int] = attrs.field(factory=set)
    waited: set[int] = attrs.field(factory=set)
    killed: list[int] = attrs.field(factory=list)

    async def run(self) -> None:
        while True:
            self.seen |= worker_processes(self.parent)
            for pid in self.seen - set(self.killed):
                if len(self.killed) >= self.kills:
                    break
                state = _state(pid)
                if state == "S":
                    self.waited.add(pid)
                elif state == "R" and pid in self.waited:
                    os.kill(pid, signal.SIGKILL)
                    self.killed.append(pid)
            await trio.sleep(0.002)
