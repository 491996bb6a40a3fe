"""What the export checks of each line it sends (ledger/otlp_export.py): a line that is
not a record stops it, whichever way it is decoded (a decision by the reader's fast
path, any other kind by the converter), and so does a line that breaks the chain; in
both cases nothing is sent and the message names the seq and the runbook. A decision
the fast path takes is exported exactly as the converter's record would be."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Final

import orjson
import pytest

from boxmaker.core.labels import Taint
from boxmaker.core.vocabulary import VerdictCode
from boxmaker.ledger import otlp_batch, otlp_export
from boxmaker.ledger.otlp_batch import BatchJob, make_part
from boxmaker.ledger.records import GENESIS_PREV, Decision, Genesis, Stop, encode_line

LEDGER: Final = "l-0123456789abcdef"
NOWHERE: Final = "http://127.0.0.1:9"
"""Never contacted: the export stops before its first request."""
AT: Final = "2026-01-02T03:04:05.678Z"


def decision(call: str) -> Decision:
    return Decision(
        call, "s-000000000001", "read_file", {"path": "a"}, VerdictCode.RUN, None, "notes",
        Taint.PUBLIC, False, "b-1",
    )  # fmt: skip


def chained(bodies: list[Any], edit: dict[int, dict[str, Any]] | None = None) -> bytes:
    """The lines of ``bodies`` chained from genesis, with line ``seq``'s fields changed
    as ``edit`` says before it is hashed (so the chain holds)."""
    prev, lines = GENESIS_PREV, []
    for seq, body in enumerate([Genesis(ledger=LEDGER), *bodies]):
        line = encode_line(seq, AT, prev, body)
        if edit and seq in edit:
            line = orjson.dumps(orjson.loads(line) | edit[seq], option=orjson.OPT_SORT_KEYS)
        lines.append(line)
        prev = hashlib.sha256(line).hexdigest()
    return b"".join(line + b"\n" for line in lines)


@pytest.fixture(params=["thread", "worker process"])
def parallel_from(request: pytest.FixtureRequest) -> int:
    """Where the batch is made: a short batch in a thread, and the same batch in a
    worker process (its problem crosses back to the exporter)."""
    return otlp_export.PARALLEL_LINES if request.param == "thread" else 1


async def stopped(path: Path, tmp_path: Path, parallel_from: int) -> str:
    with pytest.raises(otlp_export.ExportProblem) as caught:
        await otlp_export.export_ledger(
            path, NOWHERE, tmp_path / "cursor.json", capture_content=False, follow=False,
            say=print, parallel_from=parallel_from,
        )  # fmt: skip
    assert not (tmp_path / "cursor.json").exists()
    return str(caught.value)


@pytest.mark.parametrize(
    ("seq", "fields", "says"),
    [
        (1, {"verdict": "maybe"}, "expected VerdictCode @ $.verdict"),
        (1, {"untrusted": "no"}, "untrusted"),
        (1, {"extra": 1}, "extra"),
        (2, {"boot": 7}, "boot"),
    ],
)
async def test_a_line_that_is_not_a_record_stops_the_export(
    tmp_path: Path, seq: int, fields: dict[str, Any], says: str, parallel_from: int
) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_bytes(chained([decision("c-0000000000000001"), Stop(boot="b-1")], {seq: fields}))
    message = await stopped(path, tmp_path, parallel_from)
    assert message.startswith(f"{path}: the line after seq {seq - 1} is not a record (")
    assert says in message
    assert message.endswith("run `bxctl audit verify`; see docs/runbook.md#otlp-export")


async def test_a_line_that_breaks_the_chain_stops_the_export(
    tmp_path: Path, parallel_from: int
) -> None:
    path = tmp_path / "audit.jsonl"
    lines = chained([decision("c-0000000000000001"), Stop(boot="b-1")]).splitlines()
    lines[1] = lines[1].replace(b"c-0000000000000001", b"c-0000000000000002")  # prev kept
    path.write_bytes(b"\n".join(lines) + b"\n")
    message = await stopped(path, tmp_path, parallel_from)
    assert "the chain breaks at seq 2 (expected seq 2 after the line hashed" in message


def test_a_decision_is_sent_as_the_converters_record_would_be(tmp_path: Path) -> None:
    """The batch made with the fast path and one made with every line by the converter
    are the same bytes."""
    path = tmp_path / "audit.jsonl"
    bodies = [decision(f"c-{n:016x}") for n in range(5)] + [Stop(boot="b-1")]
    path.write_bytes(chained(bodies))

    def batch() -> Any:
        lines = tuple(path.read_bytes().splitlines())
        return make_part(BatchJob(LEDGER, "0", False, 0, GENESIS_PREV, -1, lines))

    fast = batch()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(otlp_batch, "decision_of", lambda fields: None)
        typed = batch()
    assert fast == typed
    assert fast.log_count == 7
