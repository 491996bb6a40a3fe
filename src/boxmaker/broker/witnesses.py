"""brokerd's witnesses (docs/protocol.md, "Witnesses"): after each checkpoint, each
``[[witness]]`` gets it by C2SP tlog-witness ``add-checkpoint``, with the consistency
proof from the size it last cosigned (read from the tiles under ``ledger/tree/``), and
its cosignature is kept in ``ledger/tree/cosignatures/<name>``: the checkpoint note
with the witness's signature line added, a signed note any verifier can check.

Nothing here blocks the writer or a call: :meth:`WitnessSender.checkpointed` only
records the newest checkpoint and wakes one task per witness; each task sends the
newest checkpoint there is when it is free (never a queue of old ones), each request
under the witness's ``timeout``, retried after an error with a backoff that doubles up
to :attr:`Backoff.most`. A 409 names the witness's size: the request is made again
from it. A refusal (400/403/404/422) is logged with its reason and retried at the next
checkpoint; a 422 means the witness holds a tree this ledger is not an extension of
(docs/runbook.md#witness-fork).

:meth:`WitnessSender.lagging` says, from this state in memory alone, whether a witness
lags (step 3 of a decision, with ``[ledger] witness_lag = "deny_risky"``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Final, TypeAlias

import attrs
import httpx
import trio

from boxmaker.home.config import WitnessConfig
from boxmaker.home.file_ops import write_atomically
from boxmaker.home.regular_file import read_regular_file
from boxmaker.ledger.checkpoint import CheckpointError, parse_checkpoint
from boxmaker.ledger.cosignatures import (
    MAX_COSIGNATURE_FILE,
    RUNBOOK_WITNESS,
    cosignature_path,
    read_cosigned,
)
from boxmaker.ledger.merkle import Hash, ProofError, prove_tree
from boxmaker.ledger.signed_note import (
    NoteError,
    NoteVerifier,
    open_note,
    parse_vkey,
    verify_cosignature,
)
from boxmaker.ledger.tiles import TileProblem, TileStore
from boxmaker.ledger.tree import CHECKPOINT_FILE
from boxmaker.ledger.witness_protocol import (
    ADD_CHECKPOINT_PATH,
    SIZE_CONTENT_TYPE,
    AddCheckpoint,
    WitnessRequestError,
    format_add_checkpoint,
    parse_conflict,
    pick_cosignature,
)

log = logging.getLogger("boxmaker.brokerd.witness")

RUNBOOK_FORK: Final = "docs/runbook.md#witness-fork"
MAX_CONFLICTS: Final = 3
"""409s answered in a row before the round counts as failed: one is the normal way to
learn a witness's size; more mean its size moves under us."""
WitnessClient: TypeAlias = httpx.AsyncClient
"""What the witnesses are reached with (serve_broker's seam for a test's transport)."""
NO_CHECKPOINTS_DETAIL: Final = (
    "no checkpoint is signed this boot (the ledger's origin could not be read), so no "
    f"witness can cosign: risky calls are denied; see {RUNBOOK_WITNESS}"
)


@attrs.frozen
class Backoff:
    """Seconds before retrying a witness after a failed round: ``first``, doubling up
    to ``most``."""

    first: float = 1.0
    most: float = 300.0

    def after(self, failures: int) -> float:
        return min(self.most, self.first * 2.0 ** max(0, failures - 1))


class WitnessFailure(Exception):
    """One round with a witness that ended without a cosignature; :attr:`reason` is a
    reason code (``unreachable``, ``timeout``, ``refused_<status>``, ``bad_answer``,
    ``witness_ahead``, ``no_proof``)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@attrs.define
class WitnessLink:
    """One witness as the sender knows it."""

    config: WitnessConfig
    verifier: NoteVerifier
    cosigned_size: int | None = None
    """The size of the newest checkpoint it cosigned for us (None: none kept)."""
    known_size: int = 0
    """What we believe its size for our origin is (its last cosigned, or its 409)."""
    failures: int = 0
    last_problem: str | None = None
    wake: trio.Event = attrs.Factory(trio.Event)


@attrs.frozen
class _Checkpoint:
    note: bytes
    text: str
    size: int


def _read_newest(tree_dir: Path) -> tuple[bytes, int] | None:
    """The newest checkpoint's note beside the tiles and its size, unchecked (the hook
    checks it), or None."""
    try:
        note = read_regular_file(tree_dir / CHECKPOINT_FILE, limit=MAX_COSIGNATURE_FILE)
        size = int(note.split(b"\n", 2)[1])
    except (OSError, ValueError, IndexError):
        return None
    return note, size


def _proof(tree_dir: Path, size: int, old: int) -> tuple[Hash, ...]:
    if old in (0, size):
        return ()
    # A store of our own: the writer's may be replacing a partial tile as we read.
    return tuple(prove_tree(size, old, TileStore(tree_dir)))


class WitnessSender:
    """Sends each checkpoint to every configured witness; one task per witness under
    :meth:`run`. ``ledger_verifier`` is the ledger key's verifier (the notes handed to
    :meth:`checkpointed` are checked with it, and their text taken from it)."""

    def __init__(
        self,
        witnesses: Sequence[WitnessConfig],
        tree_dir: Path,
        ledger_verifier: NoteVerifier,
        *,
        client: httpx.AsyncClient | None = None,
        backoff: Backoff = Backoff(),
        max_lag: int = 5000,
        start_size: int = 0,
    ) -> None:
        self.tree_dir = tree_dir
        self.start_size = start_size
        """The ledger's records when brokerd started: a witness that never cosigned in
        this ledger is behind by the records checkpointed since."""
        self.ledger_verifier = ledger_verifier
        self.backoff = backoff
        self.max_lag = max_lag
        self.links = [WitnessLink(config, parse_vkey(config.vkey)) for config in witnesses]
        self._client = client
        self._latest: _Checkpoint | None = None
        self.progressed = trio.Event()
        """Set (and replaced) after each round with a witness, cosigned or not: what
        waits for a witness's state to change waits on it."""

    def checkpointed(self, note: bytes, size: int) -> None:
        """The writer's hook after each checkpoint: never blocks, never raises for a
        witness's sake. A note that is not the ledger's own signed checkpoint of
        ``size`` is logged and dropped."""
        try:
            text = open_note(note, [self.ledger_verifier]).text
            checkpoint = parse_checkpoint(text)
        except (NoteError, CheckpointError) as exc:
            log.error("a checkpoint not sent to witnesses: %s", exc)  # noqa: TRY400
            return
        if checkpoint.size != size:
            log.error("a checkpoint of size %d handed over as size %d", checkpoint.size, size)
            return
        if self._latest is not None and size < self._latest.size:
            return
        self._latest = _Checkpoint(note, text, size)
        for link in self.links:
            link.wake.set()

    on_checkpoint = checkpointed

    def lag(self, link: WitnessLink) -> int | None:
        """Records between the newest checkpoint and the witness's last cosignature
        (None: it never cosigned)."""
        if link.cosigned_size is None:
            return None
        newest = self._latest.size if self._latest is not None else link.cosigned_size
        return max(0, newest - link.cosigned_size)

    def behind(self, link: WitnessLink) -> int:
        """Records in the newest checkpoint that the witness has not cosigned: beyond
        the size it last cosigned or, when it never cosigned in this ledger, beyond
        :attr:`start_size`. Records after the newest checkpoint are not counted: no
        witness can have seen them (docs/decisions.md, "Witnesses")."""
        since = self.start_size if link.cosigned_size is None else link.cosigned_size
        newest = self._latest.size if self._latest is not None else since
        return max(0, newest - since)

    def lagging(self) -> str | None:
        """Why the first witness more than :attr:`max_lag` records :meth:`behind` lags,
        in words that name it and its lag, or None when none does. No I/O: this is
        asked at every decision."""
        for link in self.links:
            behind = self.behind(link)
            if behind <= self.max_lag:
                continue
            if link.cosigned_size is None:
                cosigned = "it never cosigned this ledger"
            else:
                cosigned = f"it last cosigned size {link.cosigned_size}"
            problem = f", its last answer: {link.last_problem}" if link.last_problem else ""
            return (
                f"witness {link.config.name} is {behind} records behind the ledger's newest "
                f"checkpoint ({cosigned}{problem}), more than witness_max_lag "
                f"{self.max_lag}: risky calls are denied until it cosigns; see "
                f"{RUNBOOK_WITNESS}"
            )
        return None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Load what each witness cosigned before, then serve them until cancelled."""
        origin = self.ledger_verifier.name
        newest = await trio.to_thread.run_sync(_read_newest, self.tree_dir)
        if newest is not None and self._latest is None:
            # The checkpoint of the last stop, sent now rather than at the next one.
            self.checkpointed(*newest)
        for link in self.links:
            path = cosignature_path(self.tree_dir, link.config.name)
            link.cosigned_size = await trio.to_thread.run_sync(
                read_cosigned, path, link.verifier, origin
            )
            link.known_size = link.cosigned_size or 0
        async with _client_for(self._client) as client, trio.open_nursery() as nursery:
            for link in self.links:
                nursery.start_soon(self._serve, client, link)
            task_status.started()

    async def _serve(self, client: httpx.AsyncClient, link: WitnessLink) -> None:
        while True:
            await link.wake.wait()
            link.wake = trio.Event()
            latest = self._latest
            if latest is None or link.cosigned_size == latest.size:
                continue
            try:
                await self._round(client, link, latest)
            except WitnessFailure as exc:
                self._failed(link, exc)
            else:
                link.failures, link.last_problem = 0, None
                self._progress()
                continue
            self._progress()
            if link.last_problem and link.last_problem.startswith("refused_"):
                continue  # tried again at the next checkpoint, not in a loop
            await trio.sleep(self.backoff.after(link.failures))
            link.wake.set()

    def _progress(self) -> None:
        self.progressed.set()
        self.progressed = trio.Event()

    def _failed(self, link: WitnessLink, failure: WitnessFailure) -> None:
        link.failures += 1
        link.last_problem = failure.reason
        anchor = RUNBOOK_FORK if failure.reason == "refused_422" else RUNBOOK_WITNESS
        log.warning(
            "witness %s: no cosignature (attempt %d): %s; see %s",
            link.config.name,
            link.failures,
            failure,
            anchor,
        )
        lag = self.lag(link)
        if lag is None or lag > self.max_lag:
            shown = "never cosigned" if lag is None else f"{lag} records behind"
            log.warning("witness %s is lagging: %s", link.config.name, shown)

    async def _round(
        self, client: httpx.AsyncClient, link: WitnessLink, latest: _Checkpoint
    ) -> None:
        url = link.config.url.rstrip("/") + ADD_CHECKPOINT_PATH
        for _ in range(MAX_CONFLICTS):
            old = link.known_size
            if old > latest.size:
                raise WitnessFailure(
                    "witness_ahead",
                    f"the witness has size {old}, beyond this ledger's newest checkpoint "
                    f"{latest.size}: the ledger was cut back or replaced",
                )
            try:
                proof = await trio.to_thread.run_sync(_proof, self.tree_dir, latest.size, old)
            except (ProofError, TileProblem, OSError) as exc:
                raise WitnessFailure(
                    "no_proof", f"from size {old} to {latest.size}: {exc}"
                ) from exc
            body = format_add_checkpoint(AddCheckpoint(old, proof, latest.note))
            try:
                with trio.fail_after(link.config.timeout):
                    response = await client.post(url, content=body)
            except trio.TooSlowError:
                raise WitnessFailure(
                    "timeout", f"{url}: no answer in {link.config.timeout} s"
                ) from None
            except httpx.HTTPError as exc:
                raise WitnessFailure("unreachable", f"{url}: {exc!r}") from exc
            if response.status_code == 409:
                link.known_size = _conflict_size(response)
                continue
            if response.status_code != 200:
                first = response.content[:300].decode("utf-8", errors="replace").split("\n")[0]
                raise WitnessFailure(f"refused_{response.status_code}", first or "(no body)")
            await self._keep(link, latest, response.content)
            return
        raise WitnessFailure("conflict", f"{MAX_CONFLICTS} answers 409 in a row")

    async def _keep(self, link: WitnessLink, latest: _Checkpoint, answer: bytes) -> None:
        try:
            line = pick_cosignature(answer, link.verifier)
            verify_cosignature(latest.text, line, link.verifier)
        except (WitnessRequestError, NoteError) as exc:
            raise WitnessFailure("bad_answer", str(exc)) from exc
        path = cosignature_path(self.tree_dir, link.config.name)
        await trio.to_thread.run_sync(_write_cosigned, path, latest.note + line.encode())
        link.cosigned_size = link.known_size = latest.size
        log.info("witness %s cosigned size %d", link.config.name, latest.size)


def _conflict_size(response: httpx.Response) -> int:
    content_type = response.headers.get("content-type", "").split(";")[0].strip()
    if content_type != SIZE_CONTENT_TYPE:
        raise WitnessFailure("bad_answer", f"a 409 of type {content_type!r}")
    try:
        return parse_conflict(response.content)
    except WitnessRequestError as exc:
        raise WitnessFailure("bad_answer", str(exc)) from exc


def _write_cosigned(path: Path, data: bytes) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_atomically(path, data, mode=0o600)


@contextlib.asynccontextmanager
async def _client_for(given: httpx.AsyncClient | None) -> AsyncIterator[httpx.AsyncClient]:
    if given is not None:
        yield given
        return
    # trust_env=False: the environment's proxies are not the way to a witness. The
    # time limits are the caller's (trio.fail_after per request).
    async with httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(None)) as client:
        yield client
