"""Links inside the workspace must not stretch a path grant or launder a label.

The attack: grants allow the file tools on ``pub/**`` only, ``[labels]`` makes
``secrets/**`` secret, and links inside the workspace point from ``pub/`` into
``secrets/`` — a symlink to the file, a symlink to the directory (in the middle of a
path, or listed itself), and a hard link to the file. Before the fix each of them read,
listed or overwrote ``secrets/``, and the hard link even read as internal. Each call is
replayed against the real brokerd (serve_broker on its real sockets, in process), and
each refusal is checked by its exact reason, its result record, and ``secrets/key``
unchanged; the calls the grants do allow still work.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Final

import pytest
from tests.harness.broker import (
    PENDING_TIMEOUT,
    SESSION,
    Brokerd,
    call,
    records_of,
    tool_request,
)
from tests.harness.homes import grant, read_state_file, write_config, write_grants

from boxmaker.home.paths import Home

SECRET_TEXT: Final = "TOPSECRET\n"
GUARD: Final = 60.0
PUB_GRANTS: Final = (
    grant("read-pub", "read_file", "auto", paths=["pub/**"])
    + grant("list-pub", "list_dir", "auto", paths=["pub/**"])
    + grant("write-pub", "write_file", "auto", paths=["pub/**"])
)


def plant(home: Home) -> Path:
    """The workspace of the attack; returns secrets/key."""
    write_config(
        home, f'[broker]\npending_timeout = {PENDING_TIMEOUT}\n[labels]\nsecret = ["secrets/**"]\n'
    )
    workspace = home.default_workspace
    (workspace / "secrets").mkdir()
    key = workspace / "secrets" / "key"
    key.write_text(SECRET_TEXT, encoding="utf-8")
    pub = workspace / "pub"
    pub.mkdir()
    (pub / "readme.txt").write_text("hello\n", encoding="utf-8")
    (pub / "k").symlink_to("../secrets/key")
    (pub / "s").symlink_to("../secrets")
    (pub / "alias").symlink_to("readme.txt")
    os.link(key, pub / "hard")
    return key


async def answer_and_result(
    home: Home, tool: str, arguments: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The final answer of one call, and its result record."""
    frame = tool_request(tool, arguments)
    frames = await call(home, frame)
    answer = frames[-1]
    results = [r for r in records_of(home, frame["call"]) if r["kind"] == "result"]
    assert len(results) == 1, records_of(home, frame["call"])
    return answer, results[0]


@pytest.mark.parametrize(
    ("tool", "arguments", "grant_id"),
    [
        pytest.param("read_file", {"path": "pub/k"}, "read-pub", id="symlink-to-file"),
        pytest.param("read_file", {"path": "pub/s/key"}, "read-pub", id="symlink-mid-path"),
        pytest.param("read_file", {"path": "pub/hard"}, "read-pub", id="hard-link"),
        pytest.param("list_dir", {"path": "pub/s"}, "list-pub", id="list-through-link"),
        pytest.param(
            "write_file", {"path": "pub/s/key", "content": "x"}, "write-pub", id="overwrite"
        ),
        pytest.param("write_file", {"path": "pub/s/new", "content": "x"}, "write-pub", id="create"),
    ],
)
async def test_a_link_out_of_a_path_grant_is_refused(
    home: Home, brokerd: Brokerd, tool: str, arguments: dict[str, Any], grant_id: str
) -> None:
    key = plant(home)
    write_grants(home, PUB_GRANTS)
    await brokerd.start()
    answer, result = await answer_and_result(home, tool, arguments)
    await brokerd.stop()
    assert (answer["outcome"], answer.get("reason")) == ("failed", "path_escape"), answer
    assert f"grant {grant_id}" in answer["detail"], answer
    assert "content" not in answer
    assert (result["status"], result["reason"]) == ("failed", "path_escape"), result
    assert result["output_bytes"] == 0
    # Nothing secret was read, listed or written: the session never rose to secret.
    assert result["label"] == {
        "taint": "internal" if tool != "write_file" else "public",
        "untrusted": False,
    }
    assert result["taint_after"] != "secret"
    assert key.read_text(encoding="utf-8") == SECRET_TEXT
    assert sorted(os.listdir(key.parent)) == ["key"]


async def test_what_the_grant_covers_still_works(home: Home, brokerd: Brokerd) -> None:
    plant(home)
    write_grants(home, PUB_GRANTS)
    await brokerd.start()
    answer, result = await answer_and_result(home, "read_file", {"path": "pub/readme.txt"})
    assert (answer["outcome"], answer["content"]) == ("ok", "hello\n"), answer
    assert result["label"] == {"taint": "internal", "untrusted": False}
    # A symlink that stays inside the grant is followed, as before.
    answer, _ = await answer_and_result(home, "read_file", {"path": "pub/alias"})
    assert (answer["outcome"], answer["content"]) == ("ok", "hello\n"), answer
    answer, _ = await answer_and_result(home, "list_dir", {"path": "pub"})
    assert answer["outcome"] == "ok", answer
    assert answer["content"].split("\n") == ["alias@", "hard", "k@", "readme.txt", "s@"]
    answer, _ = await answer_and_result(
        home, "write_file", {"path": "pub/new.txt", "content": "new"}
    )
    assert answer["outcome"] == "ok", answer
    await brokerd.stop()
    assert (home.default_workspace / "pub" / "new.txt").read_text(encoding="utf-8") == "new"


async def test_a_hard_link_read_by_opt_in_raises_the_session_to_secret(
    home: Home, brokerd: Brokerd
) -> None:
    key = plant(home)
    write_grants(
        home,
        grant("read-pub", "read_file", "auto", paths=["pub/**"]).replace(
            'mode = "auto"', 'mode = "auto"\nhard_links = true'
        ),
    )
    await brokerd.start()
    answer, result = await answer_and_result(home, "read_file", {"path": "pub/hard"})
    await brokerd.stop()
    assert (answer["outcome"], answer["content"]) == ("ok", SECRET_TEXT), answer
    # Its other names are unknown: the highest label [labels] can give.
    top = {"taint": "secret", "untrusted": True}
    assert answer["label"] == top
    assert result["label"] == top
    assert (result["taint_after"], result["untrusted_after"]) == ("secret", True)
    assert read_state_file(home, SESSION) == {"v": 1, "taint": "secret", "untrusted": True}
    assert key.read_text(encoding="utf-8") == SECRET_TEXT
