"""What the frames of all three sockets share: the validators of frame fields (bounded
text, counts). The ids' validators, :func:`to_ms` and the ``error`` frame are the call's
vocabulary (:mod:`boxmaker.core.vocabulary`), where the frames of a call are defined.
"""

from __future__ import annotations

from typing import Any

import attrs

from boxmaker.core.vocabulary import FieldValidator
from boxmaker.formats.convert import InvalidField


def text_between(low: int, high: int) -> FieldValidator:
    """An attrs validator: ``low`` to ``high`` characters, not blank when ``low`` > 0;
    ``None`` passes (an optional field left out)."""

    def check(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is None:
            return
        if not (low <= len(value) <= high) or (low > 0 and not value.strip()):
            raise InvalidField(attribute.name, f"expected {low} to {high} characters")

    return check


def non_negative(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    """An attrs validator: a count or a duration, never below zero."""
    if value < 0:
        raise InvalidField(attribute.name, "expected a number >= 0")
