"""``bxctl mcp pin`` on a real terminal (a tmux pane), as the owner sees it: each
definition shown escaped (a hostile server's terminal escapes neither clear the screen
nor retitle the window), then the question; keys typed while the server was starting —
before the definition could be read — never answer it; ``y`` typed after it pins, and
anything else pins nothing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.harness.mcp_servers import echo_definition, fake_server, server_toml
from tests.harness.sandbox import sandbox_workspace, use_sandbox_workspace
from tests.harness.screen import bxctl_argv, terminal

from boxmaker.home.paths import Home
from boxmaker.mcp.pins import Pin, read_pins

pytestmark = pytest.mark.slow

HOSTILE = "Echo \x1b[2J\x1b]0;owned\x07the text back."
QUESTION = "pin these 1 change(s) of fake? [y/N] "


@pytest.fixture
def pin_home(home: Home) -> Iterator[Home]:
    with sandbox_workspace() as workspace:
        use_sandbox_workspace(home, workspace)
        definition = workspace.parent / "definition" / "echo.txt"
        definition.parent.mkdir()
        definition.write_text(HOSTILE + "\n")
        with home.config_toml.open("a") as file:
            file.write("\n" + server_toml("fake", fake_server(definition)))
        yield home


def asking(text: str) -> bool:
    return text.rstrip().endswith(QUESTION.rstrip())


async def test_pin_shows_the_definition_escaped_and_takes_only_an_answer_typed_after_it(
    pin_home: Home,
) -> None:
    argv = bxctl_argv("mcp", "pin", "fake", "echo", "--home", str(pin_home.root))
    async with terminal(argv) as screen:
        # Typed at once, while the server starts in its sandbox: dropped, not an answer.
        await screen.type("y")
        await screen.send("Enter")
        shown = await screen.wait_for(asking)
        assert not pin_home.mcp_pins.exists()
        assert "not pinned: mcp.fake.echo" in shown
        assert '"description": "Echo \\u001b[2J\\u001b]0;owned\\u0007the text back."' in shown
        assert await screen.title() != "owned"
        await screen.type("y")
        await screen.send("Enter")
        assert await screen.exit_code() == 0
    assert read_pins(pin_home.mcp_pins) == {"fake": {"echo": Pin.of(echo_definition(HOSTILE))}}


async def test_pin_pins_nothing_unless_the_answer_is_yes(pin_home: Home) -> None:
    argv = bxctl_argv("mcp", "pin", "fake", "echo", "--home", str(pin_home.root))
    async with terminal(argv) as screen:
        await screen.wait_for(asking)
        await screen.send("Enter")
        assert await screen.exit_code() == 1
        assert "nothing pinned" in await screen.text()
    assert not pin_home.mcp_pins.exists()
