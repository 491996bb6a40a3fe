"""The owner's screens on network grants, connect calls and connection records, in
process, as the owner reads them: ``bxctl why`` of a connect call (its host:port, the
calling call and its tool, the grant, the tunnel's figures) and of the calling shell call
(its connections), ``audit show``, ``grants list``, ``grants test`` (a connect, and
whether a shell call gets a way out), ``grants what-if`` on recorded connects, and the
grant ``approve --always`` writes for a connect ask."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from tests.harness.homes import write_grants, write_state

from boxmaker.cli import why as why_module
from boxmaker.cli.always import AlwaysGrant
from boxmaker.cli.app import app
from boxmaker.cli.why import ENDED_WORDS, connection_words
from boxmaker.core.catalogue import CheckedArguments, check_arguments
from boxmaker.core.grant_parse import parse_grants
from boxmaker.core.grant_scope import Asked, Scope, always_grant, asked, grant_of
from boxmaker.core.grants import GrantSet, Mode
from boxmaker.core.labels import Label, Taint
from boxmaker.core.reasons import Reason
from boxmaker.home.paths import Home
from boxmaker.ledger.records import (
    Body,
    Connection,
    ConnectionEnd,
    Decision,
    Result,
    Start,
    VerdictCode,
)
from boxmaker.ledger.writer import LedgerWriter

pytestmark = pytest.mark.usefixtures("utc_owner")

T0 = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)
BOOT = "b-" + "0" * 16
SESSION = "s-" + "1" * 12
SHELL = "c-00000000000000a0"
PYPI_CALL = "c-00000000000000c1"
EVIL_CALL = "c-00000000000000c2"
QUIET_CALL = "c-00000000000000c3"
COMMAND = "pip install attrs"

GRANTS = """\
[[grant]]
id = "sh"
tool = "shell"
mode = "auto"

[[grant]]
id = "pypi"
tool = "connect"
mode = "auto"
hosts = ["pypi.org", "*.pythonhosted.org"]
via = ["shell"]
commands = ["pip install *"]
note = "pip only"

[[grant]]
id = "docs"
tool = "connect"
mode = "ask"
hosts = ["docs.python.org:8443"]
via = ["shell", "mcp.fetch.*"]
plain_http = true
if_untrusted = "ask"
"""


def bxctl(home: Home, *args: str) -> int:
    return int(app([*args, "--home", str(home.root)], result_action="return_value"))


def connect_arguments(host: str, port: int = 443) -> dict[str, Any]:
    return {
        "host": host,
        "port": port,
        "scheme": "https",
        "via": SHELL,
        "via_tool": "shell",
        "via_command": COMMAND,
    }


def decision(
    call: str,
    tool: str,
    arguments: dict[str, Any],
    verdict: VerdictCode = VerdictCode.RUN,
    reason: Reason | None = None,
    grant: str | None = None,
) -> Decision:
    return Decision(
        call=call,
        session=SESSION,
        tool=tool,
        arguments=arguments,
        verdict=verdict,
        reason=reason,
        grant=grant,
        taint=Taint.PUBLIC,
        untrusted=False,
        boot=BOOT,
    )


def result(call: str, label: Label, after: Label) -> Result:
    return Result.of_run(call, ok=True, reason=None, label=label, content="x" * 5, after=after)


CONNECTION = Connection(
    call=PYPI_CALL,
    via=SHELL,
    session=SESSION,
    host="pypi.org",
    port=443,
    address="151.101.0.223",
    server_name="pypi.org",
    bytes_up=517,
    bytes_down=40960,
    duration_ms=812,
    ended=ConnectionEnd.CLOSED,
)
UNTRUSTED = Label(Taint.PUBLIC, True)

STORY: tuple[Body, ...] = (
    Start(boot=BOOT, version="test"),
    decision(SHELL, "shell", {"command": COMMAND}, grant="sh"),
    decision(PYPI_CALL, "connect", connect_arguments("pypi.org"), grant="pypi"),
    decision(
        EVIL_CALL,
        "connect",
        connect_arguments("evil.example"),
        VerdictCode.DENY,
        Reason.NO_GRANT,
    ),
    decision(QUIET_CALL, "connect", connect_arguments("files.pythonhosted.org"), grant="pypi"),
    CONNECTION,
    result(PYPI_CALL, UNTRUSTED, UNTRUSTED),
    result(SHELL, Label(Taint.PUBLIC, False), UNTRUSTED),
)


def write_ledger(home: Home, bodies: tuple[Body, ...] = STORY) -> None:
    """A new ledger of ``bodies``, all at T0 (genesis included)."""

    async def append() -> None:
        writer = LedgerWriter.open(home.audit_log, clock=lambda: T0)
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            for body in bodies:
                await writer.append(body)
            await writer.aclose()

    home.audit_log.unlink(missing_ok=True)
    trio.run(append)


@pytest.fixture
def story(home: Home, monkeypatch: pytest.MonkeyPatch) -> Home:
    write_grants(home, GRANTS)
    write_ledger(home)
    monkeypatch.setattr(why_module, "utc_now", lambda: T0 + dt.timedelta(seconds=10))
    return home


def why(home: Home, call: str, capsys: pytest.CaptureFixture[str], *args: str) -> list[str]:
    capsys.readouterr()
    argv = ["why", call, "--home", str(home.root), *args]

    async def run() -> int:
        return int(await app.run_async(argv, result_action="return_value"))

    assert trio.run(run) == 0
    return capsys.readouterr().out.splitlines()


# ---------------------------------------------------------------------------------------
# why


def test_why_of_a_connect_names_the_destination_the_calling_call_the_grant_and_the_tunnel(
    story: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = why(story, PYPI_CALL, capsys)
    assert lines == [
        f"call {PYPI_CALL}: connect to pypi.org:443, a tunnel of shell call {SHELL} "
        f"({COMMAND}), asked by session {SESSION}",
        "decided 12:00:00 (10s ago): run",
        '  grant pypi (in grants.toml now: mode auto, note "pip only")',
        "    its text then is not known: no policy record of its boot before the decision",
        "  the session was taint public, trusted",
        "tunnel to pypi.org:443 at 151.101.0.223 (TLS server name pypi.org): 517 bytes up, "
        "40960 bytes down, 812 ms; ended closed (either side ended it)",
        "ran 12:00:00 (10s ago): ok, 5 bytes of output, labelled public and untrusted",
        "  the session is now taint public, untrusted",
    ]


def test_why_of_the_calling_shell_call_lists_its_connections(
    story: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = why(story, SHELL, capsys)
    start = lines.index("its connections, each a connect call (bxctl why CALL tells more):")
    assert lines[0] == (
        f'call {SHELL}: shell {{"command":"{COMMAND}"}}, asked by session {SESSION}'
    )
    assert lines[start + 1 : start + 4] == [
        f"  {PYPI_CALL} pypi.org:443: run (grant pypi); 517 bytes up, 40960 down, ended closed",
        f"  {EVIL_CALL} evil.example:443: deny no_grant",
        f"  {QUIET_CALL} files.pythonhosted.org:443: run (grant pypi); no connection record: "
        "it did not open, or is open still",
    ]
    assert lines[start + 4].startswith("ran 12:00:00 (10s ago): ok")


def test_why_json_has_the_connection_and_the_tunnels(
    story: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    connect = orjson.loads("\n".join(why(story, PYPI_CALL, capsys, "--json")))
    assert connect["connection"] == {
        "at": "2026-06-01T12:00:00.000Z",
        "address": "151.101.0.223",
        "bytes_down": 40960,
        "bytes_up": 517,
        "duration_ms": 812,
        "ended": "closed",
        "host": "pypi.org",
        "port": 443,
        "server_name": "pypi.org",
        "session": SESSION,
        "via": SHELL,
    }
    assert connect["tunnels"] == []
    shell = orjson.loads("\n".join(why(story, SHELL, capsys, "--json")))
    assert shell["connection"] is None
    assert [t["call"] for t in shell["tunnels"]] == [PYPI_CALL, EVIL_CALL, QUIET_CALL]
    assert shell["tunnels"][0]["connection"]["bytes_up"] == 517
    assert shell["tunnels"][1]["decision"]["reason"] == "no_grant"
    assert shell["tunnels"][2]["connection"] is None


def test_every_way_a_tunnel_ends_has_words() -> None:
    assert set(ENDED_WORDS) == set(ConnectionEnd)
    for end in ConnectionEnd:
        assert ENDED_WORDS[end].startswith(f"{end.value} (")


def test_a_tunnel_without_tls_and_to_an_ipv6_address_in_words() -> None:
    bare = Connection(
        call=PYPI_CALL,
        via=SHELL,
        session=SESSION,
        host="::1",
        port=8443,
        address="::1",
        server_name=None,
        bytes_up=3,
        bytes_down=0,
        duration_ms=1,
        ended=ConnectionEnd.NOT_TLS,
    )
    assert connection_words(bare) == (
        "tunnel to [::1]:8443 at ::1 (no TLS server name): 3 bytes up, 0 bytes down, 1 ms; "
        "ended not_tls (what the sandbox sent was not TLS)"
    )


# ---------------------------------------------------------------------------------------
# audit show


def test_audit_show_of_a_connect_call_has_its_connection(
    story: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert bxctl(story, "audit", "show", "--call", PYPI_CALL) == 0
    shown = capsys.readouterr().out.splitlines()
    lines = [line for line in shown if line.split()[0].isdigit()]  # the grant's text aside
    assert [line.split()[2] for line in lines] == ["decision", "connection", "result"]
    assert lines[1].endswith(
        f"connection  {PYPI_CALL}  session={SESSION}  via={SHELL}  host=pypi.org  port=443  "
        "address=151.101.0.223  server_name=pypi.org  bytes_up=517  bytes_down=40960  "
        "duration_ms=812  ended=closed"
    )
    assert bxctl(story, "audit", "show", "--call", SHELL, "--json") == 0
    kinds = [orjson.loads(line)["kind"] for line in capsys.readouterr().out.splitlines()]
    assert kinds == ["decision", "result"]  # a call's own records only


def test_audit_verify_counts_a_connect_call_as_any_call(
    story: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert bxctl(story, "audit", "verify") == 0
    out = capsys.readouterr().out
    assert "calls: 4 (complete 2, denied 1, refused 0, expired 0, withdrawn 0, pending 0, " in out
    assert "ledger: sound" in out


# ---------------------------------------------------------------------------------------
# grants list and test


def test_grants_list_shows_a_connect_grants_hosts_via_commands_and_plain_http(
    story: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert bxctl(story, "grants", "list") == 0
    lines = capsys.readouterr().out.splitlines()
    pypi = lines.index("pypi  connect  auto")
    assert lines[pypi + 1 : pypi + 5] == [
        "    hosts: pypi.org, *.pythonhosted.org",
        "    via: shell",
        "    commands: pip install *",
        "    max_taint: secret, if_untrusted: deny",
    ]
    assert lines[pypi + 5].startswith("    decided 2 call(s) (run 2), last ")
    assert lines[pypi + 5].endswith(f"({QUIET_CALL})")
    assert lines[pypi + 6] == "    note: pip only"
    docs = lines.index("docs  connect  ask")
    assert lines[docs + 1 : docs + 5] == [
        "    hosts: docs.python.org:8443",
        "    via: shell, mcp.fetch.*",
        "    plain_http: true (plain-HTTP requests too, port 80 by default)",
        "    max_taint: secret, if_untrusted: ask",
    ]
    assert bxctl(story, "grants", "list", "--json") == 0
    listed = {g["id"]: g for g in orjson.loads(capsys.readouterr().out)["grants"]}
    assert (listed["docs"]["hosts"], listed["docs"]["via"], listed["docs"]["plain_http"]) == (
        ["docs.python.org:8443"],
        ["shell", "mcp.fetch.*"],
        True,
    )
    assert (listed["sh"]["via"], listed["sh"]["plain_http"]) == (None, None)


def test_grants_test_decides_a_connect_as_brokerd_would(
    story: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    pip = '{"host": "files.pythonhosted.org", "port": 443, "via_tool": "shell", '
    pip += '"via_command": "pip install attrs"}'
    assert bxctl(story, "grants", "test", "connect", pip) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == [
        "verdict: run",
        "reason: none",
        f"grant: pypi ({story.grants_toml}, line 6)",
    ]
    write_state(story, SESSION, "public", untrusted=True)
    assert bxctl(story, "grants", "test", "connect", pip, "--session", SESSION) == 0
    assert capsys.readouterr().out.splitlines()[:3] == [
        "verdict: deny",
        "reason: untrusted",
        "detail: the session is untrusted and grant pypi says if_untrusted = deny",
    ]
    curl = '{"host": "pypi.org", "port": 443, "via_tool": "shell", "via_command": "curl x"}'
    assert bxctl(story, "grants", "test", "connect", curl) == 0
    assert capsys.readouterr().out.splitlines()[:3] == [
        "verdict: deny",
        "reason: no_grant",
        "detail: no grant allows connect on pypi.org:443",
    ]
    plain = '{"host": "docs.python.org", "port": 8443, "via_tool": "mcp.fetch.get", '
    plain += '"scheme": "http"}'
    assert bxctl(story, "grants", "test", "connect", plain, "--json") == 0
    answer = orjson.loads(capsys.readouterr().out)
    assert (answer["verdict"], answer["grant"], answer["arguments"]["via"]) == (
        "ask",
        "docs",
        "c-0000000000000000",
    )
    assert answer["network_grants"] is None


def test_grants_test_of_a_shell_call_says_whether_it_gets_a_way_out(
    story: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert bxctl(story, "grants", "test", "shell", '{"command": "pip install attrs"}') == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "network: a way out, each connection decided as a connect call (grants: pypi, docs)"
    )
    assert bxctl(story, "grants", "test", "shell", '{"command": "make"}') == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "network: a way out, each connection decided as a connect call (grants: docs)"
    )
    write_grants(story, GRANTS.split('[[grant]]\nid = "docs"')[0])
    assert bxctl(story, "grants", "test", "shell", '{"command": "make"}', "--json") == 0
    assert orjson.loads(capsys.readouterr().out)["network_grants"] == []
    assert bxctl(story, "grants", "test", "shell", '{"command": "make"}') == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "network: none (no connect grant's via and commands cover this call: no socket at all)"
    )


def test_the_model_tools_are_still_what_grants_test_knows_without_connect(
    story: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert bxctl(story, "grants", "test", "connect", '{"host": "pypi.org"}') == 2
    assert capsys.readouterr().err == "bxctl: bad_arguments: missing argument 'port'\n"


# ---------------------------------------------------------------------------------------
# what-if


def test_what_if_replays_recorded_connects(
    story: Home, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    candidate = tmp_path / "candidate.toml"
    candidate.write_text(
        GRANTS.replace('hosts = ["pypi.org", "*.pythonhosted.org"]', 'hosts = ["pypi.org"]')
    )
    capsys.readouterr()
    assert bxctl(story, "grants", "what-if", str(candidate)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "replayed 4 decisions: 1 would change, 3 would not"
    assert "pypi → no grant: 1 call" in lines
    flip = next(line for line in lines if QUIET_CALL in line)
    assert flip.startswith("  run → deny (no_grant)  ")
    assert '"host":"files.pythonhosted.org"' in flip


# ---------------------------------------------------------------------------------------
# approve --always on a connect ask


def asked_connect(grants_text: str, arguments: dict[str, Any]) -> tuple[dict[str, Any], Asked]:
    grants = parse_grants(grants_text)
    assert isinstance(grants, GrantSet)
    found = asked(
        grants, grant="docs", tool="connect", arguments=arguments, workspace="/nonexistent"
    )
    assert isinstance(found, Asked), found
    table = always_grant(
        approval="a-1f2e3d4c",
        call=PYPI_CALL,
        arguments=found.arguments,
        asking=found.asking,
        scope=Scope.EXACT,
        lasting=None,
        owner="owner",
        now=T0,
    )
    assert isinstance(table, dict), table
    return table, found


def test_approve_always_on_a_connect_writes_one_host_port_for_its_via_tool() -> None:
    arguments = {
        "host": "Docs.Python.org",
        "port": 8443,
        "via": SHELL,
        "via_tool": "shell",
        "via_command": "curl https://docs.python.org:8443/",
    }
    table, found = asked_connect(GRANTS, arguments)
    assert {key: value for key, value in table.items() if key != "note"} == {
        "id": "always-a-1f2e3d4c",
        "tool": "connect",
        "mode": "auto",
        "wins_over_ask": True,
        "hosts": ["docs.python.org:8443"],
        "via": ["shell"],
        "max_taint": "secret",
        "if_untrusted": "ask",
    }
    grant = grant_of(table)
    assert grant.mode is Mode.AUTO
    assert grant.via == ("shell",)
    checked = found.arguments
    assert grant.covers(checked, T0)
    other = check_arguments("connect", {**arguments, "host": "evil.example"}, internal=True)
    assert isinstance(other, CheckedArguments)
    assert not grant.covers(other, T0)
    shown = AlwaysGrant(table, checked).lines()
    assert shown[1:7] == [
        "    [[grant]]",
        '    id = "always-a-1f2e3d4c"',
        '    tool = "connect"',
        '    mode = "auto"',
        "    wins_over_ask = true",
        '    hosts = ["docs.python.org:8443"]',
    ]
    assert (
        "  from now on it runs, without asking: connect to docs.python.org:8443 from any shell call"
    ) in shown
    assert "  (an untrusted session is still asked)" in shown


def test_approve_always_keeps_the_asking_grants_commands_and_plain_http() -> None:
    text = GRANTS.replace(
        'via = ["shell", "mcp.fetch.*"]', 'via = ["shell", "mcp.fetch.*"]\ncommands = ["curl *"]'
    ).replace('if_untrusted = "ask"\n', "")
    arguments = {
        "host": "docs.python.org",
        "port": 8443,
        "via": SHELL,
        "via_tool": "shell",
        "via_command": "curl http://docs.python.org:8443/",
        "scheme": "http",
    }
    table, found = asked_connect(text, arguments)
    assert (table["hosts"], table["via"], table["commands"], table["plain_http"]) == (
        ["docs.python.org:8443"],
        ["shell"],
        ["curl *"],
        True,
    )
    assert table["if_untrusted"] == "deny"  # the asking connect grant's default
    assert AlwaysGrant(table, found.arguments).runs() == (
        "connect to http://docs.python.org:8443 (plain HTTP) from any shell call whose "
        "command matches curl *"
    )


def test_approve_always_for_an_mcp_tools_tunnel_names_that_tool_only() -> None:
    arguments = {"host": "docs.python.org", "port": 8443, "via": SHELL, "via_tool": "mcp.fetch.get"}
    table, _ = asked_connect(GRANTS, arguments)
    assert table["via"] == ["mcp.fetch.get"]
    assert "commands" not in table
