"""RunSpecs for the runner's tests, made as brokerd makes them: a real verdict
(:func:`boxmaker.core.decide.evaluate` on parsed grants) and
:meth:`~boxmaker.broker.run_spec.RunSpec.for_verdict`."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any, Final

from boxmaker.broker.run_spec import RunSpec
from boxmaker.core.decide import Ask, Run, Verdict, evaluate
from boxmaker.core.grant_parse import parse_grants
from boxmaker.core.grants import GrantSet
from boxmaker.core.labels import FRESH, LabelRules
from boxmaker.core.vocabulary import ToolRequest
from boxmaker.home.config import RunnerConfig

NOW: Final = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)
GRANTS_TEXT = """
[[grant]]
id = "read"
tool = "read_file"
mode = "auto"

[[grant]]
id = "list"
tool = "list_dir"
mode = "auto"

[[grant]]
id = "write"
tool = "write_file"
mode = "auto"

[[grant]]
id = "sh"
tool = "shell"
mode = "auto"

[[grant]]
id = "sh-secret"
tool = "shell"
mode = "auto"
commands = ["cat secrets/*"]
label_taint = "secret"

[[grant]]
id = "web"
tool = "http_get"
mode = "auto"
hosts = ["127.0.0.1"]
"""


def grant_set(text: str) -> GrantSet:
    grants = parse_grants(text)
    assert isinstance(grants, GrantSet), grants
    return grants


GRANTS: Final = grant_set(GRANTS_TEXT)


def verdict_for(
    tool: str, arguments: dict[str, Any], workspace: Path, grants: GrantSet = GRANTS
) -> Verdict:
    """core's verdict on one call, on a fresh session at :data:`NOW`."""
    return evaluate(
        ToolRequest(
            call="c-0123456789abcdef", session="s-0123456789ab", tool=tool, arguments=arguments
        ),
        ledger_usable=True,
        grants=grants,
        state=FRESH,
        now=NOW,
        workspace=str(workspace),
    )


def spec_for_verdict(
    verdict: Verdict, workspace: Path, *, config: RunnerConfig | None = None, approved: bool = False
) -> RunSpec:
    """``RunSpec.for_verdict`` with the runner's defaults."""
    assert isinstance(verdict, Run | Ask), verdict.decision
    return RunSpec.for_verdict(
        verdict,
        workspace=workspace,
        runner=config or RunnerConfig(),
        labels=LabelRules(),
        approved=approved,
    )


def spec_for(
    tool: str,
    arguments: dict[str, Any],
    workspace: Path,
    *,
    config: RunnerConfig | None = None,
    grants: GrantSet = GRANTS,
) -> RunSpec:
    """The RunSpec of a call the grants let run at once (verdict ``run``)."""
    verdict = verdict_for(tool, arguments, workspace, grants)
    assert isinstance(verdict, Run), verdict.decision
    return spec_for_verdict(verdict, workspace, config=config)
