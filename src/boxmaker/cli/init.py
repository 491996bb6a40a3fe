"""``bxctl init``: create the home (docs/runbook.md#config), and with ``--workspace`` a
workspace the shell's sandbox can use (docs/runbook.md#sandbox-as-root)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

import orjson

from boxmaker.broker.sandbox_check import sandbox_problem
from boxmaker.cli.common import DEFAULT, Common, Exit, fail, print_json
from boxmaker.home.config import Config, ConfigError, load_config
from boxmaker.home.paths import Home, HomeError
from boxmaker.ledger.ledger_key import LedgerKeyError, create_ledger_key, read_ledger_origin
from boxmaker.ledger.live_file import LedgerTorn, open_ledger
from boxmaker.ledger.records import BadRecord

SANDBOX_OWNER: Final = 65534
"""Whom ``init --workspace`` gives a new workspace to when it runs as root and
``[runner] sandbox_uid`` is not set: ``nobody``, the one ordinary uid every system has
(docs/decisions.md, "A workspace the sandbox can use")."""


def init(*, workspace: Path | None = None, common: Common = DEFAULT) -> Exit:
    """Create the home: directories 0700, a default config.toml, an empty grants.toml,
    the ledger with its genesis record, and the ledger's signing key (keys/, never
    replaced; docs/runbook.md#ledger-key); then say whether the shell tool can run in
    the workspace.

    Existing files are never overwritten; running it again only tightens modes.

    Parameters
    ----------
    workspace
        The directory the tools work in, written into a new config.toml (an existing
        one must already name it). Created when missing (0700). As root, a new or empty
        one is given to the sandbox's uid ([runner] sandbox_uid, else 65534, nobody),
        since the sandbox never runs as root; an existing one with files is left as it
        is, and init says what to run. Exit 1 when the shell cannot run there.
    """
    home = common.resolve()
    # abspath, not resolve(): the path as typed, made absolute, as config.toml keeps it.
    chosen = None if workspace is None else Path(os.path.abspath(workspace))  # noqa: PTH100
    try:
        home.create()
        written = home.write_defaults(workspace=_toml_string(chosen))
        config = load_config(home)
        if chosen is not None and config.workspace != chosen:
            return fail(
                f"{home.config_toml} names the workspace {config.workspace}; to use {chosen}, "
                f"set `workspace = {_toml_string(chosen)}` there and run init again; "
                "see docs/runbook.md#config",
                Exit.USAGE,
            )
        given = _make_workspace(config, for_sandbox=chosen is not None)
        tail = open_ledger(home.audit_log)
        key_created = create_ledger_key(home, read_ledger_origin(home.audit_log))
    except (HomeError, LedgerTorn, LedgerKeyError) as exc:
        return fail(str(exc))
    except BadRecord as exc:
        return fail(f"{home.audit_log}: {exc}; see docs/runbook.md#ledger-key")
    except ConfigError as exc:
        return fail(f"{exc}; see docs/runbook.md#config")
    except OSError as exc:
        return fail(f"{exc.filename}: {exc.strerror}")
    shell = sandbox_problem(config.workspace, config.runner.sandbox_uid)
    fix = _what_to_run(config) if shell is not None and chosen is not None else None
    if common.json:
        print_json(
            {
                "home": str(home.root),
                "written": [str(path) for path in written],
                "workspace": str(config.workspace),
                "workspace_owner": given,
                "shell_ready": shell is None,
                "shell_problem": shell,
                "run": fix,
                "ledger": str(home.audit_log),
                "head": tail.head,
                "ledger_key": str(home.ledger_key),
                "ledger_key_created": key_created,
                "ledger_vkey": str(home.ledger_vkey),
            }
        )
    else:
        _say(home, config, written, given, tail.head)
        made = "made" if key_created else "kept"
        print(f"ledger key: {home.ledger_key} ({made}); its public key: {home.ledger_vkey}")
        if shell is not None:
            fail(f"warning: the shell tool cannot run in this workspace: {shell}")
            if fix is not None:
                fail(f"to give it to the sandbox's uid, run: {fix}")
            elif chosen is None:
                fail(
                    "`bxctl init --workspace DIR` sets up a workspace it can use; "
                    "see docs/runbook.md#sandbox-as-root"
                )
        print("next: add grants to grants.toml, then `bxctl grants check`")
    return Exit.FAILED if shell is not None and chosen is not None else Exit.DONE


def _say(home: Home, config: Config, written: list[Path], given: int | None, head: str) -> None:
    print(f"home: {home.root}")
    for path in written:
        print(f"wrote {path}")
    owner = "" if given is None else f" (given to uid {given}, the sandbox's)"
    print(f"workspace: {config.workspace}{owner}")
    print(f"ledger: {home.audit_log} (head {head})")


def _toml_string(path: Path | None) -> str | None:
    # A JSON string is a TOML basic string: the same escapes.
    return None if path is None else orjson.dumps(str(path)).decode()


def _sandbox_owner(config: Config) -> int:
    return config.runner.sandbox_uid or SANDBOX_OWNER


def _make_workspace(config: Config, *, for_sandbox: bool) -> int | None:
    """Create the workspace when missing; with ``for_sandbox`` as root, give a new or
    empty one that belongs to root to the sandbox's uid (the uid it returns). A
    workspace with files is never taken from its owner here (:func:`_what_to_run`),
    nor is a directory above it opened up."""
    workspace = config.workspace
    try:
        workspace.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        fresh = False
    else:
        fresh = True
    if not for_sandbox or os.geteuid() != 0:
        return None
    if not fresh and (workspace.stat().st_uid != 0 or any(workspace.iterdir())):
        return None
    uid = _sandbox_owner(config)
    os.chown(workspace, uid, uid, follow_symlinks=False)
    return uid


def _what_to_run(config: Config) -> str | None:
    """The command that gives a workspace of root's, with files in it, to the sandbox's
    uid; None when that is not what stops the shell (a directory above it, bwrap)."""
    workspace = config.workspace
    if os.geteuid() != 0:
        return None
    try:
        owner = workspace.stat().st_uid
    except OSError:
        return None
    if owner != 0:
        return None
    uid = _sandbox_owner(config)
    return f"chown -R {uid}:{uid} {workspace}"
