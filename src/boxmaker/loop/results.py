"""What the owner is shown of a call's answer (docs/protocol.md, loop.sock): the
``tool_result`` event, with the answer's detail and the head of its output, bounded.

loopd already holds the broker's whole answer, the one the model is told; the owner gets
its first lines (for ``shell``: stdout, stderr and the exit status apart), enough to
follow the turn without flooding the terminal. Pure: no I/O.
"""

from __future__ import annotations

import re
from typing import Final

from boxmaker.core.vocabulary import AnswerOutcome
from boxmaker.loop.broker_port import PortAnswer
from boxmaker.wire import OutputHead, ToolResultEvent
from boxmaker.wire.loop import MAX_DETAIL, MAX_HEAD_LINE, MAX_HEAD_LINES

SHELL: Final = "shell"
STDERR_MARK: Final = "\n[stderr]\n"
"""How the runner puts a command's stderr after its stdout (broker/sandbox.py)."""
EXIT_STATUS: Final = re.compile(r"\bexit status (-?\d+)")
"""How brokerd's ``tool_error`` detail of a command names its exit status
(broker/tools/shell.py)."""
CUT: Final = "…"


def cut(text: str, limit: int) -> str:
    """``text``, or its first ``limit`` characters ending in ``…``.

    >>> cut("abcdef", 4), cut("abcd", 4)
    ('abc…', 'abcd')
    """
    return text if len(text) <= limit else text[: limit - len(CUT)] + CUT


def output_head(text: str) -> OutputHead | None:
    """The first lines of ``text`` (split at newlines only: a ``\\r`` stays in its line,
    where ``printable`` shows it), each cut to a bounded length; None when empty.

    >>> output_head("one\\ntwo\\n")
    OutputHead(lines=['one', 'two'], total_lines=2)
    >>> output_head("") is None
    True
    """
    if not text:
        return None
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    shown = [cut(line, MAX_HEAD_LINE) for line in lines[:MAX_HEAD_LINES]]
    return OutputHead(lines=shown, total_lines=len(lines))


def result_event(call: str, tool: str, answer: PortAnswer, *, elapsed_s: float) -> ToolResultEvent:
    """The ``tool_result`` of ``call``: outcome, reason, detail, the output's head.

    >>> answer = PortAnswer(AnswerOutcome.OK, content="hi\\n[stderr]\\noops")
    >>> e = result_event("c-0123456789abcdef", "shell", answer, elapsed_s=0.25)
    >>> e.output.lines, e.stderr.lines, e.exit_code, e.elapsed_ms
    (['hi'], ['oops'], 0, 250)
    """
    output = stderr = None
    exit_code = None
    if answer.outcome is AnswerOutcome.OK and answer.content:
        if tool == SHELL:
            stdout, marked, errors = answer.content.partition(STDERR_MARK)
            output, stderr = output_head(stdout), output_head(errors) if marked else None
        else:
            output = output_head(answer.content)
    if tool == SHELL:
        if answer.outcome is AnswerOutcome.OK:
            exit_code = 0
        elif answer.detail and (status := EXIT_STATUS.search(answer.detail)):
            exit_code = int(status.group(1))
    return ToolResultEvent(
        call=call,
        outcome=answer.outcome,
        reason=answer.reason,
        detail=None if answer.detail is None else cut(answer.detail, MAX_DETAIL),
        output=output,
        stderr=stderr,
        exit_code=exit_code,
        elapsed_ms=max(0, round(elapsed_s * 1000)),
    )
