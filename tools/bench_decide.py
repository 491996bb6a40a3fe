"""How many decide() calls per second, with 100 grants (target: at least 50,000/s).

A realistic mix: read_file/list_dir/write_file grants with a few globs each, shell
grants with command patterns, http_get grants with hosts, some with expiry. The requests
match late in the file (the last read_file grant) or not at all, so every grant of the
tool is tried. Prints plain lines: one per case, then the slowest.

    python tools/bench_decide.py [--seconds 1.0]
"""

from __future__ import annotations

import argparse
import datetime as dt
import time

from boxmaker.core.catalogue import CheckedArguments, check_arguments
from boxmaker.core.decide import CheckedRequest, decide
from boxmaker.core.grant_parse import parse_grants
from boxmaker.core.grants import GrantSet
from boxmaker.core.labels import Label, Taint

TARGET = 50_000


def grants_text(count: int = 100) -> str:
    tables = []
    for i in range(count - 1):
        kind = i % 5
        if kind in (0, 1):
            tool = ("read_file", "list_dir")[kind]
            body = f'paths = ["project{i}/**", "docs/{i}/*.md", "**/build{i}/*.log"]'
        elif kind == 2:
            tool, body = "write_file", f'paths = ["out{i}/**"]'
        elif kind == 3:
            tool, body = "shell", f'commands = ["git status*", "make test{i}*", "ls *"]'
        else:
            tool, body = "http_get", f'hosts = ["docs{i}.example.org", "*.pkg{i}.example"]'
        mode = ("auto", "ask", "deny")[i % 3]
        expires = "expires = 2030-01-01T00:00:00Z\n" if i % 7 == 0 else ""
        tables.append(
            f'[[grant]]\nid = "g{i}"\ntool = "{tool}"\nmode = "{mode}"\n{body}\n'
            f'max_taint = "internal"\n{expires}note = "grant {i}"\n'
        )
    tables.append(
        '[[grant]]\nid = "last"\ntool = "read_file"\nmode = "auto"\npaths = ["notes/**"]\n'
    )
    return "\n".join(tables)


def request(tool: str, arguments: dict[str, object]) -> CheckedRequest:
    checked = check_arguments(tool, arguments)
    assert isinstance(checked, CheckedArguments), checked
    return CheckedRequest("c-0123456789abcdef", "s-0123456789ab", checked)


def rate(req: CheckedRequest, grants: GrantSet, seconds: float) -> float:
    now = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)
    state = Label(Taint.INTERNAL, False)
    done = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        for _ in range(1000):
            decide(req, grants, state, now)
        done += 1000
    return done / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0)
    seconds = parser.parse_args().seconds
    grants = parse_grants(grants_text())
    assert isinstance(grants, GrantSet), grants
    cases = {
        "read_file matching the last grant": request("read_file", {"path": "notes/a/b.txt"}),
        "read_file matching no grant": request("read_file", {"path": "elsewhere/x.txt"}),
        "shell matching no grant": request("shell", {"command": "rm -rf build"}),
        "http_get matching no grant": request("http_get", {"url": "https://evil.example/"}),
    }
    print(f"grants: {len(grants.grants)}")
    slowest = float("inf")
    for name, req in cases.items():
        per_second = rate(req, grants, seconds)
        slowest = min(slowest, per_second)
        print(f"{name}: {per_second:,.0f} decisions/s")
    verdict = "ok" if slowest >= TARGET else "BELOW TARGET"
    print(f"slowest: {slowest:,.0f} decisions/s (target {TARGET:,}/s): {verdict}")
    return 0 if slowest >= TARGET else 1


if __name__ == "__main__":
    raise SystemExit(main())
