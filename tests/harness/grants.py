"""The pure core's values a test starts from, each asserted to be what the test needs:
parsed grants, checked arguments, the fields of an approve-always grant."""

from __future__ import annotations

import datetime as dt
from typing import Any

from boxmaker.core.catalogue import CheckedArguments, check_arguments
from boxmaker.core.grant_parse import parse_grants
from boxmaker.core.grant_scope import Scope, ScopeProblem, always_grant
from boxmaker.core.grants import Grant, GrantSet


def grant_set(text: str) -> GrantSet:
    """``text`` parsed; it must be valid grants."""
    result = parse_grants(text)
    assert isinstance(result, GrantSet), result
    return result


def checked(tool: str, arguments: dict[str, Any]) -> CheckedArguments:
    """``arguments`` checked for ``tool``; they must pass."""
    result = check_arguments(tool, arguments)
    assert isinstance(result, CheckedArguments), result
    return result


def exact_always(
    arguments: CheckedArguments,
    asking: Grant,
    *,
    approval: str,
    call: str,
    owner: str,
    now: dt.datetime,
) -> dict[str, object] | ScopeProblem:
    """What approve-always writes for exactly these arguments, with no end."""
    return always_grant(
        approval=approval,
        call=call,
        arguments=arguments,
        asking=asking,
        scope=Scope.EXACT,
        lasting=None,
        owner=owner,
        now=now,
    )
