"""tools/check_docs.py's check of the call's table: the docstring's drawing and
docs/protocol.md's copy must name exactly the table's data (core/call_table.py TRANSITIONS);
a copy that drifts, in a next phase, a row or an event, fails the check."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from boxmaker.core import call_table

TOOLS = Path(__file__).resolve().parent.parent / "tools"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_docs", TOOLS / "check_docs.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_docs"] = module
    spec.loader.exec_module(module)
    return module


check_docs = _load()
DOCSTRING = (call_table.__doc__ or "").splitlines()
PROTOCOL = (TOOLS.parent / "docs" / "protocol.md").read_text(encoding="utf-8").splitlines()
WHERE = "the drawing"


def problems(lines: list[str]) -> list[str]:
    drawn = check_docs.drawn_table(lines)
    result: list[str] = check_docs.table_problems(WHERE, drawn, check_docs.transitions())
    return result


def replaced(lines: list[str], old: str, new: str) -> list[str]:
    """``lines`` with the one line containing ``old`` changed to hold ``new`` instead."""
    [where] = [number for number, line in enumerate(lines) if old in line]
    return [*lines[:where], lines[where].replace(old, new), *lines[where + 1 :]]


def without(lines: list[str], old: str) -> list[str]:
    [where] = [number for number, line in enumerate(lines) if old in line]
    return [*lines[:where], *lines[where + 1 :]]


def test_both_drawings_are_the_table() -> None:
    assert check_docs.call_table_problems() == []
    data = check_docs.transitions()
    assert len(data) == 25
    assert check_docs.drawn_table(DOCSTRING) == data
    assert check_docs.drawn_table(PROTOCOL) == data


def test_the_data_names_the_six_rows_that_choose_their_next_phase() -> None:
    chosen = {key: going for key, going in check_docs.transitions().items() if len(going) > 1}
    assert chosen == {
        ("IDLE", "Decided"): {"DONE", "DECISION"},
        ("DECISION", "Recorded"): {"DONE", "LOOK_RUN", "ENQUEUE"},
        ("ENQUEUE", "Enqueued"): {"WAITING", "ENDING"},
        ("WAITING", "OwnerApproved"): {"APPROVAL", "LOOK_APPROVAL"},
        ("APPROVAL", "Recorded"): {"DONE", "RUNNING"},
        ("LOOK_RUN", "Looked"): {"RUNNING", "GONE"},
    }


@pytest.mark.parametrize("lines", [DOCSTRING, PROTOCOL], ids=["docstring", "protocol.md"])
def test_a_drifted_next_phase_fails(lines: list[str]) -> None:
    drifted = replaced(lines, "last look                                   → LOOK_RUN", "→ RUNNING")
    assert problems(drifted) == [
        f"{WHERE}: Recorded in DECISION goes to DONE or ENQUEUE or RUNNING, "
        "the table says DONE or ENQUEUE or LOOK_RUN"
    ]


@pytest.mark.parametrize("lines", [DOCSTRING, PROTOCOL], ids=["docstring", "protocol.md"])
def test_a_row_left_out_fails(lines: list[str]) -> None:
    drifted = without(lines, "Ran(outcome)  ")
    assert problems(drifted) == [f"{WHERE}: does not draw the table's row Ran in RUNNING"]


@pytest.mark.parametrize("lines", [DOCSTRING, PROTOCOL], ids=["docstring", "protocol.md"])
def test_a_row_the_table_has_not_fails(lines: list[str]) -> None:
    drifted = replaced(lines, "StateRaised(state)  ", "Expired             ")
    assert problems(drifted) == [
        f"{WHERE}: draws Expired in RAISING, which the table has no row for",
        f"{WHERE}: does not draw the table's row StateRaised in RAISING",
    ]


def test_a_row_under_the_wrong_phase_fails() -> None:
    [where] = [number for number, line in enumerate(PROTOCOL) if line == "GONE"]
    drifted = [*PROTOCOL[:where], "GOING", *PROTOCOL[where + 1 :]]
    assert problems(drifted) == [
        f"{WHERE}: draws RecordFailed in GOING, which the table has no row for",
        f"{WHERE}: draws Recorded in GOING, which the table has no row for",
        f"{WHERE}: does not draw the table's row RecordFailed in GONE",
        f"{WHERE}: does not draw the table's row Recorded in GONE",
    ]


def test_the_check_names_the_copy_that_drifted() -> None:
    copies = check_docs.drawings()
    where = "docs/protocol.md (The call's states)"
    assert set(copies) == {"src/boxmaker/core/call_table.py (the docstring's table)", where}
    copies[where] = "\n".join(replaced(PROTOCOL, "→ RAISING", "→ RESULT"))
    assert check_docs.call_table_problems(copies) == [
        f"{where}: Ran in RUNNING goes to RESULT, the table says RAISING"
    ]


ARCHITECTURE = (TOOLS.parent / "docs" / "architecture.md").read_text(encoding="utf-8")


def test_the_code_map_names_every_module() -> None:
    assert check_docs.code_map_problems() == []


def test_a_module_missing_from_the_code_map_fails() -> None:
    text = ARCHITECTURE.replace(
        "    drive.py      the one driver loop", "    drove.py      the one"
    )
    assert check_docs.code_map_problems(text) == [
        "docs/architecture.md: the code map does not name src/boxmaker/core/drive.py",
        "docs/architecture.md: the code map names src/boxmaker/core/drove.py, which is not there",
    ]


def test_a_module_named_in_the_wrong_folder_fails() -> None:
    moved = ARCHITECTURE.replace("    threads.py    how brokerd", "      threads.py  how brokerd")
    assert check_docs.code_map_problems(moved) == [
        "docs/architecture.md: the code map does not name src/boxmaker/runtime/threads.py",
        "docs/architecture.md: the code map names src/boxmaker/runtime/oneshot.py/threads.py, "
        "which is not there",
    ]


def test_a_module_named_only_in_a_description_is_not_named() -> None:
    text = ARCHITECTURE.replace(
        "    oneshot.py    one value", "                  oneshot.py one value"
    )
    assert check_docs.code_map_problems(text) == [
        "docs/architecture.md: the code map does not name src/boxmaker/runtime/oneshot.py"
    ]
