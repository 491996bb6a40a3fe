"""bxctl, the owner's CLI (spec §11). One sub-app per noun."""

from __future__ import annotations

from cyclopts import App

from boxmaker import __version__
from boxmaker.cli.audit import audit_app
from boxmaker.cli.chat import chat
from boxmaker.cli.daemons import down, up
from boxmaker.cli.demo import demo
from boxmaker.cli.grants import grants_app
from boxmaker.cli.init import init
from boxmaker.cli.owner import approvals, approve, refuse, sessions, status

app = App(
    name="bxctl",
    help="The owner's CLI for boxmaker: chat, grants, approvals and the audit ledger.",
    version=__version__,
    backend="trio",
)
app.command(init)
app.command(grants_app)
app.command(audit_app)
for command in (demo, up, down, chat, approvals, approve, refuse, status, sessions):
    app.command(command)


def main() -> None:
    """Console entry point: a command's return value is the exit code (spec §11)."""
    app()


if __name__ == "__main__":
    main()
