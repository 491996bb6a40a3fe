"""``bxctl grants revoke``: remove one grant from grants.toml the careful way
(:mod:`boxmaker.home.grants_edit`), then have a running brokerd decide without it at once."""

from __future__ import annotations

import trio

from boxmaker.cli.admin_client import DaemonUnreachable, ask_broker
from boxmaker.cli.common import DEFAULT, Common, Exit, fail, print_json
from boxmaker.formats.printable import printable
from boxmaker.home.grants_edit import GrantsEditError, remove_grant
from boxmaker.wire import ErrorFrame, GrantsReloaded, ReloadGrantsRequest


async def revoke(grant: str, /, *, common: Common = DEFAULT) -> Exit:
    """Remove one grant from grants.toml (its comments elsewhere stay), and have
    brokerd, if it runs, decide without it from the next call (docs/runbook.md#grants-edit).

    Parameters
    ----------
    grant
        The grant's id, as grants.toml and `bxctl grants check` show it.
    """
    home = common.resolve()
    try:
        removed = await trio.to_thread.run_sync(remove_grant, home.grants_toml, grant)
    except GrantsEditError as exc:
        return fail(str(exc))
    try:
        answer = await ask_broker(home, ReloadGrantsRequest())
    except DaemonUnreachable:
        answer = None
    if isinstance(answer, GrantsReloaded):
        if answer.valid:
            broker = f"brokerd decides with {answer.grants} grant(s) from now"
        else:
            broker = f"brokerd finds grants.toml invalid: {answer.problem}"
    elif isinstance(answer, ErrorFrame):
        broker = f"brokerd could not re-read grants.toml ({answer.code}: {answer.detail})"
    else:
        broker = "brokerd is not running; it reads grants.toml when it starts"
    if common.json:
        print_json(
            {
                "revoked": removed.id,
                "tool": removed.tool,
                "mode": removed.mode,
                "brokerd": None if not isinstance(answer, GrantsReloaded) else answer.grants,
                "brokerd_problem": answer.problem if isinstance(answer, GrantsReloaded) else None,
            }
        )
    else:
        print(printable(f"revoked grant {removed.id} ({removed.tool} {removed.mode}); {broker}"))
    return Exit.DONE
