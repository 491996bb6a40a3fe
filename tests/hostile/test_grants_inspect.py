"""``bxctl grants list / test / check`` show text that others chose: a grant's patterns
and note (approve-always writes the model's path or command line into grants.toml), the
keys and values of a broken file, and the ledger's fields (a tampered line). None of it
may drive the owner's terminal or forge a line of output: it is shown escaped, not
dropped."""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest
from tests.harness.cli import bxctl
from tests.harness.homes import short_home, write_grants
from tests.hostile.test_terminal import HOSTILE, unsafe_in

from boxmaker.core.labels import Taint
from boxmaker.core.vocabulary import Decision, VerdictCode
from boxmaker.home.paths import Home
from boxmaker.ledger.records import encode_line

ESCAPED = "\\u001b]2;PWNED\\u0007\\u001b[2J\\u202e"
"""HOSTILE's start as printable shows it."""


def toml_string(text: str) -> str:
    """A TOML basic string: JSON's escapes, and DEL escaped too (TOML forbids it raw)."""
    return orjson.dumps(text).decode().replace("\x7f", "\\u007f")


@pytest.fixture
def home() -> Iterator[Home]:
    with short_home("bx-gi-") as home:
        bxctl(home, "init")
        yield home


def test_a_hostile_grants_file_and_ledger_line_are_shown_escaped(home: Home) -> None:
    write_grants(
        home,
        "[[grant]]\n"
        'id = "model-wrote"\n'
        'tool = "shell"\n'
        'mode = "auto"\n'
        f"commands = [{toml_string(HOSTILE + '*')}]\n"
        f"note = {toml_string(HOSTILE)}\n"
        "[[grant]]\n"
        'id = "read-it"\n'
        'tool = "read_file"\n'
        'mode = "ask"\n'
        f"paths = [{toml_string('notes/' + HOSTILE)}]\n",
    )
    # A tampered decision, well formed but for its call id (the reader takes any text:
    # an id is checked where a call begins, not where it is read back); and one whose
    # time is the hostile text, which the reader does not take for a decision at all.
    body = Decision(
        HOSTILE, "s-1", "read_file", {}, VerdictCode.ASK, None, "read-it", Taint.PUBLIC, False, "b"
    )
    with home.audit_log.open("ab") as ledger:
        ledger.write(encode_line(1, "2026-01-02T03:04:05.678Z", "00", body) + b"\n")
        ledger.write(encode_line(2, HOSTILE, "00", body) + b"\n")
    shown = {
        "list": bxctl(home, "grants", "list").stdout,
        "list --json": bxctl(home, "grants", "list", "--json").stdout,
        "check": bxctl(home, "grants", "check").stdout,
        "check --json": bxctl(home, "grants", "check", "--json").stdout,
        "test": bxctl(
            home, "grants", "test", "shell", orjson.dumps({"command": HOSTILE}).decode()
        ).stdout,
        "test --json": bxctl(
            home, "grants", "test", "shell", orjson.dumps({"command": HOSTILE}).decode(), "--json"
        ).stdout,
    }
    assert f"    note: {ESCAPED}" in shown["list"]
    assert f"    commands: {ESCAPED}" in shown["list"]
    assert "decided 1 call(s) (ask 1), last " in shown["list"]
    assert f" ({ESCAPED}" in shown["list"]
    assert "'\\x1b]2;PWNED\\x07\\x1b[2J\\u202e" in shown["check"]
    assert ESCAPED in shown["test"]
    found = [problem for where, text in shown.items() for problem in unsafe_in(where, text)]
    assert found == [], "\n".join(found)


def test_a_hostile_invalid_file_is_shown_escaped(home: Home) -> None:
    write_grants(
        home,
        "[[grant]]\n"
        'id = "bad"\n'
        f"tool = {toml_string(HOSTILE)}\n"
        'mode = "auto"\n'
        f"{toml_string(HOSTILE)} = 1\n",
    )
    shown = {
        "check": bxctl(home, "grants", "check", check=False),
        "check --json": bxctl(home, "grants", "check", "--json", check=False),
        "list": bxctl(home, "grants", "list", check=False),
        "test": bxctl(home, "grants", "test", "read_file", '{"path": "a"}', check=False),
    }
    assert [done.returncode for done in shown.values()] == [1, 1, 1, 0]
    text = {where: done.stdout + done.stderr for where, done in shown.items()}
    assert "key '\\x1b]2;PWNED\\x07" in text["check"]
    found = [problem for where, out in text.items() for problem in unsafe_in(where, out)]
    assert found == [], "\n".join(found)
