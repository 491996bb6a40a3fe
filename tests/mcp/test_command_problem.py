"""What stops an MCP server's program from starting in its sandbox is said by name
(mcp/gateway_launch.py ``command_problem``): without it the server only exits 127 with an
empty log (tried as a new user would, with a server imported from a Claude file)."""

from __future__ import annotations

from pathlib import Path

from boxmaker.home.mcp_config import McpServerConfig
from boxmaker.mcp.gateway_launch import command_problem

SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"


def _script(path: Path, first_line: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{first_line}\nexit 0\n")
    path.chmod(0o755)
    return path


def test_a_program_on_the_sandboxs_path_starts() -> None:
    assert command_problem(McpServerConfig(command="sh"), "") is None
    assert command_problem(McpServerConfig(command="/bin/sh"), "") is None


def test_a_bare_name_found_nowhere_is_said() -> None:
    problem = command_problem(McpServerConfig(command="no-such-mcp-server"), "")
    assert problem == f"command 'no-such-mcp-server' is not on the sandbox's PATH ({SANDBOX_PATH})"


def test_a_bare_name_on_the_owners_path_is_named_with_where_it_is(tmp_path: Path) -> None:
    program = _script(tmp_path / "venv" / "bin" / "my-mcp", "#!/bin/sh")
    problem = command_problem(McpServerConfig(command="my-mcp"), str(program.parent))
    assert problem == (
        f"command 'my-mcp' is not on the sandbox's PATH ({SANDBOX_PATH}): it is {program} on "
        "your PATH; give that as command, and the directory it is installed in as "
        "read_only_paths"
    )


def test_a_program_the_sandbox_does_not_show_is_refused_until_its_directory_is(
    tmp_path: Path,
) -> None:
    program = _script(tmp_path / "tools" / "my-mcp", "#!/bin/sh")
    problem = command_problem(McpServerConfig(command=str(program)), "")
    assert problem == (
        f"command {program}: the sandbox does not show it; add the directory it is "
        "installed in to read_only_paths"
    )
    shown = McpServerConfig(command=str(program), read_only_paths=(str(program.parent),))
    assert command_problem(shown, "") is None


def test_a_missing_program_is_said(tmp_path: Path) -> None:
    missing = tmp_path / "gone"
    assert command_problem(McpServerConfig(command=str(missing)), "") == (
        f"command {missing}: no such program"
    )


def test_a_scripts_interpreter_and_the_real_one_it_links_to_must_both_be_shown(
    tmp_path: Path,
) -> None:
    real = _script(tmp_path / "base" / "bin" / "python3", "#!/bin/sh")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(real)
    program = _script(venv / "bin" / "my-mcp", f"#!{venv}/bin/python -I")
    only_venv = McpServerConfig(command=str(program), read_only_paths=(str(venv),))
    assert command_problem(only_venv, "") == (
        f"command {program} is a script run by {venv}/bin/python ({real}), which the "
        f"sandbox does not show; add {tmp_path / 'base'} (the interpreter's installation) "
        "to read_only_paths, or run a system interpreter (docs/mcp.md)"
    )
    both = McpServerConfig(
        command=str(program), read_only_paths=(str(venv), str(tmp_path / "base"))
    )
    assert command_problem(both, "") is None


def test_a_script_run_by_a_system_interpreter_needs_nothing_more(tmp_path: Path) -> None:
    program = _script(tmp_path / "srv" / "server", "#!/usr/bin/env python3")
    shown = McpServerConfig(command=str(program), read_only_paths=(str(program.parent),))
    assert command_problem(shown, "") is None
