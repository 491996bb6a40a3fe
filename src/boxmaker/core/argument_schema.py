"""The built-in tools' arguments checked against the JSON schemas the model is served,
by jsonschema (docs/decisions.md, "Layout and stack": tool arguments), and the first
problem worded for the model and the owner.

The schemas are a small subset of JSON schema (object, properties, required, no
additional properties, string and integer, minimum, maximum, minLength); the wording
names the argument, the way every ``bad_arguments`` detail does. One strictness beyond
the standard: an integer argument is a JSON integer, never a number like ``1.0`` (the
arguments become attrs values through the one converter, which must not round a
float).

>>> check = ArgumentSchema({
...     "type": "object",
...     "properties": {"n": {"type": "integer", "minimum": 1}},
...     "required": ["n"],
...     "additionalProperties": False,
... })
>>> check.problem({"n": 2}) is None
True
>>> check.problem({"n": 1.0}), check.problem({"n": 0}), check.problem({"m": 1, "n": 1})
("argument 'n' must be an integer", "argument 'n' must be at least 1", "unknown argument 'm'")
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import jsonschema.exceptions
import jsonschema.protocols
import jsonschema.validators
import referencing

__all__ = ["ArgumentSchema"]

_TYPE_WORDS: Final = {"string": "a string", "integer": "an integer"}

_STRICT_TYPES: Final = jsonschema.validators.Draft202012Validator.TYPE_CHECKER.redefine(
    "integer", lambda _checker, value: type(value) is int
)
# jsonschema's stubs leave ``extend`` untyped; it returns a validator class.
_StrictValidator: Final[type[jsonschema.protocols.Validator]] = jsonschema.validators.extend(  # type: ignore[no-untyped-call]
    jsonschema.validators.Draft202012Validator, type_checker=_STRICT_TYPES
)


class ArgumentSchema:
    """One tool's parameter schema, compiled once."""

    def __init__(self, schema: Mapping[str, Any]) -> None:
        _StrictValidator.check_schema(dict(schema))
        self._schema = schema
        self._properties: list[str] = list(schema["properties"])
        self._validator: jsonschema.protocols.Validator = _StrictValidator(
            schema, registry=referencing.Registry()
        )

    def problem(self, arguments: Mapping[str, Any]) -> str | None:
        """The first problem of ``arguments`` (a JSON object), or None: an unknown
        argument first, then a missing one, then each argument's in the schema's
        order."""
        errors = list(self._validator.iter_errors(arguments))
        if not errors:
            return None
        return self._words(min(errors, key=self._rank), arguments)

    def _rank(self, error: jsonschema.exceptions.ValidationError) -> int:
        if error.validator == "additionalProperties":
            return 0
        if error.validator == "required":
            return 1
        return 2 + self._properties.index(str(error.absolute_path[0]))

    def _words(
        self, error: jsonschema.exceptions.ValidationError, arguments: Mapping[str, Any]
    ) -> str:
        if error.validator == "additionalProperties":
            unknown = next(key for key in arguments if key not in self._properties)
            return f"unknown argument {unknown!r}"
        if error.validator == "required":
            missing = next(key for key in self._schema["required"] if key not in arguments)
            return f"missing argument {missing!r}"
        key = str(error.absolute_path[0])
        limit: Any = error.validator_value
        if error.validator == "type":
            return f"argument {key!r} must be {_TYPE_WORDS[limit]}"
        if error.validator == "minimum":
            return f"argument {key!r} must be at least {limit}"
        if error.validator == "maximum":
            return f"argument {key!r} must be at most {limit}"
        if error.validator == "minLength":
            return f"argument {key!r} must not be empty"
        return f"argument {key!r}: {error.message[:200]}"
