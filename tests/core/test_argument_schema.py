"""core/argument_schema.py: a tool's schema compiled when it is built (a schema that is
not one is refused then, not at the first call), and the one problem said of arguments
that break several rules: an unknown argument before a missing one, a missing one
before a bad value, and among bad values the first argument in the schema's order; a
rule without words of its own says jsonschema's, cut to 200 characters."""

from __future__ import annotations

from typing import Any, Final

import jsonschema.exceptions
import pytest

from boxmaker.core.argument_schema import ArgumentSchema

SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "minLength": 1},
        "count": {"type": "integer", "minimum": 1, "maximum": 9},
        "label": {"type": "string", "maxLength": 4},
    },
    "required": ["path", "count"],
    "additionalProperties": False,
}


@pytest.fixture
def schema() -> ArgumentSchema:
    """Built here, in the test: the catalogue's are built at import."""
    return ArgumentSchema(SCHEMA)


def test_a_schema_that_is_not_one_is_refused_when_built() -> None:
    with pytest.raises(jsonschema.exceptions.SchemaError):
        ArgumentSchema({"type": "object", "properties": {}, "required": "path"})


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({"path": "a", "count": 3}, None),
        ({"path": "a", "count": 3, "label": "abcd"}, None),
        ({"path": "", "count": 3, "extra": 1}, "unknown argument 'extra'"),
        ({"path": "", "extra": 1}, "unknown argument 'extra'"),
        ({"path": ""}, "missing argument 'count'"),
        ({"count": 0}, "missing argument 'path'"),
        ({"path": 7, "count": 0}, "argument 'path' must be a string"),
        ({"path": "", "count": 0}, "argument 'path' must not be empty"),
        ({"path": "a", "count": 0, "label": 1}, "argument 'count' must be at least 1"),
        ({"path": "a", "count": 10}, "argument 'count' must be at most 9"),
        ({"path": "a", "count": 2.0}, "argument 'count' must be an integer"),
        ({"path": "a", "count": True}, "argument 'count' must be an integer"),
    ],
)
def test_the_first_problem_by_rank_then_the_schemas_order(
    schema: ArgumentSchema, arguments: dict[str, Any], problem: str | None
) -> None:
    assert schema.problem(arguments) == problem


def test_a_missing_argument_comes_before_a_bad_value_of_the_first() -> None:
    """The ranks, not jsonschema's order of errors: here it finds the bad value first."""
    required_last = {**SCHEMA, "required": ["count", "path"]}
    problem = ArgumentSchema(required_last).problem({"path": 7})
    assert problem == "missing argument 'count'"


def test_words_of_a_rule_without_its_own_are_jsonschemas_cut_to_200(
    schema: ArgumentSchema,
) -> None:
    problem = schema.problem({"path": "a", "count": 1, "label": "x" * 500})
    assert problem is not None
    prefix = "argument 'label': "
    assert problem.startswith(prefix + "'xxxx")
    assert len(problem) == len(prefix) + 200
