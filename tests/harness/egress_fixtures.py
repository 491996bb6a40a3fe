"""The egress tests' fixtures (tests/broker/test_egress.py, tests/hostile/
test_egress_proxy.py): a pytest plugin tests/conftest.py loads, so each test names
what it needs — a sandbox workspace, a TLS echo server with a certificate of its own,
the resolver seam, the shell's stand-in, and brokerd started with the last two."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from boxmaker.home.paths import Home

from .broker import Brokerd
from .sandbox import sandbox_workspace
from .tunnels import Certificate, Resolver, ShellStandIn, TlsEchoServer, configure


@pytest.fixture
def ws(home: Home) -> Iterator[Path]:
    with sandbox_workspace() as workspace:
        configure(home, workspace)
        yield workspace


@pytest.fixture
def certificate() -> Certificate:
    return Certificate.make()


@pytest.fixture
async def server(nursery: trio.Nursery, certificate: Certificate, tmp_path: Path) -> TlsEchoServer:
    echo = TlsEchoServer(certificate.server_context(tmp_path))
    await nursery.start(echo.serve)
    return echo


@pytest.fixture
def resolver() -> Resolver:
    """Two names, both to 127.0.0.1; every lookup is kept (``lookups``)."""
    return Resolver({"svc.test": ["127.0.0.1"], "other.test": ["127.0.0.1"]})


@pytest.fixture
def shell() -> ShellStandIn:
    return ShellStandIn()


@pytest.fixture
async def started(brokerd: Brokerd, resolver: Resolver, shell: ShellStandIn, ws: Path) -> Brokerd:
    """brokerd with the shell stand-in and the resolver; grants are written by the test
    before its call (brokerd reads them at each decision)."""
    await brokerd.start(execute=shell, host=resolver.host)
    return brokerd
