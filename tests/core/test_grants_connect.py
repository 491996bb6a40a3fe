"""connect grants: parsing every key and problem, and what they cover (hosts and ports,
via, commands against the calling command, plain HTTP, expiry, untrusted sessions)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from boxmaker.core.catalogue import (
    INTERNAL_TOOLS,
    MAX_COMMAND_BYTES,
    TOOL_NAMES,
    ArgumentProblem,
    CheckedArguments,
    ConnectArgs,
    catalogue_tools,
    check_arguments,
    result_label,
)
from boxmaker.core.decide import Ask, Deny, Run, evaluate
from boxmaker.core.grant_lint import lint_grants, shadows
from boxmaker.core.grant_parse import GrantsProblem, all_problems, parse_grants, parse_toml
from boxmaker.core.grants import Grant, GrantSet, Mode
from boxmaker.core.hosts import Destination
from boxmaker.core.labels import FRESH, Label, LabelRules, Taint
from boxmaker.core.network import connect_request
from boxmaker.core.reasons import Reason
from boxmaker.core.vocabulary import ToolRequest, VerdictCode

NOW = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)
CALL = "c-00000000000000c1"
VIA = "c-00000000000000a0"
SESSION = "s-000000000001"
UNTRUSTED = Label(Taint.PUBLIC, True)


def connect(
    host: str = "pypi.org",
    port: int = 443,
    *,
    via_tool: str = "shell",
    via_command: str | None = "pip install attrs",
    scheme: str = "https",
) -> CheckedArguments:
    raw: dict[str, Any] = {"host": host, "port": port, "via": VIA, "via_tool": via_tool}
    raw["scheme"] = scheme
    if via_command is not None:
        raw["via_command"] = via_command
    checked = check_arguments("connect", raw, internal=True)
    assert isinstance(checked, CheckedArguments), checked
    return checked


def table(*lines: str, gid: str = "net", mode: str = "auto") -> str:
    head = [
        "[[grant]]",
        f'id = "{gid}"',
        'tool = "connect"',
        f'mode = "{mode}"',
    ]
    return "\n".join(head + list(lines)) + "\n"


def one(*lines: str, mode: str = "auto") -> Grant:
    parsed = parse_grants(table(*lines, mode=mode))
    assert isinstance(parsed, GrantSet), parsed
    return parsed.grants[0]


def problems(text: str) -> list[tuple[str | None, str]]:
    document = parse_toml(text)
    assert isinstance(document, dict)
    found = all_problems(document)
    assert not isinstance(found, GrantSet)
    return [(p.key, p.message) for p in found]


PYPI = ('hosts = ["pypi.org", "*.pythonhosted.org"]', 'via = ["shell"]')


# ---------------------------------------------------------------------------------------
# The model can never name connect


def test_connect_without_internal_is_unknown_tool_exactly_as_before() -> None:
    raw = {"host": "pypi.org", "port": 443, "via": VIA, "via_tool": "shell"}
    assert check_arguments("connect", raw) == ArgumentProblem(
        Reason.UNKNOWN_TOOL, "unknown tool 'connect'"
    )
    assert check_arguments("connect", raw, internal=True) == CheckedArguments(
        "connect", ConnectArgs("pypi.org", 443, VIA, "shell")
    )


@given(st.dictionaries(st.text(max_size=12), st.one_of(st.text(max_size=12), st.integers())))
def test_no_arguments_make_connect_known_without_internal(raw: dict[str, Any]) -> None:
    checked = check_arguments("connect", raw)
    assert checked == ArgumentProblem(Reason.UNKNOWN_TOOL, "unknown tool 'connect'")


def test_a_model_request_for_connect_is_denied_unknown_tool_even_with_a_grant() -> None:
    grants = parse_grants(table(*PYPI, 'if_untrusted = "auto"'))
    assert isinstance(grants, GrantSet)
    request = connect_request(
        call=CALL,
        session=SESSION,
        via=VIA,
        via_tool="shell",
        via_command=None,
        host="pypi.org",
        port=443,
    )
    kwargs: dict[str, Any] = {"ledger_usable": True, "grants": grants, "state": FRESH, "now": NOW}
    denied = evaluate(request, **kwargs)
    assert isinstance(denied, Deny)
    assert denied.decision.reason is Reason.UNKNOWN_TOOL
    assert denied.decision.detail == "unknown tool 'connect'"
    assert isinstance(evaluate(request, internal=True, **kwargs), Run)


def test_the_catalogue_never_lists_connect() -> None:
    names = [tool["function"]["name"] for tool in catalogue_tools()]
    assert names == list(TOOL_NAMES)
    assert INTERNAL_TOOLS == ("connect",)
    assert "connect" not in names


# ---------------------------------------------------------------------------------------
# connect's arguments


def test_checked_connect_arguments_match_as_hosts_and_commands() -> None:
    checked = connect("PyPI.org", 443)
    assert checked.destination == Destination("https", "pypi.org", 443)
    assert checked.command == "pip install attrs"
    assert checked.host == "pypi.org"
    assert checked.subject() == "pypi.org:443"
    assert checked.to_json() == {
        "host": "pypi.org",
        "port": 443,
        "via": VIA,
        "via_tool": "shell",
        "via_command": "pip install attrs",
        "scheme": "https",
    }
    assert connect("0:0::1", 8443, scheme="http").subject() == "http://[::1]:8443"


@pytest.mark.parametrize(
    ("change", "detail"),
    [
        ({"host": "*.pypi.org"}, "argument 'host': '*.pypi.org' is not a host name or IP"),
        ({"host": "pypi.org."}, "argument 'host': 'pypi.org.' is not a host name or IP"),
        ({"host": "a b"}, "argument 'host': 'a b' is not a host name or IP"),
        ({"host": "fe80::1%eth0"}, "argument 'host': 'fe80::1%eth0' is not a host name or IP"),
        ({"host": ""}, "argument 'host' must not be empty"),
        ({"port": 0}, "argument 'port' must be at least 1"),
        ({"port": 65536}, "argument 'port' must be at most 65535"),
        ({"port": True}, "argument 'port' must be an integer"),
        ({"port": "443"}, "argument 'port' must be an integer"),
        ({"via": "c-1"}, "argument 'via' must be a call id (c- and 16 hex digits)"),
        ({"via_tool": "connect"}, "argument 'via_tool': 'connect' is not a tool's name"),
        ({"via_tool": "mcp.*"}, "argument 'via_tool': 'mcp.*' is not a tool's name"),
        ({"via_command": "a\x00b"}, "argument 'via_command' contains a NUL byte"),
        ({"via_command": "x" * 65537}, "argument 'via_command' is longer than 65536 bytes"),
        ({"scheme": "ftp"}, "argument 'scheme' must be http or https"),
        # via_command (optional) is absent: the schema still checks the keys after it.
        ({"scheme": 5}, "argument 'scheme' must be a string"),
        ({"extra": 1}, "unknown argument 'extra'"),
    ],
)
def test_bad_connect_arguments(change: dict[str, Any], detail: str) -> None:
    raw: dict[str, Any] = {"host": "pypi.org", "port": 443, "via": VIA, "via_tool": "shell"}
    raw |= change
    checked = check_arguments("connect", raw, internal=True)
    assert isinstance(checked, ArgumentProblem)
    assert checked.reason is Reason.BAD_ARGUMENTS
    assert checked.detail.startswith(detail), checked.detail


def test_a_long_bad_host_or_tool_name_is_shown_by_its_first_100_characters() -> None:
    raw: dict[str, Any] = {"host": "*" + "A" * 150, "port": 443, "via": VIA, "via_tool": "shell"}
    assert check_arguments("connect", raw, internal=True) == ArgumentProblem(
        Reason.BAD_ARGUMENTS,
        f"argument 'host': {'*' + 'a' * 99!r} is not a host name or IP address: "
        "it has glob characters or escapes",
    )
    raw = {"host": "a.org", "port": 443, "via": VIA, "via_tool": "x" * 150}
    assert check_arguments("connect", raw, internal=True) == ArgumentProblem(
        Reason.BAD_ARGUMENTS, f"argument 'via_tool': {'x' * 100!r} is not a tool's name"
    )


def test_a_via_command_of_exactly_the_length_limit_is_accepted() -> None:
    assert MAX_COMMAND_BYTES == 64 * 1024
    assert connect(via_command="x" * MAX_COMMAND_BYTES).command == "x" * (64 * 1024)


def test_a_via_command_belongs_to_a_shell_call_only() -> None:
    raw = {"host": "a.org", "port": 443, "via": VIA, "via_tool": "mcp.f.get", "via_command": "x"}
    assert check_arguments("connect", raw, internal=True) == ArgumentProblem(
        Reason.BAD_ARGUMENTS, "argument 'via_command' is a shell call's command only"
    )


def test_a_connections_own_result_raises_nothing_its_calling_calls_does() -> None:
    assert result_label(connect(), LabelRules(), Taint.SECRET) == Label(Taint.PUBLIC, False)


# ---------------------------------------------------------------------------------------
# Parsing


def test_a_full_connect_grant_parses() -> None:
    grant = one(
        'hosts = ["PyPI.org", "files.pythonhosted.org:8443"]',
        'via = ["shell", "mcp.fetch.*"]',
        'commands = ["pip install *"]',
        "plain_http = true",
        "wins_over_ask = true",
        "expires = 2026-12-31T00:00:00Z",
        'note = "pip"',
    )
    assert grant.hosts == ("pypi.org", "files.pythonhosted.org:8443")
    assert grant.via == ("shell", "mcp.fetch.*")
    assert grant.commands == ("pip install *",)
    assert grant.plain_http is True
    assert grant.if_untrusted is Mode.DENY
    assert grant.approvers == ("owner",)


def test_if_untrusted_defaults_to_deny_for_connect_only() -> None:
    assert one(*PYPI).if_untrusted is Mode.DENY
    assert one(*PYPI, 'if_untrusted = "ask"').if_untrusted is Mode.ASK
    assert Grant("g", "connect", Mode.AUTO).if_untrusted is Mode.DENY
    assert Grant("g", "http_get", Mode.AUTO).if_untrusted is Mode.ASK


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (('via = ["shell"]',), [("hosts", "required for connect (there is no default)")]),
        (('hosts = ["a.org"]',), [("via", "required for connect (there is no default)")]),
        (
            ('hosts = ["a.org"]', "via = []"),
            [("via", "an empty array matches nothing (leave the key out instead)")],
        ),
        (
            ("hosts = []", 'via = ["shell"]'),
            [("hosts", "an empty array matches nothing (leave the key out instead)")],
        ),
        (
            ('hosts = ["a.org"]', 'via = ["http_get"]'),
            [
                (
                    "via",
                    "'http_get': expected shell, or an external tool's name or family "
                    "(mcp.SERVER.TOOL, mcp.SERVER.*, mcp.*)",
                )
            ],
        ),
        (
            ('hosts = ["a.org"]', 'via = ["claude.*"]'),
            [
                (
                    "via",
                    "'claude.*': expected shell, or an external tool's name or family "
                    "(mcp.SERVER.TOOL, mcp.SERVER.*, mcp.*)",
                )
            ],
        ),
        (('hosts = ["a.org"]', 'via = ["shell", "shell"]'), [("via", "a tool named twice")]),
        (
            ('hosts = ["a.org"]', 'via = ["mcp.f.*"]', 'commands = ["pip *"]'),
            [
                (
                    "commands",
                    'matched against a shell call\'s command: applies only when via has "shell"',
                )
            ],
        ),
        (
            ('hosts = ["a.org"]', 'via = ["shell"]', 'plain_http = "yes"'),
            [("plain_http", "expected true or false (a boolean), got a string")],
        ),
        (
            ('hosts = ["https://a.org"]', 'via = ["shell"]'),
            [
                (
                    "hosts",
                    "'https://a.org': expected a host name, *.suffix or IP address, with an "
                    "optional :port (no scheme or path)",
                )
            ],
        ),
        (
            ('hosts = ["a.org"]', 'via = ["shell"]', 'paths = ["x"]'),
            [("paths", "does not apply to tool connect")],
        ),
        (
            ('hosts = ["a.org"]', 'via = ["shell"]', 'label_taint = "secret"'),
            [("label_taint", "does not apply to tool connect")],
        ),
        (
            ('hosts = ["a.org"]', 'via = ["shell"]', "hard_links = true"),
            [("hard_links", "does not apply to tool connect")],
        ),
        (
            ('hosts = ["a.org"]', 'via = ["shell"]', "other_arguments = false"),
            [("other_arguments", "does not apply to tool connect")],
        ),
    ],
)
def test_connect_grant_problems(lines: tuple[str, ...], expected: list[tuple[str, str]]) -> None:
    assert problems(table(*lines)) == expected


def test_only_the_owner_answers_a_connect_ask() -> None:
    text = table(*PYPI, 'approvers = ["owner", "mcp-client"]', mode="ask")
    assert problems(text) == [("approvers", 'only the owner answers a connect: "owner"')]
    assert one(*PYPI, 'approvers = ["owner"]', mode="ask").approvers == ("owner",)


VIA_FAMILIES = (
    "expected shell, or an external tool's name or family (mcp.SERVER.TOOL, mcp.SERVER.*, mcp.*)"
)


@pytest.mark.parametrize(
    ("lines", "mode", "expected"),
    [
        (
            ('hosts = ["a.org"]', 'via = "shell"'),
            "auto",
            ("via", "expected an array of strings, got a string", None),
        ),
        (
            ('hosts = ["a.org"]', 'via = ["Shel"]'),
            "auto",
            ("via", f"'Shel': {VIA_FAMILIES}", "shell"),
        ),
        (
            ('hosts = ["a.org"]', 'via = ["mcp.f.get", "mcp.f.get"]'),
            "auto",
            ("via", "a tool named twice", None),
        ),
        (
            ('hosts = ["a.org"]', 'via = ["mcp.f.*"]', 'commands = ["pip *"]'),
            "auto",
            (
                "commands",
                'matched against a shell call\'s command: applies only when via has "shell"',
                None,
            ),
        ),
        (
            (*PYPI, 'approvers = ["owner", "mcp-client"]'),
            "ask",
            ("approvers", 'only the owner answers a connect: "owner"', None),
        ),
    ],
    ids=["via-not-array", "via-misspelt", "via-twice", "commands-without-shell", "approvers"],
)
def test_a_connect_grant_problem_names_its_grant_and_the_nearest_word(
    lines: tuple[str, ...], mode: str, expected: tuple[str, str, str | None]
) -> None:
    document = parse_toml(table(*lines, gid="net-1", mode=mode))
    assert isinstance(document, dict)
    found = all_problems(document)
    assert not isinstance(found, GrantSet)
    assert [(p.grant_id, p.key, p.message, p.suggestion) for p in found] == [("net-1", *expected)]


def test_a_grant_without_the_connect_keys_has_their_defaults() -> None:
    # Equal to the Grant built with every default: via (), plain_http False, not None.
    assert one(*PYPI) == Grant(
        "net", "connect", Mode.AUTO, hosts=("pypi.org", "*.pythonhosted.org"), via=("shell",)
    )
    other = parse_grants('[[grant]]\nid = "r"\ntool = "read_file"\nmode = "auto"\n')
    assert other == GrantSet((Grant("r", "read_file", Mode.AUTO),))
    assert isinstance(other, GrantSet)
    assert (other.grants[0].via, other.grants[0].plain_http) == ((), False)


@pytest.mark.parametrize("key", ['via = ["shell"]', "plain_http = true"])
@pytest.mark.parametrize("tool", ["shell", "http_get", "mcp.f.get"])
def test_connect_keys_do_not_apply_to_other_tools(key: str, tool: str) -> None:
    extra = 'hosts = ["a.org"]\n' if tool == "http_get" else ""
    text = f'[[grant]]\nid = "g"\ntool = "{tool}"\nmode = "auto"\n{extra}{key}\n'
    parsed = parse_grants(text)
    assert isinstance(parsed, GrantsProblem)
    assert (parsed.key, parsed.message) == (key.split(" ")[0], f"does not apply to tool {tool}")


# ---------------------------------------------------------------------------------------
# What a connect grant covers


@pytest.mark.parametrize(
    ("entry", "host", "port", "scheme", "covered"),
    [
        ("pypi.org", "pypi.org", 443, "https", True),
        ("pypi.org", "pypi.org", 80, "https", False),
        ("pypi.org", "pypi.org", 80, "http", True),
        ("pypi.org", "pypi.org", 443, "http", False),
        ("pypi.org", "pypi.org", 8443, "https", False),
        ("pypi.org:8443", "pypi.org", 8443, "https", True),
        ("pypi.org:8443", "pypi.org", 443, "https", False),
        ("*.pythonhosted.org", "files.pythonhosted.org", 443, "https", True),
        ("*.pythonhosted.org", "a.b.pythonhosted.org", 443, "https", True),
        ("*.pythonhosted.org", "pythonhosted.org", 443, "https", False),
        ("*.pythonhosted.org", "evilpythonhosted.org", 443, "https", False),
        ("127.0.0.1:8443", "127.0.0.1", 8443, "https", True),
        ("[::1]:8443", "0:0::1", 8443, "https", True),
    ],
)
def test_hosts_and_ports(entry: str, host: str, port: int, scheme: str, covered: bool) -> None:
    grant = one(f'hosts = ["{entry}"]', 'via = ["shell"]', "plain_http = true")
    assert grant.covers(connect(host, port, scheme=scheme), NOW) is covered


def test_plain_http_needs_plain_http_true() -> None:
    request = connect("pypi.org", 80, scheme="http")
    assert not one(*PYPI).covers(request, NOW)
    assert one(*PYPI, "plain_http = true").covers(request, NOW)
    assert one(*PYPI).covers(connect("pypi.org", 443), NOW)


@pytest.mark.parametrize(
    ("via", "via_tool", "covered"),
    [
        ("shell", "shell", True),
        ("shell", "mcp.fetch.get", False),
        ("mcp.fetch.*", "mcp.fetch.get", True),
        ("mcp.fetch.*", "mcp.fetcher.get", False),
        ("mcp.*", "mcp.fetch.get", True),
        ("mcp.*", "shell", False),
        ("mcp.fetch.get", "mcp.fetch.get", True),
        ("mcp.fetch.get", "mcp.fetch.put", False),
    ],
)
def test_via_names_the_calling_tool_exactly_or_by_family(
    via: str, via_tool: str, covered: bool
) -> None:
    grant = one('hosts = ["pypi.org"]', f'via = ["{via}"]')
    command = "pip install x" if via_tool == "shell" else None
    assert grant.covers(connect(via_tool=via_tool, via_command=command), NOW) is covered


def test_commands_match_the_calling_shell_command() -> None:
    grant = one(*PYPI, 'commands = ["pip install *"]')
    assert grant.covers(connect(via_command="pip install attrs"), NOW)
    assert not grant.covers(connect(via_command="curl https://pypi.org"), NOW)
    assert not grant.covers(connect(via_command=None), NOW)
    assert one(*PYPI).covers(connect(via_command=None), NOW)


def test_expires_is_exclusive() -> None:
    grant = one(*PYPI, "expires = 2026-06-01T12:00:00Z")
    assert grant.covers(connect(), NOW - dt.timedelta(microseconds=1))
    assert not grant.covers(connect(), NOW)


def test_a_hand_built_grant_without_hosts_or_via_allows_nothing() -> None:
    assert not Grant("g", "connect", Mode.AUTO, via=("shell",)).covers(connect(), NOW)
    assert not Grant("g", "connect", Mode.AUTO, hosts=("pypi.org",)).covers(connect(), NOW)


def test_an_http_get_grant_never_covers_a_connect_nor_the_reverse() -> None:
    grants = parse_grants(
        '[[grant]]\nid = "web"\ntool = "http_get"\nmode = "auto"\nhosts = ["pypi.org"]\n'
    )
    assert isinstance(grants, GrantSet)
    assert grants.in_precedence("connect") == ()
    assert grants.matching("connect", connect(), NOW) == []
    net = parse_grants(table(*PYPI))
    assert isinstance(net, GrantSet)
    url = check_arguments("http_get", {"url": "https://pypi.org/"})
    assert isinstance(url, CheckedArguments)
    assert net.matching("http_get", url, NOW) == []
    assert [g.id for g in net.in_precedence("connect")] == ["net"]


# ---------------------------------------------------------------------------------------
# Deciding


def decide_connect(text: str, state: Label, checked: CheckedArguments | None = None) -> Any:
    grants = parse_grants(text)
    assert isinstance(grants, GrantSet)
    arguments = (checked or connect()).to_json()
    request = ToolRequest(call=CALL, session=SESSION, tool="connect", arguments=arguments)
    return evaluate(request, ledger_usable=True, grants=grants, state=state, now=NOW, internal=True)


def test_an_untrusted_session_gets_no_new_host_by_default() -> None:
    assert isinstance(decide_connect(table(*PYPI), FRESH), Run)
    denied = decide_connect(table(*PYPI), UNTRUSTED)
    assert isinstance(denied, Deny)
    assert denied.decision.reason is Reason.UNTRUSTED
    assert denied.decision.detail == (
        "the session is untrusted and grant net says if_untrusted = deny"
    )
    assert denied.decision.grant == "net"
    asked = decide_connect(table(*PYPI, 'if_untrusted = "ask"'), UNTRUSTED)
    assert isinstance(asked, Ask)
    assert asked.decision.verdict is VerdictCode.ASK
    assert isinstance(decide_connect(table(*PYPI, 'if_untrusted = "auto"'), UNTRUSTED), Run)


def test_no_grant_names_the_destination() -> None:
    denied = decide_connect(table(*PYPI), FRESH, connect("evil.example", 443))
    assert isinstance(denied, Deny)
    assert denied.decision.reason is Reason.NO_GRANT
    assert denied.decision.detail == "no grant allows connect on evil.example:443"
    assert denied.decision.arguments["host"] == "evil.example"


def test_a_deny_grant_wins() -> None:
    text = table(*PYPI) + table('hosts = ["pypi.org"]', 'via = ["shell"]', gid="no", mode="deny")
    denied = decide_connect(text, FRESH)
    assert isinstance(denied, Deny)
    assert denied.decision.reason is Reason.DENIED_BY_GRANT
    assert denied.decision.detail == "grant no denies connect on pypi.org:443"


# ---------------------------------------------------------------------------------------
# grants check's shadow analysis


def test_shadows_for_connect_looks_at_via_hosts_and_plain_http() -> None:
    wide = one('hosts = ["*.org"]', 'via = ["shell", "mcp.*"]', "plain_http = true")
    assert shadows(wide, one('hosts = ["a.org"]', 'via = ["mcp.f.*"]'), NOW)
    assert not shadows(one(*PYPI), one('hosts = ["pypi.org"]', 'via = ["mcp.f.*"]'), NOW)
    assert not shadows(one(*PYPI), one(*PYPI, "plain_http = true"), NOW)
    assert not shadows(one(*PYPI), one('hosts = ["evil.org"]', 'via = ["shell"]'), NOW)


def test_grants_check_warns_of_a_connect_pattern_that_chains() -> None:
    lint = lint_grants(table(*PYPI, 'commands = ["pip install *"]'), NOW)
    assert [(f.code, f.grant_id, f.key) for f in lint.findings] == [("chains", "net", "commands")]
    assert lint_grants(table(*PYPI, 'commands = ["pip install attrs"]'), NOW).findings == ()
