"""Homes for tests: a fresh home on a short path, and writers of the files an owner
edits (config.toml, grants.toml) and brokerd keeps (session state)."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from boxmaker.home.paths import Home


@contextlib.contextmanager
def short_home(prefix: str = "bx-") -> Iterator[Home]:
    """A fresh home, removed afterwards. Short path: AF_UNIX paths are capped at 107
    bytes, and pytest's tmp_path can be longer than that."""
    home = Home(Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp")))
    home.create()
    try:
        yield home
    finally:
        shutil.rmtree(home.root, ignore_errors=True)


def write_config(home: Home, text: str) -> None:
    home.config_toml.write_text(text, encoding="utf-8")


def write_grants(home: Home, text: str) -> None:
    """Replace grants.toml the way an editor does (new inode), so the stat changes."""
    temp = home.grants_toml.with_name("grants.toml.tmp")
    temp.write_text(text, encoding="utf-8")
    temp.replace(home.grants_toml)


def grant(gid: str, tool: str, mode: str, **extra: str | list[str]) -> str:
    """One ``[[grant]]`` table (values are TOML strings or arrays of strings)."""
    return grant_table(gid, tool, mode, **{k: orjson.dumps(v).decode() for k, v in extra.items()})


def grant_table(gid: str, tool: str, mode: str, **toml_values: str) -> str:
    """One ``[[grant]]`` table whose further values are TOML as written
    (``paths='["notes/**"]'``, ``expires="2026-07-01T00:00:00Z"``)."""
    lines = ["[[grant]]", f'id = "{gid}"', f'tool = "{tool}"', f'mode = "{mode}"']
    lines += [f"{key} = {value}" for key, value in toml_values.items()]
    return "\n".join(lines) + "\n"


def write_state(home: Home, session: str, taint: str, untrusted: bool = False) -> None:
    data = {"v": 1, "taint": taint, "untrusted": untrusted}
    home.session_state(session).write_bytes(orjson.dumps(data))


def read_state_file(home: Home, session: str) -> dict[str, Any] | None:
    path = home.session_state(session)
    return orjson.loads(path.read_bytes()) if path.exists() else None
