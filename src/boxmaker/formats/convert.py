"""The one cattrs converter, the id formats, and readable structuring errors.

The bottom of boxmaker's imports: it imports nothing of boxmaker but the clock's time
format, so the core, the ledger and the frames (boxmaker/wire/) all build on it.
Every JSON or TOML document that enters or leaves boxmaker goes through ``converter``:
frames, config.toml, grants.toml, state files, ledger records.

The converter is strict where cattrs' defaults are lenient: ``"5"`` is not an int, ``1``
is not ``true``, ``5`` is not a string, an enum takes only its own values, and times
are aware UTC datetimes written the way :mod:`boxmaker.formats.clock` writes them
(docs/decisions.md, "Wire").
"""

from __future__ import annotations

import datetime as dt
import enum
import functools
import math
import pathlib
import re
import secrets
from collections import abc
from collections.abc import Callable
from typing import Any, Literal, TypeAlias, get_args, get_origin

import attrs
import orjson
from cattrs.cols import homogenous_tuple_structure_factory, list_structure_factory
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError, IterableValidationError
from cattrs.preconf.orjson import make_converter

from boxmaker.formats.clock import format_utc, parse_utc

converter = make_converter(forbid_extra_keys=True)
"""The one converter (cattrs' orjson preconf; extra keys are errors)."""

CALL_ID = re.compile(r"c-[0-9a-f]{16}")
SESSION_ID = re.compile(r"s-[0-9a-f]{12}")
APPROVAL_ID = re.compile(r"a-[0-9a-f]{8}")


def new_call_id() -> str:
    """A fresh call id, ``c-`` + 16 hex.

    >>> bool(CALL_ID.fullmatch(new_call_id()))
    True
    """
    return "c-" + secrets.token_hex(8)


def new_session_id() -> str:
    """A fresh session id, ``s-`` + 12 hex.

    >>> bool(SESSION_ID.fullmatch(new_session_id()))
    True
    """
    return "s-" + secrets.token_hex(6)


def new_approval_id() -> str:
    """A fresh approval id, ``a-`` + 8 hex.

    >>> bool(APPROVAL_ID.fullmatch(new_approval_id()))
    True
    """
    return "a-" + secrets.token_hex(4)


# ---------------------------------------------------------------------------------------
# Errors and their readable form


class WrongType(TypeError):
    """A value of the wrong JSON/TOML type; the message is what a reader sees."""


class InvalidField(ValueError):
    """An attrs validator's complaint, naming the field.

    cattrs calls ``__init__`` after structuring every field, outside its per-field
    bookkeeping, so a validator's error would lose its path; carrying the name here
    puts it back (see :func:`problems`).
    """

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name
        self.message = message


KeyPath: TypeAlias = tuple[str | int, ...]


def problems(exc: BaseException, path: KeyPath = ()) -> list[tuple[KeyPath, str]]:
    """Every problem in a cattrs structuring error, as (key path, message).

    Used for ``bad_frame`` details and for config.toml / grants.toml messages, which
    must name the key (docs/runbook.md#config, docs/runbook.md#grants).

    >>> @attrs.frozen
    ... class Point:
    ...     x: int
    >>> try:
    ...     converter.structure({"x": "1", "y": 2}, Point)
    ... except Exception as exc:
    ...     problems(exc)
    [(('x',), 'expected an integer'), (('y',), 'unknown key')]
    """
    found: list[tuple[KeyPath, str]] = []
    if isinstance(exc, ClassValidationError):
        with_names, without = exc.group_exceptions()
        for sub, note in with_names:
            found.extend(problems(sub, (*path, note.name)))
        for sub in without:
            found.extend(problems(sub, path))
    elif isinstance(exc, IterableValidationError):
        with_index, without = exc.group_exceptions()
        for sub, index_note in with_index:
            index = index_note.index
            found.extend(problems(sub, (*path, index if isinstance(index, int | str) else "?")))
        for sub in without:
            found.extend(problems(sub, path))
    elif isinstance(exc, ForbiddenExtraKeysError):
        found.extend(((*path, key), "unknown key") for key in sorted(exc.extra_fields))
    elif isinstance(exc, InvalidField):
        found.append(((*path, exc.name), exc.message))
    elif isinstance(exc, KeyError):
        found.append((path, "required key missing"))
    elif isinstance(exc, AttributeError) and str(exc).endswith("has no attribute 'items'"):
        found.append((path, "expected an object"))
    elif isinstance(exc, WrongType | ValueError):
        found.append((path, str(exc)))
    else:
        found.append((path, f"invalid value ({type(exc).__name__})"))
    return found


def format_path(path: KeyPath) -> str:
    """``("entries", 0, "grant", "id")`` → ``entries[0].grant.id``.

    >>> format_path(("entries", 0, "grant", "id"))
    'entries[0].grant.id'
    >>> format_path(())
    '(frame)'
    """
    text = ""
    for step in path:
        text += f"[{step}]" if isinstance(step, int) else (f".{step}" if text else step)
    return text or "(frame)"


# ---------------------------------------------------------------------------------------
# Strict structuring of the leaves


def _structure_str(value: object, _: object) -> str:
    if not isinstance(value, str):
        raise WrongType("expected a string")
    return value


def _structure_int(value: object, _: object) -> int:
    # bool is an int subclass; JSON's true is not a number.
    if not isinstance(value, int) or isinstance(value, bool):
        raise WrongType("expected an integer")
    return value


def _structure_float(value: object, _: object) -> float:
    # Durations may be written 300 or 300.0 (seconds, floats allowed). NaN/inf cannot
    # round-trip through JSON (orjson writes them as null), so they are refused everywhere.
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise WrongType("expected a number")
    if not math.isfinite(value):
        raise WrongType("expected a finite number")
    return float(value)


def _structure_bool(value: object, _: object) -> bool:
    if not isinstance(value, bool):
        raise WrongType("expected true or false")
    return value


def _structure_path(value: object, _: object) -> pathlib.Path:
    if not isinstance(value, str) or not value:
        raise WrongType("expected a non-empty string")
    return pathlib.Path(value)


def _structure_datetime(value: object, _: object) -> dt.datetime:
    # TOML hands over datetime objects (grants' `expires`); JSON hands over strings.
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            raise WrongType("expected a time with a zone (e.g. ...Z)")
        return value.astimezone(dt.UTC)
    if not isinstance(value, str):
        raise WrongType("expected a UTC time (ISO 8601)")
    try:
        return parse_utc(value)
    except ValueError:
        raise WrongType("expected a UTC time (ISO 8601 with a zone)") from None


@functools.cache
def _members(cl: type[enum.Enum]) -> tuple[dict[Any, enum.Enum], str]:
    by_value = {member.value: member for member in cl}
    return by_value, "expected one of: " + ", ".join(str(v) for v in by_value)


def _structure_enum(value: object, cl: type[enum.Enum]) -> enum.Enum:
    by_value, words = _members(cl)
    # A dict lookup alone would let 1 stand for True; the type must match too.
    for member_value, member in by_value.items():
        if type(value) is type(member_value) and value == member_value:
            return member
    raise WrongType(words)


def _is_literal(cl: Any) -> bool:
    return getattr(cl, "__origin__", None) is Literal


def _literal_hook(cl: Any) -> Callable[[object, object], object]:
    allowed = get_args(cl)
    words = "expected " + " or ".join(orjson.dumps(v).decode() for v in allowed)

    def structure(value: object, _: object) -> object:
        for candidate in allowed:
            if type(value) is type(candidate) and value == candidate:
                return candidate
        raise WrongType(words)

    return structure


# cattrs tries its singledispatch registrations first, and singledispatch follows the
# MRO: StrEnum would find the str hook, so the enum bases are registered explicitly.
converter.register_structure_hook(str, _structure_str)
converter.register_structure_hook(int, _structure_int)
converter.register_structure_hook(float, _structure_float)
converter.register_structure_hook(bool, _structure_bool)
for _enum_base in (enum.Enum, enum.StrEnum, enum.IntEnum):
    converter.register_structure_hook(_enum_base, _structure_enum)
converter.register_structure_hook(pathlib.Path, _structure_path)


# cattrs builds a class from anything indexable and a list or tuple from any iterable,
# so ``"abc"`` would become ``("a", "b", "c")``. Containers are checked first.
def _is_attrs_class(cl: Any) -> bool:
    return isinstance(cl, type) and attrs.has(cl) and get_origin(cl) is None


def _attrs_factory(cl: Any) -> Callable[[object, object], Any]:
    inner = converter.gen_structure_attrs_fromdict(cl)

    def structure(value: object, _: object) -> Any:
        if not isinstance(value, dict):
            raise WrongType("expected an object")
        return inner(value, cl)

    return structure


def _is_homogeneous_sequence(cl: Any) -> bool:
    origin = get_origin(cl)
    if origin in (list, abc.Sequence, abc.MutableSequence):
        return True
    return origin is tuple and len(get_args(cl)) == 2 and get_args(cl)[1] is Ellipsis


def _sequence_factory(cl: Any) -> Callable[[object, object], Any]:
    as_tuple = get_origin(cl) in (tuple, abc.Sequence)
    inner = (homogenous_tuple_structure_factory if as_tuple else list_structure_factory)(
        cl, converter
    )

    def structure(value: object, _: object) -> Any:
        if not isinstance(value, list | tuple):
            raise WrongType("expected a list")
        return inner(value, cl)

    return structure


converter.register_structure_hook_factory(_is_attrs_class, _attrs_factory)
converter.register_structure_hook_factory(_is_homogeneous_sequence, _sequence_factory)
converter.register_structure_hook(dt.datetime, _structure_datetime)
converter.register_unstructure_hook(dt.datetime, format_utc)
converter.register_structure_hook_factory(_is_literal, _literal_hook)
