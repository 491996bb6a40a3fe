"""The ``tool_result`` the owner is shown: the detail and the output's head, bounded."""

from __future__ import annotations

import orjson
import pytest

from boxmaker.core.vocabulary import AnswerOutcome
from boxmaker.loop.broker_port import PortAnswer
from boxmaker.loop.results import output_head, result_event
from boxmaker.wire import BadFrame, ModelDoneEvent, OutputHead, decode_loop_event, encode_frame
from boxmaker.wire.loop import MAX_DELTA, MAX_DETAIL, MAX_HEAD_LINE, MAX_HEAD_LINES

CALL = "c-0123456789abcdef"


def test_the_head_keeps_the_first_lines_and_counts_them_all() -> None:
    text = "".join(f"{n}\n" for n in range(20))
    assert output_head(text) == OutputHead(
        lines=[str(n) for n in range(MAX_HEAD_LINES)], total_lines=20
    )


def test_a_long_line_is_cut_with_an_ellipsis_and_a_short_one_kept() -> None:
    head = output_head("x" * (MAX_HEAD_LINE + 1) + "\n" + "y" * MAX_HEAD_LINE)
    assert head is not None
    assert head.lines == ["x" * (MAX_HEAD_LINE - 1) + "…", "y" * MAX_HEAD_LINE]


def test_only_newlines_split_lines() -> None:
    head = output_head("a\rb\u2028c\x0bd\nlast")
    assert head == OutputHead(lines=["a\rb\u2028c\x0bd", "last"], total_lines=2)


def test_a_shell_success_shows_stdout_stderr_and_exit_0() -> None:
    answer = PortAnswer(AnswerOutcome.OK, content="out 1\nout 2\n\n[stderr]\nwarn\n")
    event = result_event(CALL, "shell", answer, elapsed_s=1.2345)
    assert event.output == OutputHead(lines=["out 1", "out 2"], total_lines=2)
    assert event.stderr == OutputHead(lines=["warn"], total_lines=1)
    assert (event.exit_code, event.elapsed_ms, event.detail) == (0, 1234, None)


def test_a_shell_with_only_stderr_has_no_output() -> None:
    answer = PortAnswer(AnswerOutcome.OK, content="\n[stderr]\nonly this")
    event = result_event(CALL, "shell", answer, elapsed_s=0)
    assert (event.output, event.stderr) == (None, OutputHead(lines=["only this"], total_lines=1))


@pytest.mark.parametrize(
    ("detail", "code"),
    [
        ("exit status 3: boom", 3),
        ("the memory limit (exit status 137: killed); see docs/runbook.md#sandbox-limits", 137),
        ("killed after 5 s (the time limit)", None),
    ],
)
def test_a_failed_shell_takes_its_exit_status_from_the_detail(
    detail: str, code: int | None
) -> None:
    answer = PortAnswer(AnswerOutcome.FAILED, reason="tool_error", detail=detail)
    event = result_event(CALL, "shell", answer, elapsed_s=0)
    assert (event.exit_code, event.detail, event.output) == (code, detail, None)


def test_other_tools_have_no_exit_status_and_their_content_is_the_output() -> None:
    answer = PortAnswer(AnswerOutcome.OK, content="a.txt\nb/\n")
    event = result_event(CALL, "list_dir", answer, elapsed_s=0)
    assert (event.exit_code, event.stderr) == (None, None)
    assert event.output == OutputHead(lines=["a.txt", "b/"], total_lines=2)


def test_a_long_detail_is_cut() -> None:
    answer = PortAnswer(AnswerOutcome.DENIED, reason="no_grant", detail="d" * (MAX_DETAIL + 50))
    event = result_event(CALL, "read_file", answer, elapsed_s=0)
    assert event.detail == "d" * (MAX_DETAIL - 1) + "…"
    assert event.output is None


def test_the_new_events_round_trip_and_their_bounds_hold_on_decoding() -> None:
    event = result_event(
        CALL, "shell", PortAnswer(AnswerOutcome.OK, content="hi\n[stderr]\nho"), elapsed_s=0.5
    )
    assert decode_loop_event(encode_frame(event).rstrip(b"\n")) == event
    too_many = {"lines": ["x"] * (MAX_HEAD_LINES + 1), "total_lines": 9}
    frame = {"kind": "tool_result", "call": CALL, "outcome": "ok", "output": too_many}
    with pytest.raises(BadFrame):
        decode_loop_event(orjson.dumps(frame))
    with pytest.raises(BadFrame):
        decode_loop_event(orjson.dumps({"kind": "reply_delta", "text": "x" * (MAX_DELTA + 1)}))
    with pytest.raises(BadFrame):
        decode_loop_event(
            orjson.dumps({"kind": "progress", "step": 1, "elapsed_ms": -1, "tokens": 0})
        )
    done = ModelDoneEvent(step=2, elapsed_ms=10)
    assert encode_frame(done) == b'{"kind":"model_done","step":2,"elapsed_ms":10}\n'
