"""Deciding a tool request: the ordered pipeline and the pure ``decide()``.

:func:`evaluate` is the decision's steps 2-7 in order (docs/architecture.md), each
stopping at the first denial:

2. the ledger is usable (else ``audit_unavailable``; that denial alone is not
   recordable, ``Ruling.recordable`` is False);
3. no witness lags, for a risky call (:func:`risky`), when the owner chose
   ``[ledger] witness_lag = "deny_risky"`` (else ``witness_lagging``);
4. the tool is in the catalogue and its arguments fit (``unknown_tool``,
   ``bad_arguments``);
5. grants.toml is valid (``grants_invalid``) — checked before the state, never after;
6. the session state is readable (``state_unreadable``);
7. :func:`decide`.

Approve's re-decision is the same :func:`evaluate` on the original
:class:`ToolRequest` with the grants and state current at approval time, mapped by
:func:`approval_outcome`: Ask → ``ask``, Run → ``allowed``, Deny → ``denied`` with the
decision's reason.

Every function here is pure and total: no clock (``now`` is an aware datetime), no files.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, TypeAlias, assert_never

import attrs

from boxmaker.core.catalogue import (
    READ_ONLY_TOOLS,
    ArgumentProblem,
    CheckedArguments,
    check_arguments,
)
from boxmaker.core.external_tools import EMPTY_CATALOGUE, ExternalCatalogue
from boxmaker.core.grant_parse import GrantsProblem
from boxmaker.core.grants import Grant, GrantSet, Mode
from boxmaker.core.labels import UNKNOWN, Label
from boxmaker.core.reasons import AUDIT_UNAVAILABLE_DETAIL, Reason
from boxmaker.core.state import RUNBOOK_STATE, StateUnreadable
from boxmaker.core.vocabulary import ApprovalOutcome, ToolRequest, VerdictCode


@attrs.frozen
class CheckedRequest:
    """A tool request past step 4: a known tool, arguments that fit, paths normalized."""

    call: str
    session: str
    arguments: CheckedArguments

    @property
    def tool(self) -> str:
        return self.arguments.tool


@attrs.frozen
class Ruling:
    """What was decided, and on what, and why in words: a verdict's content. Its record
    (the ledger's ``decision``, docs/protocol.md) is made from it
    (:meth:`boxmaker.core.vocabulary.Decision.of`) and keeps all but the words.

    ``arguments`` are the checked, normalized arguments, or the raw ones when the
    denial came before they were checked. ``mode`` is the effective mode (an ``auto``
    grant asked because the session is untrusted has mode ``ask``). ``note`` is the
    grant's note. ``state`` is the state decided on: UNKNOWN (secret, untrusted) when it
    could not be read.
    """

    call: str
    session: str
    tool: str
    arguments: dict[str, Any]
    verdict: VerdictCode
    reason: Reason | None = None
    detail: str | None = None
    grant: str | None = None
    mode: Mode | None = None
    note: str | None = None
    state: Label = UNKNOWN
    recordable: bool = True
    """False only for ``audit_unavailable`` (step 2: it cannot be recorded)."""
    definition: str | None = None
    """An ``mcp.*`` tool's definition hash as decided on (an approval binds it)."""


@attrs.frozen
class Run:
    """Run the call: ``grant`` is the grant that let it, ``checked`` its checked
    arguments, so what runs is built from the verdict alone."""

    decision: Ruling
    grant: Grant
    checked: CheckedArguments


@attrs.frozen
class Ask:
    """Ask the owner; ``grant`` and ``checked`` as for :class:`Run` (an approved ask
    runs on them)."""

    decision: Ruling
    grant: Grant
    checked: CheckedArguments

    def too_many_pending(self, detail: str) -> Deny:
        """This ask, denied ``too_many_pending`` (the pending caps are full): on the
        grant it matched and the state it was decided on."""
        return self.denied(Reason.TOO_MANY_PENDING, detail)

    def cannot_run(self, missing_directory: str) -> Deny:
        """This write_file ask, denied ``not_found`` before the owner is asked: the
        directory it would write in does not exist, so approving it could only fail."""
        path = self.decision.arguments.get("path")
        detail = (
            f"{path}: the directory {missing_directory} does not exist "
            "(write_file does not create directories)"
        )
        return self.denied(Reason.NOT_FOUND, detail)

    def denied(self, reason: Reason, detail: str) -> Deny:
        """This ask, denied ``reason`` on the grant it matched and its state."""
        return Deny(
            attrs.evolve(self.decision, verdict=VerdictCode.DENY, reason=reason, detail=detail)
        )


@attrs.frozen
class Deny:
    decision: Ruling


Verdict: TypeAlias = Run | Ask | Deny


def _deny(
    request: CheckedRequest,
    state: Label,
    reason: Reason,
    detail: str,
    grant: Grant | None = None,
    mode: Mode | None = None,
) -> Deny:
    return Deny(
        Ruling(
            call=request.call,
            session=request.session,
            tool=request.tool,
            arguments=request.arguments.to_json(),
            verdict=VerdictCode.DENY,
            reason=reason,
            detail=detail,
            grant=grant.id if grant else None,
            mode=mode,
            note=grant.note if grant else None,
            state=state,
            definition=request.arguments.definition,
        )
    )


def _pick(request: CheckedRequest, grants: GrantSet, now: dt.datetime) -> Grant | None:
    """Step 7's precedence: deny, then auto with ``wins_over_ask``, then ask, then auto;
    file order within each (:meth:`GrantSet.in_precedence`)."""
    arguments = request.arguments
    for grant in grants.in_precedence(arguments.tool):
        if grant.covers(arguments, now):
            return grant
    return None


def decide(request: CheckedRequest, grants: GrantSet, state: Label, now: dt.datetime) -> Verdict:
    """The heart of the system (step 7): pure, total, deterministic.

    ``now`` must be an aware datetime. Only the grant picked by precedence is held to
    its conditions: when it denies, no lower grant is tried.

    >>> from boxmaker.core.catalogue import check_arguments
    >>> from boxmaker.core.grant_parse import parse_grants
    >>> from boxmaker.core.labels import FRESH
    >>> req = CheckedRequest("c-0", "s-0", check_arguments("read_file", {"path": "notes.txt"}))
    >>> now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    >>> decide(req, GrantSet(), FRESH, now).decision.detail
    'no grant allows read_file on notes.txt'
    >>> grants = parse_grants('[[grant]]\\nid = "r"\\ntool = "read_file"\\nmode = "auto"')
    >>> type(decide(req, grants, FRESH, now)).__name__
    'Run'
    """
    grant = _pick(request, grants, now)
    if grant is None:
        detail = f"no grant allows {request.tool} on {request.arguments.subject()}"
        return _deny(request, state, Reason.NO_GRANT, detail)
    if grant.mode is Mode.DENY:
        detail = f"grant {grant.id} denies {request.tool} on {request.arguments.subject()}"
        return _deny(request, state, Reason.DENIED_BY_GRANT, detail, grant, Mode.DENY)
    if state.taint > grant.max_taint:
        detail = (
            f"the session's taint {state.taint} is above grant {grant.id}'s "
            f"max_taint {grant.max_taint}"
        )
        return _deny(request, state, Reason.TAINT_EXCEEDED, detail, grant, grant.mode)
    mode = grant.mode
    why: str | None = None
    if state.untrusted:
        if grant.if_untrusted is Mode.DENY:
            detail = f"the session is untrusted and grant {grant.id} says if_untrusted = deny"
            return _deny(request, state, Reason.UNTRUSTED, detail, grant, grant.mode)
        if grant.if_untrusted is Mode.ASK and mode is Mode.AUTO:
            mode = Mode.ASK
            why = f"the session is untrusted and grant {grant.id} says if_untrusted = ask"
    decision = Ruling(
        call=request.call,
        session=request.session,
        tool=request.tool,
        arguments=request.arguments.to_json(),
        verdict=VerdictCode.ASK if mode is Mode.ASK else VerdictCode.RUN,
        detail=why,
        grant=grant.id,
        mode=mode,
        note=grant.note,
        state=state,
        definition=request.arguments.definition,
    )
    if mode is Mode.ASK:
        return Ask(decision, grant, request.arguments)
    return Run(decision, grant, request.arguments)


def risky(tool: str) -> bool:
    """Whether a call of ``tool`` could change something or send something out: every
    tool but the read-only built-ins (:data:`~boxmaker.core.catalogue.READ_ONLY_TOOLS`),
    so ``shell``, ``write_file``, ``http_get``, ``connect`` and every ``mcp.*`` and
    ``claude.*`` tool, and any name the catalogue does not know.

    >>> risky("read_file"), risky("list_dir"), risky("write_file"), risky("mcp.git.git_log")
    (False, False, True, True)
    """
    return tool not in READ_ONLY_TOOLS


def evaluate(
    request: ToolRequest,
    *,
    ledger_usable: bool,
    witness_lagging: str | None = None,
    grants: GrantSet | GrantsProblem,
    state: Label | StateUnreadable,
    now: dt.datetime,
    workspace: str | None = None,
    external: ExternalCatalogue = EMPTY_CATALOGUE,
    asked: Ruling | None = None,
    internal: bool = False,
) -> Verdict:
    """Steps 2-7, in order; total (never raises for any request).

    ``witness_lagging`` is why a witness lags (naming it and its lag) when the owner
    chose ``witness_lag = "deny_risky"`` and one lags, else None: a risky call is then
    denied ``witness_lagging`` with it as the detail, on its raw arguments, before the
    catalogue is asked (a witness's lag does not depend on the call).

    ``workspace`` is the absolute workspace root (an absolute path inside it is accepted,
    docs/decisions.md); ``external`` the gateway's catalogue now. The same call with the
    current grants, state and catalogue is approve's re-decision, which passes the ask's
    decision as ``asked``: an external tool whose definition is no longer the one the
    owner was asked about is denied ``tool_changed`` (an approval binds the definition).
    ``internal``: brokerd's own request (a tunnel's ``connect``), never a socket's frame
    (:func:`~boxmaker.core.catalogue.check_arguments`).
    """
    seen = state if isinstance(state, Label) else UNKNOWN

    def early(
        reason: Reason, detail: str, arguments: dict[str, Any], definition: str | None = None
    ) -> Deny:
        return Deny(
            Ruling(
                call=request.call,
                session=request.session,
                tool=request.tool,
                arguments=arguments,
                verdict=VerdictCode.DENY,
                reason=reason,
                detail=detail,
                state=seen,
                recordable=reason is not Reason.AUDIT_UNAVAILABLE,
                definition=definition,
            )
        )

    if not ledger_usable:
        return early(Reason.AUDIT_UNAVAILABLE, AUDIT_UNAVAILABLE_DETAIL, request.arguments)
    if witness_lagging is not None and risky(request.tool):
        return early(Reason.WITNESS_LAGGING, witness_lagging, request.arguments)
    checked = check_arguments(
        request.tool, request.arguments, workspace=workspace, external=external, internal=internal
    )
    if isinstance(checked, ArgumentProblem):
        return early(checked.reason, checked.detail, request.arguments)
    bound = None if asked is None or checked.external is None else asked.definition
    if bound is not None and checked.definition != bound:
        detail = (
            f"{request.tool}: its definition changed since the owner was asked "
            f"(asked about {bound}, now {checked.definition})"
        )
        return early(Reason.TOOL_CHANGED, detail, checked.to_json(), checked.definition)
    if isinstance(grants, GrantsProblem):
        return early(Reason.GRANTS_INVALID, grants.detail(), checked.to_json())
    if isinstance(state, StateUnreadable):
        detail = f"{state.detail}; see {RUNBOOK_STATE}"
        return early(Reason.STATE_UNREADABLE, detail, checked.to_json())
    return decide(CheckedRequest(request.call, request.session, checked), grants, state, now)


def approval_outcome(verdict: Verdict) -> ApprovalOutcome:
    """What approve's re-decision means.

    >>> approval_outcome(Deny(Ruling("c", "s", "shell", {}, VerdictCode.DENY)))
    <ApprovalOutcome.DENIED: 'denied'>
    """
    match verdict:
        case Ask():
            return ApprovalOutcome.ASK
        case Run():
            return ApprovalOutcome.ALLOWED
        case Deny():
            return ApprovalOutcome.DENIED
        case _:
            assert_never(verdict)  # pragma: no mutate - unreachable, mypy checks it
