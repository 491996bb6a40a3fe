"""``bxctl audit``: verify and show the ledger (docs/decisions.md, "Verify")."""

from __future__ import annotations

import collections
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import orjson
from cyclopts import App

from boxmaker.cli.common import DEFAULT, Common, Exit, fail, print_json
from boxmaker.ledger.policies import GrantThen, grant_then, policies_dir
from boxmaker.ledger.records import parse_head
from boxmaker.ledger.verify import iter_lines, verify_file
from boxmaker.printable import printable

audit_app = App(name="audit", help="The hash-chained audit ledger.")

# Fields shown after the common ones, in this order, when a record has them.
SHOWN_FIELDS = (
    "session",
    "tool",
    "arguments",
    "verdict",
    "approval",
    "outcome",
    "status",
    "label",
    "reason",
    "grant",
    "by",
    "taint",
    "untrusted",
    "taint_after",
    "untrusted_after",
    "output_bytes",
    "boot",
    "version",
    "ledger",
    "file",
)


@audit_app.command
def verify(*, expect_head: str | None = None, common: Common = DEFAULT) -> Exit:
    """Check the whole ledger: each line, the seq, the hash chain, the order per call.

    Prints one line per problem, then the records, the calls by state and the head.
    Exit 0 when sound, 1 when a problem is found, 2 on a usage or I/O error.

    Parameters
    ----------
    expect_head
        A head noted earlier (SEQ:HASH): the ledger must still contain it, which
        detects the removal of the newest records (docs/threat-model.md).
    """
    if expect_head is not None:
        try:
            parse_head(expect_head)
        except ValueError as exc:
            return fail(str(exc), Exit.USAGE)
    path = common.resolve().audit_log
    try:
        report = verify_file(path, expect_head)
    except OSError as exc:
        return fail(f"{path}: {exc.strerror}", Exit.USAGE)
    if common.json:
        print_json(
            {
                "sound": report.sound,
                "file": str(path),
                "records": report.records,
                "head": report.head,
                "problems": [{"seq": p.seq, "what": p.what} for p in report.problems],
                "problems_left_out": report.problems_left_out,
                "calls": attrs.asdict(report.calls),
            }
        )
    else:
        for problem in report.problems:
            print(printable(str(problem)))
        if report.problems_left_out:
            print(f"... and {report.problems_left_out} more problem(s)")
        states = ", ".join(f"{name} {n}" for name, n in attrs.asdict(report.calls).items())
        print(f"records: {report.records}")
        print(f"calls: {report.calls.total} ({states})")
        print(f"head: {report.head}")
        verdict = "sound" if report.sound else f"{len(report.problems)} problem(s) found"
        print(f"ledger: {verdict}")
    return Exit.DONE if report.sound else Exit.FAILED


def _records(path: Path) -> Iterator[tuple[bytes, dict[str, Any] | None]]:
    """Each line with its parsed record; a line that is not a JSON object gives None."""
    for raw in iter_lines(path):
        line = raw.rstrip(b"\n")
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            yield line, None
            continue
        yield line, record if isinstance(record, dict) else None


Selected = list[tuple[bytes, dict[str, Any] | None]]


def select_records(path: Path, call: str | None, session: str | None, tail: int | None) -> Selected:
    """The records ``show`` selects, each line with its parsed record (None: not a
    record); also what ``bxctl why`` reads."""
    return select_with_policies(path, call, session, tail)[0]


def select_with_policies(
    path: Path, call: str | None, session: str | None, tail: int | None
) -> tuple[Selected, dict[int, dict[str, Any]]]:
    """:func:`select_records`, and for each selected decision (by its seq) the policy in
    force when it was decided: the last ``policy`` record of its boot before it
    (docs/protocol.md, "Policy records"). A decision with none is not in the map."""
    # Approvals and results name only the call; the session is on its decision.
    calls_of_session: set[str] = set()
    kept: collections.deque[tuple[bytes, dict[str, Any] | None]] = collections.deque(maxlen=tail)
    in_force: dict[str, Any] | None = None
    policy_of: dict[int, dict[str, Any]] = {}
    for line, record in _records(path):
        if record is None:
            if call is None and session is None:
                kept.append((line, None))
            continue
        kind = record.get("kind")
        if kind == "policy":
            in_force = record
        if session is not None:
            if kind == "decision" and record.get("session") == session:
                calls_of_session.add(str(record.get("call")))
            if record.get("call") not in calls_of_session:
                continue
        if call is not None and record.get("call") != call:
            continue
        kept.append((line, record))
        seq = record.get("seq")
        if (
            kind == "decision"
            and in_force is not None
            and type(seq) is int
            and in_force.get("boot") == record.get("boot")
        ):
            policy_of[seq] = in_force
    shown = {record.get("seq") for _, record in kept if record is not None}
    return list(kept), {seq: policy for seq, policy in policy_of.items() if seq in shown}


def _describe(record: dict[str, Any]) -> str:
    """One line for one record; its values are the model's and the owner's words."""
    parts = [f"{record.get('seq')!s:>6}", str(record.get("at")), f"{record.get('kind')!s:<8}"]
    if "call" in record:
        parts.append(str(record["call"]))
    for name in SHOWN_FIELDS:
        if record.get(name) is not None:
            value = record[name]
            # JSON's words for JSON's values: true/false, not Python's True/False.
            shown = value if isinstance(value, str) else orjson.dumps(value).decode()
            parts.append(f"{name}={shown}")
    return printable("  ".join(parts))


def grant_then_lines(then: GrantThen, grant_id: object, indent: str = "  ") -> list[str]:
    """The grant that decided a call, as it was then (:func:`~boxmaker.ledger.policies.
    grant_then`), in lines to print, each through ``printable`` (the text is a file's)."""
    if then.text is None:
        return [f"{indent}its text then is not known: {then.missing}"]
    where = f"grants.toml {then.sha256[:12] if then.sha256 else '?'}…, policy seq {then.policy_seq}"
    lines = [f"{indent}grant {grant_id} as it was then ({where}):"]
    lines += [f"{indent}  {line.removesuffix(chr(13))}" for line in then.text.split("\n")]
    return lines


def _grant_of(ledger: Path, record: dict[str, Any], policy_of: dict[int, Any]) -> GrantThen:
    seq = record.get("seq")
    policy = policy_of.get(seq) if type(seq) is int else None
    return grant_then(policies_dir(ledger), policy, str(record["grant"]))


@audit_app.command
def show(
    *,
    call: str | None = None,
    session: str | None = None,
    tail: int | None = None,
    common: Common = DEFAULT,
) -> Exit:
    """Print ledger records, one line each (with --json: the records' own JSON lines).

    Parameters
    ----------
    call
        Only the records of this call (c-…), and the text of the grant that decided
        it as it was then; exit 1 when it has none.
    session
        Only the records of this session's calls (s-…).
    tail
        Only the last N of the selected records.
    """
    if tail is not None and tail < 1:
        return fail("--tail takes a number of records, 1 or more", Exit.USAGE)
    path = common.resolve().audit_log
    try:
        selected, policy_of = select_with_policies(path, call, session, tail)
    except OSError as exc:
        return fail(f"{path}: {exc.strerror}", Exit.USAGE)
    if call is not None and not selected:
        return fail(f"no records of call {call} in the ledger ({path})", Exit.FAILED)
    for line, record in selected:
        if common.json:
            # A record's own JSON, its controls escaped as JSON escapes them: the same JSON.
            text = line.decode("utf-8", errors="backslashreplace")
            sys.stdout.write(printable(text) + "\n")
        elif record is None:
            print(f"(not a record) {line[:120].decode('utf-8', errors='backslashreplace')}")
        else:
            print(_describe(record))
            if call is not None and record.get("kind") == "decision" and record.get("grant"):
                for text in grant_then_lines(_grant_of(path, record, policy_of), record["grant"]):
                    print(printable(text))
    sys.stdout.flush()
    return Exit.DONE
