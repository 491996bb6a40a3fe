"""The hash-chained audit ledger (docs/protocol.md, docs/decisions.md): records, the single
writer, verification.

- :mod:`boxmaker.ledger.records`: record bodies and their canonical bytes (pure);
- :mod:`boxmaker.ledger.writer`: open/repair, and the trio writer task (group commit);
- :mod:`boxmaker.ledger.reader`: the one reader, lines in, typed records out (a typed
  path, and a fast path for decisions);
- :mod:`boxmaker.ledger.verify`: streaming verification (pure core, file wrapper).
"""

from __future__ import annotations

from boxmaker.core.vocabulary import ApprovalBy, ApprovalOutcome, VerdictCode
from boxmaker.ledger.live_file import LedgerTorn, Tail, open_ledger, repair
from boxmaker.ledger.reader import LedgerReader, NotARecord, iter_lines
from boxmaker.ledger.records import (
    Approval,
    BadRecord,
    Body,
    Decision,
    Genesis,
    Kind,
    Policy,
    Record,
    Repair,
    Result,
    ResultStatus,
    Start,
    Stop,
    decode_line,
    encode_line,
    format_head,
    line_hash,
    new_boot_id,
    parse_head,
)
from boxmaker.ledger.verify import CallCounts, Problem, Report, verify_lines
from boxmaker.ledger.verify_files import verify_file
from boxmaker.ledger.writer import Appended, LedgerFile, LedgerStopped, LedgerWriter, OsLedgerFile

__all__ = [
    "Appended",
    "Approval",
    "ApprovalBy",
    "ApprovalOutcome",
    "BadRecord",
    "Body",
    "CallCounts",
    "Decision",
    "Genesis",
    "Kind",
    "LedgerFile",
    "LedgerReader",
    "LedgerStopped",
    "LedgerTorn",
    "LedgerWriter",
    "NotARecord",
    "OsLedgerFile",
    "Policy",
    "Problem",
    "Record",
    "Repair",
    "Report",
    "Result",
    "ResultStatus",
    "Start",
    "Stop",
    "Tail",
    "VerdictCode",
    "decode_line",
    "encode_line",
    "format_head",
    "iter_lines",
    "line_hash",
    "new_boot_id",
    "open_ledger",
    "parse_head",
    "repair",
    "verify_file",
    "verify_lines",
]
