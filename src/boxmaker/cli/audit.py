"""``bxctl audit``: verify, show and export the ledger (docs/decisions.md, "Verify";
docs/operations.md)."""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import attrs
import orjson
from cyclopts import App

from boxmaker.cli.audit_export import export
from boxmaker.cli.common import DEFAULT, Common, Exit, fail, print_json
from boxmaker.core.catalogue import INTERNAL_TOOLS
from boxmaker.core.vocabulary import Decision, Record, holds
from boxmaker.formats.printable import printable
from boxmaker.home.paths import Home
from boxmaker.home.regular_file import read_regular_file
from boxmaker.ledger.fast_start import SinceCheckpoint, verify_since_checkpoint
from boxmaker.ledger.policies import GrantThen, grant_then, policies_dir
from boxmaker.ledger.reader import POLICY_WORD, LedgerReader, NotARecord
from boxmaker.ledger.records import Body, Connection, Policy, body_fields, call_of, parse_head
from boxmaker.ledger.segments import SegmentProblem, ledger_files, ledger_lines
from boxmaker.ledger.signed_note import NoteError, NoteVerifier, parse_vkey
from boxmaker.ledger.verify_files import verify_file

audit_app = App(name="audit", help="The hash-chained audit ledger.")
audit_app.command(export)

MAX_VKEY_FILE = 1024

# Fields shown after the common ones, in this order, when a record has them.
SHOWN_FIELDS = (
    "session",
    "via",
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
    "approver",
    "note",
    "definition",
    "taint",
    "untrusted",
    "taint_after",
    "untrusted_after",
    "output_bytes",
    "boot",
    "version",
    "ledger",
    "file",
    "server",
    "tools",
    "host",
    "port",
    "address",
    "server_name",
    "bytes_up",
    "bytes_down",
    "duration_ms",
    "ended",
)


@audit_app.command
def verify(
    *, expect_head: str | None = None, since_checkpoint: bool = False, common: Common = DEFAULT
) -> Exit:
    """Check the whole ledger: each line, the seq, the hash chain, the order per call,
    the tree (each checkpoint's root, note and signature, and the tiles).

    Prints one line per problem, then the records, the calls by state and the head.
    Exit 0 when sound, 1 when a problem is found, 2 on a usage or I/O error.

    Parameters
    ----------
    expect_head
        A head noted earlier (SEQ:HASH): the ledger must still contain it, which
        detects the removal of the newest records (docs/threat-model.md).
    since_checkpoint
        Only the records after the newest checkpoint, as brokerd's start checks them
        (its signature and its root against the tiles first); the full check when
        that checkpoint cannot be used, saying why.
    """
    if expect_head is not None:
        if since_checkpoint:
            return fail(
                "--expect-head checks the whole ledger: not with --since-checkpoint", Exit.USAGE
            )
        try:
            parse_head(expect_head)
        except ValueError as exc:
            return fail(str(exc), Exit.USAGE)
    home = common.resolve()
    path = home.audit_log
    try:
        verifier = _ledger_verifier(home)
    except (OSError, NoteError) as exc:
        return fail(f"{home.ledger_vkey}: {exc}; see docs/runbook.md#ledger-key", Exit.USAGE)
    started: str | None = None
    try:
        found = verify_since_checkpoint(path, verifier) if since_checkpoint else None
        if isinstance(found, SinceCheckpoint):
            report = found.report
            started = f"from checkpoint seq {found.checkpoint_seq}"
        else:
            if found is not None:
                started = f"in full: the checkpoint cannot be used: {found}"
            report = verify_file(path, expect_head, verifier=verifier)
            if report.archived:
                started = (
                    f"lines 0-{report.archived - 1} archived (not read); "
                    f"verified from checkpoint {report.archived} on"
                )
    except OSError as exc:
        return fail(f"{path}: {exc.strerror}", Exit.USAGE)
    signatures = "checked" if verifier is not None else f"not checked: no key ({home.ledger_vkey})"
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
                "checkpoints": report.checkpoints,
                "signatures": signatures,
                "tiles_checked": report.tiles_checked,
                "verified": started or "in full",
                "resumed_from": report.resumed_from,
                "archived": report.archived,
                "warnings": list(report.warnings),
            }
        )
    else:
        if started is not None:
            print(printable(started if report.archived else f"verified {started}"))
        for warning in report.warnings:
            print(printable(f"warning: {warning}"))
        for problem in report.problems:
            print(printable(str(problem)))
        if report.problems_left_out:
            print(f"... and {report.problems_left_out} more problem(s)")
        states = ", ".join(f"{name} {n}" for name, n in attrs.asdict(report.calls).items())
        after = "" if report.resumed_from is None else f" (from seq {report.resumed_from})"
        print(f"records: {report.records}{after}")
        print(f"calls: {report.calls.total} ({states})")
        print(f"checkpoints: {report.checkpoints}, signatures {signatures}")
        if report.resumed_from is None:
            print(f"tree tiles compared: {report.tiles_checked}")
        print(f"head: {report.head}")
        verdict = "sound" if report.sound else f"{len(report.problems)} problem(s) found"
        print(f"ledger: {verdict}")
    return Exit.DONE if report.sound else Exit.FAILED


def _ledger_verifier(home: Home) -> NoteVerifier | None:
    """The ledger key's verifier from ``keys/ledger.vkey``; None when there is none."""
    try:
        text = read_regular_file(home.ledger_vkey, limit=MAX_VKEY_FILE)
    except FileNotFoundError:
        return None
    return parse_vkey(text.decode("utf-8", errors="replace").strip())


Read = Record[Body] | NotARecord
"""A line as the ledger's reader reads it: a record, or why it is not one."""
Selected = list[tuple[bytes, Read]]


def via_of(body: Body) -> str | None:
    """The calling call of a tunnel's record (a connect's decision, a connection), else
    None."""
    match body:
        case Connection():
            return body.via
        case Decision() if body.tool in INTERNAL_TOOLS:
            via = body.arguments.get("via")
            return via if isinstance(via, str) else None
        case _:
            return None


def select_with_policies(
    path: Path, call: str | None, session: str | None, tail: int | None, *, tunnels: bool = False
) -> tuple[Selected, dict[int, Record[Policy]]]:
    """The records ``show`` selects, each line with its record (or why it is not one;
    only without a filter), and for each selected decision (by its seq) the policy in
    force when it was decided: the last ``policy`` record of its boot before it
    (docs/protocol.md, "Policy records"). A decision with none is not in the map; nor is
    any without a filter (only a call's records show the grant's text). Also what
    ``bxctl why`` reads.

    The ledger reader's typed path decodes a line by the one converter, at about a
    tenth of orjson's rate (docs/decisions.md, "Ledger"), so no more lines than needed
    are decoded: with no filter, only the lines shown (the last ``tail``); of one call,
    only the lines that name the call or a policy
    (:data:`~boxmaker.ledger.reader.POLICY_WORD`). A session's are all decoded.
    ``tunnels``: of one call, also its tunnels' decisions and connection records (they
    name it as their ``via``)."""
    if call is None and session is None:
        last = collections.deque(ledger_lines(ledger_files(path.parent)), maxlen=tail)
        return list(LedgerReader(last).records()), {}
    # Approvals and results name only the call; the session is on its decision.
    calls_of_session: set[str] = set()
    kept: collections.deque[tuple[bytes, Read]] = collections.deque(maxlen=tail)
    in_force: Record[Policy] | None = None
    policy_of: dict[int, Record[Policy]] = {}
    mentioning = () if call is None else (call.encode(), POLICY_WORD)
    reader = LedgerReader(ledger_lines(ledger_files(path.parent)))
    for line, record in reader.records(mentioning=mentioning):
        if isinstance(record, NotARecord):
            continue
        body = record.body
        if holds(record, Policy):
            in_force = record
        if session is not None:
            if isinstance(body, Decision) and body.session == session:
                calls_of_session.add(body.call)
            if call_of(body) not in calls_of_session:
                continue
        related = call_of(body) == call or (tunnels and via_of(body) == call)
        if call is not None and not related:
            continue
        kept.append((line, record))
        if holds(record, Decision) and in_force and in_force.body.boot == record.body.boot:
            policy_of[record.seq] = in_force
    shown = {record.seq for _, record in kept if isinstance(record, Record)}
    return list(kept), {seq: policy for seq, policy in policy_of.items() if seq in shown}


def _describe(record: Record[Body]) -> str:
    """One line for one record; its values are the model's and the owner's words."""
    fields = body_fields(record.body)
    parts = [f"{record.seq!s:>6}", record.at, f"{record.body.kind.value:<8}"]
    if "call" in fields:
        parts.append(str(fields["call"]))
    for name in SHOWN_FIELDS:
        if fields.get(name) is not None:
            value = fields[name]
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


def grant_of(
    ledger: Path, record: Record[Decision], policy_of: dict[int, Record[Policy]]
) -> GrantThen | None:
    """The grant that decided ``record`` as it was then; None when none decided it."""
    grant = record.body.grant
    if grant is None:
        return None
    return grant_then(policies_dir(ledger), policy_of.get(record.seq), grant)


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
    except SegmentProblem as exc:
        return fail(f"{path.parent}: {exc}", Exit.USAGE)
    if call is not None and not selected:
        return fail(f"no records of call {call} in the ledger ({path})", Exit.FAILED)
    for line, record in selected:
        if common.json:
            # A record's own JSON, its controls escaped as JSON escapes them: the same JSON.
            text = line.decode("utf-8", errors="backslashreplace")
            sys.stdout.write(printable(text) + "\n")
        elif isinstance(record, NotARecord):
            print(f"(not a record) {line[:120].decode('utf-8', errors='backslashreplace')}")
        else:
            print(_describe(record))
            if call is not None and holds(record, Decision) and record.body.grant:
                then = grant_of(path, record, policy_of)
                for text in grant_then_lines(then, record.body.grant) if then else ():
                    print(printable(text))
    sys.stdout.flush()
    return Exit.DONE
