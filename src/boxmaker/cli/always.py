"""``a`` (approve always) at an approval prompt — the chat's and ``bxctl approvals
--watch``'s: the grant it would write, shown before anything is sent, and the owner's
confirmation of exactly that grant.

The grant shown is built by the code brokerd writes it with
(:func:`boxmaker.core.grant_scope.always_grant`), from the inputs brokerd uses: brokerd's
own view of the call (its ``approvals`` entry, whose arguments are the checked ones),
the grant in grants.toml that asked, the workspace's real path; and it is shown as
:func:`boxmaker.home.grants_edit.grant_text` writes it. Only its note is left out: it names
the time of writing. What the grant lets run is said in words from the same checked
arguments.

The confirmation is the word :data:`CONFIRM_WORD` and Enter, typed at a prompt that
settles first (:meth:`~boxmaker.cli.terminal.OwnerTerminal.line`): a word cannot come
from a single key pressed out of habit, and nothing typed before the grant was on the
screen reaches it (docs/decisions.md).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import attrs
import trio

from boxmaker.cli.terminal import OwnerTerminal
from boxmaker.core.catalogue import FILE_TOOLS, CheckedArguments, ConnectArgs, connect_target
from boxmaker.core.external_tools import assumed_catalogue
from boxmaker.core.grant_scope import Scope, ScopeProblem, always_grant, asked
from boxmaker.core.hosts import DEFAULT_PORTS
from boxmaker.formats.clock import local_time, utc_now
from boxmaker.formats.printable import printable
from boxmaker.home.config import ConfigError, load_config
from boxmaker.home.grants_edit import grant_text, owner_name
from boxmaker.home.grants_file import read_grants
from boxmaker.home.paths import Home, HomeError
from boxmaker.wire import ApprovalView

CONFIRM_WORD: Final = "always"
CONFIRM_PROMPT: Final = f"type {CONFIRM_WORD} and Enter to write it (anything else goes back): "
CONFIRM_LIMIT: Final = 40
"""The longest line the confirmation prompt takes: room for a wrong answer, no more."""
NOT_CONFIRMED: Final = "not confirmed: no grant written; the call still waits"
NO_GRANT: Final = "no grant can be written for this call: {problem}"


@attrs.frozen
class AlwaysGrant:
    """The grant ``a`` would write: its keys, in the order written, and the call's checked
    arguments it was built from."""

    fields: dict[str, Any]
    arguments: CheckedArguments

    def runs(self) -> str:
        """What the grant lets run without asking, in words.

        >>> from boxmaker.core.catalogue import check_arguments
        >>> shell = check_arguments("shell", {"command": "ls *.txt"})
        >>> AlwaysGrant({"commands": ["ls [*].txt"]}, shell).runs()
        'shell with exactly the command line: ls *.txt'
        >>> get = check_arguments("http_get", {"url": "https://example.org/a"})
        >>> AlwaysGrant({"hosts": ["example.org"]}, get).runs()
        "http_get of any URL of the host example.org on its scheme's own port (80, 443)"
        """
        tool, arguments = self.arguments.tool, self.arguments
        if arguments.external is not None:
            return f"{tool} with exactly these arguments and no other: {arguments.subject()}"
        if tool in FILE_TOOLS:
            return f"{tool} of exactly the path: {arguments.paths[0]}"
        if tool == "shell":
            return f"shell with exactly the command line: {arguments.command}"
        if isinstance(arguments.value, ConnectArgs):
            return self._connects(arguments.value)
        destination = arguments.destination
        assert destination is not None
        port = (
            "its scheme's own port (80, 443)"
            if destination.port == DEFAULT_PORTS[destination.scheme]
            else f"port {destination.port}"
        )
        return f"http_get of any URL of the host {destination.host} on {port}"

    def _connects(self, value: ConnectArgs) -> str:
        """A connect grant's reach in words.

        >>> from boxmaker.core.catalogue import check_arguments
        >>> raw = {"host": "pypi.org", "port": 443, "via": "c-00000000000000a0",
        ...        "via_tool": "shell", "via_command": "pip install attrs"}
        >>> net = check_arguments("connect", raw, internal=True)
        >>> AlwaysGrant({"via": ["shell"], "commands": ["pip *"]}, net).runs()
        'connect to pypi.org:443 from any shell call whose command matches pip *'
        """
        whose = f"any {value.via_tool} call"
        commands = self.fields.get("commands")
        if commands:
            whose += f" whose command matches {', '.join(commands)}"
        plain = " (plain HTTP)" if value.scheme == "http" else ""
        return f"connect to {connect_target(value)}{plain} from {whose}"

    def lines(self) -> list[str]:
        """The confirmation's text, each line escaped."""
        fields = {key: value for key, value in self.fields.items() if key != "note"}
        expires = self.fields.get("expires")
        until = (
            "no expiry"
            if expires is None
            else f"until {local_time(expires, utc_now())} (the asking grant's own expiry)"
        )
        untrusted = self.fields["if_untrusted"]
        lines = [
            f"  always: this grant is added to grants.toml ({until}):",
            *(f"    {line}" for line in grant_text(fields).splitlines()),
            "    (and a note: who approved it, when, for which approval and call)",
            f"  from now on it runs, without asking: {self.runs()}",
            f"  (an untrusted session is {'denied' if untrusted == 'deny' else 'still asked'})",
        ]
        return [printable(line) for line in lines]


def always_grant_for(home: Home, entry: ApprovalView) -> AlwaysGrant | ScopeProblem:
    """The grant ``a`` on ``entry`` would make brokerd write (exact, no ``--for``), or why
    there is none. Reads config.toml and grants.toml: run it in a worker thread."""
    try:
        config = load_config(home)
    except (ConfigError, HomeError) as exc:
        return ScopeProblem(f"{exc}; see docs/runbook.md#config")
    # The workspace's real path, as brokerd resolves it at start (broker/serve.py).
    workspace = str(Path(os.path.realpath(config.workspace)))
    found = asked(
        read_grants(home.grants_toml).value,
        grant=entry.grant.id,
        tool=entry.tool,
        arguments=entry.arguments,
        workspace=workspace,
        # bxctl cannot ask brokerd's gateway: brokerd checks the tool again when it writes.
        external=assumed_catalogue(entry.tool),
    )
    if isinstance(found, ScopeProblem):
        return found
    checked = found.arguments
    fields = always_grant(
        approval=entry.approval,
        call=entry.call,
        arguments=checked,
        asking=found.asking,
        scope=Scope.EXACT,
        lasting=None,
        owner=owner_name(os.getuid()),
        now=utc_now(),
    )
    if isinstance(fields, ScopeProblem):
        return fields
    return AlwaysGrant(fields, checked)


async def confirm_always(
    terminal: OwnerTerminal, home: Home, entry: ApprovalView | None, show: Callable[[str], None]
) -> bool:
    """``a`` pressed on ``entry`` (inside ``terminal.keys()``): the grant it would write
    (or why there is none) given to ``show``, then the confirmation's question. Did the
    owner type :data:`CONFIRM_WORD`? Escape, Enter alone or any other text is no, and
    ``show`` hears so."""
    grant = (
        ScopeProblem("brokerd's view of the call cannot be had")
        if entry is None
        else await trio.to_thread.run_sync(always_grant_for, home, entry)
    )
    if isinstance(grant, ScopeProblem):
        show(printable("  " + NO_GRANT.format(problem=grant.message)))
        return False
    show("\n".join(grant.lines()))
    answer = await terminal.line(CONFIRM_PROMPT, limit=CONFIRM_LIMIT)
    if answer is not None and answer.strip() == CONFIRM_WORD:
        return True
    show("  " + NOT_CONFIRMED)
    return False
