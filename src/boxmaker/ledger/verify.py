"""Streaming ledger verification (docs/decisions.md, "Verify"): one pass, raw bytes, no
re-serializing.

:func:`verify_lines` is the pure core. It takes the lines as iterating a binary file
yields them: each ends with ``\n`` except perhaps the last (any iterable of such lines
will do). :func:`~boxmaker.ledger.verify_files.verify_file` is the wrapper that reads a
ledger's files.

What is checked, per line: it is a JSON object with ``seq``, ``prev``, ``at`` (a string)
and ``kind``; ``seq`` is the next number; ``prev`` is the SHA-256 of the previous line's
exact bytes (64 zeros for the first); ``kind`` is known, and the first record (only the
first) is ``genesis``; the per-call order is decision → at most one approval → at most
one result, with an approval only after an ``ask`` verdict and a result only after a
``run`` verdict or an approval whose outcome is ``ask``/``allowed``. The last line must
end with a newline. With ``expect_head``, that seq must be in the file with that hash.
A ``policy`` record names its grants by a SHA-256 (or says why none could be read);
:func:`~boxmaker.ledger.verify_files.check_kept` then checks each named version kept
beside the ledger.
A ``connection`` record (a tunnel's end) must have its fields' forms (call ids, a
session id, a port from 1, counts from 0, an IP address, a known ``ended``) and come
while its ``connect`` call runs: after the decision (or approval) that let it run and
before its result.

The tree (docs/protocol.md, "Verifying"): the RFC 6962 tree over the lines is computed
in the same loop, and each ``checkpoint`` record is checked against it (its root, its
signed note, the calls then open: :mod:`boxmaker.ledger.verify_tree`); with a
:class:`~boxmaker.ledger.verify_tree.TileCheck`, the tiles under ``ledger/tree/`` are
compared with the lines. With a :class:`ResumePoint` the lines are those after a
checkpoint (:mod:`boxmaker.ledger.fast_start`).

Where a problem is reported (its ``seq``): the position the line holds in the chain,
i.e. the seq the line should have. After a wrong ``seq`` the count follows the line's
own number, so one gap or swap is one problem and not a cascade. A broken ``prev`` link
names the line that was edited, judged by the next link: a line whose bytes were changed
breaks only the link after it (seq N+1's ``prev`` no longer names it), while a line whose
own ``prev`` was changed breaks both of its links (and the expected head, if it is the
last). So a broken link alone is reported at the line before it, "seq N was changed",
and two in a row at the line between them. A broken link at a line whose ``seq`` is
wrong (a line gone or added) is reported at that line, as is the first line's.

Call states (the summary):

- ``complete``: has a result (``ok``, or ``failed`` for a reason other than
  ``requester_gone``, or a run ``stopped`` half-way when its requester left);
- ``denied``: a ``deny`` verdict, or an approval with outcome ``denied``;
- ``refused``, ``expired``: the approval's outcome;
- ``withdrawn``: an approval ``withdrawn``, or a result ``failed`` with reason
  ``requester_gone`` (nothing ran: the requester left before an auto run);
- ``pending``: asked, no approval yet, in the newest boot while it has not stopped;
- ``running``: decided to run (``run`` verdict, or approval ``ask``/``allowed``), no
  result yet, in the newest boot while it has not stopped;
- ``unfinished``: pending or running, but from an earlier boot or a stopped one: that
  brokerd is gone, so the call never ends (a state that could not be raised
  leaves such a call too: docs/protocol.md, the write order).

The newest boot is that of the last ``start`` record; a ledger written without ``start``
records is one boot. A ``stop`` of the newest boot ends it.

Memory, and what it costs: only open calls (asked, or running) are kept, in a dict, so
memory follows the open calls and not the file. A finished call is forgotten. The
trade-off: a call id is checked to name at most one *open* call at a time; a decision
that reuses the id of a call that already ended starts a new call and is not reported
(an approval or result after its call ended is: it has no open decision). Keeping every
id ever seen would catch that reuse, but it costs ~100 bytes a call and, measured, a
third of the speed. Problems are capped at ``max_problems`` (the rest are counted).

What it shares with the one reader (:mod:`boxmaker.ledger.reader`): the lines, as
iterating the file opened with :data:`~boxmaker.ledger.reader.READ_BUFFER` yields them
(:func:`~boxmaker.ledger.reader.iter_lines`' convention: newline kept, the last perhaps
without), and the first line's decoding (:func:`~boxmaker.ledger.records.line_fields`).
It keeps its own loop over the rest: each line's exact bytes must be hashed, and a
record that is not well formed is a problem to report where it stands in the chain, not
a line to pass over.

Performance: the loop works on ``orjson.loads``' dict and ``hashlib`` directly, with no
attrs/cattrs per record (and no call to the shared decoding per line, which would cost
one each); tools/bench_ledger.py compares it with a bare hash+parse loop.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
from collections.abc import Iterable
from typing import Final

import attrs
import orjson

from boxmaker.ledger.checkpoint import ledger_origin
from boxmaker.ledger.merkle import Frontier, Hash
from boxmaker.ledger.policies import is_sha256
from boxmaker.ledger.records import (
    GENESIS_PREV,
    BadRecord,
    CallPhase,
    connection_problem,
    format_head,
    line_fields,
    parse_head,
)
from boxmaker.ledger.signed_note import NoteVerifier
from boxmaker.ledger.tiles import TILE_WIDTH
from boxmaker.ledger.verify_report import CallCounts, Problem, Report, ResumePoint
from boxmaker.ledger.verify_tree import TileCheck, checkpoint_problems

__all__ = [
    "MAX_PROBLEMS",
    "CallCounts",
    "Problem",
    "Report",
    "ResumePoint",
    "verify_lines",
]

MAX_PROBLEMS = 1000

# Phases of an open call.
_ASKED = 0
_RUNNING = 1  # a run verdict: an approval would be out of order
_APPROVED = 2  # an approval let it run: a second approval would be out of order
_LEFT_OPEN = 3  # resumed from a checkpoint: an earlier boot left it open, phase not kept
_PHASE_NAMES: Final = {
    _ASKED: CallPhase.ASKED,
    _RUNNING: CallPhase.RUNNING,
    _APPROVED: CallPhase.APPROVED,
}
_PHASE_OF: Final = {name: phase for phase, name in _PHASE_NAMES.items()}

_NOT_JSON = object()


def verify_lines(  # one flat loop: helpers per record would cost a call each
    lines: Iterable[bytes],
    expect_head: str | None = None,
    *,
    max_problems: int = MAX_PROBLEMS,
    verifier: NoteVerifier | None = None,
    resume: ResumePoint | None = None,
    tiles: TileCheck | None = None,
) -> Report:
    """Check a ledger given as its lines; see the module docstring. With ``resume``,
    the lines are those from :attr:`ResumePoint.next_seq` on. ``verifier`` checks each
    checkpoint note's signature; ``tiles`` compares the tree's tiles with the lines.

    >>> from boxmaker.ledger.records import encode_line, Genesis, line_hash
    >>> first = encode_line(0, "2026-01-02T03:04:05.678Z", GENESIS_PREV, Genesis("l-1"))
    >>> report = verify_lines([first + b"\\n"])
    >>> report.sound, report.records, report.head == "0:" + line_hash(first)
    (True, 1, True)
    >>> [str(p) for p in verify_lines([first]).problems]
    ['seq 0: torn last line (no newline)']
    """
    want_seq, want_hash = parse_head(expect_head) if expect_head is not None else (-1, "")
    head_found = False
    problems: list[Problem] = []
    left_out = 0

    def problem(seq: int, what: str) -> None:
        nonlocal left_out
        if len(problems) < max_problems:
            problems.append(Problem(seq, what))
        else:
            left_out += 1

    # The line whose prev did not match, until the next link says which line was edited.
    suspect = -1

    def edited_before_suspect(sure: bool) -> None:
        nonlocal suspect
        edited = suspect - 1
        what = f"seq {edited} was changed (its hash is not what seq {suspect} names as prev)"
        problem(edited, what if sure else f"{what}, or seq {suspect}'s prev was")
        suspect = -1

    sha256 = hashlib.sha256
    loads = orjson.loads
    decode_error = orjson.JSONDecodeError
    # Open calls only: call -> boot tag + phase (the tag, a multiple of 4, changes with
    # each boot, so no tuple is built per call). Finished calls are forgotten.
    open_calls: dict[str, int] = {}
    policies: list[tuple[int, str]] = []
    boot_tag = 4
    complete = denied = withdrawn = 0
    approval_ends = dict.fromkeys(("denied", "refused", "expired", "withdrawn"), 0)
    newest_boot: object = None
    boot_stopped = False
    seq = -1
    records = 0
    prev_hash = GENESIS_PREV
    digest = ""
    origin: str | None = None
    genesis_at = 1  # the record count a genesis may have
    checkpoints = 0
    # The tree (RFC 6962) inline: the frontier's edge and size, a leaf added a line
    # later so that at a checkpoint it covers exactly the lines before it.
    edge: list[Hash] = []
    tree_size = 0
    held = None
    tile_leaves: list[Hash] = []
    if resume is not None:
        seq = resume.next_seq - 1
        prev_hash = digest = resume.prev_hash
        edge = list(resume.tree.edge)
        tree_size = resume.tree.size
        newest_boot = resume.newest_boot
        boot_stopped = resume.boot_stopped
        origin = resume.origin
        genesis_at = 0
        open_calls = {
            call: _PHASE_OF[phase] + boot_tag for call, phase in resume.open_calls.items()
        }
        open_calls.update(dict.fromkeys(resume.unfinished, _LEFT_OPEN))
        if want_seq >= 0 and want_seq < resume.next_seq:
            raise ValueError(f"the expected head's seq {want_seq} is before the resumed lines")
        if tiles is not None:
            raise ValueError("the tiles are checked in a full verification only")

    lines = iter(lines)
    first = next(lines, None)
    if first is None:
        return Report(
            problems=(),
            records=0,
            head=None if resume is None else format_head(seq, prev_hash),
            calls=_open_counts(open_calls, boot_tag, boot_stopped, CallCounts()),
            open_calls=frozenset(open_calls),
            resumed_from=None if resume is None else resume.next_seq,
        )
    # Checked here, once, rather than by a test on every line of the loop.
    if resume is None:
        try:
            first_rec = line_fields(first)
        except BadRecord:
            first_rec = {}
        first_kind = first_rec.get("kind")
        if first_kind != "genesis":
            problem(0, f"the first record is {first_kind!r}, not genesis")
        else:
            ledger = first_rec.get("ledger")
            try:
                origin = ledger_origin(ledger if type(ledger) is str else "")
            except ValueError:
                problem(0, f"genesis with ledger id {ledger!r}")

    for records, raw in enumerate(itertools.chain((first,), lines), 1):
        seq += 1
        # Every line but a file's last ends with a newline; the last is checked after
        # the loop, which keeps a test off this path.
        line = raw[:-1]
        digest = sha256(line).hexdigest()
        if held is not None:
            leaf = sha256(b"\x00" + held).digest()
            tile_leaves.append(leaf)
            if len(tile_leaves) == TILE_WIDTH:
                if tiles is not None:
                    tiles.add(tile_leaves)
                tile_leaves = []
            carry = tree_size
            while carry & 1:
                leaf = sha256(b"\x01" + edge.pop() + leaf).digest()
                carry >>= 1
            edge.append(leaf)
            tree_size += 1
        held = line
        try:
            rec = loads(line)
        except decode_error:
            rec = _NOT_JSON
            if raw[-1:] != b"\n":
                # The torn last line: judge it by all of its bytes, not less its last.
                digest = sha256(raw).hexdigest()
                with contextlib.suppress(decode_error):
                    rec = loads(raw)
            if rec is _NOT_JSON:
                if suspect >= 0:
                    edited_before_suspect(sure=False)
                problem(seq, "not valid JSON")
                if seq == want_seq:
                    head_found = True
                    problem(seq, f"line hash differs from the expected head {expect_head}")
                prev_hash = digest
                continue
        try:
            own_seq = rec["seq"]
            own_prev = rec["prev"]
            at = rec["at"]
            kind = rec["kind"]
        except (KeyError, TypeError):
            if suspect >= 0:
                edited_before_suspect(sure=False)
            problem(seq, _shape_problem(rec))
            if seq == want_seq:
                head_found = True
                problem(seq, f"line hash differs from the expected head {expect_head}")
            prev_hash = digest
            continue
        seq_ok = own_seq == seq and type(own_seq) is int
        if not seq_ok:
            problem(seq, f"seq {own_seq!r} where {seq} was expected")
            if type(own_seq) is int:
                seq = own_seq
        link_broken = own_prev != prev_hash
        if suspect >= 0:
            if link_broken and seq_ok:
                problem(
                    suspect,
                    f"seq {suspect} was changed (its prev does not name seq {suspect - 1}, "
                    f"and its hash is not what seq {seq} names as prev)",
                )
                suspect = -1
                link_broken = False
            else:
                edited_before_suspect(sure=True)
        if link_broken:
            if seq_ok and seq > 0:
                suspect = seq
            else:
                problem(seq, f"prev does not match the hash of the line before ({prev_hash[:12]}…)")
        prev_hash = digest
        if seq == want_seq:
            head_found = True
            if digest != want_hash:
                problem(seq, f"line hash differs from the expected head {expect_head}")
                if suspect == seq:  # its link before, and the head, both name this line
                    problem(seq, f"seq {seq} was changed (its prev does not name seq {seq - 1})")
                    suspect = -1
            elif suspect == seq:  # the head vouches for this line: the one before changed
                edited_before_suspect(sure=True)
        if type(at) is not str:
            problem(seq, f"at {at!r} is not a UTC time")

        try:
            if kind == "decision":
                call = rec["call"]
                verdict = rec["verdict"]
                if type(call) is not str:
                    problem(seq, f"decision with call id {call!r}")
                    continue
                if call in open_calls:
                    problem(seq, f"a second decision for call {call} while it is open")
                elif verdict == "run":
                    open_calls[call] = boot_tag + _RUNNING
                elif verdict == "ask":
                    open_calls[call] = boot_tag + _ASKED
                elif verdict == "deny":
                    denied += 1
                else:
                    problem(seq, f"decision for call {call} with unknown verdict {verdict!r}")

            elif kind == "result":
                call = rec["call"]
                status = rec["status"]
                state = open_calls.get(call)
                if state is None or state & 3 == _ASKED:
                    problem(seq, _out_of_order("result", call, state))
                elif status == "ok":
                    del open_calls[call]
                    complete += 1
                elif status == "failed":
                    del open_calls[call]
                    if rec["reason"] == "requester_gone" and not rec.get("stopped"):
                        withdrawn += 1
                    else:
                        complete += 1
                else:
                    problem(seq, f"result for call {call} with unknown status {status!r}")

            elif kind == "approval":
                call = rec["call"]
                outcome = rec["outcome"]
                state = open_calls.get(call)
                if state is None or state & 3 != _ASKED:
                    problem(seq, _out_of_order("approval", call, state))
                elif outcome == "ask" or outcome == "allowed":
                    open_calls[call] = state - _ASKED + _APPROVED
                elif outcome in approval_ends:
                    del open_calls[call]
                    approval_ends[outcome] += 1
                else:
                    problem(seq, f"approval for call {call} with unknown outcome {outcome!r}")

            elif kind == "start":
                newest_boot = rec["boot"]
                boot_stopped = False
                boot_tag += 4
            elif kind == "stop":
                if rec["boot"] == newest_boot:
                    boot_stopped = True
            elif kind == "genesis":
                if records != genesis_at:
                    problem(seq, "a genesis record after the first")
            elif kind == "policy":
                sha = rec["sha256"]
                if is_sha256(sha):
                    policies.append((seq, sha))
                elif sha is not None:
                    problem(seq, f"policy record with sha256 {sha!r}")
                elif type(rec["problem"]) is not str:
                    problem(seq, "policy record with neither a sha256 nor a problem")
            elif kind == "mcp_tools":
                tools = rec["tools"]
                if type(rec["server"]) is not str or type(tools) is not dict:
                    problem(seq, "mcp_tools record with a field of the wrong type")
                elif not all(is_sha256(digest) for digest in tools.values()):
                    problem(seq, "mcp_tools record with a definition hash that is not a sha256")
            elif kind == "connection":
                call = rec["call"]
                found = connection_problem(rec)
                if found is not None:
                    problem(seq, f"connection record {found}")
                elif open_calls.get(call, _ASKED) & 3 == _ASKED:
                    # Written when an opened tunnel closes, before its connect's result.
                    problem(seq, f"connection for call {call} that is not running")
            elif kind == "checkpoint":
                checkpoints += 1
                if rec["size"] != seq:
                    problem(seq, f"checkpoint record of size {rec['size']!r}, not its seq")
                # The writer's boot's calls, with their phases, until its stop.
                ours = rec["boot"] == newest_boot and not boot_stopped
                found_open = {
                    call: _PHASE_NAMES[state & 3]
                    for call, state in open_calls.items()
                    if ours and state & ~3 == boot_tag
                }
                for what in checkpoint_problems(
                    rec,
                    Frontier(edge=list(edge), size=tree_size),
                    origin,
                    verifier,
                    found_open,
                    frozenset(open_calls.keys() - found_open.keys()),
                ):
                    problem(seq, what)
            elif kind != "repair":
                problem(seq, f"unknown kind {kind!r}")
        except KeyError as missing:
            problem(seq, f"{kind} record without {missing}")
        except TypeError:  # an unhashable value where an id or code belongs
            problem(seq, f"{kind} record with a field of the wrong type")

    if suspect >= 0:
        edited_before_suspect(sure=False)
    if raw[-1:] != b"\n":
        # A write cut short (docs/runbook.md#ledger-torn). The head is the hash of all of its bytes.
        problem(seq, "torn last line (no newline)")
        digest = sha256(raw).hexdigest()
    elif tiles is not None:
        tile_leaves.append(sha256(b"\x00" + line).digest())
        tree_size += 1
    if tiles is not None:
        tiles.finish(tile_leaves, tree_size)
        for what in tiles.problems:
            problem(0, what)
    if want_seq >= 0 and not head_found:
        problem(want_seq, f"the expected head {expect_head} is not in the ledger (truncated?)")

    ended = CallCounts(
        complete=complete,
        denied=denied + approval_ends["denied"],
        refused=approval_ends["refused"],
        expired=approval_ends["expired"],
        withdrawn=withdrawn + approval_ends["withdrawn"],
    )
    return Report(
        problems=tuple(sorted(problems, key=lambda found: found.seq)),
        records=records,
        head=format_head(seq, digest) if records else None,
        calls=_open_counts(open_calls, boot_tag, boot_stopped, ended),
        problems_left_out=left_out,
        open_calls=frozenset(open_calls),
        policies=tuple(policies),
        checkpoints=checkpoints,
        signatures_checked=verifier is not None,
        tiles_checked=0 if tiles is None else tiles.tiles,
        tiles_sound=None if tiles is None else not tiles.problems,
        resumed_from=None if resume is None else resume.next_seq,
    )


def _open_counts(
    open_calls: dict[str, int], boot_tag: int, boot_stopped: bool, ended: CallCounts
) -> CallCounts:
    """``ended`` with the open calls counted: pending, running, or unfinished."""
    pending = running = unfinished = 0
    for state in open_calls.values():
        if boot_stopped or state & ~3 != boot_tag:
            unfinished += 1
        elif state & 3 == _ASKED:
            pending += 1
        else:
            running += 1
    return attrs.evolve(ended, pending=pending, running=running, unfinished=unfinished)


def _shape_problem(rec: object) -> str:
    if not isinstance(rec, dict):
        return "not a JSON object"
    missing = [name for name in ("seq", "at", "kind", "prev") if name not in rec]
    return "missing " + ", ".join(missing)


def _out_of_order(kind: str, call: str, state: int | None) -> str:
    if state is None:
        return f"{kind} for call {call} with no open decision (none, or the call had ended)"
    phase = state & 3
    if phase == _LEFT_OPEN:
        return f"{kind} for call {call}, which an earlier boot left open"
    if phase == _ASKED:
        return f"{kind} for call {call} before its approval"
    if phase == _RUNNING:
        return f"{kind} for call {call} whose verdict was run, not ask"
    return f"a second {kind} for call {call}"
