"""What runs for one decided call (:class:`RunSpec`), and how its run ended
(:class:`RunResult`; docs/protocol.md).

Nothing runs without a RunSpec, and a RunSpec is made only by :meth:`RunSpec.for_verdict`
from a verdict core made (:func:`boxmaker.core.decide.evaluate`), ``run`` or ``ask``
that the owner approved: it carries the grant that matched and the arguments core
checked. A RunSpec's private token stops accidental construction, not a determined
caller (``attrs.evolve`` copies it): Python has no private constructors.

A shell call's sandbox is chosen here, from ``[runner]`` (:func:`_launch`) and the
finding of :mod:`boxmaker.broker.sandbox_check` (the one the look before a shell ask
takes): a missing or too old bwrap, or a sandbox that may not run as things are, is a
detail for ``sandbox_unavailable`` (docs/decisions.md, "The runner and the sandbox").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Final, cast

import attrs

from boxmaker.broker.sandbox import STDERR_TAIL
from boxmaker.broker.sandbox_check import find_sandbox
from boxmaker.broker.sandbox_plan import (
    PROXY_ENV,
    SANDBOX_ENV,
    Launch,
    SandboxLimits,
    sandbox_argv,
)
from boxmaker.core.catalogue import (
    MAX_BYTES,
    CheckedArguments,
    HttpGetArgs,
    ShellArgs,
    ToolName,
    result_label,
)
from boxmaker.core.decide import Ask, Run
from boxmaker.core.grants import Grant
from boxmaker.core.labels import Label, LabelRules
from boxmaker.core.reasons import Reason
from boxmaker.home.config import RunnerConfig

HTTP_TIMEOUT: Final = 10.0
"""Seconds for a whole http_get: connect, headers and body."""


@attrs.frozen
class RunResult:
    """How a run ended: ``ok`` with content, or failed with a reason."""

    ok: bool
    reason: Reason | None
    """None when ok; else tool_error, timeout, not_found, too_large, path_escape or
    sandbox_unavailable."""
    detail: str | None
    content: str
    """What the model is given on success; "" on failure."""
    label: Label
    """The result's label; a failure carries the label of what it touched."""

    @classmethod
    def success(cls, content: str, label: Label) -> RunResult:
        return cls(True, None, None, content, label)

    @classmethod
    def failure(cls, reason: Reason, detail: str, label: Label) -> RunResult:
        return cls(False, reason, detail, "", label)


class ToolFailed(Exception):
    """A tool failure with its reason code, raised inside a tool (in a worker thread for
    the file tools); :func:`boxmaker.broker.runner.execute` answers it as a RunResult."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def describe_error(exc: BaseException) -> str:
    """An exception as a failure's detail: an OSError's own words, else its type and text."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return f"{type(exc).__name__}: {exc}"[:STDERR_TAIL]


def sandbox_limits(runner: RunnerConfig) -> SandboxLimits:
    """The sandbox limits of `[runner]` (a shell call's, and an MCP server's)."""
    cpu_time = runner.cpu_time_limit
    return SandboxLimits(
        memory=runner.memory_limit_mib << 20,
        processes=runner.process_limit,
        file_size=runner.file_size_limit_mib << 20,
        cpu_time=cpu_time if cpu_time is not None else math.ceil(runner.shell_timeout),
    )


def _launch(workspace: Path, runner: RunnerConfig) -> Launch | str:
    """The sandbox of a shell call in ``workspace``, or why there can be none (the
    same finding as the look before a shell ask: sandbox_check.py)."""
    found = find_sandbox(workspace, runner.sandbox_uid)
    if isinstance(found, str):
        return found
    limits = sandbox_limits(runner)
    return Launch(sandbox_argv(found.bwrap, workspace, limits), found.user, limits)


_FOR_VERDICT: Final = object()


def _only_for_verdict(instance: object, attribute: object, value: object) -> None:
    if value is not _FOR_VERDICT:
        raise TypeError("a RunSpec is made only by RunSpec.for_verdict")


@attrs.frozen
class RunSpec:
    """What runs for one decided call; made only by :meth:`for_verdict`."""

    _call: str
    _arguments: CheckedArguments
    _workspace: Path
    _rules: LabelRules
    _label: Label
    _time_limit: float | None
    _output_cap: int
    _sandbox: Launch | str | None
    """shell: how its sandbox starts, or why it cannot (a detail for
    sandbox_unavailable); None for the other tools."""
    _hosts: tuple[str, ...]
    _grant: str | None
    _bounds: Grant
    """The decision's grant: its ``paths`` and ``hard_links`` bound the file opened."""
    _token: object = attrs.field(validator=_only_for_verdict, repr=False)
    egress_dir: Path | None = None
    """shell: the call's egress directory, with brokerd's proxy socket in it, when the
    call may use the network (brokerd sets it once the socket listens:
    ``attrs.evolve(spec, egress_dir=...)``); its sandbox then has a way out
    (:func:`~boxmaker.broker.sandbox_plan.egress_launch`). None: no network at all."""

    @classmethod
    def for_verdict(
        cls,
        verdict: Run | Ask,
        *,
        workspace: Path,
        runner: RunnerConfig,
        labels: LabelRules,
        approved: bool = False,
    ) -> RunSpec:
        """The RunSpec of a ``run`` verdict, or of an ``ask`` one the owner approved,
        built from the verdict alone: it carries the grant that matched and the
        arguments decide() checked, so nothing is looked up or checked a second time.
        Raises ValueError for an ask not approved."""
        if isinstance(verdict, Ask) and not approved:
            raise ValueError(
                f"call {verdict.decision.call}: an ask decision runs only once approved"
            )
        if not isinstance(verdict, Run | Ask):
            raise ValueError(f"call {verdict.decision.call}: only a run or ask verdict runs")  # noqa: TRY004
        call = verdict.decision.call
        return cls._build(call, verdict.checked, verdict.grant, workspace, runner, labels)

    @classmethod
    def _build(
        cls,
        call: str,
        checked: CheckedArguments,
        grant: Grant,
        workspace: Path,
        runner: RunnerConfig,
        labels: LabelRules,
    ) -> RunSpec:
        if checked.external is not None:
            raise ValueError(f"call {call}: {checked.tool} runs through the gateway")
        if grant.tool != checked.tool:
            raise ValueError(f"call {call}: grant {grant.id} is not for {checked.tool}")
        label = result_label(checked, labels, grant.label_taint)
        value = checked.value
        time_limit: float | None = None
        output_cap = MAX_BYTES
        sandbox: Launch | str | None = None
        if isinstance(value, ShellArgs):
            time_limit = runner.shell_timeout
            output_cap = runner.output_cap
            sandbox = _launch(workspace, runner)
        elif isinstance(value, HttpGetArgs):
            time_limit = HTTP_TIMEOUT
        return cls(
            call,
            checked,
            workspace,
            labels,
            label,
            time_limit,
            output_cap,
            sandbox,
            grant.hosts,
            grant.id,
            grant,
            _FOR_VERDICT,
        )

    @property
    def call(self) -> str:
        return self._call

    @property
    def tool(self) -> ToolName:
        # Only a built-in tool's call has a RunSpec (:meth:`_build` refuses the others).
        return cast(ToolName, self._arguments.tool)

    @property
    def arguments(self) -> CheckedArguments:
        return self._arguments

    @property
    def workspace(self) -> Path:
        return self._workspace

    @property
    def label(self) -> Label:
        """The result's label as decided; a file tool may raise it by the real path."""
        return self._label

    @property
    def time_limit(self) -> float | None:
        """Seconds: shell's RunnerConfig.shell_timeout, http_get's 10; file tools None."""
        return self._time_limit

    @property
    def output_cap(self) -> int:
        """Bytes of output kept: shell's RunnerConfig.output_cap, else 1 MiB."""
        return self._output_cap

    @property
    def sandbox(self) -> Launch | str | None:
        """shell: how its sandbox starts (:class:`~boxmaker.broker.sandbox_plan.Launch`), or
        why it cannot (str). None for the other tools."""
        return self._sandbox

    @property
    def argv(self) -> tuple[str, ...] | None:
        """shell: the bwrap command line (mounts, env and limits included; the sandbox
        adds only its descriptors) of a call without a way out; one with
        :attr:`egress_dir` runs :func:`~boxmaker.broker.sandbox_plan.egress_launch` of it.
        None for the other tools, and when it cannot run."""
        return self._sandbox.argv if isinstance(self._sandbox, Launch) else None

    @property
    def env(self) -> Mapping[str, str]:
        """The whole environment of a shell command (``--clearenv``), the proxy's
        variables included when it has a way out; empty for the other tools."""
        if self.tool != "shell":
            return {}
        return SANDBOX_ENV if self.egress_dir is None else {**SANDBOX_ENV, **PROXY_ENV}

    @property
    def network(self) -> tuple[str, ...]:
        """Hosts the call may reach: the grant's for http_get, none for every other tool."""
        return self._hosts if self.tool == "http_get" else ()

    @property
    def grant(self) -> str | None:
        return self._grant

    @property
    def bounds(self) -> Grant:
        """The decision's grant: its ``paths`` and ``hard_links`` bound the file opened."""
        return self._bounds

    @property
    def rules(self) -> LabelRules:
        """The ``[labels]`` rules the result's label was decided by (a file tool raises it
        by the real path opened)."""
        return self._rules
