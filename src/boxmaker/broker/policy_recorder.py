"""brokerd's record of each change of the grants it decides with (docs/protocol.md,
"Policy records")."""

from __future__ import annotations

import logging
from pathlib import Path

from boxmaker.core.grant_parse import GrantsProblem
from boxmaker.core.grants import GrantSet
from boxmaker.home.grants_file import GrantsRead
from boxmaker.ledger.policies import RUNBOOK_KEPT, KeptProblem, keep
from boxmaker.ledger.records import Policy
from boxmaker.ledger.writer import LedgerStopped, LedgerWriter
from boxmaker.runtime.threads import WORKER_THREAD, ToThread

log = logging.getLogger("boxmaker.brokerd")


class PolicyRecorder:
    """Records each change of the grants brokerd decides with (docs/protocol.md, "Policy
    records"): keeps the new bytes beside the ledger (:func:`boxmaker.ledger.policies.
    keep`), then appends a ``policy`` record naming them, or the problem. The same
    content as this boot's last policy record is not recorded again.
    """

    def __init__(
        self,
        writer: LedgerWriter,
        boot: str,
        directory: Path,
        *,
        to_thread: ToThread = WORKER_THREAD,
    ) -> None:
        self.writer = writer
        self.boot = boot
        self.directory = directory
        self._to_thread = to_thread
        self._last: tuple[str | None, str | None] | None = None

    @staticmethod
    def _key(loaded: GrantsRead, value: GrantSet | GrantsProblem) -> tuple[str | None, str | None]:
        sha = loaded.digest if loaded.data is not None else None
        return sha, value.describe() if isinstance(value, GrantsProblem) else None

    def needed(self, loaded: GrantsRead, value: GrantSet | GrantsProblem) -> bool:
        """Would these grants be a change from the last ones recorded this boot?"""
        return self._key(loaded, value) != self._last

    async def record(self, loaded: GrantsRead, value: GrantSet | GrantsProblem) -> None:
        """Keep, then record. A version that could not be kept is still recorded (the
        record says what decided; ``bxctl audit verify`` then names the missing copy);
        a record that could not be written leaves every call denied
        ``audit_unavailable``, as the stopped ledger does anyway."""
        sha, problem = key = self._key(loaded, value)
        if loaded.data is not None:
            await self._keep(loaded.data)
        grants = len(value.grants) if isinstance(value, GrantSet) else None
        body = Policy(boot=self.boot, sha256=sha, grants=grants, problem=problem)
        try:
            await self.writer.append(body)
        except LedgerStopped:
            log.warning("the policy record could not be written; every call is denied")
            return
        self._last = key
        log.info("policy: grants.toml %s, %s", sha, problem or f"{grants} grants")

    async def _keep(self, data: bytes) -> None:
        try:
            kept = await self._to_thread(keep, self.directory, data)
        except (KeptProblem, OSError) as exc:
            # Expected states, not crashes: the words say it, no traceback.
            log.error(  # noqa: TRY400
                "this grants.toml could not be kept: %s; see %s", exc, RUNBOOK_KEPT
            )
            return
        if kept.replaced is not None:
            log.warning(
                "replaced an untrusted kept version: %s; see %s", kept.replaced, RUNBOOK_KEPT
            )
