"""bxctl, the owner's CLI (README.md lists its commands). One sub-app per noun."""

from __future__ import annotations

import os
import sys
from typing import Final, Literal, TextIO, cast

from cyclopts import App
from rich.console import Console

from boxmaker import __version__
from boxmaker.cli.audit import audit_app
from boxmaker.cli.audit_proofs import check_proof_command, consistency, prove
from boxmaker.cli.chat import chat
from boxmaker.cli.common import Exit
from boxmaker.cli.daemons import down, reload, restart, up
from boxmaker.cli.demo import demo
from boxmaker.cli.grants import grants_app
from boxmaker.cli.init import init
from boxmaker.cli.logs import logs
from boxmaker.cli.mcp import mcp_app
from boxmaker.cli.owner import approvals, approve, refuse, status
from boxmaker.cli.runbook import runbook
from boxmaker.cli.sessions import sessions
from boxmaker.cli.why import why
from boxmaker.cli.witness import witness_app
from boxmaker.formats.printable import PrintableStream

app = App(
    name="bxctl",
    help="The owner's CLI for boxmaker: chat, grants, approvals and the audit ledger.",
    version=__version__,
    backend="trio",
)
app.command(init)
app.command(grants_app)
app.command(audit_app)
# The proofs for outsiders live in their own module, which builds on audit's.
audit_app.command(prove)
audit_app.command(check_proof_command, name="check-proof")
audit_app.command(consistency)
app.command(mcp_app)
app.command(witness_app)
for command in (demo, up, down, restart, reload, logs, chat, approvals, approve, refuse, why):
    app.command(command)
app.command(status)
app.command(sessions)
app.command(runbook)


@app.command
def completion(shell: Literal["bash", "zsh", "fish"] = "bash", /) -> Exit:
    """Print bxctl's shell completion script (cyclopts writes it), to install as your
    shell loads such scripts, e.g. for bash:
    bxctl completion bash > ~/.local/share/bash-completion/completions/bxctl

    Parameters
    ----------
    shell
        The shell the script is for.
    """
    print(app.generate_completion(prog_name="bxctl", shell=shell), end="")
    return Exit.DONE


BROKEN_PIPE: Final = 141
"""What a shell reports for a program killed by SIGPIPE (128 + 13), as ``cat`` is."""


def main() -> None:
    """Console entry point: a command's return value is the exit code (README.md
    lists them).

    Everything the commands print passes through ``printable``: what the model chose
    cannot drive the owner's terminal. Only cyclopts' help and usage errors, which hold
    no outside text, go to the terminal as they are (with their colours).

    A reader that stops early (``bxctl audit show | head``) ends the command quietly
    with exit 141, as it ends ``cat``: the output was not all delivered."""
    terminal = sys.stdout
    console, error_console = Console(file=terminal), Console(file=sys.stderr, stderr=True)
    sys.stdout = cast(TextIO, PrintableStream(terminal))
    sys.stderr = cast(TextIO, PrintableStream(sys.stderr))
    try:
        code = app(console=console, error_console=error_console, result_action="return_value")
        sys.stdout.flush()
    except BrokenPipeError:
        # Python flushes stdout once more at exit: let that go nowhere, not to stderr.
        os.dup2(os.open(os.devnull, os.O_WRONLY), terminal.fileno())
        sys.exit(BROKEN_PIPE)
    sys.exit(int(code or 0))


if __name__ == "__main__":
    main()
