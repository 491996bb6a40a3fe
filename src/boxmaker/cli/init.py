"""``bxctl init``: create the home (docs/runbook.md#config)."""

from __future__ import annotations

from boxmaker.cli.common import DEFAULT, Common, Exit, fail, print_json
from boxmaker.home.config import ConfigError, load_config
from boxmaker.home.paths import HomeError
from boxmaker.ledger.writer import LedgerTorn, open_ledger


def init(*, common: Common = DEFAULT) -> Exit:
    """Create the home: directories 0700, a default config.toml, an empty grants.toml,
    and the ledger with its genesis record.

    Existing files are never overwritten; running it again only tightens modes.
    """
    home = common.resolve()
    try:
        home.create()
        written = home.write_defaults()
        config = load_config(home)
        config.workspace.mkdir(mode=0o700, parents=True, exist_ok=True)
        tail = open_ledger(home.audit_log)
    except (HomeError, LedgerTorn) as exc:
        return fail(str(exc))
    except ConfigError as exc:
        return fail(f"{exc}; see docs/runbook.md#config")
    except OSError as exc:
        return fail(f"{exc.filename}: {exc.strerror}")
    if common.json:
        print_json(
            {
                "home": str(home.root),
                "written": [str(path) for path in written],
                "workspace": str(config.workspace),
                "ledger": str(home.audit_log),
                "head": tail.head,
            }
        )
    else:
        print(f"home: {home.root}")
        for path in written:
            print(f"wrote {path}")
        print(f"workspace: {config.workspace}")
        print(f"ledger: {home.audit_log} (head {tail.head})")
        print("next: add grants to grants.toml, then `bxctl grants check`")
    return Exit.DONE
