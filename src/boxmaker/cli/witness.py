"""``bxctl witness``: the small witness for one owner (docs/operations.md, "A witness
for one owner"): ``init`` makes its key and prints its vkey, ``serve`` answers
add-checkpoint (boxmaker.witness.server)."""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Annotated

from cyclopts import App, Parameter

from boxmaker.cli.common import Exit, fail
from boxmaker.ledger.ledger_key import LedgerKeyError, create_private_key
from boxmaker.runtime.daemon import run_daemon
from boxmaker.witness.server import WitnessSettings, load_signer, serve_witness
from boxmaker.witness.state import WitnessSetupError, log_keys

witness_app = App(
    name="witness",
    help="A C2SP tlog-witness for your ledgers, to run as another user or elsewhere.",
)


@witness_app.command
def init(*, key: Path, name: str) -> Exit:
    """Make the witness's Ed25519 key (PKCS#8 PEM, 0600; an existing key is kept) and
    print its vkey, the line a ``[[witness]]`` table's ``vkey`` takes.

    Parameters
    ----------
    key
        The key file.
    name
        The witness's name, e.g. ``witness.example/alice`` (no spaces, no ``+``).
    """
    try:
        created = create_private_key(key)
        signer = load_signer(key, name)
    except (LedgerKeyError, WitnessSetupError) as exc:
        return fail(str(exc))
    except OSError as exc:
        return fail(f"{key}: {exc.strerror}")
    if not created:
        sys.stderr.write(f"bxctl: {key} exists: its key is kept\n")
    print(signer.cosignature_verifier.vkey)
    return Exit.DONE


@witness_app.command
def serve(
    *,
    listen: str,
    key: Path,
    name: str,
    state: Path,
    log: Annotated[list[str], Parameter(consume_multiple=False)],
) -> int:
    """Answer POST /add-checkpoint on ``--listen`` until SIGINT/SIGTERM (exit 0). The
    key is made on the first run when missing (its vkey is in the first log line).

    Exit 2: an option is wrong. Exit 1: the key or state cannot be used, the address
    cannot be listened on, or the witness failed.

    Parameters
    ----------
    listen
        HOST:PORT to listen on (port 0: any free port; the log line says which).
    key
        The witness's key file.
    name
        The witness's name (as ``init`` was given).
    state
        The state file (origin, size and root per log; written atomically, 0600).
    log
        ORIGIN=VKEY, once per log key served (the ledger's keys/ledger.vkey line).
    """
    try:
        logs = log_keys(log)
    except WitnessSetupError as exc:
        return fail(str(exc), Exit.USAGE)
    try:
        create_private_key(key)
    except OSError as exc:
        return fail(f"{key}: {exc.strerror}")
    settings = WitnessSettings(listen=listen, key=key, name=name, state=state, logs=logs)
    return run_daemon(
        "witness",
        functools.partial(serve_witness, settings, handle_signals=True),
        failures=(WitnessSetupError, LedgerKeyError),
    )
