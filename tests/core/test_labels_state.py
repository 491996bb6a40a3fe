"""Labels, label rules and the state file format."""

from __future__ import annotations

import json
import time

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from boxmaker.core.labels import (
    FRESH,
    UNKNOWN,
    Label,
    LabelRules,
    Taint,
    shell_label,
)
from boxmaker.core.state import StateUnreadable, encode_state, parse_state
from boxmaker.formats.convert import converter

labels = st.builds(Label, st.sampled_from(list(Taint)), st.booleans())


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (".env", Label(Taint.SECRET, False)),
        ("app/.env", Label(Taint.SECRET, False)),
        ("keys/server.pem", Label(Taint.SECRET, False)),
        ("secrets", Label(Taint.SECRET, False)),
        ("secrets/a/b", Label(Taint.SECRET, False)),
        ("downloads/x.html", Label(Taint.INTERNAL, True)),
        ("downloads/.env", Label(Taint.SECRET, True)),
        ("notes.txt", Label(Taint.INTERNAL, False)),
        (".", Label(Taint.INTERNAL, False)),
        ("my-secrets/a", Label(Taint.INTERNAL, False)),
    ],
)
def test_default_label_rules(path: str, expected: Label) -> None:
    assert LabelRules().label_for_path(path) == expected


def test_rules_from_config() -> None:
    rules = converter.structure({"secret": ["private/**"], "untrusted": []}, LabelRules)
    assert rules.label_for_path("private/x") == Label(Taint.SECRET, False)
    assert rules.label_for_path(".env") == Label(Taint.INTERNAL, False)
    assert rules.label_for_path("downloads/x") == Label(Taint.INTERNAL, False)


def test_a_bad_rule_is_refused() -> None:
    with pytest.raises(ValueError, match=r"\[labels\] secret: '/etc/\*\*'"):
        LabelRules(secret=("/etc/**",))


workspace_paths = st.lists(
    st.sampled_from(["secrets", "downloads", "pub", ".env", "a.pem", "x"]), min_size=1, max_size=3
).map("/".join)
rule_sets = st.sampled_from(
    [
        LabelRules(),
        LabelRules(secret=(), untrusted=()),
        LabelRules(secret=("pub/**",), untrusted=()),
    ]
)


@given(rule_sets, workspace_paths, workspace_paths, st.integers(min_value=0, max_value=5))
def test_an_opened_file_reads_as_the_highest_of_its_names(
    rules: LabelRules, requested: str, real: str, links: int
) -> None:
    label = rules.label_for_opened(requested, real, links)
    both = rules.label_for_path(requested).join(rules.label_for_path(real))
    assert rules.highest().dominates(label)
    assert label == (both.join(rules.highest()) if links > 1 else both)


@given(rule_sets, workspace_paths)
def test_no_path_reads_higher_than_the_highest(rules: LabelRules, path: str) -> None:
    assert rules.highest().dominates(rules.label_for_path(path))


def test_a_hard_link_reads_as_the_highest_label_the_rules_give() -> None:
    rules = converter.structure({"secret": ["secrets/**"], "untrusted": []}, LabelRules)
    assert rules.label_for_opened("pub/hard", "pub/hard", 1) == Label(Taint.INTERNAL, False)
    assert rules.label_for_opened("pub/hard", "pub/hard", 2) == Label(Taint.SECRET, False)
    assert rules.label_for_opened("pub/k", "secrets/key", 1) == Label(Taint.SECRET, False)
    assert LabelRules().label_for_opened("a", "a", 3) == Label(Taint.SECRET, True)


def test_shell_label() -> None:
    assert shell_label(None) == Label(Taint.INTERNAL, False)
    assert shell_label(Taint.SECRET) == Label(Taint.SECRET, False)
    assert shell_label(Taint.PUBLIC) == Label(Taint.INTERNAL, False)


def test_fresh_and_unknown() -> None:
    assert (FRESH.taint, FRESH.untrusted) == (Taint.PUBLIC, False)
    assert (UNKNOWN.taint, UNKNOWN.untrusted) == (Taint.SECRET, True)


@given(st.lists(labels, max_size=12))
def test_a_state_only_rises(sequence: list[Label]) -> None:
    state = FRESH
    for label in sequence:
        raised = state.join(label)
        assert raised.dominates(state)
        assert raised.dominates(label)
        assert raised.taint >= state.taint
        assert raised.untrusted >= state.untrusted
        state = raised
    assert UNKNOWN.dominates(state)


@given(labels, labels, labels)
def test_join_is_a_lattice_join(a: Label, b: Label, c: Label) -> None:
    assert a.join(b) == b.join(a)
    assert a.join(b).join(c) == a.join(b.join(c))
    assert a.join(a) == a
    assert FRESH.join(a) == a


@given(labels)
def test_state_round_trip(label: Label) -> None:
    assert parse_state(encode_state(label)) == label


def test_the_spec_example_reads() -> None:
    assert parse_state(b'{"v": 1, "taint": "public", "untrusted": false}') == FRESH


@pytest.mark.parametrize(
    ("data", "detail"),
    [
        (b"", None),
        (b"{", None),
        (b"\xff", None),
        (b"[]", "expected a JSON object"),
        (b'"x"', "expected a JSON object"),
        (b'{"v": 1, "taint": "public"}', None),
        (b'{"v": 1, "taint": "public", "untrusted": false, "x": 1}', None),
        (b'{"v": 2, "taint": "public", "untrusted": false}', "unknown version 2 (expected 1)"),
        (b'{"v": true, "taint": "public", "untrusted": false}', None),
        (b'{"v": 1.0, "taint": "public", "untrusted": false}', None),
        (b'{"v": "1", "taint": "public", "untrusted": false}', None),
        (b'{"v": 1, "taint": "top", "untrusted": false}', "unknown taint 'top'"),
        (b'{"v": 1, "taint": "PUBLIC", "untrusted": false}', None),
        (b'{"v": 1, "taint": 0, "untrusted": false}', None),
        (b'{"v": 1, "taint": "public", "untrusted": 0}', "untrusted must be true or false"),
        (b'{"v": 1, "taint": "public", "untrusted": "false"}', None),
    ],
)
def test_unreadable_states(data: bytes, detail: str | None) -> None:
    result = parse_state(data)
    assert isinstance(result, StateUnreadable)
    if detail is not None:
        assert result.detail == detail


@given(st.binary(max_size=80))
def test_parse_state_never_raises(data: bytes) -> None:
    assert isinstance(parse_state(data), Label | StateUnreadable)


json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=6,
)


@given(st.dictionaries(st.sampled_from(["v", "taint", "untrusted", "x"]), json_like, max_size=4))
def test_parse_state_of_any_object_never_raises(document: dict[str, object]) -> None:
    result = parse_state(json.dumps(document).encode())
    if isinstance(result, Label):
        assert orjson.loads(encode_state(result)) == document


def test_label_rules_match_a_long_path_in_linear_time() -> None:
    # [labels] use the same glob matcher as grants: no backtracking on a long real path
    # (the runner labels by the resolved path, which no argument limit bounds).
    rules = LabelRules(secret=("**/a/**/a/**/a/**/b",), untrusted=("src/**/test/**/*.py",))
    long_path = "/".join(["a"] * 32768)
    start = time.perf_counter()
    label = rules.label_for_path(long_path)
    elapsed = time.perf_counter() - start
    assert label == Label(Taint.INTERNAL, False)
    assert elapsed < 1.0, f"{elapsed:.2f} s"
    assert rules.label_for_path("a/a/x/a/b") == Label(Taint.SECRET, False)
