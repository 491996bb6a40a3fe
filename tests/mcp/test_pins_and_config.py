"""The pieces of the gateway that need no server: ``[mcp_servers]`` parsed and placed
(home/mcp_config.py), the pins file read and written (mcp/pins.py), the bind mounts of a
server's paths (mcp/gateway_launch.py), the log's rotation, and what a result gives the
model (mcp/gateway.py)."""

from __future__ import annotations

import stat
from pathlib import Path

import mcp_types as types
import orjson
import pytest

from boxmaker.broker.serve import CONFIG_CONCERN, LIVE_KEYS
from boxmaker.core.external_tools import definition_hash
from boxmaker.core.labels import Label, Taint
from boxmaker.home.config import ConfigError, parse_config, workspace_problem
from boxmaker.home.mcp_config import McpServerConfig
from boxmaker.home.paths import Home
from boxmaker.home.reload import reload_config
from boxmaker.mcp.gateway import backoff, result_text
from boxmaker.mcp.gateway_launch import server_mounts
from boxmaker.mcp.gateway_server import LOG_ROTATE, _open_log, tool_definition
from boxmaker.mcp.pins import (
    Pin,
    PinsError,
    ToolStatus,
    compare,
    read_pins,
    write_pins,
)

HOME = Home(Path("/tmp/bx-config-test"))


def _problems(text: str) -> tuple[str, ...]:
    with pytest.raises(ConfigError) as raised:
        parse_config(text, HOME)
    return raised.value.problems


def test_an_entry_takes_codex_keys_and_boxmakers_with_defaults() -> None:
    config = parse_config(
        '[mcp_servers.git]\ncommand = "uvx"\nargs = ["mcp-server-git"]\n'
        'env = { A = "1" }\nread_only_paths = ["repo"]\nlabel = "secret+untrusted"\n',
        HOME,
    )
    git = config.mcp_servers["git"]
    assert git == McpServerConfig(
        command="uvx",
        args=("mcp-server-git",),
        env={"A": "1"},
        read_only_paths=(str(HOME.default_workspace / "repo"),),
        label="secret+untrusted",
    )
    assert git.result_label == Label(Taint.SECRET, True)
    assert (git.startup_timeout_s, git.call_timeout_s) == (30.0, 60.0)
    assert McpServerConfig(command="x").result_label == Label(Taint.INTERNAL, True)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            "[mcp_servers.git]\nargs = []\n",
            "config.toml: [mcp_servers.git] command: required key missing; "
            "see docs/runbook.md#mcp-servers",
        ),
        (
            '[mcp_servers.git]\ncommand = "bin/x"\n',
            "config.toml: [mcp_servers.git] command: the program is an absolute path or a bare "
            "name looked up on the sandbox's PATH; see docs/runbook.md#mcp-servers",
        ),
        (
            '[mcp_servers.git]\ncommand = "x"\nlabel = "trusted"\n',
            "config.toml: [mcp_servers.git] label: expected one of untrusted, public, internal, "
            "secret, public+untrusted, internal+untrusted, secret+untrusted; "
            "see docs/runbook.md#mcp-servers",
        ),
        (
            '[mcp_servers.git]\ncommand = "x"\ncall_timeout_s = 0\n',
            "config.toml: [mcp_servers.git] call_timeout_s: expected seconds above 0, at most "
            "3600; see docs/runbook.md#mcp-servers",
        ),
        (
            '[mcp_servers.git]\ncommand = "x"\nenv_pass = ["A-B"]\n',
            "config.toml: [mcp_servers.git] env_pass: 'A-B': not an environment variable's "
            "name; see docs/runbook.md#mcp-servers",
        ),
        (
            '[mcp_servers.Git]\ncommand = "x"\n',
            "config.toml: [mcp_servers.Git]: the name must match [a-z0-9][a-z0-9_-]{0,62} (it "
            "becomes the tools' names mcp.Git.TOOL); see docs/runbook.md#mcp-servers",
        ),
        (
            '[mcp_servers.git]\ncommand = "x"\nread_only_paths = ["/tmp"]\n',
            "config.toml: [mcp_servers.git] read_only_paths: /tmp: must not be the home or "
            "contain it; see docs/runbook.md#mcp-servers",
        ),
        (
            '[mcp_servers.git]\ncommand = "x"\nread_only_paths = ["/tmp/bx-config-test/state"]\n',
            "config.toml: [mcp_servers.git] read_only_paths: /tmp/bx-config-test/state: inside "
            "the home, only workspace/ may be used; see docs/runbook.md#mcp-servers",
        ),
        (
            '[mcp_servers.git]\ncommand = "x"\nwritable_paths = ["/srv/data"]\n',
            "config.toml: [mcp_servers.git] writable_paths: /srv/data: outside the workspace "
            "/tmp/bx-config-test/workspace (a path outside it may only be read: "
            "read_only_paths); see docs/runbook.md#mcp-servers",
        ),
    ],
)
def test_a_bad_entry_is_refused_naming_the_key_and_the_runbook(text: str, problem: str) -> None:
    assert _problems(text) == (problem,)


def test_a_link_in_a_path_is_judged_by_where_it_leads_at_the_start(tmp_path: Path) -> None:
    home = Home(tmp_path / "home")
    workspace = tmp_path / "ws"
    (workspace / "data").mkdir(parents=True)
    (workspace / "to-home").symlink_to(home.root)
    home.root.mkdir()

    def mounts(server: McpServerConfig) -> tuple[str, ...] | str:
        return server_mounts(
            server, workspace=workspace, home_problem=lambda p: workspace_problem(home, p)
        )

    inside = str(workspace / "data")
    assert mounts(McpServerConfig(command="x", writable_paths=(inside,))) == (
        "--bind",
        inside,
        inside,
    )
    linked = str(workspace / "to-home")
    assert mounts(McpServerConfig(command="x", read_only_paths=(linked,))) == (
        f"{linked}: must not be the home or contain it"
    )
    missing = str(workspace / "gone")
    assert mounts(McpServerConfig(command="x", read_only_paths=(missing,))) == (
        f"{missing}: no such file or directory"
    )


def test_pins_round_trip_0600_and_a_forged_hash_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "mcp_pins.json"
    echo = {"name": "echo", "description": "Echo.", "inputSchema": {"type": "object"}}
    write_pins(path, {"fake": {"echo": Pin.of(echo)}})
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_pins(path) == {"fake": {"echo": Pin(echo, definition_hash(echo))}}
    raw = orjson.loads(path.read_bytes())
    raw["servers"]["fake"]["echo"]["definition"]["description"] = "Echo, and leak."
    path.write_bytes(orjson.dumps(raw))
    with pytest.raises(PinsError) as raised:
        read_pins(path)
    assert str(raised.value) == (
        f"{path}: fake.echo: its sha256 is not its definition's; see docs/runbook.md#mcp-pin"
    )
    assert read_pins(tmp_path / "none.json") == {}


def test_the_hash_covers_every_part_of_a_definition_and_nothing_else() -> None:
    base = {"name": "t", "description": "d", "inputSchema": {"type": "object"}}
    for key, value in [
        ("title", "T"),
        ("description", "d2"),
        ("inputSchema", {"type": "object", "required": ["x"]}),
        ("outputSchema", {"type": "object"}),
        ("annotations", {"readOnlyHint": True}),
        ("name", "u"),
    ]:
        assert definition_hash({**base, key: value}) != definition_hash(base), key
    assert definition_hash({**base, "_meta": {"x": 1}, "icons": []}) == definition_hash(base)
    assert compare({"t": Pin.of(base)}, {"t": {**base, "title": "T"}}) == {"t": ToolStatus.CHANGED}


def test_a_definition_is_what_the_server_sent() -> None:
    tool = types.Tool(name="t", description="d", input_schema={"type": "object"})
    assert tool_definition(tool) == {
        "name": "t",
        "description": "d",
        "inputSchema": {"type": "object"},
    }


def test_backoff_and_result_text() -> None:
    assert [backoff(n) for n in (1, 2, 6, 7, 30)] == [1.0, 2.0, 32.0, 60.0, 60.0]
    result = types.CallToolResult(
        content=[
            types.TextContent(type="text", text="one"),
            types.ImageContent(type="image", data="aGk=", mime_type="image/png"),
        ]
    )
    assert result_text(result) == "one\n[image content left out]"
    structured = types.CallToolResult(content=[], structured_content={"n": 1})
    assert result_text(structured) == '{"n":1}'
    long = types.CallToolResult(content=[types.TextContent(type="text", text="x" * (2 << 20))])
    assert result_text(long).endswith("\n[output cut at 1048576 bytes]")


def test_a_log_past_its_size_is_moved_aside_at_a_start(tmp_path: Path) -> None:
    log = tmp_path / "mcp-fake.log"
    log.write_bytes(b"x" * (LOG_ROTATE + 1))
    fd = _open_log(log)
    try:
        assert log.read_bytes() == b"[boxmaker: the server starts]\n"
        assert (tmp_path / "mcp-fake.log.1").stat().st_size == LOG_ROTATE + 1
        assert stat.S_IMODE(log.stat().st_mode) == 0o600
    finally:
        import os

        os.close(fd)


def test_a_changed_mcp_servers_table_needs_brokerds_restart() -> None:
    old = parse_config('[mcp_servers.git]\ncommand = "a"\n', HOME)
    new = parse_config('[mcp_servers.git]\ncommand = "b"\n', HOME)
    done = reload_config(old, new, concern=CONFIG_CONCERN, live=LIVE_KEYS)
    assert (done.applied, done.needs_restart) == ((), ("mcp_servers",))
    assert done.config.mcp_servers["git"].command == "a"
