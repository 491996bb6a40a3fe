"""``bxctl mcp serve`` without the optional extra, and with a broken config: a clear
message and exit 1, before anything is served."""

from __future__ import annotations

import sys

import pytest

from boxmaker.cli.app import app
from boxmaker.home.paths import Home


def test_without_the_sdk_the_serve_says_how_to_install_it(
    home: Home, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # As if the SDK were not installed, whatever this process imported before: `mcp`
    # cannot be imported, and nothing imported from it is left to be found.
    for name in [m for m in sys.modules if m.startswith(("mcp.", "boxmaker.mcp."))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "mcp", None)
    code = app(["mcp", "serve", "--home", str(home.root)], result_action="return_value")
    assert code == 1
    assert capsys.readouterr().err == (
        "bxctl: `bxctl mcp serve` needs the MCP SDK, which is not installed: "
        "pip install 'boxmaker[mcp]' (see docs/runbook.md#mcp-extra)\n"
    )


def test_a_broken_config_is_named_before_serving(
    home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    home.config_toml.write_text("[broker]\npending_timeout = -1\n")
    code = app(["mcp", "serve", "--home", str(home.root)], result_action="return_value")
    assert code == 1
    assert capsys.readouterr().err == (
        "bxctl: config.toml: [broker] pending_timeout: expected a number above 0; "
        "see docs/runbook.md#config\n"
    )
