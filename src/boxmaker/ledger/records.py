"""Ledger records and their canonical bytes (docs/protocol.md). Pure: no files, no clock.

The records of a call (:class:`Decision`, :class:`Approval`, :class:`Result`), their
outcomes and the kinds are the call's vocabulary (:mod:`boxmaker.core.vocabulary`),
which the call's machine writes as they are; they are re-exported here with the
records of brokerd's own life.

A stored line is a record body's fields plus the common fields ``seq``, ``at``, ``kind``
and ``prev``, encoded by orjson with sorted keys and no spaces. The chain hashes the raw
line bytes (without the newline), so nothing is ever re-serialized to be checked.

>>> line = encode_line(0, "2026-01-02T03:04:05.678Z", GENESIS_PREV, Genesis(ledger="l-1"))
>>> line  # doctest: +ELLIPSIS
b'{"at":"2026-01-02T03:04:05.678Z","kind":"genesis","ledger":"l-1","prev":"000...000","seq":0}'
>>> decode_line(line).body
Genesis(ledger='l-1')
>>> format_head(0, line_hash(line)) == "0:" + line_hash(line)
True

Lines are read back by :mod:`boxmaker.ledger.reader`, the one reader: :func:`decode_line`
is its typed path, a line decoded whole by the one converter (:func:`line_fields` then
:func:`decode_fields`, which the writer's start and verify share where they decode).
"""

from __future__ import annotations

import enum
import hashlib
import ipaddress
import secrets
from typing import Any, ClassVar, Final

import attrs
import cattrs
import orjson
from cattrs.gen import make_dict_unstructure_fn, override

from boxmaker.core.vocabulary import (
    Approval,
    ApprovalBy,
    ApprovalOutcome,
    Decision,
    Kind,
    Record,
    Result,
    ResultStatus,
    VerdictCode,
    record_time,
)
from boxmaker.formats.convert import CALL_ID, SESSION_ID, converter

__all__ = [
    "BODY_TYPES",
    "COMMON_FIELDS",
    "GENESIS_PREV",
    "Approval",
    "ApprovalBy",
    "ApprovalOutcome",
    "BadRecord",
    "Body",
    "CallPhase",
    "CheckpointRecord",
    "Connection",
    "ConnectionEnd",
    "Decision",
    "Genesis",
    "Kind",
    "McpTools",
    "NotJson",
    "Policy",
    "Record",
    "Repair",
    "Result",
    "ResultStatus",
    "Start",
    "Stop",
    "VerdictCode",
    "body_fields",
    "call_of",
    "connection_problem",
    "decode_fields",
    "decode_line",
    "encode_line",
    "format_head",
    "line_fields",
    "line_hash",
    "new_boot_id",
    "new_ledger_id",
    "parse_head",
]

GENESIS_PREV = "0" * 64
"""The ``prev`` of record 0: there is no previous line."""

COMMON_FIELDS = frozenset({"seq", "at", "kind", "prev"})
"""Fields the writer adds to every body; no body may use these names."""


@attrs.frozen
class Genesis:
    """Record 0 of every ledger."""

    kind: ClassVar[Kind] = Kind.GENESIS
    ledger: str


@attrs.frozen
class Start:
    """A brokerd start (one per boot)."""

    kind: ClassVar[Kind] = Kind.START
    boot: str
    version: str


@attrs.frozen
class Stop:
    """A clean brokerd stop."""

    kind: ClassVar[Kind] = Kind.STOP
    boot: str


@attrs.frozen
class Repair:
    """A torn tail was moved aside (docs/runbook.md#ledger-torn): ``file`` is its name in the
    ledger directory."""

    kind: ClassVar[Kind] = Kind.REPAIR
    file: str
    sha256: str


@attrs.frozen
class Policy:
    """The grants brokerd decides with from here on: written before any decision made
    with them, at start and whenever grants.toml's content changes (docs/protocol.md,
    "Policy records"). ``sha256`` names the bytes read (kept as
    ``ledger/policies/<sha256>.toml``), None when none could be read; ``grants`` is
    their number when they are valid, ``problem`` why not otherwise (every call is then
    denied ``grants_invalid``)."""

    kind: ClassVar[Kind] = Kind.POLICY
    boot: str
    sha256: str | None
    grants: int | None
    problem: str | None


@attrs.frozen
class McpTools:
    """The tools an MCP server listed when brokerd started it (docs/protocol.md, "MCP
    tools records"; docs/mcp.md): each tool's name and the SHA-256 of its canonical
    definition, written after every ``tools/list``, before any call of that start, so
    a changed definition is on record whether or not it was pinned."""

    kind: ClassVar[Kind] = Kind.MCP_TOOLS
    boot: str
    server: str
    tools: dict[str, str]
    """Tool name -> definition hash (64 lowercase hex)."""


class ConnectionEnd(enum.StrEnum):
    """How a tunnel ended (a :class:`Connection`'s ``ended``)."""

    CLOSED = "closed"
    """Either side ended it."""
    IDLE = "idle"
    """Nothing went either way for the idle timeout."""
    BYTE_CAP = "byte_cap"
    """The calling call's bytes were spent."""
    CALL_ENDED = "call_ended"
    """The calling call finished: every tunnel of it closes at once."""
    SERVER_NAME_MISMATCH = "server_name_mismatch"
    """The TLS ClientHello named another server than the CONNECT's host."""
    NOT_TLS = "not_tls"
    """The first bytes through a CONNECT tunnel were not a TLS ClientHello."""
    LEDGER_FAILED = "ledger_failed"
    """A ledger write failed (fail closed: every open tunnel closes)."""
    STOPPING = "stopping"
    """brokerd is stopping."""
    UPSTREAM_ERROR = "upstream_error"
    """The connection to the host failed after it was dialled."""


@attrs.frozen
class Connection:
    """The end of a tunnel that opened (docs/protocol.md, "Connection records"): written
    by brokerd when it closes, before its ``connect`` call's ``result``. ``call`` is the
    connect call, ``via`` the call whose sandbox opened it; ``address`` the IP address
    dialled, ``server_name`` the TLS ClientHello's (None without one); ``bytes_up`` went
    from the sandbox to the host, ``bytes_down`` back."""

    kind: ClassVar[Kind] = Kind.CONNECTION
    call: str
    via: str
    session: str
    host: str
    port: int
    address: str
    server_name: str | None
    bytes_up: int
    bytes_down: int
    duration_ms: int
    ended: ConnectionEnd


class CallPhase(enum.StrEnum):
    """Where an open call stands (a :class:`CheckpointRecord`'s ``open_calls``)."""

    ASKED = "asked"
    """Decided ``ask``, no approval yet."""
    RUNNING = "running"
    """Decided ``run``, no result yet."""
    APPROVED = "approved"
    """An approval let it run, no result yet."""


@attrs.frozen
class CheckpointRecord:
    """A signed checkpoint of the ledger's Merkle tree (docs/protocol.md, "Checkpoints"):
    written by the ledger writer every ``[ledger] checkpoint_every`` records or
    ``checkpoint_seconds`` with new records, and at a clean stop. ``size`` is this
    record's own seq: the tree covers every line before it. ``root`` is the tree's root
    (64 hex), ``note`` the C2SP signed note of the checkpoint (origin, size, root in
    base64, then the ledger key's signature). ``open_calls`` are the calls open at
    ``size`` that ``boot`` (the writer's) made, each with its phase, and ``unfinished``
    those earlier boots left open: what a verification starting here needs of
    everything before it."""

    kind: ClassVar[Kind] = Kind.CHECKPOINT
    boot: str
    size: int
    root: str
    note: str
    open_calls: dict[str, CallPhase]
    unfinished: list[str]


Body = (
    Genesis
    | Start
    | Stop
    | Repair
    | Decision
    | Approval
    | Result
    | Policy
    | McpTools
    | Connection
    | CheckpointRecord
)

# An approval without a grant written, a note, a definition or an approver keeps the line
# it had before the field existed.
converter.register_unstructure_hook(
    Approval,
    make_dict_unstructure_fn(
        Approval,
        converter,
        grant_written=override(omit_if_default=True),
        note=override(omit_if_default=True),
        definition=override(omit_if_default=True),
        approver=override(omit_if_default=True),
    ),
)
# Likewise a result of a run that was not stopped, and any record of a built-in tool's call.
converter.register_unstructure_hook(
    Result,
    make_dict_unstructure_fn(
        Result,
        converter,
        stopped=override(omit_if_default=True),
        definition=override(omit_if_default=True),
    ),
)
converter.register_unstructure_hook(
    Decision,
    make_dict_unstructure_fn(Decision, converter, definition=override(omit_if_default=True)),
)

BODY_TYPES: dict[Kind, type[Body]] = {
    Kind.GENESIS: Genesis,
    Kind.START: Start,
    Kind.STOP: Stop,
    Kind.REPAIR: Repair,
    Kind.DECISION: Decision,
    Kind.APPROVAL: Approval,
    Kind.RESULT: Result,
    Kind.POLICY: Policy,
    Kind.MCP_TOOLS: McpTools,
    Kind.CONNECTION: Connection,
    Kind.CHECKPOINT: CheckpointRecord,
}


class BadRecord(ValueError):
    """A line that is not a record of a known kind with the right fields."""


class NotJson(BadRecord):
    """A line that is not JSON at all (a torn write, or not a ledger's line)."""


def new_ledger_id() -> str:
    """A fresh ledger id, ``l-`` + 16 hex.

    >>> len(new_ledger_id())
    18
    """
    return "l-" + secrets.token_hex(8)


def new_boot_id() -> str:
    """A fresh boot id, ``b-`` + 16 hex.

    >>> new_boot_id().startswith("b-")
    True
    """
    return "b-" + secrets.token_hex(8)


def body_fields(body: Body) -> dict[str, Any]:
    """A body's fields as its line holds them (JSON's values, by the one converter),
    without the common ones: what a reader shows of a record.

    >>> body_fields(Stop(boot="b-1"))
    {'boot': 'b-1'}
    """
    fields: dict[str, Any] = converter.unstructure(body, type(body))
    return fields


def call_of(body: Body) -> str | None:
    """The call a record is of (a decision, approval, result or connection), else None.

    >>> call_of(Stop(boot="b-1")) is None
    True
    """
    match body:
        case Decision() | Approval() | Result() | Connection():
            return body.call
        case _:
            return None


def encode_line(seq: int, at: str, prev: str, body: Body) -> bytes:
    """The canonical bytes of a record, without the newline: keys sorted, no spaces.

    >>> encode_line(3, "2026-01-02T03:04:05.678Z", "ab", Stop(boot="b-1"))
    b'{"at":"2026-01-02T03:04:05.678Z","boot":"b-1","kind":"stop","prev":"ab","seq":3}'
    """
    fields = body_fields(body)
    fields["seq"] = seq
    fields["at"] = at
    fields["kind"] = body.kind.value
    fields["prev"] = prev
    return orjson.dumps(fields, option=orjson.OPT_SORT_KEYS)


def line_fields(line: bytes) -> dict[str, Any]:
    """The JSON object a line holds. Raises :class:`NotJson`, or :class:`BadRecord`
    for JSON that is not an object.

    >>> line_fields(b'{"seq": 1}')
    {'seq': 1}
    >>> line_fields(b"[1]")
    Traceback (most recent call last):
    ...
    boxmaker.ledger.records.BadRecord: not a JSON object
    """
    try:
        fields = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise NotJson(f"not JSON: {exc}") from None
    if type(fields) is not dict:
        raise BadRecord("not a JSON object")
    return fields


def decode_fields(fields: dict[str, Any]) -> Record[Body]:
    """The record a line's JSON object says (it is consumed): the common fields, then
    the body by the one converter, then ``at``, which must be a time with an offset.
    Raises :class:`BadRecord`.

    >>> decode_fields({"seq": 1})
    Traceback (most recent call last):
    ...
    boxmaker.ledger.records.BadRecord: missing common field 'at'
    """
    common = {}
    for name in ("seq", "at", "kind", "prev"):
        if name not in fields:
            raise BadRecord(f"missing common field {name!r}")
        common[name] = fields.pop(name)
    seq, at, kind, prev = common["seq"], common["at"], common["kind"], common["prev"]
    if type(seq) is not int or type(at) is not str or type(prev) is not str:
        raise BadRecord("common field of the wrong type")
    try:
        body_type = BODY_TYPES[Kind(kind)]
    except ValueError:
        raise BadRecord(f"unknown kind {kind!r}") from None
    try:
        body = converter.structure(fields, body_type)
    except Exception as exc:  # cattrs raises validation groups of many kinds; one answer
        raise BadRecord(f"bad {kind} record: " + "; ".join(cattrs.transform_error(exc))) from None
    try:
        record_time(at)
    except ValueError:
        raise BadRecord(f"at {at!r} is not a UTC time") from None
    return Record(seq=seq, at=at, prev=prev, body=body)


def decode_line(line: bytes) -> Record[Body]:
    """Read a line back into a :class:`~boxmaker.core.vocabulary.Record` (the reader's
    typed path: :mod:`boxmaker.ledger.reader`). Raises :class:`BadRecord`.

    >>> decode_line(b'{"seq": 1}')
    Traceback (most recent call last):
    ...
    boxmaker.ledger.records.BadRecord: missing common field 'at'
    >>> decode_line(b'{"at":"now","boot":"b-1","kind":"stop","prev":"ab","seq":3}')
    Traceback (most recent call last):
    ...
    boxmaker.ledger.records.BadRecord: at 'now' is not a UTC time
    """
    return decode_fields(line_fields(line))


def line_hash(line: bytes) -> str:
    """SHA-256 hex of a line's exact bytes, without its newline: the next
    record's ``prev``.

    >>> line_hash(b"")
    'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855'
    """
    return hashlib.sha256(line).hexdigest()


def format_head(seq: int, digest: str) -> str:
    """The head, ``SEQ:HASH``.

    >>> format_head(7, "ab")
    '7:ab'
    """
    return f"{seq}:{digest}"


def parse_head(text: str) -> tuple[int, str]:
    """Read a head noted earlier (``--expect-head``).

    >>> parse_head("7:" + "a" * 64)[0]
    7
    >>> parse_head("7:xyz")
    Traceback (most recent call last):
    ...
    ValueError: a head is SEQ:SHA256 (64 lowercase hex), not '7:xyz'
    """
    seq_text, _, digest = text.partition(":")
    if (
        not seq_text.isascii()
        or not seq_text.isdigit()
        or len(digest) != 64
        or digest.strip("0123456789abcdef")
    ):
        raise ValueError(f"a head is SEQ:SHA256 (64 lowercase hex), not {text!r}")
    return int(seq_text), digest


_CONNECTION_ENDS: Final = frozenset(end.value for end in ConnectionEnd)
_CONNECTION_COUNTS: Final = ("port", "bytes_up", "bytes_down", "duration_ms")


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def connection_problem(rec: dict[str, Any]) -> str | None:
    """What is wrong with a ``connection`` record's fields (raises KeyError for a
    missing one), or None.

    >>> print(connection_problem({"call": "c-1", "via": "c-0000000000000001"}))
    with call id 'c-1'
    """
    for name in ("call", "via"):
        if type(rec[name]) is not str or not CALL_ID.fullmatch(rec[name]):
            return f"with {name} id {rec[name]!r}"
    if type(rec["session"]) is not str or not SESSION_ID.fullmatch(rec["session"]):
        return f"with session id {rec['session']!r}"
    if type(rec["host"]) is not str or not rec["host"]:
        return f"with host {rec['host']!r}"
    for name in _CONNECTION_COUNTS:
        if type(rec[name]) is not int or rec[name] < 0:
            return f"with {name} {rec[name]!r}"
    if not 1 <= rec["port"] <= 65535:
        return f"with port {rec['port']!r}"
    address = rec["address"]
    if type(address) is not str or not _is_address(address):
        return f"with address {address!r}, not an IP address"
    if rec["server_name"] is not None and type(rec["server_name"]) is not str:
        return f"with server_name {rec['server_name']!r}"
    if rec["ended"] not in _CONNECTION_ENDS:
        return f"with ended {rec['ended']!r}"
    return None
