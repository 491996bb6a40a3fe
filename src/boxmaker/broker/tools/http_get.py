"""The ``http_get`` tool (docs/protocol.md; docs/decisions.md, "The runner and the
sandbox"; docs/egress.md).

No redirect is followed (a 3xx is ``tool_error`` naming the Location,
so the next URL goes through decide() again); a status of 400 or more is
``tool_error``; the body is capped after content decoding (no zip bombs); proxies and
.netrc from brokerd's environment are ignored. The host and port are checked against
the grant's ``hosts`` again right before connecting; then the host is resolved once,
every address it resolves to is checked (:func:`boxmaker.core.hosts.address_problem`:
loopback, private, link-local and other special addresses only where the grant names
them), and the connection goes to a checked address (the next one in the resolver's
order when one does not connect), with the URL's host in the Host header and as the
TLS server name: no second lookup, so no DNS rebinding in between.
A refused address is ``tool_error`` with a detail pointing at the runbook.

httpx is imported by the first ``http_get``, not at start (~8 MB of resident memory
brokerd needs only where http_get is granted).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import trio

from boxmaker.broker.run_spec import RunResult, RunSpec, ToolFailed, describe_error
from boxmaker.broker.tools.host import Host, is_address
from boxmaker.core.catalogue import MAX_BYTES, HttpGetArgs
from boxmaker.core.hosts import address_problem, host_rules
from boxmaker.core.reasons import Reason

if TYPE_CHECKING:
    import httpx

RUNBOOK_HTTP_GET: Final = "docs/runbook.md#http-get"


async def http_get(spec: RunSpec, args: HttpGetArgs, machine: Host) -> RunResult:
    # Imported on the first http_get, not at start: httpx (with ssl and its transport
    # stack) is ~8 MB of brokerd's resident memory, paid only where http_get is used.
    import httpx

    host = spec.arguments.host
    destination = spec.arguments.destination
    rules = host_rules(spec.network)
    url = httpx.URL(args.url)
    # Fail closed on the run path too: the host and port must be the grant's, and httpx
    # must read the URL's host the way the check did.
    if (
        host is None
        or destination is None
        or not any(rule.allows(destination) for rule in rules)
        or url.host != host
    ):
        detail = f"host {host!r} is not allowed by grant {spec.grant}"
        return RunResult.failure(Reason.TOOL_ERROR, detail, spec.label)
    body = b""
    encoding = "utf-8"
    with trio.move_on_after(machine.http_timeout) as scope:
        try:
            addresses = await machine.resolve(destination.host, destination.port)
        except OSError as exc:
            detail = f"{destination.host}: the name does not resolve ({describe_error(exc)})"
            raise ToolFailed(Reason.TOOL_ERROR, detail) from None
        problem = address_problem(rules, destination, addresses)
        if problem is not None or not addresses:
            problem = problem or f"{destination.host}: the name resolves to no address"
            raise ToolFailed(Reason.TOOL_ERROR, f"{problem}; see {RUNBOOK_HTTP_GET}")
        # The checked address, never the name again: the URL carries the address, the
        # Host header and the TLS server name (certificate check included) the name.
        headers = {"Host": url.netloc.decode("ascii")}
        extensions = {} if is_address(host) else {"sni_hostname": url.host}
        try:
            async with httpx.AsyncClient(
                follow_redirects=False, trust_env=False, timeout=machine.http_timeout
            ) as client:
                # In the resolver's order; the next address only when one does not connect
                # (all of them were checked above).
                for index, address in enumerate(addresses):
                    target = url.copy_with(host=address)
                    try:
                        body, encoding = await _fetch(client, target, headers, extensions, args.url)
                        break
                    except httpx.ConnectError:
                        if index == len(addresses) - 1:
                            raise
        except httpx.HTTPError as exc:
            raise ToolFailed(Reason.TOOL_ERROR, f"{type(exc).__name__}: {exc}"[:500]) from None
    if scope.cancelled_caught:
        detail = f"{args.url}: no complete answer within {machine.http_timeout:g} s"
        return RunResult.failure(Reason.TIMEOUT, detail, spec.label)
    try:
        text = body.decode(encoding, errors="replace")
    except LookupError:
        text = body.decode("utf-8", errors="replace")
    return RunResult.success(text, spec.label)


async def _fetch(
    client: httpx.AsyncClient,
    target: httpx.URL,
    headers: dict[str, str],
    extensions: dict[str, str],
    url: str,
) -> tuple[bytes, str]:
    """GET ``target`` (``url`` with a checked address for its host) once: the body (at
    most 1 MiB) and its encoding, or ToolFailed for a redirect, an error status or a body
    too large."""
    body = bytearray()
    async with client.stream("GET", target, headers=headers, extensions=extensions) as response:
        if response.is_redirect:
            location = response.headers.get("location", "")[:500]
            detail = (
                f"HTTP {response.status_code}: redirect to {location} "
                "(not followed; ask for that URL)"
            )
            raise ToolFailed(Reason.TOOL_ERROR, detail)
        if response.status_code >= 400:
            detail = f"HTTP {response.status_code} {response.reason_phrase}"
            raise ToolFailed(Reason.TOOL_ERROR, detail)
        over = False
        # Stopping by cancellation, not by leaving the loop: the exception then
        # unwinds httpx's chain of async generators instead of abandoning them.
        with trio.CancelScope() as reading:
            async for chunk in response.aiter_bytes():
                if over:
                    continue
                body += chunk
                if len(body) > MAX_BYTES:
                    over = True
                    reading.cancel()
        if over:
            raise ToolFailed(Reason.TOO_LARGE, f"{url}: over {MAX_BYTES} bytes")
        return bytes(body), response.encoding or "utf-8"
