"""Changing grants.toml: the one way any program adds or removes a grant
(docs/runbook.md#grants-edit).

Every change is: take an exclusive ``flock`` on ``grants.toml.lock`` beside the file
(0600, never through a link, waited for at most :data:`LOCK_WAIT_S`), read the file
(a regular file, never through a link: boxmaker.home.regular_file), parse it with tomlkit so
its comments and layout survive, add or remove one ``[[grant]]`` table, check the result
with brokerd's own reading (:func:`boxmaker.home.grants_file.read_grants`) — it must be valid
and say exactly the grants before plus (or less) that one —, then write it atomically
(:func:`boxmaker.home.file_ops.write_atomically`). A grants.toml that is already invalid is
never rewritten. Just before the rename the file's stat must still be the one it was
read under: an editor that saved meanwhile (without the lock) is not clobbered, the
change fails and can be tried again.

Blocking: brokerd calls these in a worker thread.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import pwd
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import tomlkit
import tomlkit.exceptions
from tomlkit.items import AoT, Comment, Table, Whitespace

from boxmaker.core.grant_parse import GrantsProblem
from boxmaker.core.grants import Grant, GrantSet
from boxmaker.home.file_ops import OS_FILES, FileOps, stat_key, write_atomically
from boxmaker.home.grants_file import read_grants
from boxmaker.home.regular_file import NotRegularFile, open_regular_file, read_regular_file

RUNBOOK_GRANTS_EDIT: Final = "docs/runbook.md#grants-edit"
LOCK_WAIT_S: Final = 5.0
"""How long a change waits for the lock. Anyone who can open the lock file (the owner's
own programs) could hold it for ever; brokerd must answer the owner, not hang."""
_LOCK_POLL_S: Final = 0.02
FILE_MODE: Final = 0o600


class GrantsEditError(Exception):
    """Why grants.toml was not changed (the message names the runbook entry)."""

    def __init__(self, message: str) -> None:
        super().__init__(f"{message}; see {RUNBOOK_GRANTS_EDIT}")


def lock_path(grants_toml: Path) -> Path:
    return grants_toml.with_name(grants_toml.name + ".lock")


@contextlib.contextmanager
def locked(grants_toml: Path, *, wait: float | None = None) -> Iterator[None]:
    """Hold grants.toml's lock (exclusive), waiting at most ``wait`` seconds for it
    (:data:`LOCK_WAIT_S` unless given)."""
    wait = LOCK_WAIT_S if wait is None else wait
    path = lock_path(grants_toml)
    try:
        fd = open_regular_file(path, os.O_RDWR | os.O_CREAT, FILE_MODE)
    except NotRegularFile as exc:
        raise GrantsEditError(f"{path}: {exc.strerror}") from None
    except OSError as exc:
        raise GrantsEditError(f"{path}: cannot open the lock ({exc.strerror})") from None
    try:
        ends = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise GrantsEditError(f"{path}: cannot lock ({exc.strerror})") from None
            if time.monotonic() >= ends:
                raise GrantsEditError(
                    f"{path}: another program has held the lock for {wait:g} s; nothing changed"
                )
            time.sleep(_LOCK_POLL_S)
        yield
    finally:
        os.close(fd)  # closing releases the lock


class _ReplaceIfUnchanged:
    """``files``' calls, but the rename happens only while grants.toml's stat is still
    ``key`` (what it was read under)."""

    def __init__(self, key: object, files: FileOps) -> None:
        self._key = key
        self._files = files

    def open(self, path: Path, flags: int, mode: int = 0o777) -> int:
        return self._files.open(path, flags, mode)

    def write(self, fd: int, data: bytes | memoryview) -> int:
        return self._files.write(fd, data)

    def fsync(self, fd: int) -> None:
        self._files.fsync(fd)

    def close(self, fd: int) -> None:
        self._files.close(fd)

    def unlink(self, path: Path) -> None:
        self._files.unlink(path)

    def replace(self, source: Path, target: Path) -> None:
        if stat_key(target) != self._key:
            raise GrantsEditError(
                f"{target} changed while it was being rewritten (an editor saved it?); "
                "nothing changed, try again"
            )
        self._files.replace(source, target)


def _read(path: Path) -> tuple[object, bytes, GrantSet]:
    key = stat_key(path)
    try:
        data = read_regular_file(path)
    except FileNotFoundError:
        raise GrantsEditError(f"{path}: no such file (`bxctl init` creates it)") from None
    except OSError as exc:
        raise GrantsEditError(f"{path}: cannot read it ({exc.strerror})") from None
    if stat_key(path) != key:
        raise GrantsEditError(f"{path} changed while it was read; nothing changed, try again")
    grants = read_grants(path, read=lambda _: data).value
    if isinstance(grants, GrantsProblem):
        raise GrantsEditError(
            f"grants.toml is invalid, so it is not rewritten: {grants.describe()}"
        )
    return key, data, grants


def _checked(path: Path, text: str, expected: tuple[Grant, ...]) -> bytes:
    """The new bytes, once brokerd's own reading of them says exactly ``expected``."""
    data = text.encode("utf-8")
    grants = read_grants(path, read=lambda _: data).value
    if isinstance(grants, GrantsProblem):
        raise GrantsEditError(f"the changed file would be invalid: {grants.describe()}")
    if grants.grants != expected:
        raise GrantsEditError("the changed file would not say what was meant; nothing changed")
    return data


def _change(
    path: Path,
    edit: Callable[[tomlkit.TOMLDocument, GrantSet], tuple[Grant, ...]],
    *,
    wait: float | None,
    files: FileOps,
) -> None:
    with locked(path, wait=wait):
        key, data, grants = _read(path)
        try:
            document = tomlkit.parse(data.decode("utf-8"))
        except tomlkit.exceptions.TOMLKitError as exc:  # pragma: no cover - tomllib read it
            raise GrantsEditError(f"grants.toml: {exc}") from None
        expected = edit(document, grants)
        new = _checked(path, tomlkit.dumps(document), expected)
        write_atomically(path, new, mode=FILE_MODE, files=_ReplaceIfUnchanged(key, files))


def _grant_tables(document: tomlkit.TOMLDocument) -> AoT | None:
    item = document.get("grant")
    if item is None:
        return None
    if not isinstance(item, AoT):
        raise GrantsEditError("grants.toml holds its grants other than as [[grant]] tables")
    return item


def _grant_table(fields: dict[str, Any]) -> Table:
    table = tomlkit.table()
    for name, value in fields.items():
        if isinstance(value, dict):
            # An inline table (an external tool's ``arguments``): a [grant.arguments]
            # sub-table would be a header of its own, where the grant's text is cut.
            inline = tomlkit.inline_table()
            inline.update(value)
            value = inline
        table.add(name, value)
    return table


def owner_name(uid: int) -> str:
    """The owner as an approve-always grant's note names them: the user name, else
    ``uid N``."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def grant_text(fields: dict[str, Any]) -> str:
    """The ``[[grant]]`` table :func:`add_grant` writes for ``fields``, as text: what
    the owner is shown before it is written.

    >>> print(grant_text({"id": "g", "paths": ["a b"]}), end="")
    [[grant]]
    id = "g"
    paths = ["a b"]
    """
    tables = tomlkit.aot()
    tables.append(_grant_table(fields))
    document = tomlkit.document()
    document.append("grant", tables)
    return tomlkit.dumps(document)


def add_grant(
    path: Path,
    fields: dict[str, Any],
    new: Grant,
    *,
    wait: float | None = None,
    files: FileOps = OS_FILES,
) -> None:
    """Append one ``[[grant]]`` table (``fields``, in their order) at the end of the
    grants; ``new`` is the grant they make. Raises :class:`GrantsEditError`. ``wait``:
    for the lock (:func:`locked`); ``files``: the file layer the new file is written
    through (a test's stands in for the disk)."""

    def edit(document: tomlkit.TOMLDocument, grants: GrantSet) -> tuple[Grant, ...]:
        if any(grant.id == new.id for grant in grants.grants):
            raise GrantsEditError(f"grants.toml already has a grant {new.id}")
        table = _grant_table(fields)
        tables = _grant_tables(document)
        if tables is None:
            tables = tomlkit.aot()
            tables.append(table)
            document.append("grant", tables)
        else:
            _end_with_blank_line(tables[-1] if len(tables) else None)
            tables.append(table)
        return (*grants.grants, new)

    _change(path, edit, wait=wait, files=files)


def _end_with_blank_line(table: Table | None) -> None:
    """A blank line between the last table and the new one, as people write them."""
    if table is None:
        return
    text = table.as_string()
    if not text.endswith("\n\n"):
        table.add(tomlkit.nl())


def remove_grant(
    path: Path, grant_id: str, *, wait: float | None = None, files: FileOps = OS_FILES
) -> Grant:
    """Remove the ``[[grant]]`` table whose id is ``grant_id``; the grant removed.

    The table goes with its keys and the comments among them; comments after its last
    key (most often about the grant below) stay, as does everything else.
    Raises :class:`GrantsEditError`, also when there is no such grant."""
    removed: list[Grant] = []

    def edit(document: tomlkit.TOMLDocument, grants: GrantSet) -> tuple[Grant, ...]:
        found = [grant for grant in grants.grants if grant.id == grant_id]
        if not found:
            raise GrantsEditError(f"grants.toml has no grant {grant_id!r}")
        removed.append(found[0])
        tables = _grant_tables(document)
        assert tables is not None
        index = next(i for i, t in enumerate(tables) if t.get("id") == grant_id)
        trailing = _trailing_comments(tables[index])
        del tables[index]
        if not len(tables):
            del document["grant"]  # not an empty `grant = []` left behind
            for item in trailing:
                document.add(item)
        elif index > 0:
            above = tables[index - 1]
            if index == len(tables) and _last_in(document, tables):
                _drop_blank_tail(above)  # the blank line add_grant put before it
            for item in trailing:
                above.add(item)
        elif trailing:
            _keep_before(document, trailing)
        return tuple(grant for grant in grants.grants if grant.id != grant_id)

    _change(path, edit, wait=wait, files=files)
    return removed[0]


def _last_in(document: tomlkit.TOMLDocument, tables: AoT) -> bool:
    """Are the ``[[grant]]`` tables the end of the file?"""
    return bool(document.body) and document.body[-1][1] is tables


def _drop_blank_tail(table: Table) -> None:
    """Blank lines at the very end of the file, after the table's last key, go."""
    body = table.value.body
    while body and body[-1][0] is None and isinstance(body[-1][1], Whitespace):
        body.pop()


def _trailing_comments(table: Table) -> list[Comment | Whitespace]:
    """The comment lines (and the blank lines among them) after the table's last key."""
    body = table.value.body
    tail: list[Comment | Whitespace] = []
    for key, item in reversed(body):
        if key is not None or not isinstance(item, Comment | Whitespace):
            break
        tail.append(item)
    tail.reverse()
    # From the first comment on: the blank lines above it separated it from this table.
    while tail and not isinstance(tail[0], Comment):
        tail.pop(0)
    return tail


def _keep_before(document: tomlkit.TOMLDocument, items: list[Comment | Whitespace]) -> None:
    """Put comment lines just above the ``[[grant]]`` tables (the first was removed)."""
    # Straight into the body: only dumps() reads the document after this.
    body = document.body
    index = next(i for i, (key, _) in enumerate(body) if key is not None and key.key == "grant")
    for offset, item in enumerate(items):
        body.insert(index + offset, (None, item))
