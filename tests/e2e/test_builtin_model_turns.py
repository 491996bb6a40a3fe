"""The built-in model (llama.cpp's server with SmolLM2-135M) answering a denial: loopd's
own turn ends within its limits — no step reaches ``[loop] max_step_tokens``, the reply
keeps none of the chat template's tags — where it used to write ``<error>`` until
``max_tokens`` (docs/decisions.md, "A turn always ends"). It needs the optional model
(``nox -s gate`` installs it); without it, it is skipped and says so."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import trio
from tests.harness.homes import short_home
from tests.harness.model import MISSING, builtin_model, turn_answered
from tests.harness.stack import proxied_client

from boxmaker.core.reasons import Reason
from boxmaker.core.vocabulary import AnswerOutcome
from boxmaker.home.config import LoopConfig
from boxmaker.home.paths import Home
from boxmaker.loop.broker_port import PortAnswer
from boxmaker.loop.turn import TEMPLATE_TAGS
from boxmaker.wire import ModelDoneEvent, ReplyEvent, ToolCallEvent

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(MISSING), reason=f"the built-in model is not installed: {MISSING}"),
]

GUARD = 180.0
"""A turn of two steps on a loaded 2-core machine, with room: a runaway step took
43 to 181 s."""
STEP_TOKENS = 128
"""A limit below the default, so reaching it is quick to see."""
GRANTS_INVALID = PortAnswer(
    AnswerOutcome.DENIED,
    reason=Reason.GRANTS_INVALID,
    detail="grants.toml: grant 1 (notes): mode: expected one of auto, ask, deny; got 'yes'",
)


@pytest.fixture
def home() -> Iterator[Home]:
    with short_home("bx-turn-") as fresh:
        fresh.config_toml.write_text("")
        yield fresh


async def test_a_denied_calls_turn_ends_within_its_limits(home: Home) -> None:
    config = LoopConfig(first_step="named", max_step_tokens=STEP_TOKENS)
    with builtin_model(home), trio.fail_after(GUARD):
        async with proxied_client(home, f"unix://{home.model_sock}") as client:
            events = await turn_answered(
                client, GRANTS_INVALID, text='Read the file at path "notes.txt".', config=config
            )
    assert any(isinstance(event, ToolCallEvent) for event in events), events
    steps = [event for event in events if isinstance(event, ModelDoneEvent)]
    assert len(steps) >= 2, events
    for step in steps:
        assert step.cut != "max_tokens", events
        assert step.tokens is None or step.tokens < STEP_TOKENS, events
    reply = events[-1]
    assert isinstance(reply, ReplyEvent), events
    assert not any(tag in reply.text for tag in TEMPLATE_TAGS), reply
