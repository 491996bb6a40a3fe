"""``brokerd serve``: the broker daemon (docs/architecture.md, docs/protocol.md).

One nursery holds the ledger writer, the grants watcher, the signal task and the two
listeners (broker.sock, admin.sock); each accepted connection runs in its own task of a
connection nursery (broker calls and admin clients in separate ones, so shutdown can
treat them differently). A pending call's deadline and its requester's look belong to
its own connection's task (broker/pending.py), so there is no broker-wide timer.
Readiness is ``task_status.started(broker)``, so tests start
the real daemon with ``await nursery.start(serve_broker, home)``.

Start: load config.toml (exit 2 on a problem), make the home private and ``run/`` 0700,
complete a seal of the ledger cut short (docs/runbook.md#ledger-segments), open the
ledger (a torn tail refuses to start, exit 1; ``--repair`` moves it aside),
load the ledger key (made when missing, as ``bxctl init`` does; one that cannot be used
refuses to start, exit 1: docs/runbook.md#ledger-key) and the ledger's tree, bind the
sockets, append ``start``. The ledger writer appends a signed checkpoint every
``[ledger] checkpoint_every`` records or ``checkpoint_seconds``, and one last after
``stop`` (docs/protocol.md, "Checkpoints").

Clean stop (SIGINT/SIGTERM, docs/protocol.md): stop accepting; answer every pending entry
withdrawn (``broker_stopping``); cancel idle admin connections; give running calls up
to 5 s; append ``stop``; flush and close the ledger; remove our sockets; exit 0.
SIGHUP re-reads grants.toml, and config.toml: the keys of :data:`LIVE_KEYS` apply to the
calls that come after; any other change is logged as needing a restart
(docs/runbook.md#reload).

The workspace must never reach the home (docs/runbook.md#config): checked on real paths
at start (exit 2 like any config.toml problem) and again at every grants re-read, every
watcher tick and SIGHUP (:class:`HomeGuard`); found later, brokerd stops and exits 2.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import resource
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Final

import attrs
import trio
from cyclopts import App, Parameter

from boxmaker import __version__
from boxmaker.broker import runner
from boxmaker.broker.accept import serve_capped
from boxmaker.broker.admin import handle_admin_connection
from boxmaker.broker.cgroup_plan import NoCgroups
from boxmaker.broker.cgroups import CgroupTree, SandboxBounds, find_cgroups
from boxmaker.broker.connection import handle_broker_connection
from boxmaker.broker.grants_watcher import GrantsWatcher
from boxmaker.broker.home_guard import HomeGuard
from boxmaker.broker.mcp_port import EmptyGateway, McpGateway
from boxmaker.broker.policy_recorder import PolicyRecorder
from boxmaker.broker.sandbox_pool import SandboxPool
from boxmaker.broker.state import Broker, Executor, StateRaiser
from boxmaker.broker.tools.host import REAL_HOST, Host
from boxmaker.broker.witnesses import WitnessClient, WitnessSender
from boxmaker.home import state_files
from boxmaker.home.config import Config, ConfigError, load_config, workspace_problem
from boxmaker.home.grants_file import GrantsReader, read_grants_bytes
from boxmaker.home.paths import Home, HomeError, resolve_home
from boxmaker.ledger.checkpointer import Checkpointer, CheckpointHook
from boxmaker.ledger.fast_start import RUNBOOK_FAST_START, RefusalReason
from boxmaker.ledger.ledger_key import (
    LedgerKeyError,
    create_ledger_key,
    load_ledger_signer,
    read_ledger_origin,
)
from boxmaker.ledger.live_file import LedgerTorn, Tail, open_ledger, repair
from boxmaker.ledger.open_calls import OpenCalls
from boxmaker.ledger.policies import policies_dir
from boxmaker.ledger.records import BadRecord, Repair, Start, Stop, new_boot_id
from boxmaker.ledger.seal import Sealer, finish_seal
from boxmaker.ledger.segments import SegmentProblem, ledger_files
from boxmaker.ledger.signed_note import NoteSigner
from boxmaker.ledger.start import start_ledger
from boxmaker.ledger.tree import LedgerTree, tree_dir
from boxmaker.ledger.writer import LedgerFile, LedgerWriter, OsLedgerFile
from boxmaker.runtime.daemon import reread_config, run_daemon, setup_logging
from boxmaker.runtime.threads import WORKER_THREAD, ToThread
from boxmaker.runtime.unix_sockets import ListenerError, UnixListener, open_unix_listener

log = logging.getLogger("boxmaker.brokerd")

GRACE_S: Final = 5.0
"""Running calls get up to 5 s to finish on a clean stop (docs/protocol.md)."""
GRANTS_POLL_S: Final = 2.0
"""The watcher also looks between calls, so a broken file is logged while idle."""

LedgerOpener = Callable[[Path], LedgerFile]

CONFIG_CONCERN: Final = frozenset(
    {"workspace", "broker", "labels", "runner", "notify", "egress", "ledger", "mcp_servers"}
)
"""The parts of config.toml brokerd reads."""
LIVE_KEYS: Final = frozenset({"broker.pending_timeout", "labels", "runner", "egress"})
"""What SIGHUP applies at once, each read afresh by every call that comes after (a call
already waiting or running keeps what it started with): an ask's timeout, the labels
(a session's taint so far stays; only later reads are labelled anew), the tools' time
and output and the sandbox's uid and limits (the sandbox kept set up ahead is used only
for exactly the same launch), a call's bounds on its way out (``[egress]``). Not
live: ``workspace`` (its real path is pinned and watched from the start: HomeGuard) and
the broker.sock caps (sized once, against the open-file limit, for the boot)."""


@attrs.frozen
class _Prepared:
    config: Config
    guard: HomeGuard
    tail: Tail
    file: LedgerFile
    repaired: Repair | None
    open_calls: frozenset[str]
    end: int
    """The ledger file's size when opened: where the next record's line starts."""
    signed: tuple[NoteSigner, LedgerTree] | None
    """The ledger key and the tree, for checkpoints (None: the genesis record could not
    be read, so the ledger has no origin to sign for)."""
    live_first: int
    """The seq of the live file's first line (0 until the ledger is first sealed)."""


def _prepare(
    home: Home, *, repair_torn: bool, open_file: LedgerOpener, to_thread: ToThread
) -> _Prepared:
    """The blocking part of a start; raises ConfigError, HomeError, LedgerTorn,
    SegmentProblem."""
    config = load_config(home)
    # The workspace's real path, used from now on (see Broker.workspace), checked once
    # more: load_config's check resolved the links a moment ago, they may have moved.
    guard = HomeGuard(
        home, config.workspace, Path(os.path.realpath(config.workspace)), to_thread=to_thread
    )
    problem = guard.problem()
    if problem is not None:
        raise ConfigError([f"{home.config_toml.name}: workspace: {problem}"])
    if config.mcp_servers and importlib.util.find_spec("mcp") is None:
        raise ConfigError([MCP_EXTRA_MISSING])
    # Every directory of the home 0700 (a looser run/ tightened, another user's refused:
    # docs/protocol.md); state/sessions must exist before the first state is raised.
    home.create()
    # A seal cut short by a crash is completed (or its .next moved aside) first: the
    # live file is then whole (docs/runbook.md#ledger-segments).
    finish_seal(home.ledger_dir)
    repaired = None
    if repair_torn and home.audit_log.exists():
        repaired = repair(home.audit_log)
    tail = open_ledger(home.audit_log)
    signer = _ledger_signer(home)
    # The ledger verified at start, from its newest checkpoint when that holds: the
    # calls earlier boots left open must not be decided again under the same id (a
    # second decision breaks verification), and a damaged chain is worth a line in the
    # log before anything is appended to it.
    started = time.perf_counter()
    ledger = start_ledger(home, None if signer is None else signer.verifier, tail.next_seq)
    report = ledger.report
    took = time.perf_counter() - started
    if ledger.fallback is None:
        log.info(
            "ledger verified from checkpoint seq %d: %d record(s) after it, %.3f s",
            ledger.checkpoint_seq,
            report.records,
            took,
        )
    else:
        # No checkpoint yet (a new ledger, or one from before checkpoints) is no warning.
        first = ledger.fallback.reason is RefusalReason.NO_POSITION
        log.log(
            logging.INFO if first else logging.WARNING,
            "ledger verified in full (%d records, %.3f s), not from a checkpoint: %s; see %s",
            report.records,
            took,
            ledger.fallback,
            RUNBOOK_FAST_START,
        )
    if not report.sound:
        log.error(
            "the ledger has %d problem(s), the first: %s; run `bxctl audit verify`",
            len(report.problems) + report.problems_left_out,
            report.problems[0],
        )
    file = open_file(home.audit_log)
    end = home.audit_log.stat().st_size
    signed = None if signer is None else (signer, ledger.tree)
    live_first = ledger_files(home.ledger_dir).live_first
    return _Prepared(
        config, guard, tail, file, repaired, report.open_calls, end, signed, live_first
    )


def _ledger_signer(home: Home) -> NoteSigner | None:
    """The ledger key (made when missing: docs/runbook.md#ledger-key). Raises
    LedgerKeyError for a key that cannot be used; None when the genesis record cannot
    be read (the ledger has no origin to sign for)."""
    try:
        origin = read_ledger_origin(home.audit_log)
    except BadRecord:
        log.exception("no checkpoints this boot: the ledger's origin is unknown")
        return None
    if create_ledger_key(home, origin):
        log.warning(
            "made a new ledger key %s (there was none); its public key: %s",
            home.ledger_key,
            home.ledger_vkey,
        )
    return load_ledger_signer(home, origin)


MCP_EXTRA_MISSING: Final = (
    "config.toml: [mcp_servers]: the MCP SDK is not installed: pip install "
    "'boxmaker[mcp]'; see docs/runbook.md#mcp-servers"
)


def _gateway(broker: Broker, prepared: _Prepared, bounds: SandboxBounds) -> McpGateway:
    """The MCP servers of config.toml behind brokerd; the SDK is loaded only when there
    are some (docs/mcp.md)."""
    config = prepared.config
    if not config.mcp_servers:
        return EmptyGateway()
    from boxmaker.broker.server_egress import ServerWaysOut
    from boxmaker.mcp.gateway import Gateway  # the SDK: only when needed

    home = broker.home
    return Gateway(
        home=home,
        config=config,
        workspace=prepared.guard.real_workspace,
        home_problem=lambda path: workspace_problem(home, path),
        record=broker.record,
        boot=broker.boot,
        bounds=bounds,
        to_thread=broker.to_thread,
        ways_out=ServerWaysOut(broker),
    )


async def serve_broker(
    home: Home,
    *,
    repair_torn: bool = False,
    open_file: LedgerOpener = OsLedgerFile.open,
    handle_signals: bool = False,
    owner_uid: int | None = None,
    read_grants: GrantsReader = read_grants_bytes,
    grants_watcher: type[GrantsWatcher] = GrantsWatcher,
    execute: Executor = runner.execute,
    raise_state: StateRaiser = state_files.raise_state,
    to_thread: ToThread = WORKER_THREAD,
    cgroups: Callable[[str], CgroupTree | NoCgroups] = find_cgroups,
    gateway: McpGateway | None = None,
    host: Host = REAL_HOST,
    on_checkpoint: CheckpointHook | None = None,
    witness_client: WitnessClient | None = None,
    task_status: trio.TaskStatus[Broker] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run brokerd on ``home`` until :meth:`Broker.request_stop` (or a signal, with
    ``handle_signals``). Startup problems raise before ``started()``: ConfigError,
    HomeError, LedgerTorn, ListenerError.

    ``open_file`` opens the ledger's file layer (tests inject one that fails);
    ``owner_uid`` is who may use admin.sock and broker.sock (default: our own uid);
    ``read_grants`` reads grants.toml's bytes (tests inject one that fails). A workspace
    found to reach the home while serving stops brokerd, which then raises ConfigError.
    The seams tests pass their own of: ``grants_watcher`` (a slow one), ``execute`` (a
    slow run), ``raise_state`` (a state that cannot be raised) and ``to_thread`` (every
    blocking step run inline, so the autojump clock stays exact; :mod:`boxmaker.runtime.threads`)
    and ``cgroups`` (what bounds each sandbox, made for the boot: cgroups.py).
    ``gateway`` is the MCP servers' port (broker/mcp_port.py; default: none).
    ``host`` is what the egress proxy asks of the machine (a test's resolver).
    ``on_checkpoint(note, size)`` is called after each checkpoint is stored.
    ``witness_client`` is the HTTP client the witnesses are reached with (a test's mock
    transport; default: one of brokerd's own).
    """
    prepared = await to_thread(
        functools.partial(
            _prepare, home, repair_torn=repair_torn, open_file=open_file, to_thread=to_thread
        )
    )
    boot = new_boot_id()
    witnesses = _witness_sender(home, prepared, witness_client)
    if witnesses is not None:
        on_checkpoint = _both(on_checkpoint, witnesses.checkpointed)
    checkpointer = _checkpointer(home, prepared, boot, to_thread, on_checkpoint)
    writer = LedgerWriter(
        prepared.file,
        prepared.tail,
        to_thread=to_thread,
        checkpointer=checkpointer,
        end=prepared.end,
        # Sealed at a checkpoint only: without the key the live file grows on.
        sealer=None
        if checkpointer is None
        else Sealer(home.ledger_dir, prepared.config.ledger.segment_records),
        live_first=prepared.live_first,
    )
    listeners: list[UnixListener] = []
    try:
        for path in (home.broker_sock, home.admin_sock):
            listeners.append(await open_unix_listener(path, to_thread=to_thread))
    except BaseException:
        for listener in listeners:
            await listener.listener.aclose()
            listener.remove_path()
        await writer.aclose()
        raise
    bounds = SandboxBounds(await to_thread(cgroups, boot))
    # Once per start: what bounds the shell's sandbox (bxctl status shows it too).
    log.log(
        logging.INFO if bounds.bounded and bounds.refusal is None else logging.WARNING,
        "sandbox bounds: %s",
        bounds.describe(),
    )
    policy = PolicyRecorder(writer, boot, policies_dir(home.audit_log), to_thread=to_thread)
    broker = Broker(
        home=home,
        config=prepared.config,
        writer=writer,
        boot=boot,
        version=__version__,
        owner_uid=os.getuid() if owner_uid is None else owner_uid,
        grants=grants_watcher(
            home.grants_toml,
            read=read_grants,
            guard=prepared.guard,
            policy=policy,
            to_thread=to_thread,
        ),
        guard=prepared.guard,
        calls=set(prepared.open_calls),
        execute=execute,
        raise_state=raise_state,
        to_thread=to_thread,
        sandboxes=SandboxPool(bounds, run_dir=home.run_dir),
        gateway=gateway or EmptyGateway(),
        host=host,
        witnesses=witnesses,
    )
    if gateway is None:
        broker.gateway = _gateway(broker, prepared, bounds)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            if witnesses is not None:
                await nursery.start(witnesses.run)
            if not await broker.record(Start(boot=broker.boot, version=broker.version)):
                log.error("the start record could not be written; every call will be denied")
            if prepared.repaired is not None:
                await broker.record(prepared.repaired)
            # The first policy record of the boot, before any call can be decided.
            await broker.grants.current()
            nursery.start_soon(_watch_grants, broker)
            nursery.start_soon(_stop_when_refused, broker)
            await nursery.start(broker.sandboxes.run)
            await nursery.start(broker.notifier.run)
            if handle_signals:
                nursery.start_soon(_signals, broker)
            async with trio.open_nursery() as servers:
                await servers.start(broker.gateway.run)
                await _serve_connections(broker, listeners[0], listeners[1], task_status)
                # The MCP servers stop with the calls, before the sandboxes' cgroups go.
                servers.cancel_scope.cancel()
            if not await broker.record(Stop(boot=broker.boot)):
                log.error("the stop record could not be written")
            await writer.aclose()
            log.info("brokerd stopped (boot %s, head %s)", broker.boot, writer.head)
            nursery.cancel_scope.cancel()
    finally:
        for listener in listeners:
            listener.remove_path()
    if broker.guard.refusal is not None:
        raise ConfigError([f"{home.config_toml.name}: workspace: {broker.guard.refusal}"])


def _witness_sender(
    home: Home, prepared: _Prepared, client: WitnessClient | None
) -> WitnessSender | None:
    """The ``[[witness]]`` tables' sender (broker/witnesses.py), when there are some and
    checkpoints are signed this boot."""
    config = prepared.config
    if not config.witness or prepared.signed is None:
        return None
    signer, _ = prepared.signed
    return WitnessSender(
        config.witness,
        tree_dir(home),
        signer.verifier,
        client=client,
        max_lag=config.ledger.witness_max_lag,
        start_size=prepared.tail.next_seq,
    )


def _both(first: CheckpointHook | None, second: CheckpointHook) -> CheckpointHook:
    if first is None:
        return second

    def hook(note: bytes, size: int) -> None:
        try:
            first(note, size)
        finally:
            second(note, size)

    return hook


def _checkpointer(
    home: Home,
    prepared: _Prepared,
    boot: str,
    to_thread: ToThread,
    on_checkpoint: CheckpointHook | None,
) -> Checkpointer | None:
    if prepared.signed is None:
        return None
    signer, tree = prepared.signed
    return Checkpointer(
        tree,
        signer,
        boot=boot,
        open_calls=OpenCalls(boot, unfinished=prepared.open_calls),
        directory=tree_dir(home),
        every=prepared.config.ledger.checkpoint_every,
        seconds=prepared.config.ledger.checkpoint_seconds,
        on_checkpoint=on_checkpoint,
        to_thread=to_thread,
    )


async def _serve_connections(
    broker: Broker,
    broker_listener: UnixListener,
    admin_listener: UnixListener,
    task_status: trio.TaskStatus[Broker],
) -> None:
    """Accept until a stop is requested, then shut down cleanly (see the module docstring)."""
    async with trio.open_nursery() as calls:
        async with trio.open_nursery() as admins:
            async with trio.open_nursery() as accept:
                await accept.start(
                    serve_capped,
                    broker_listener.listener,
                    functools.partial(handle_broker_connection, broker),
                    calls,
                    broker.capacity,
                )
                await accept.start(
                    functools.partial(
                        trio.serve_listeners,
                        functools.partial(handle_admin_connection, broker),
                        [admin_listener.listener],
                        handler_nursery=admins,
                    )
                )
                log.info(
                    "brokerd %s serving %s and %s (boot %s)",
                    broker.version,
                    broker_listener.path,
                    admin_listener.path,
                    broker.boot,
                )
                log.info("brokerd limits: %s", broker.capacity.limits.describe())
                task_status.started(broker)
                await broker.wait_stop_requested()
                log.info("stopping: no new connections")
                accept.cancel_scope.cancel()
            # The accept loops closed the listeners; remove the paths at once, so a client
            # sees "not running" rather than a socket nobody accepts on.
            broker_listener.remove_path()
            admin_listener.remove_path()
            withdrawn = broker.withdraw_all()
            log.info("stopping: %d pending approvals withdrawn", withdrawn)
            # An admin client mid-approve already handed its command over; the call's
            # task records it. Idle admin connections have nothing to finish.
            admins.cancel_scope.cancel()
        calls.cancel_scope.deadline = trio.current_time() + GRACE_S


async def _watch_grants(broker: Broker) -> None:
    while True:
        await trio.sleep(GRANTS_POLL_S)
        await broker.guard.look()
        await broker.grants.current()


async def _stop_when_refused(broker: Broker) -> None:
    """The workspace came to reach the home (HomeGuard): a clean stop, then exit 2."""
    await broker.guard.refused.wait()
    broker.request_stop()


async def _signals(broker: Broker) -> None:
    # Each SIGHUP's re-read is a task of its own: however long a read takes, the loop
    # goes on receiving, so SIGINT/SIGTERM are always served.
    async with trio.open_nursery() as reloads:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as received:
            async for signum in received:
                if signum == signal.SIGHUP:
                    log.info("SIGHUP: re-reading grants.toml and config.toml")
                    reloads.start_soon(_reload, broker)
                else:
                    log.info("%s: stopping", signal.Signals(signum).name)
                    broker.request_stop()


async def _reload(broker: Broker) -> None:
    await broker.guard.look()
    await broker.grants.current(force=True)
    broker.config = await reread_config(
        broker.home, broker.config, concern=CONFIG_CONCERN, live=LIVE_KEYS, log=log
    )


# ---------------------------------------------------------------------------------------
# The command line

app = App(
    name="brokerd",
    help="The boxmaker broker: decides, asks, runs and records tool calls.",
    version=__version__,
)


@app.command
def serve(
    *,
    home: Annotated[str | None, Parameter(help="The boxmaker home.")] = None,
    repair: Annotated[
        bool,
        Parameter(negative="", help="Move a torn ledger tail aside (docs/runbook.md#ledger-torn)."),
    ] = False,
    run_broker: Annotated[Callable[..., Awaitable[None]], Parameter(parse=False)] = serve_broker,
) -> int:
    """Serve broker.sock and admin.sock until SIGINT/SIGTERM (exit 0).

    Exit 2: config.toml has a problem. Exit 1: the ledger is torn or its files do not
    fit together, the ledger key, the
    home or a socket path cannot be used, or brokerd failed.
    """
    # run_broker is no option (parse=False): a test passes its own through
    # app.parse_args to see what the command runs.
    setup_logging("brokerd")
    _raise_fd_limit()
    return run_daemon(
        "brokerd",
        functools.partial(run_broker, resolve_home(home), repair_torn=repair, handle_signals=True),
        failures=(LedgerTorn, SegmentProblem, LedgerKeyError, HomeError, ListenerError),
    )


def _raise_fd_limit() -> None:
    """Each pending call holds one open connection: raise the soft fd limit to the hard
    one, so brokerd can hold as many as the system lets it, and log the limit."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard != resource.RLIM_INFINITY and soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    except (OSError, ValueError) as exc:
        log.warning("could not raise the open file limit: %s", exc)
        return
    log.info("open file limit: %s", "unlimited" if soft == resource.RLIM_INFINITY else soft)


def main() -> None:
    """Console entry point (``brokerd``): the command's return value is the exit code."""
    app()


if __name__ == "__main__":
    main()
