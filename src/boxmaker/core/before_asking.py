"""What a decision becomes before the owner is asked, given what was found on disk. Pure.

A ``write_file`` on an ``ask`` grant into a directory that does not exist could only
fail once approved (write_file creates no directory), so it is denied ``not_found`` at
its decision, naming the first missing directory, and the owner is never asked
(docs/protocol.md, ``not_found``). Only such an ask needs a look: :func:`path_to_look`
names the path whose directories must exist, the caller looks (the I/O:
:func:`boxmaker.broker.workspace_paths.missing_directory`), and :func:`before_asking`
says what the verdict becomes. brokerd and ``bxctl grants test`` take the step in the
same function (:func:`boxmaker.broker.decide_now.decide_now`).
"""

from __future__ import annotations

from boxmaker.core.decide import Ask, Verdict


def path_to_look(verdict: Verdict) -> str | None:
    """The path whose directories must exist before the owner is asked about
    ``verdict``: a write_file ask's. None when no look is needed: a write that runs at
    once fails ``not_found`` by itself, a denial is answered as it is, and no other
    tool's ask needs a directory to exist."""
    if isinstance(verdict, Ask) and verdict.decision.tool == "write_file":
        return str(verdict.decision.arguments["path"])
    return None


def before_asking(verdict: Verdict, missing_directory: str | None) -> Verdict:
    """``verdict`` once the look at its path found ``missing_directory``, the first
    directory of the path that does not exist (None: they all exist, or the path could
    not be looked at and the write itself fails with its own reason). A write_file ask
    with a missing directory is denied ``not_found`` on the grant it matched and the
    state it was decided on (:meth:`~boxmaker.core.decide.Ask.cannot_run`); every other
    verdict stays as it is."""
    if missing_directory is not None and path_to_look(verdict) is not None:
        assert isinstance(verdict, Ask)  # path_to_look names only asks
        return verdict.cannot_run(missing_directory)
    return verdict
