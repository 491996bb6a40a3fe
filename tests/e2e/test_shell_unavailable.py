"""``bxctl up`` and ``bxctl status`` on a home whose shell cannot run: they say so and
why, the daemons real (docs/runbook.md#sandbox-as-root). As root the real case: a
workspace of root's, mode 0700, that the sandbox's ordinary uid cannot enter."""

from __future__ import annotations

import os

import pytest
from tests.harness.cli import bxctl, scripted_home
from tests.harness.sandbox import AS_ROOT, SANDBOX_UID, sandbox_workspace, use_sandbox_workspace

pytestmark = pytest.mark.skipif(not AS_ROOT, reason="the sandbox runs as another uid only as root")


def test_up_and_status_say_the_shell_cannot_run_and_why() -> None:
    runner = f"[runner]\nsandbox_uid = {SANDBOX_UID}\n"
    with scripted_home([], config=runner) as (home, _, _), sandbox_workspace() as workspace:
        os.chown(workspace, 0, 0)
        workspace.chmod(0o700)
        use_sandbox_workspace(home, workspace)
        why = (
            f"the sandbox runs as uid {SANDBOX_UID} (gid {SANDBOX_UID}) and cannot reach the "
            "workspace: the workspace is not searchable by it (mode 0700, owner 0, group 0); "
            f"`bxctl init --workspace {workspace}` gives it to that uid, or use another "
            "workspace; see docs/runbook.md#sandbox-as-root"
        )
        up = bxctl(home, "up")
        assert (
            "bxctl: warning: the shell tool cannot run here, so brokerd denies every shell "
            f"call sandbox_unavailable before anyone is asked: {why}"
        ) in up.stderr.splitlines()
        status = bxctl(home, "status")
        lines = status.stdout.splitlines()
        assert "shell_ready    no" in lines
        assert f"shell_problem  {why}" in lines
        # Once the sandbox's uid owns it, neither says anything of the shell.
        os.chown(workspace, SANDBOX_UID, SANDBOX_UID)
        assert "shell_ready    yes" in bxctl(home, "status").stdout.splitlines()
        assert "shell tool" not in bxctl(home, "up").stderr
