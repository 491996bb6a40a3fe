"""What a decision becomes before the owner is asked, given what was found on disk. Pure.

An ask the owner approves must be able to run: one that could only fail once approved
is denied at its decision, on the grant it matched, and the owner is never asked.
Two asks need a look first:

- a ``write_file`` into a directory that does not exist (write_file creates no
  directory): denied ``not_found``, naming the first missing directory
  (docs/protocol.md, ``not_found``);
- a ``shell`` call whose sandbox cannot run here (no usable bubblewrap, one too old,
  a sandbox user that cannot reach the workspace): denied ``sandbox_unavailable`` with
  the finding's words, which name the runbook entry (docs/runbook.md#sandbox).

:func:`path_to_look` and :func:`needs_sandbox` say which look a verdict needs, the
caller looks (the I/O: :func:`boxmaker.broker.workspace_paths.missing_directory`,
:func:`boxmaker.broker.sandbox_check.sandbox_problem`), and :func:`before_asking` says
what the verdict becomes. brokerd and ``bxctl grants test`` take the step in the same
function (:func:`boxmaker.broker.decide_now.decide_now`).
"""

from __future__ import annotations

from boxmaker.core.decide import Ask, Verdict
from boxmaker.core.reasons import Reason


def path_to_look(verdict: Verdict) -> str | None:
    """The path whose directories must exist before the owner is asked about
    ``verdict``: a write_file ask's. None when no look is needed: a write that runs at
    once fails ``not_found`` by itself, a denial is answered as it is, and no other
    tool's ask needs a directory to exist."""
    if isinstance(verdict, Ask) and verdict.decision.tool == "write_file":
        return str(verdict.decision.arguments["path"])
    return None


def needs_sandbox(verdict: Verdict) -> bool:
    """Whether the owner may be asked about ``verdict`` only once the shell's sandbox is
    known to run: a shell ask. A shell call that runs at once fails
    ``sandbox_unavailable`` by itself, with the same words."""
    return isinstance(verdict, Ask) and verdict.decision.tool == "shell"


def before_asking(
    verdict: Verdict, missing_directory: str | None, sandbox_problem: str | None = None
) -> Verdict:
    """``verdict`` once the looks found ``missing_directory``, the first directory of a
    write's path that does not exist (None: they all exist, or the path could not be
    looked at and the write itself fails with its own reason), and ``sandbox_problem``,
    why the shell's sandbox cannot run (None: it can). A write_file ask with a missing
    directory is denied ``not_found``, a shell ask whose sandbox cannot run
    ``sandbox_unavailable``, each on the grant it matched and the state it was decided
    on (:meth:`~boxmaker.core.decide.Ask.cannot_run`,
    :meth:`~boxmaker.core.decide.Ask.denied`); every other verdict stays as it is."""
    if missing_directory is not None and path_to_look(verdict) is not None:
        assert isinstance(verdict, Ask)  # path_to_look names only asks
        return verdict.cannot_run(missing_directory)
    if sandbox_problem is not None and needs_sandbox(verdict):
        assert isinstance(verdict, Ask)  # needs_sandbox names only asks
        return verdict.denied(Reason.SANDBOX_UNAVAILABLE, sandbox_problem)
    return verdict
