"""Which calls may use the network, and the ``connect`` request of one tunnel. Pure.

A call's sandbox gets a way out (one proxy socket of its own, docs/egress.md) only when
some ``connect`` grant could allow one of its tunnels: :func:`network_grants` is not
empty. Each tunnel is then a call of its own, of the internal tool ``connect``
(:func:`connect_request`), decided against the same grants like any tool call. A call
with no network grant gets the sandbox without a socket at all.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from boxmaker.core.grants import CONNECT, Grant, GrantSet, Mode
from boxmaker.core.vocabulary import ToolRequest


def network_grants(
    grants: GrantSet, tool: str, command: str | None, now: dt.datetime
) -> tuple[Grant, ...]:
    """The unexpired connect grants, ``deny`` ones left out, whose ``via`` names ``tool``
    (exactly or by family) and whose ``commands`` (when they have any) match ``command``:
    the grants that could let a tunnel of this call out. Computed when the call runs,
    with the grants current then; ``now`` is an aware datetime.

    >>> from boxmaker.core.grant_parse import parse_grants
    >>> grants = parse_grants('''
    ... [[grant]]
    ... id = "pypi"
    ... tool = "connect"
    ... mode = "auto"
    ... hosts = ["pypi.org"]
    ... via = ["shell"]
    ... commands = ["pip install *"]
    ... ''')
    >>> now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    >>> [g.id for g in network_grants(grants, "shell", "pip install attrs", now)]
    ['pypi']
    >>> network_grants(grants, "shell", "curl evil.example", now)
    ()
    """
    found = []
    for grant in grants.for_tool(CONNECT):
        if grant.mode is Mode.DENY or grant.expired(now) or not grant.serves(tool):
            continue
        if not grant.covers_command(command):
            continue
        found.append(grant)
    return tuple(found)


def connect_request(
    *,
    call: str,
    session: str,
    via: str,
    via_tool: str,
    via_command: str | None,
    host: str,
    port: int,
    scheme: str = "https",
) -> ToolRequest:
    """The ``connect`` request of one tunnel of the call ``via`` (its tool ``via_tool``,
    its command ``via_command`` for a shell call) to ``host``:``port``; decided with
    ``evaluate(..., internal=True)``.

    >>> request = connect_request(
    ...     call="c-00000000000000a1", session="s-000000000001", via="c-00000000000000a0",
    ...     via_tool="shell", via_command="pip install attrs", host="pypi.org", port=443)
    >>> request.tool, request.arguments["host"], request.arguments["scheme"]
    ('connect', 'pypi.org', 'https')
    """
    arguments: dict[str, Any] = {
        "host": host,
        "port": port,
        "scheme": scheme,
        "via": via,
        "via_tool": via_tool,
    }
    if via_command is not None:
        arguments["via_command"] = via_command
    return ToolRequest(call=call, session=session, tool=CONNECT, arguments=arguments)
