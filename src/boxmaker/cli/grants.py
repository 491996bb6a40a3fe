"""``bxctl grants``: check grants.toml (docs/runbook.md#grants)."""

from __future__ import annotations

from cyclopts import App

from boxmaker.cli.common import DEFAULT, Common, Exit, print_json
from boxmaker.cli.what_if import what_if
from boxmaker.core.grants import GrantsProblem
from boxmaker.grants_file import load_grants
from boxmaker.printable import printable

grants_app = App(name="grants", help="The owner's grants (grants.toml).")
grants_app.command(what_if)


@grants_app.command
def check(*, common: Common = DEFAULT) -> Exit:
    """Validate grants.toml; on a problem, name the file, the grant id and the key.

    Exit 0 when valid, 1 when invalid (brokerd then denies every call grants_invalid).
    """
    path = common.resolve().grants_toml
    result = load_grants(path)
    if isinstance(result, GrantsProblem):
        if common.json:
            print_json(
                {
                    "valid": False,
                    "file": result.file,
                    "grant": result.grant_id,
                    "key": result.key,
                    "problem": result.message,
                }
            )
        else:
            print(printable(f"invalid: {result.detail()}"))
        return Exit.FAILED
    if common.json:
        print_json(
            {
                "valid": True,
                "file": str(path),
                "grants": [{"id": g.id, "tool": g.tool, "mode": g.mode} for g in result.grants],
            }
        )
    else:
        print(printable(f"{path}: valid, {len(result.grants)} grant(s)"))
        for grant in result.grants:
            print(printable(f"  {grant.id}: {grant.tool} {grant.mode}"))
    return Exit.DONE
