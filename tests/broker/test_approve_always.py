"""``bxctl approve --always`` and ``bxctl grants revoke`` against the real brokerd in
process: the grant is written, brokerd decides with it from the very next call, the
approval record names it; revoke takes it away as promptly."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import orjson
import pytest
import trio
import trio.testing
from tests.harness.broker import (
    Brokerd,
    Client,
    admin,
    body,
    call,
    inline,
    records_of,
    tool_request,
)
from tests.harness.cli import bxctl_in_process as bxctl
from tests.harness.homes import grant, write_grants

from boxmaker.core import call_events as ev
from boxmaker.home.grants_edit import add_grant
from boxmaker.home.grants_file import load_grants
from boxmaker.home.paths import Home

pytestmark = pytest.mark.usefixtures("inline_threads")

Clock = trio.testing.MockClock
OWNERS_GRANTS = "# the owner's grants\n\n" + grant(
    "read-notes", "read_file", "ask", paths=["notes/**"], note="the owner's notes"
)


@pytest.fixture
def asking_home(home: Home) -> Home:
    (home.default_workspace / "notes").mkdir()
    (home.default_workspace / "notes" / "a.txt").write_text("alpha\n")
    (home.default_workspace / "notes" / "b.txt").write_text("beta\n")
    write_grants(home, OWNERS_GRANTS)
    return home


async def pending(home: Home, path: str) -> tuple[Client, dict[str, Any]]:
    client = await Client.open(home.broker_sock)
    frame = await client.ask(tool_request("read_file", {"path": path}))
    assert frame["kind"] == "pending", frame
    return client, frame


async def outcome(home: Home, path: str) -> tuple[str, str | None]:
    """One read_file call, answered at once: (decision verdict, grant)."""
    frame = tool_request("read_file", {"path": path})
    async with trio.open_nursery() as nursery:
        nursery.start_soon(call, home, frame)
        await trio.sleep(1)
        [decided] = [r for r in records_of(home, frame["call"]) if r["kind"] == "decision"]
        nursery.cancel_scope.cancel()
    return decided["verdict"], decided["grant"]


async def test_approve_always_writes_the_grant_and_the_next_call_runs_without_asking(
    asking_home: Home, brokerd: Brokerd, autojump_clock: Clock, capsys: pytest.CaptureFixture[str]
) -> None:
    home = asking_home
    broker = await brokerd.start()
    client, frame = await pending(home, "notes/a.txt")
    approval = frame["approval"]
    written = f"always-{approval}"
    assert await bxctl(home, "approve", approval, "--always", "--json") == 0
    answer = orjson.loads(capsys.readouterr().out)
    assert (answer["outcome"], answer["grant_written"]) == ("allowed", written)
    assert answer["ran"] == {"outcome": "ok", "reason": None, "detail": None}
    assert (await client.final())["content"] == "alpha\n"
    await client.aclose()

    # The file: the owner's bytes, then the grant.
    text = home.grants_toml.read_text(encoding="utf-8")
    assert text.startswith(OWNERS_GRANTS + "\n[[grant]]\n")
    assert f'id = "{written}"' in text
    assert 'paths = ["notes/a.txt"]' in text
    assert re.search(rf'note = "approved always by \S+ at .* for approval {approval} ', text)

    # The same call again: it runs on the new grant; another file of the directory asks.
    assert await outcome(home, "notes/a.txt") == ("run", written)
    assert await outcome(home, "notes/b.txt") == ("ask", "read-notes")
    await brokerd.stop()
    [record] = [r for r in records_of(home, frame["call"]) if r["kind"] == "approval"]
    assert body(record) == {
        "kind": "approval",
        "call": frame["call"],
        "approval": approval,
        "outcome": "allowed",
        "reason": None,
        "by": "owner",
        "taint": "public",
        "untrusted": False,
        "grant_written": written,
    }
    assert broker.table.entries() == []
    capsys.readouterr()
    assert await bxctl(home, "why", frame["call"]) == 0
    assert f"  approved always: grant {written} was written to grants.toml first\n" in (
        capsys.readouterr().out
    )


async def test_the_words_say_which_grant_was_written(
    asking_home: Home, brokerd: Brokerd, autojump_clock: Clock, capsys: pytest.CaptureFixture[str]
) -> None:
    home = asking_home
    await brokerd.start()
    client, frame = await pending(home, "notes/a.txt")
    approval = frame["approval"]
    assert await bxctl(home, "approve", approval, "--always", "--scope", "dir", "--for", "2h") == 0
    said = capsys.readouterr().out.strip()
    assert said == (
        f"approved {frame['call']}: read_file ran (ok); grant always-{approval} written: the "
        "same call runs without asking from now on (an untrusted session is still asked)"
    )
    await client.aclose()
    text = home.grants_toml.read_text(encoding="utf-8")
    assert 'paths = ["notes/*"]' in text
    assert re.search(r"\nexpires = \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\n", text)
    assert await outcome(home, "notes/b.txt") == ("run", f"always-{approval}")


async def test_a_grant_that_cannot_be_written_leaves_the_call_waiting(
    home: Home, brokerd: Brokerd, autojump_clock: Clock, capsys: pytest.CaptureFixture[str]
) -> None:
    (home.default_workspace / "a*b.txt").write_text("star\n")
    write_grants(home, grant("ask-all", "read_file", "ask"))
    broker = await brokerd.start()
    client, frame = await pending(home, "a*b.txt")
    approval = frame["approval"]
    before = home.grants_toml.read_bytes()
    assert await bxctl(home, "approve", approval, "--always") == 1
    assert capsys.readouterr().err.strip() == (
        "bxctl: grant_not_written: no grant written, the call still waits: the path has a "
        "'*', which a glob cannot name exactly; approve it once"
    )
    assert home.grants_toml.read_bytes() == before
    assert [entry.approval for entry in broker.table.entries()] == [approval]
    # Approved once, it runs.
    assert await bxctl(home, "approve", approval) == 0
    assert (await client.final())["content"] == "star\n"
    await client.aclose()


async def test_revoke_removes_the_grant_and_brokerd_stops_using_it_at_once(
    asking_home: Home, brokerd: Brokerd, autojump_clock: Clock, capsys: pytest.CaptureFixture[str]
) -> None:
    home = asking_home
    write_grants(
        home,
        OWNERS_GRANTS + "\n# notes may be written\n" + grant("write", "write_file", "auto"),
    )
    await brokerd.start()
    client, frame = await pending(home, "notes/a.txt")
    written = f"always-{frame['approval']}"
    assert await bxctl(home, "approve", frame["approval"], "--always") == 0
    await client.aclose()
    assert await outcome(home, "notes/a.txt") == ("run", written)
    capsys.readouterr()
    assert await bxctl(home, "grants", "revoke", written) == 0
    assert capsys.readouterr().out.strip() == (
        f"revoked grant {written} (read_file auto); brokerd decides with 2 grant(s) from now"
    )
    grants = load_grants(home.grants_toml)
    assert [g.id for g in grants.grants] == ["read-notes", "write"]  # type: ignore[union-attr]
    assert home.grants_toml.read_text(encoding="utf-8").startswith(
        OWNERS_GRANTS + "\n# notes may be written\n"
    )
    assert await outcome(home, "notes/a.txt") == ("ask", "read-notes")
    assert await bxctl(home, "grants", "revoke", written) == 1
    assert f"grants.toml has no grant '{written}'" in capsys.readouterr().err


async def test_revoke_works_while_brokerd_is_down(
    asking_home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    home = asking_home
    assert await bxctl(home, "grants", "revoke", "read-notes", "--json") == 0
    assert orjson.loads(capsys.readouterr().out) == {
        "revoked": "read-notes",
        "tool": "read_file",
        "mode": "ask",
        "brokerd": None,
        "brokerd_problem": None,
    }
    assert home.grants_toml.read_text(encoding="utf-8") == "# the owner's grants\n\n"


async def test_reload_grants_answers_what_brokerd_decides_with(
    asking_home: Home, brokerd: Brokerd, autojump_clock: Clock
) -> None:
    await brokerd.start()
    assert await admin(asking_home, {"kind": "reload_grants"}) == {
        "kind": "grants_reloaded",
        "valid": True,
        "grants": 1,
        "problem": None,
    }
    asking_home.grants_toml.write_text("[[grant]\n")
    answer = await admin(asking_home, {"kind": "reload_grants"})
    assert (answer["valid"], answer["grants"]) == (False, 0)
    assert "TOML syntax" in answer["problem"]


async def test_a_grant_written_for_an_entry_that_ended_meanwhile_is_removed_again(
    asking_home: Home,
    brokerd: Brokerd,
    autojump_clock: Clock,
    capsys: pytest.CaptureFixture[str],
) -> None:
    home = asking_home
    ends_meanwhile: list[str] = []

    async def to_thread(
        sync_fn: Callable[..., Any], *args: Any, abandon_on_cancel: bool = False
    ) -> Any:
        # brokerd's worker thread (its to_thread seam): once the grant is written, the
        # entry it was written for reaches its deadline.
        done = await inline(sync_fn, *args)
        if sync_fn is add_grant and ends_meanwhile:
            broker.pending.end(ends_meanwhile.pop(), ev.Expired())
        return done

    broker = await brokerd.start(to_thread=to_thread)
    client, frame = await pending(home, "notes/a.txt")
    approval = frame["approval"]
    ends_meanwhile.append(approval)
    assert await bxctl(home, "approve", approval, "--always") == 1
    assert ends_meanwhile == []
    assert capsys.readouterr().err.strip() == f"bxctl: expired: approval {approval} expired"
    assert home.grants_toml.read_text(encoding="utf-8") == OWNERS_GRANTS
    assert (await client.final())["reason"] == "expired"
    await client.aclose()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--for", "2h"], "bxctl: --for and --scope go with --always"),
        (["--scope", "dir"], "bxctl: --for and --scope go with --always"),
        (
            ["--always", "--for", "2hours"],
            "bxctl: --for: '2hours': expected a duration such as 30m, 2h, 7d (units s, m, h, d, w)",
        ),
        (["--always", "--for", "400d"], "bxctl: --for: at most 366 days"),
    ],
)
async def test_always_options_are_checked_before_brokerd_is_asked(
    home: Home, capsys: pytest.CaptureFixture[str], args: list[str], said: str
) -> None:
    assert await bxctl(home, "approve", "a-00000001", *args) == 2
    assert capsys.readouterr().err.strip() == said
