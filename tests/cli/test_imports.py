"""What bxctl loads of brokerd: only what the two share (the decision now, the look
before an ask, whether the shell's sandbox can run: bubblewrap's version, the sandbox's
user), none of brokerd's run machinery (the runner, the
sandbox, its state). Checked in a fresh interpreter, on what is really loaded
(docs/decisions.md, "Rules in core, one decision now")."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import orjson

LOADED = textwrap.dedent(
    """
    import importlib, pkgutil, sys
    import orjson
    import {package}
    for module in pkgutil.iter_modules({package}.__path__):
        importlib.import_module(f"{package}.{{module.name}}")
    loaded = sorted(name for name in sys.modules if name.startswith("boxmaker.broker"))
    sys.stdout.buffer.write(orjson.dumps(loaded))
    """
)


def broker_modules_loaded(package: str) -> list[str]:
    """The modules of boxmaker.broker loaded once every module of ``package`` is."""
    done = subprocess.run(
        [sys.executable, "-c", LOADED.format(package=package)],
        capture_output=True,
        check=True,
        timeout=60,
    )
    return list(orjson.loads(done.stdout))


def test_bxctl_loads_none_of_brokerds_run_machinery() -> None:
    assert broker_modules_loaded("boxmaker.cli") == [
        "boxmaker.broker",
        "boxmaker.broker.bwrap_version",
        "boxmaker.broker.decide_now",
        "boxmaker.broker.sandbox_check",
        "boxmaker.broker.sandbox_plan",
        "boxmaker.broker.workspace_paths",
    ]


def test_the_check_sees_what_brokerd_loads() -> None:
    """The control: the same look at brokerd's own modules finds the runner."""
    loaded = broker_modules_loaded("boxmaker.broker")
    assert "boxmaker.broker.runner" in loaded
    assert "boxmaker.broker.decide_now" in loaded
