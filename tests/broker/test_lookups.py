"""One call's lookups (boxmaker.broker.lookups): one a name while the answer is young,
a new one once it is :data:`KEPT_S` old, nothing kept from a failure or an empty answer,
and at most :data:`NAMES_KEPT` names. Time is trio's autojump clock."""

from __future__ import annotations

import socket

import pytest
import trio
import trio.testing

from boxmaker.broker.lookups import KEPT_S, NAMES_KEPT, CallLookups


class Counting:
    def __init__(self, answers: dict[str, list[str]]) -> None:
        self.answers = answers
        self.asked: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append((host, port))
        await trio.lowlevel.checkpoint()
        if host not in self.answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return self.answers[host]


async def test_an_answer_serves_the_calls_later_connections_until_it_is_kept_s_old(
    autojump_clock: trio.testing.MockClock,
) -> None:
    resolver = Counting({"svc.test": ["192.0.2.1", "192.0.2.2"]})
    lookups = CallLookups(resolver)
    assert await lookups.resolve("svc.test", 443) == ["192.0.2.1", "192.0.2.2"]
    await trio.sleep(KEPT_S - 0.001)
    assert await lookups.resolve("svc.test", 443) == ["192.0.2.1", "192.0.2.2"]
    assert resolver.asked == [("svc.test", 443)]
    await trio.sleep(0.001)  # KEPT_S since the lookup: the boundary is a new lookup
    resolver.answers["svc.test"] = ["192.0.2.3"]
    assert await lookups.resolve("svc.test", 443) == ["192.0.2.3"]
    assert resolver.asked == [("svc.test", 443)] * 2


async def test_another_port_is_its_own_lookup_and_a_caller_cannot_change_what_is_kept(
    autojump_clock: trio.testing.MockClock,
) -> None:
    resolver = Counting({"svc.test": ["192.0.2.1"]})
    lookups = CallLookups(resolver)
    first = await lookups.resolve("svc.test", 443)
    first.append("127.0.0.1")
    assert await lookups.resolve("svc.test", 443) == ["192.0.2.1"]
    await lookups.resolve("svc.test", 8443)
    assert resolver.asked == [("svc.test", 443), ("svc.test", 8443)]


async def test_a_failure_or_an_empty_answer_is_not_kept(
    autojump_clock: trio.testing.MockClock,
) -> None:
    resolver = Counting({"empty.test": []})
    lookups = CallLookups(resolver)
    for _ in range(2):
        with pytest.raises(socket.gaierror):
            await lookups.resolve("gone.test", 443)
        assert await lookups.resolve("empty.test", 443) == []
    assert resolver.asked == [("gone.test", 443), ("empty.test", 443)] * 2


async def test_past_names_kept_the_oldest_answer_goes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    names = [f"n{i}.test" for i in range(NAMES_KEPT + 1)]
    resolver = Counting({name: ["192.0.2.1"] for name in names})
    lookups = CallLookups(resolver)
    for name in names:
        await lookups.resolve(name, 443)
    await lookups.resolve(names[-1], 443)
    await lookups.resolve(names[1], 443)
    assert len(resolver.asked) == NAMES_KEPT + 1  # both still kept
    await lookups.resolve(names[0], 443)
    assert resolver.asked[-1] == (names[0], 443)
    assert len(resolver.asked) == NAMES_KEPT + 2
