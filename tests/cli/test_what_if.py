"""``bxctl grants what-if``, in process: the text as the owner reads it (exact lines), the
JSON, --since and --session, --limit, --fail-on-change, and a candidate that does not
parse or cannot be read (exit 2)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from boxmaker.cli import what_if as what_if_module
from boxmaker.cli.app import app
from boxmaker.core.labels import Taint
from boxmaker.core.reasons import Reason
from boxmaker.ledger.records import Decision, Start
from boxmaker.ledger.writer import LedgerWriter

T0 = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)
BOOT = "b-" + "0" * 16
S1 = "s-" + "1" * 12
S2 = "s-" + "2" * 12

THEN = """\
[[grant]]
id = "read-notes"
tool = "read_file"
mode = "auto"
paths = ["notes/**"]

[[grant]]
id = "read-docs"
tool = "read_file"
mode = "ask"
paths = ["docs/**"]

[[grant]]
id = "git"
tool = "shell"
mode = "auto"
commands = ["git status*"]
"""

NOTES_AUTO = 'id = "read-notes"\ntool = "read_file"\nmode = "auto"'
CANDIDATE = (
    THEN.replace(NOTES_AUTO, NOTES_AUTO.replace("auto", "ask"))
    + """
[[grant]]
id = "make"
tool = "shell"
mode = "auto"
commands = ["make *"]

[[grant]]
id = "web"
tool = "http_get"
mode = "auto"
hosts = ["a.org"]
if_untrusted = "auto"
"""
)

# One minute apart from 12:01: (session, tool, arguments, verdict, reason, grant, taint, untrusted)
ROWS: list[tuple[str, str, dict[str, Any], str, Reason | None, str | None, str, bool]] = [
    (S1, "read_file", {"path": "notes/a.txt"}, "run", None, "read-notes", "public", False),
    (S1, "read_file", {"path": "docs/a.md"}, "ask", None, "read-docs", "public", False),
    (S2, "shell", {"command": "git status"}, "run", None, "git", "public", False),
    (S2, "read_file", {"path": "../x"}, "deny", Reason.BAD_ARGUMENTS, None, "public", False),
    (S1, "read_file", {"path": "notes/b.txt"}, "run", None, "read-notes", "internal", False),
    (S2, "http_get", {"url": "https://a.org/x"}, "deny", Reason.NO_GRANT, None, "public", True),
    (S2, "read_file", {"path": "notes/c.txt"}, "ask", None, "read-notes", "public", True),
]


def call_id(n: int) -> str:
    return f"c-{n:016x}"


def bxctl(*args: str) -> int:
    return int(app(list(args), result_action="return_value"))


def write_ledger(home: Path, rows: list[tuple[Any, ...]] = ROWS) -> None:
    """A new ledger of ``rows`` as decision records, the n-th (from 1) at 12:0n."""
    ledger = home / "ledger" / "audit.jsonl"
    ledger.unlink()
    times = iter([T0, T0] + [T0 + dt.timedelta(minutes=n + 1) for n in range(len(rows))])
    trio.run(_append, LedgerWriter.open(ledger, clock=lambda: next(times)), rows)


async def _append(writer: LedgerWriter, rows: list[tuple[Any, ...]]) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        await writer.append(Start(boot=BOOT, version="test"))
        for n, (session, tool, arguments, verdict, reason, grant, taint, untrusted) in enumerate(
            rows, start=1
        ):
            await writer.append(
                Decision(
                    call_id(n),
                    session,
                    tool,
                    arguments,
                    verdict,
                    reason,
                    grant,
                    Taint(taint),
                    untrusted,
                    BOOT,
                )
            )
        await writer.aclose()


@pytest.fixture
def home(tmp_path: Path) -> Path:
    root = tmp_path / "home"
    assert bxctl("init", "--home", str(root)) == 0
    (root / "grants.toml").write_text(THEN)
    write_ledger(root)
    return root


@pytest.fixture
def candidate(tmp_path: Path) -> Path:
    path = tmp_path / "candidate.toml"
    path.write_text(CANDIDATE)
    return path


def what_if(
    home: Path, candidate: Path, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, list[str]]:
    code, lines, _ = what_if_err(home, candidate, capsys, *args)
    return code, lines


def what_if_err(
    home: Path, candidate: Path, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, list[str], str]:
    """Exit code, stdout's lines and stderr."""
    capsys.readouterr()
    code = bxctl("grants", "what-if", str(candidate), *args, "--home", str(home))
    captured = capsys.readouterr()
    return code, captured.out.splitlines(), captured.err


def what_if_json(
    home: Path, candidate: Path, capsys: pytest.CaptureFixture[str], *args: str
) -> dict[str, Any]:
    code, lines = what_if(home, candidate, capsys, "--json", *args)
    assert code == 0
    return dict(orjson.loads("\n".join(lines)))


@pytest.mark.usefixtures("utc_owner")
def test_the_text_as_the_owner_reads_it(
    home: Path, candidate: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, lines = what_if(home, candidate, capsys)
    assert code == 0
    ledger = home / "ledger" / "audit.jsonl"
    assert lines == [
        f"what-if {candidate} (5 grants) against {ledger}",
        "replayed 6 decisions: 3 would change, 3 would not",
        "skipped 1 decision not made by grants (bad_arguments 1)",
        "",
        "read-notes → read-notes: 2 calls",
        f'  run → ask  2026-06-01 12:01:00  {call_id(1)}  {S1}  read_file {{"path":"notes/a.txt"}}',
        f'  run → ask  2026-06-01 12:05:00  {call_id(5)}  {S1}  read_file {{"path":"notes/b.txt"}}',
        "",
        "no grant → web: 1 call",
        f'  deny (no_grant) → run  2026-06-01 12:06:00  {call_id(6)}  {S2}  http_get {{"url":"https://a.org/x"}}',
        "",
        "candidate grants that would never have matched a recorded call:",
        "  make: shell auto",
    ]


@pytest.mark.usefixtures("utc_owner")
def test_the_same_grants_change_nothing(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = what_if(home, home / "grants.toml", capsys)
    assert code == 0
    assert lines[1:] == [
        "replayed 6 decisions: 0 would change, 6 would not",
        "skipped 1 decision not made by grants (bad_arguments 1)",
    ]
    assert bxctl("grants", "what-if", str(home / "grants.toml"), "--fail-on-change",
                 "--home", str(home)) == 0  # fmt: skip


def test_json_has_every_flip_with_both_decisions(
    home: Path, candidate: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    answer = what_if_json(home, candidate, capsys)
    assert {k: answer[k] for k in ("valid", "replayed", "changed", "unchanged", "skipped")} == {
        "valid": True,
        "replayed": 6,
        "changed": 3,
        "unchanged": 3,
        "skipped": {"not_by_grants": {"bad_arguments": 1}, "unreplayable": 0, "malformed": 0},
    }
    assert [(g["then"], g["now"], g["count"], g["left_out"]) for g in answer["groups"]] == [
        ("read-notes", "read-notes", 2, 0),
        (None, "web", 1, 0),
    ]
    assert answer["groups"][1]["calls"] == [
        {
            "seq": 7,
            "at": "2026-06-01T12:06:00.000Z",
            "call": call_id(6),
            "session": S2,
            "tool": "http_get",
            "arguments": {"url": "https://a.org/x"},
            "taint": "public",
            "untrusted": True,
            "then": {"verdict": "deny", "reason": "no_grant", "grant": None},
            "now": {"verdict": "run", "reason": None, "grant": "web", "detail": None},
        }
    ]
    assert answer["never_matched"] == [{"id": "make", "tool": "shell", "mode": "auto"}]
    assert answer["never_deciding"] == []


def test_fail_on_change_exits_1(
    home: Path, candidate: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _ = what_if(home, candidate, capsys, "--fail-on-change")
    assert code == 1


def test_since_and_session_select_the_decisions_replayed(
    home: Path,
    candidate: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def flipped(answer: dict[str, Any]) -> list[str]:
        return sorted(c["call"] for g in answer["groups"] for c in g["calls"])

    since = what_if_json(home, candidate, capsys, "--since", "2026-06-01T12:05:00Z")
    assert (since["since"], since["replayed"], flipped(since)) == (
        "2026-06-01T12:05:00.000Z",
        3,  # 12:05, 12:06, 12:07
        [call_id(5), call_id(6)],
    )
    session = what_if_json(home, candidate, capsys, "--session", S1)
    assert (session["session"], session["replayed"], flipped(session)) == (
        S1,
        3,
        [call_id(1), call_id(5)],
    )
    both = what_if_json(home, candidate, capsys, "--since", "2026-06-01T12:02:00Z",
                        "--session", S1)  # fmt: skip
    assert (both["replayed"], flipped(both)) == (2, [call_id(5)])
    # A duration is back from now: 12:10 now, 6m → from 12:04.
    monkeypatch.setattr(what_if_module, "utc_now", lambda: T0 + dt.timedelta(minutes=10))
    recent = what_if_json(home, candidate, capsys, "--since", "6m")
    assert (recent["since"], recent["replayed"]) == ("2026-06-01T12:04:00.000Z", 3)


@pytest.mark.usefixtures("utc_owner")
def test_limit_shows_that_many_calls_a_group_and_counts_the_rest(
    home: Path, candidate: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, lines = what_if(home, candidate, capsys, "--limit", "1")
    assert code == 0
    assert lines[4:7] == [
        "read-notes → read-notes: 2 calls",
        f'  run → ask  2026-06-01 12:01:00  {call_id(1)}  {S1}  read_file {{"path":"notes/a.txt"}}',
        "  … and 1 more (--limit 0 shows them all)",
    ]
    answer = what_if_json(home, candidate, capsys, "--limit", "1")
    assert [(len(g["calls"]), g["left_out"]) for g in answer["groups"]] == [(1, 1), (1, 0)]


@pytest.mark.usefixtures("utc_owner")
def test_a_verdict_changed_by_the_decision_itself_shows_its_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "home"
    assert bxctl("init", "--home", str(root)) == 0
    write_ledger(
        root,
        [(S1, "read_file", {"path": "notes/a.txt"}, "run", None, "read-notes", "secret", False)],
    )
    strict = tmp_path / "strict.toml"
    strict.write_text(
        THEN.replace('paths = ["notes/**"]', 'paths = ["notes/**"]\nmax_taint = "internal"')
    )
    code, lines = what_if(root, strict, capsys)
    assert code == 0
    assert lines[3:] == [
        "read-notes → read-notes: 1 call",
        f"  run → deny (taint_exceeded)  2026-06-01 12:01:00  {call_id(1)}  {S1}  "
        'read_file {"path":"notes/a.txt"}',
        "",
        "candidate grants that would never have matched a recorded call:",
        "  read-docs: read_file ask",
        "  git: shell auto",
    ]


@pytest.mark.usefixtures("utc_owner")
def test_a_grant_that_expired_since_counts_as_it_was_then(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "home"
    assert bxctl("init", "--home", str(root)) == 0
    ran = (S1, "read_file", {"path": "notes/a.txt"}, "run", None, "read-notes", "public", False)
    write_ledger(root, [ran, ran])  # at 12:01 and 12:02
    expiring = tmp_path / "expiring.toml"
    expires = 'paths = ["notes/**"]\nexpires = 2026-06-01T12:02:00Z'
    expiring.write_text(THEN.replace('paths = ["notes/**"]', expires))
    answer = what_if_json(root, expiring, capsys)
    [group] = answer["groups"]
    assert [c["call"] for c in group["calls"]] == [call_id(2)]
    assert group["calls"][0]["now"]["reason"] == "no_grant"


def test_a_candidate_that_does_not_parse_exits_2_with_its_problems(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[grant]]\nid = "x"\ntool = "read_file"\nmode = "sometimes"\n')
    code, lines = what_if(home, bad, capsys)
    assert code == 2
    assert lines == [
        "the candidate does not parse (1 problem(s)):",
        f"  {bad}, grant 'x', key 'mode': expected one of auto, ask, deny, got 'sometimes'",
    ]
    # Every problem, as `bxctl grants check` finds them, not only the first.
    worse = tmp_path / "worse.toml"
    worse.write_text('[[grant]]\nid = "x"\ntool = "red_file"\nmode = "sometimes"\n')
    code, lines = what_if(home, worse, capsys)
    assert code == 2
    assert lines[0] == "the candidate does not parse (2 problem(s)):"
    assert [line.split(": ", 1)[0] for line in lines[1:]] == [
        f"  {worse}, grant 'x', key 'tool'",
        f"  {worse}, grant 'x', key 'mode'",
    ]
    code, lines = what_if(home, bad, capsys, "--json")
    assert code == 2
    assert orjson.loads("\n".join(lines)) == {
        "valid": False,
        "candidate": str(bad),
        "problems": [
            {
                "grant": "x",
                "key": "mode",
                "problem": "expected one of auto, ask, deny, got 'sometimes'",
            }
        ],
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--since", "yesterday"), "--since takes a time"),
        (("--limit", "-1"), "--limit takes a number of calls"),
    ],
)
def test_usage_errors_exit_2(
    home: Path,
    candidate: Path,
    capsys: pytest.CaptureFixture[str],
    args: tuple[str, ...],
    message: str,
) -> None:
    code, _, err = what_if_err(home, candidate, capsys, *args)
    assert code == 2
    assert err.startswith(f"bxctl: {message}")


def test_an_unreadable_ledger_or_candidate_exits_2(
    home: Path, candidate: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    absent = tmp_path / "absent.toml"
    assert what_if_err(home, absent, capsys) == (
        2,
        [],
        f"bxctl: {absent}: No such file or directory\n",
    )
    ledger = home / "ledger" / "audit.jsonl"
    ledger.unlink()
    assert what_if_err(home, candidate, capsys) == (
        2,
        [],
        f"bxctl: {ledger}: No such file or directory\n",
    )
