"""``bxctl grants list / test / check`` against a real home and a ledger the real brokerd
wrote (in process), as the owner sees them; ``grants test`` agrees with brokerd's own
decision on generated calls."""

from __future__ import annotations

import contextlib
import datetime as dt
import re
import tempfile
from typing import Any

import orjson
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.harness.broker import (
    SESSION,
    Brokerd,
    Client,
    call,
    inline,
    records,
    records_of,
    running,
    tool_request,
)
from tests.harness.cli import bxctl_in_process
from tests.harness.homes import grant, short_home, write_grants, write_state

from boxmaker.cli.app import app
from boxmaker.formats.clock import local_time, parse_utc, utc_now
from boxmaker.home.paths import Home

pytestmark = pytest.mark.usefixtures("inline_threads")


def bxctl(home: Home, *args: str) -> int:
    return int(app([*args, "--home", str(home.root)], result_action="return_value"))


def relative_times_hidden(text: str) -> str:
    """The owner's screen with each "(2m 10s ago)" / "(in 4m)" / "(now)" as "(T)": the
    only part that moves between the command and the assertion."""
    return re.sub(r"\((?:in )?(?:\d+h )?(?:\d+m )?\d+s(?: ago)?\)|\(now\)", "(T)", text)


def shown_at(moment: dt.datetime) -> str:
    return relative_times_hidden(local_time(moment, utc_now()))


async def ask_and_leave(home: Home, frame: dict[str, Any]) -> dict[str, Any]:
    """An ask: its pending frame, then the requester leaves (the call is withdrawn)."""
    client = await Client.open(home.broker_sock)
    await client.send(frame)
    pending = await client.final()
    await client.aclose()
    return pending


# ---------------------------------------------------------------------------------------
# list

LIST_GRANTS = (
    "# the owner's grants\n"
    + grant("read-notes", "read_file", "ask", paths=["notes.txt", "notes/**"], note="my notes")
    + 'max_taint = "internal"\n\n'
    + grant("readme", "read_file", "auto", paths=["README.md"])
    + "\n"
    + grant("no-env", "read_file", "deny", paths=["**/.env"])
    + "\n"
    + grant("git", "shell", "ask", commands=["git status"])
    + 'label_taint = "secret"\n'
    + "\n"
    + grant("old", "list_dir", "auto")
    + "expires = 2026-01-01T00:00:00Z\n"
    + grant("docs", "http_get", "ask", hosts=["docs.python.org"])
)


async def test_list_shows_every_grant_its_bounds_expiry_and_use(
    home: Home, brokerd: Brokerd, capsys: pytest.CaptureFixture[str]
) -> None:
    write_grants(home, LIST_GRANTS)
    (home.default_workspace / "README.md").write_text("read me\n")
    await brokerd.start()
    readme = [tool_request("read_file", {"path": "README.md"}) for _ in range(2)]
    for frame in readme:
        assert (await call(home, frame))[0]["outcome"] == "ok"
    env = tool_request("read_file", {"path": "app/.env"})
    assert (await call(home, env))[0]["reason"] == "denied_by_grant"
    assert (await call(home, tool_request("read_file", {"path": "x"})))[0]["reason"] == "no_grant"
    notes = tool_request("read_file", {"path": "notes.txt"})
    assert (await ask_and_leave(home, notes))["kind"] == "pending"
    await brokerd.stop()

    def last(frame: dict[str, Any]) -> str:
        (decision,) = [r for r in records_of(home, frame["call"]) if r["kind"] == "decision"]
        return f"last {shown_at(parse_utc(decision['at']))} ({frame['call']})"

    capsys.readouterr()
    assert bxctl(home, "grants", "list") == 0
    out = relative_times_hidden(capsys.readouterr().out)
    expired = shown_at(dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    assert out.splitlines() == [
        f"{home.grants_toml}: 6 grant(s); use counted in {home.audit_log} "
        f"({len(records(home))} records)",
        "read-notes  read_file  ask",
        "    paths: notes.txt, notes/**",
        "    max_taint: internal, if_untrusted: ask",
        f"    decided 1 call(s) (ask 1), {last(notes)}",
        "    note: my notes",
        "readme  read_file  auto",
        "    paths: README.md",
        "    max_taint: secret, if_untrusted: ask",
        f"    decided 2 call(s) (run 2), {last(readme[1])}",
        "no-env  read_file  deny",
        "    paths: **/.env",
        "    max_taint: secret, if_untrusted: ask",
        f"    decided 1 call(s) (deny 1), {last(env)}",
        "git  shell  ask",
        "    commands: git status",
        "    max_taint: secret, if_untrusted: ask, label_taint: secret",
        "    never used: no call in the ledger was decided by it",
        "old  list_dir  auto",
        "    paths: (every path)",
        "    max_taint: secret, if_untrusted: ask",
        f"    expired {expired}",
        "    never used: no call in the ledger was decided by it",
        "docs  http_get  ask",
        "    hosts: docs.python.org",
        "    max_taint: secret, if_untrusted: ask",
        "    never used: no call in the ledger was decided by it",
    ]

    assert bxctl(home, "grants", "list", "--json") == 0
    listed = orjson.loads(capsys.readouterr().out)
    by_id = {g["id"]: g for g in listed["grants"]}
    assert by_id["readme"] | {"last_decided": None} == {
        "id": "readme",
        "tool": "read_file",
        "mode": "auto",
        "paths": ["README.md"],
        "commands": None,
        "hosts": None,
        "via": None,
        "plain_http": None,
        "max_taint": "secret",
        "if_untrusted": "ask",
        "label_taint": None,
        "hard_links": False,
        "expires": None,
        "expired": False,
        "note": None,
        "line": 10,
        "decisions": 2,
        "verdicts": {"run": 2},
        "last_decided": None,
        "last_call": readme[1]["call"],
        "never_used": False,
    }
    assert (by_id["old"]["expires"], by_id["old"]["expired"]) == ("2026-01-01T00:00:00.000Z", True)
    assert [g["id"] for g in listed["grants"] if g["never_used"]] == ["git", "old", "docs"]


def test_list_of_an_invalid_file_points_at_check(
    home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    write_grants(home, grant("a", "read_file", "sometimes"))
    assert bxctl(home, "grants", "list") == 1
    assert capsys.readouterr().err == (
        f"bxctl: grants.toml is invalid: {home.grants_toml}, grant 'a', key 'mode': expected "
        "one of auto, ask, deny, got 'sometimes'; run `bxctl grants check`\n"
    )


# ---------------------------------------------------------------------------------------
# test


@pytest.mark.usefixtures("shell_workspace")
def test_test_says_the_verdict_grant_reason_and_state(
    home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    write_grants(home, "# notes\n" + LIST_GRANTS)
    write_state(home, SESSION, "secret", untrusted=True)
    assert bxctl(home, "grants", "test", "read_file", '{"path": "./notes.txt"}') == 0
    assert capsys.readouterr().out.splitlines() == [
        "verdict: ask",
        "reason: none",
        f"grant: read-notes ({home.grants_toml}, line 3)",
        "    [[grant]]",
        '    id = "read-notes"',
        '    tool = "read_file"',
        '    mode = "ask"',
        '    paths = ["notes.txt","notes/**"]',
        '    note = "my notes"',
        '    max_taint = "internal"',
        "state: taint public, trusted (a new session: no --session given)",
    ]
    args = ("grants", "test", "read_file", '{"path": "notes.txt"}', "--session", SESSION)
    assert bxctl(home, *args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:3] == [
        "verdict: deny",
        "reason: taint_exceeded",
        "detail: the session's taint secret is above grant read-notes's max_taint internal",
    ]
    assert out[-1] == f"state: taint secret, untrusted (session {SESSION})"
    assert bxctl(home, "grants", "test", "shell", '{"command": "git status"}', "--json") == 0
    assert orjson.loads(capsys.readouterr().out) == {
        "tool": "shell",
        "arguments": {"command": "git status"},
        "session": None,
        "verdict": "ask",
        "reason": None,
        "detail": None,
        "grant": "git",
        "mode": "ask",
        "grant_line": 23,
        "grant_text": '[[grant]]\nid = "git"\ntool = "shell"\nmode = "ask"\n'
        'commands = ["git status"]\nlabel_taint = "secret"',
        "taint": "public",
        "untrusted": False,
        "state_problem": None,
        "network_grants": [],
    }
    assert bxctl(home, "grants", "test", "read_file", '{"path": "other"}') == 0
    assert capsys.readouterr().out.splitlines()[:4] == [
        "verdict: deny",
        "reason: no_grant",
        "detail: no grant allows read_file on other",
        "grant: none",
    ]


def test_test_decides_external_tools_by_their_family_grants(
    home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    write_grants(
        home,
        grant("no-push", "mcp.git.git_push", "deny")
        + grant("git", "mcp.git.*", "auto")
        + grant("bash", "claude.Bash", "ask"),
    )
    assert bxctl(home, "grants", "test", "mcp.git.git_log", '{"repo_path": "/w"}', "--json") == 0
    decided = orjson.loads(capsys.readouterr().out)
    assert (decided["verdict"], decided["grant"], decided["arguments"]) == (
        "run",
        "git",
        {"repo_path": "/w"},
    )
    assert bxctl(home, "grants", "test", "mcp.git.git_push", "{}") == 0
    assert capsys.readouterr().out.splitlines()[:3] == [
        "verdict: deny",
        "reason: denied_by_grant",
        "detail: grant no-push denies mcp.git.git_push on {}",
    ]
    assert bxctl(home, "grants", "test", "claude.Bash", '{"command": "ls"}') == 0
    assert capsys.readouterr().out.splitlines()[0] == "verdict: ask"
    assert bxctl(home, "grants", "test", "claude.", "{}") == 2
    assert capsys.readouterr().err == "bxctl: unknown_tool: unknown tool 'claude.'\n"


@pytest.mark.parametrize(
    ("tool", "arguments", "message"),
    [
        ("rm", "{}", "unknown_tool: unknown tool 'rm'"),
        ("read_file", "{path:", None),
        ("read_file", '{"pth": "a"}', "bad_arguments: unknown argument 'pth'"),
        (
            "read_file",
            '{"path": "../a"}',
            "bad_arguments: argument 'path': '..' leaves the workspace",
        ),
        ("read_file", '["a"]', "bad_arguments: arguments must be a JSON object"),
    ],
)
def test_test_refuses_what_is_not_a_call_with_exit_2(
    home: Home, capsys: pytest.CaptureFixture[str], tool: str, arguments: str, message: str | None
) -> None:
    assert bxctl(home, "grants", "test", tool, arguments) == 2
    err = capsys.readouterr().err
    if message is None:
        assert err.startswith("bxctl: the arguments are not JSON: ")
    else:
        assert err == f"bxctl: {message}\n"


# --- the property: grants test decides as brokerd does ---------------------------------

GRANT_POOL = [
    grant("r-notes", "read_file", "ask", paths=["notes/**"]) + 'max_taint = "internal"\n',
    grant("r-auto", "read_file", "auto", paths=["*.md", "docs/**"]) + 'if_untrusted = "deny"\n',
    grant("r-deny", "read_file", "deny", paths=["**/.env", "notes/secret*"]),
    grant("r-old", "read_file", "auto") + "expires = 2026-01-01T00:00:00Z\n",
    grant("r-later", "read_file", "ask", paths=["**"]) + "expires = 2099-01-01T00:00:00Z\n",
    grant("l-all", "list_dir", "auto") + 'if_untrusted = "auto"\n',
    grant("w-out", "write_file", "ask", paths=["out/**", "gone/**"]),
    grant("w-auto", "write_file", "auto", paths=["out/auto.txt"]),
    grant("sh-git", "shell", "ask", commands=["git status", "git log*"]),
    grant("sh-no", "shell", "deny", commands=["rm *"]) + 'max_taint = "public"\n',
    grant("web", "http_get", "ask", hosts=["docs.python.org", "*.example.com"]),
]

CALLS = st.sampled_from(
    [
        ("read_file", {"path": "notes/a.txt"}),
        ("read_file", {"path": "README.md"}),
        ("read_file", {"path": "docs/x/y.md"}),
        ("read_file", {"path": "app/.env"}),
        ("read_file", {"path": "notes/secret.txt"}),
        ("read_file", {"path": "./notes/../other.txt"}),
        ("read_file", {"path": "../escape"}),
        ("read_file", {"path": "a", "max_bytes": 0}),
        ("list_dir", {"path": "."}),
        ("write_file", {"path": "out/a.txt", "content": "x"}),
        ("write_file", {"path": "out/auto.txt", "content": "x"}),
        ("write_file", {"path": "gone/a.txt", "content": "x"}),
        ("shell", {"command": "git status"}),
        ("shell", {"command": "git log; rm -rf /"}),
        ("shell", {"command": "rm -rf x"}),
        ("shell", {"command": "ls"}),
        ("http_get", {"url": "https://docs.python.org/3/"}),
        ("http_get", {"url": "https://a.example.com/"}),
        ("http_get", {"url": "https://example.com/"}),
        ("http_get", {"url": "ftp://example.com/"}),
        ("rm_rf", {"path": "."}),
    ]
)


async def decided_by_grants_test(
    home: Home, tool: str, arguments: dict[str, Any]
) -> dict[str, Any]:
    """``bxctl grants test --json``'s decision, or the catalogue's refusal (exit 2)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            args = ("grants", "test", tool, orjson.dumps(arguments).decode(), "--session", SESSION)
            code = await bxctl_in_process(home, *args, "--json")
        out.seek(0)
        err.seek(0)
        if code == 2:
            return {"refused": err.read()}
        assert code == 0, err.read()
        return dict(orjson.loads(out.read()))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pool=st.lists(st.sampled_from(GRANT_POOL), unique=True, max_size=6),
    taint=st.sampled_from(["public", "internal", "secret"]),
    untrusted=st.booleans(),
    calls=st.lists(CALLS, min_size=1, max_size=4),
)
async def test_grants_test_agrees_with_brokerd(
    pool: list[str], taint: str, untrusted: bool, calls: list[tuple[str, dict[str, Any]]]
) -> None:
    with short_home("bx-gt-") as home:
        write_grants(home, "\n".join(pool))
        (home.default_workspace / "out").mkdir()
        write_state(home, SESSION, taint, untrusted)
        with trio.fail_after(30):
            async with running(home, to_thread=inline):
                for tool, arguments in calls:
                    write_state(home, SESSION, taint, untrusted)
                    predicted = await decided_by_grants_test(home, tool, arguments)
                    frame = tool_request(tool, arguments)
                    client = await Client.open(home.broker_sock)
                    await client.send(frame)
                    first = await client.final()
                    await client.aclose()
                    (decision,) = [
                        r for r in records_of(home, frame["call"]) if r["kind"] == "decision"
                    ]
                    if "refused" in predicted:
                        detail = first["detail"]
                        assert predicted["refused"] == f"bxctl: {decision['reason']}: {detail}\n"
                        continue
                    seen = {k: decision[k] for k in ("verdict", "reason", "grant", "taint")}
                    said = {k: predicted[k] for k in ("verdict", "reason", "grant", "taint")}
                    assert said == seen, (tool, arguments)
                    assert predicted["untrusted"] == decision["untrusted"]
                    if first.get("outcome") == "denied":
                        assert predicted["detail"] == first["detail"]


# ---------------------------------------------------------------------------------------
# check

SEVERAL_PROBLEMS = """\
# the owner's grants
[[grant]]
id = "notes"
tool = "read_file"
mode = "ask"
path = ["notes/**"]

[[grant]]
id = "run-git"
tool = "shel"
mode = "auot"

[[grant]]
id = "notes"
tool = "shell"
mode = "auto"
paths = ["x"]
"""


def test_check_reports_every_problem_with_its_line(
    home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    write_grants(home, SEVERAL_PROBLEMS)
    assert bxctl(home, "grants", "check") == 1
    file = home.grants_toml
    assert capsys.readouterr().out.splitlines() == [
        f"{file}:6: grant 'notes', key 'path': unknown key (did you mean 'paths'?)",
        f"{file}:10: grant 'run-git', key 'tool': expected one of read_file, list_dir, "
        "write_file, shell, http_get, connect, got 'shel' (did you mean 'shell'?)",
        f"{file}:11: grant 'run-git', key 'mode': expected one of auto, ask, deny, got 'auot' "
        "(did you mean 'auto'?)",
        f"{file}:14: grant 'notes', key 'id': duplicate id",
        f"{file}:17: grant 'notes', key 'paths': does not apply to tool shell",
        "invalid: 5 problem(s); brokerd denies every call grants_invalid until they are fixed; "
        "see docs/runbook.md#grants",
    ]
    assert bxctl(home, "grants", "check", "--json") == 1
    report = orjson.loads(capsys.readouterr().out)
    assert (report["valid"], report["grant"], report["key"]) == (False, "notes", "path")
    assert report["problems"][1] == {
        "line": 10,
        "grant": "run-git",
        "key": "tool",
        "code": "invalid",
        "message": (
            "expected one of read_file, list_dir, write_file, shell, http_get, connect, got 'shel'"
        ),
        "suggestion": "shell",
    }
    assert [p["line"] for p in report["problems"]] == [6, 10, 11, 14, 17]


WARNED = (
    grant("notes", "read_file", "ask", paths=["notes/**"])
    + grant("notes-md", "read_file", "ask", paths=["notes/*.md"])
    + grant("git", "shell", "auto", commands=["git status", "git diff*"])
)


def test_check_warns_of_shadowed_grants_and_chaining_patterns(
    home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    write_grants(home, WARNED)
    assert bxctl(home, "grants", "check") == 0
    file = home.grants_toml
    assert capsys.readouterr().out.splitlines() == [
        f"{file}: valid, 3 grant(s)",
        "  notes: read_file ask",
        "  notes-md: read_file ask",
        "  git: shell auto",
        f"warning: {file}:6: grant 'notes-md': never decides a call: grant 'notes' (line 1), "
        "an earlier grant of the same mode, is tried first and matches every call this one "
        "matches",
        f"warning: {file}:15: grant 'git', key 'commands': 'git diff*' also matches a command "
        "line that runs another command (its wildcard matches ';', '&&', '|', '$(' and "
        "backticks), e.g. 'git diff; other-command'; prefer exact command lines, or "
        'mode = "ask"',
        "2 warning(s); see docs/runbook.md#grants-warnings",
    ]
    assert bxctl(home, "grants", "check", "--strict") == 1
    capsys.readouterr()
    write_grants(home, WARNED.replace("git diff*", "git diff"))
    write_grants(home, WARNED.replace("git diff*", "git diff").replace("notes/*.md", "docs/*"))
    assert bxctl(home, "grants", "check", "--strict") == 0
    assert "warning" not in capsys.readouterr().out


def test_check_of_a_missing_file_has_no_line(
    home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    home.grants_toml.unlink()
    assert bxctl(home, "grants", "check") == 1
    assert capsys.readouterr().out.splitlines()[0] == (
        f"{home.grants_toml}: no such file (`bxctl init` creates it)"
    )
