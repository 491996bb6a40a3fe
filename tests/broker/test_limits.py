"""brokerd's caps (limits.py): what config.toml and the open-file limit make of them, and
the bookkeeping of connections, pending slots and descriptors."""

from __future__ import annotations

from pathlib import Path

import pytest

from boxmaker.broker.limits import FD_RESERVE, Capacity, Limits
from boxmaker.home.config import BrokerConfig, ConfigError, parse_config
from boxmaker.home.defaults import default_config_text
from boxmaker.home.paths import Home


def test_the_defaults_with_room_keep_10000_pending() -> None:
    limits = Limits.derive(BrokerConfig(), fd_limit=1_048_576, fds_open=30)
    assert (limits.max_connections, limits.max_pending) == (12_000, 10_000)
    assert limits.fd_reserve == FD_RESERVE
    assert limits.max_buffered_bytes == limits.max_pending_bytes == 32 * 1024 * 1024


def test_a_small_fd_limit_lowers_connections_and_pending() -> None:
    limits = Limits.derive(BrokerConfig(), fd_limit=128, fds_open=20)
    # A quarter of a small limit is kept; the rest after what is open is broker.sock's.
    assert limits.fd_reserve == 32
    assert limits.max_connections == 128 - 20 - 32
    assert limits.max_pending == limits.max_connections - limits.max_connections // 8


def test_an_absurd_fd_limit_still_leaves_one_of_each() -> None:
    limits = Limits.derive(BrokerConfig(), fd_limit=8, fds_open=20)
    assert (limits.max_connections, limits.max_pending) == (1, 1)


def test_connections_beyond_the_cap_are_refused_and_counted_again_when_freed() -> None:
    capacity = Capacity(Limits.derive(BrokerConfig(max_connections=2), fd_limit=None, fds_open=0))
    for _ in range(2):
        assert capacity.refusal(10) is None
        capacity.opened()
    refusal = capacity.refusal(12)
    assert refusal == (
        "brokerd already serves 2 connections ([broker] max_connections); "
        "see docs/runbook.md#too-many-connections"
    )
    assert capacity.refused == 1
    capacity.closed()
    assert capacity.refusal(11) is None
    assert capacity.refused == 0


def test_a_descriptor_in_the_reserve_is_refused() -> None:
    limits = Limits.derive(BrokerConfig(), fd_limit=1024, fds_open=20)
    capacity = Capacity(limits)
    assert capacity.refusal(1024 - 256 - 1) is None
    refusal = capacity.refusal(1024 - 256)
    assert refusal is not None
    assert refusal.startswith("brokerd is short of file descriptors (769 of 1024 in use, 256 kept")


def test_pending_slots_count_asks_and_their_bytes() -> None:
    config = BrokerConfig(max_pending=2, max_pending_bytes=3 * 1024 * 1024)
    capacity = Capacity(Limits.derive(config, fd_limit=None, fds_open=0))
    assert capacity.reserve_pending(2 * 1024 * 1024) is None
    bytes_full = capacity.reserve_pending(1024 * 1024 + 1)
    assert bytes_full is not None
    assert "already hold 2097152 bytes of requests ([broker] max_pending_bytes)" in bytes_full
    assert capacity.reserve_pending(100) is None
    count_full = capacity.reserve_pending(1)
    assert count_full == (
        "2 calls already wait for the owner ([broker] max_pending); "
        "see docs/runbook.md#too-many-pending"
    )
    capacity.release_pending(2 * 1024 * 1024)
    capacity.release_pending(100)
    assert (capacity.pending, capacity.pending_bytes) == (0, 0)


def test_config_keys_and_their_floors(tmp_path: Path) -> None:
    home = Home(tmp_path)
    text = "[broker]\nmax_pending = 5\nmax_connections = 9\nmax_buffered_bytes = 4194304\n"
    broker = parse_config(text, home).broker
    assert (broker.max_pending, broker.max_connections, broker.max_buffered_bytes) == (
        5,
        9,
        4194304,
    )
    with pytest.raises(ConfigError, match=r"max_buffered_bytes: expected at least 2097152"):
        parse_config("[broker]\nmax_buffered_bytes = 65536\n", home)
    with pytest.raises(ConfigError, match=r"max_pending: expected at least 1"):
        parse_config("[broker]\nmax_pending = 0\n", home)
    assert "# max_pending = 10000" in default_config_text()
