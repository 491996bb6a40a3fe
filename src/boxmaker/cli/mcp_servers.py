"""``bxctl mcp list``, ``pin``, ``logs`` and ``import``: the owner's MCP servers and the
tool definitions accepted from them (docs/mcp.md, "MCP servers through brokerd").

Everything a server said (names, descriptions, schemas, its log) is shown through
``printable``: a hostile server's terminal escapes are shown as ``\\u001b``, never
obeyed. ``pin`` starts the server itself, in the sandbox brokerd gives it, to see what it
lists now; it shows each definition to accept (a changed one as the difference from its
pin) and asks before writing the pins. The SDK is imported only when a command needs a
server (``pin``): bxctl starts without the ``mcp`` extra.
"""

from __future__ import annotations

import difflib
import os
import sys
from pathlib import Path
from typing import Annotated, Any, Final

import orjson
import trio
from cyclopts import Parameter

from boxmaker.cli.common import DEFAULT, Common, Exit, fail, print_json
from boxmaker.cli.log_tail import read_tail
from boxmaker.cli.terminal import OwnerTerminal, is_interactive
from boxmaker.formats.printable import printable
from boxmaker.home.config import Config, ConfigError, load_config, workspace_problem
from boxmaker.home.mcp_import import McpImportError, add_servers, read_servers
from boxmaker.home.paths import Home
from boxmaker.home.regular_file import read_regular_file
from boxmaker.mcp.pins import Pin, PinsError, ToolStatus, compare, read_pins, write_pins


def _config(home: Home) -> Config | Exit:
    try:
        return load_config(home)
    except ConfigError as exc:
        return fail("\n".join(exc.problems), Exit.USAGE)


def _status(home: Home) -> dict[str, Any]:
    """brokerd's last word on its servers (state/mcp_servers.json), or nothing."""
    try:
        raw = orjson.loads(read_regular_file(home.mcp_status))
    except (OSError, orjson.JSONDecodeError):
        return {}
    servers = raw.get("servers") if isinstance(raw, dict) else None
    return servers if isinstance(servers, dict) else {}


def _first_line(text: object) -> str:
    return str(text or "").strip().split("\n", 1)[0][:100]


def _pretty(definition: object) -> list[str]:
    return (
        orjson.dumps(definition, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
        .decode()
        .split("\n")
    )


def list_(*, common: Common = DEFAULT) -> Exit:
    """List the MCP servers of config.toml: their state as brokerd last saw it, and
    each tool with its state (accepted, not pinned, changed, removed)."""
    home = common.resolve()
    config = _config(home)
    if isinstance(config, Exit):
        return config
    try:
        pins = read_pins(home.mcp_pins)
    except PinsError as exc:
        return fail(str(exc))
    seen = _status(home)
    report: dict[str, Any] = {}
    for name, server in config.mcp_servers.items():
        found = seen.get(name)
        status: dict[str, Any] = found if isinstance(found, dict) else {}
        live_tools = status.get("tools")
        live = (
            {tool: entry["definition"] for tool, entry in live_tools.items()}
            if isinstance(live_tools, dict)
            else None
        )
        pinned = pins.get(name, {})
        tools = {}
        for tool, state in sorted(compare(pinned, live).items()):
            definition = pinned[tool].definition if tool in pinned else (live or {})[tool]
            tools[tool] = {"state": state.value, "description": definition.get("description")}
        report[name] = {
            "command": [server.command, *server.args],
            "state": status.get("state", "not started by brokerd"),
            "failure": status.get("failure"),
            "label": server.label,
            "tools": tools,
        }
    if common.json:
        print_json(report)
        return Exit.DONE
    if not report:
        print("no [mcp_servers] in config.toml (docs/mcp.md)")
    for name, entry in report.items():
        print(printable(f"{name}: {entry['state']}  ({' '.join(entry['command'])})"))
        if entry["failure"]:
            print(printable(f"  last failure: {entry['failure']}"))
        pending = [t for t, e in entry["tools"].items() if e["state"] != ToolStatus.ACCEPTED]
        for tool, tool_entry in entry["tools"].items():
            line = f"  {tool_entry['state']:<10}  {tool}: {_first_line(tool_entry['description'])}"
            print(printable(line))
        if pending:
            print(printable(f"  to review: bxctl mcp pin {name}  ({len(pending)} pending)"))
    return Exit.DONE


def logs(
    server: str,
    /,
    *,
    lines: Annotated[int, Parameter(name=["--lines", "-n"])] = 40,
    common: Common = DEFAULT,
) -> Exit:
    """Show the last lines an MCP server wrote on its stderr (logs/mcp-SERVER.log).

    Parameters
    ----------
    server
        The server's name in config.toml.
    lines
        How many of the last lines to show.
    """
    home = common.resolve()
    try:
        path = home.mcp_log(server)
    except ValueError as exc:
        return fail(str(exc), Exit.USAGE)
    shown = read_tail(path, lines)
    if common.json:
        print_json(shown)
        return Exit.DONE
    if not shown and not path.exists():
        return fail(f"no log for {server!r} yet ({path}): brokerd has not started it")
    for line in shown:
        print(printable(line))
    return Exit.DONE


PIN_ANSWER_LIMIT: Final = 8


async def _confirm(question: str) -> bool:
    """The owner's yes to ``question``. At a terminal the answer is a line typed once the
    question is shown (cli/terminal.py: keys typed while the server started, before the
    definitions could be read, are dropped); from a pipe, its next line."""
    if not is_interactive():
        sys.stdout.write(question)
        sys.stdout.flush()
        answer: str | None = await trio.to_thread.run_sync(sys.stdin.readline)
    else:
        terminal = OwnerTerminal()
        with terminal.keys():
            try:
                answer = await terminal.line(question, limit=PIN_ANSWER_LIMIT)
            except EOFError:
                answer = None
    return answer is not None and answer.strip().lower() in ("y", "yes")


async def _live_tools(home: Home, config: Config, server: str) -> dict[str, dict[str, Any]] | str:
    """Start ``server`` in its sandbox, as brokerd would, and take its tool list."""
    from boxmaker.mcp.gateway import Gateway  # the SDK: only for this command

    async def no_ledger(_: object) -> bool:
        return True  # bxctl writes no ledger; brokerd records what its own starts list

    gateway = Gateway(
        home=home,
        config=config,
        workspace=config.workspace,
        home_problem=lambda path: workspace_problem(home, path),
        record=no_ledger,
        boot="bxctl",
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(gateway.run)
        started = await gateway.start(server)
        nursery.cancel_scope.cancel()
    if isinstance(started, str):
        return started
    return gateway.status()["servers"][server]["tools"] or {}


async def pin(
    server: str,
    tool: str | None = None,
    /,
    *,
    yes: bool = False,
    common: Common = DEFAULT,
) -> Exit:
    """Accept an MCP server's tool definitions (all, or one): the server is started in
    its sandbox, each definition not yet accepted is shown (a changed one as the
    difference from its pin), and the pins are written once you confirm.

    Parameters
    ----------
    server
        The server's name in config.toml.
    tool
        Only this tool.
    yes
        Pin without asking.
    """
    home = common.resolve()
    config = _config(home)
    if isinstance(config, Exit):
        return config
    if server not in config.mcp_servers:
        return fail(f"no [mcp_servers.{server}] in config.toml", Exit.USAGE)
    try:
        pins = read_pins(home.mcp_pins)
    except PinsError as exc:
        return fail(str(exc))
    live = await _live_tools(home, config, server)
    if isinstance(live, str):
        return fail(f"{server} could not be started: {live} (bxctl mcp logs {server})")
    definitions = {name: entry["definition"] for name, entry in live.items()}
    pinned = dict(pins.get(server, {}))
    states = compare(pinned, definitions)
    if tool is not None:
        if tool not in states:
            return fail(f"{server} lists no tool {tool!r} and none is pinned", Exit.USAGE)
        states = {tool: states[tool]}
    todo = {name: state for name, state in states.items() if state != ToolStatus.ACCEPTED}
    if not todo:
        print(printable(f"{server}: every tool is pinned as it is listed"))
        return Exit.DONE
    for name, state in sorted(todo.items()):
        print(printable(f"{state.value}: mcp.{server}.{name}", lines=True))
        if state is ToolStatus.CHANGED:
            diff = difflib.unified_diff(
                _pretty(pinned[name].definition),
                _pretty(definitions[name]),
                "pinned",
                "now",
                lineterm="",
            )
            body = list(diff)
        elif state is ToolStatus.REMOVED:
            body = ["  (the server no longer lists it: its pin is removed)"]
        else:
            body = _pretty(definitions[name])
        for line in body:
            print(printable("  " + line))
    if not yes and not await _confirm(f"pin these {len(todo)} change(s) of {server}? [y/N] "):
        return fail("nothing pinned")
    for name, state in todo.items():
        if state is ToolStatus.REMOVED:
            pinned.pop(name, None)
        else:
            pinned[name] = Pin.of(definitions[name])
    updated = {**pins, server: pinned}
    await trio.to_thread.run_sync(write_pins, home.mcp_pins, updated)
    print(
        printable(
            f"pinned: {', '.join(sorted(todo))} ({home.mcp_pins}); brokerd reads it within 1 s"
        )
    )
    return Exit.DONE


async def import_(file: str, /, *, replace: bool = False, common: Common = DEFAULT) -> Exit:
    """Add the MCP servers of a Claude Code / Claude Desktop JSON file ("mcpServers")
    or a Codex config.toml ([mcp_servers]) to config.toml, its comments kept.

    Parameters
    ----------
    file
        The file to read.
    replace
        Overwrite servers config.toml already has.
    """
    home = common.resolve()
    try:
        imported = await trio.to_thread.run_sync(read_servers, Path(file))
        if imported.entries:
            await trio.to_thread.run_sync(
                lambda: add_servers(home, imported.entries, replace=replace)
            )
    except McpImportError as exc:
        return fail(str(exc))
    problems: list[str] = []
    if imported.entries:
        problems = await trio.to_thread.run_sync(_start_problems, home, sorted(imported.entries))
    if common.json:
        notes = [*imported.notes, *problems]
        print_json({"imported": sorted(imported.entries), "notes": notes})
        return Exit.DONE
    for note in imported.notes:
        print(printable(note))
    if not imported.entries:
        return fail(f"{file}: no server to import")
    names = ", ".join(sorted(imported.entries))
    print(printable(f"imported into config.toml: {names}; review them, then bxctl mcp pin NAME"))
    for problem in problems:
        print(printable(problem))
    return Exit.DONE


def _start_problems(home: Home, names: list[str]) -> list[str]:
    """What would stop each imported server from starting in its sandbox: an entry made
    for the owner's shell often names a program by the owner's PATH, or a script whose
    interpreter lies outside what a sandbox shows."""
    # brokerd's sandbox plan: loaded only for this command (tests/cli/test_imports.py).
    from boxmaker.mcp.gateway_launch import command_problem

    servers = load_config(home).mcp_servers
    problems = ((name, command_problem(servers[name], os.environ.get("PATH"))) for name in names)
    return [f"{name}: {problem}" for name, problem in problems if problem is not None]
