"""Checkpoints (ledger/checkpoint.py): the C2SP tlog-checkpoint example byte for byte,
round trips, every malformed text refused with its reason, the ledger's origin."""

from __future__ import annotations

import base64
import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from boxmaker.ledger.checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointProblem,
    format_checkpoint,
    ledger_origin,
    parse_checkpoint,
)
from boxmaker.ledger.signed_note import Ed25519PrivateKey, NoteSigner, open_note, sign_note

# c2sp.org/tlog-checkpoint: the example's note text (its signature line left off).
SPEC_TEXT = "example.com/behind-the-sofa\n20852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n"
SPEC_ROOT = bytes.fromhex("0ac5186a91863e8e1d90c808014aa89bf5da8e3ee1d9f07630f0378f68f1ab62")
SPEC_NOTE = (
    SPEC_TEXT + "\n— example.com/behind-the-sofa Az3grlgtzPICa5OS8npVmf1Myq/5IZniMp+ZJurmRDeOoRDe4U"
    "RYN7u5/Zhcyv2q1gGzGku9nTo+zyWE+xeMcTOAYQ8=\n"
)


def test_the_specifications_example_parses_and_formats_back_byte_for_byte() -> None:
    checkpoint = parse_checkpoint(SPEC_TEXT)
    assert checkpoint == Checkpoint("example.com/behind-the-sofa", 20852163, SPEC_ROOT)
    assert format_checkpoint(checkpoint) == SPEC_TEXT
    # The note's text is everything before its last blank line.
    assert SPEC_NOTE.rpartition("\n\n")[0] + "\n" == SPEC_TEXT


def test_the_empty_tree_is_size_zero() -> None:
    empty = Checkpoint("example.com/log", 0, hashlib.sha256(b"").digest())
    text = format_checkpoint(empty)
    assert text == "example.com/log\n0\n47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=\n"
    assert parse_checkpoint(text) == empty


def test_extension_lines_are_kept_in_order() -> None:
    text = SPEC_TEXT + "Timestamp: 1679349379012118479\nsecond extension\n"
    checkpoint = parse_checkpoint(text)
    assert checkpoint.extensions == ("Timestamp: 1679349379012118479", "second extension")
    assert format_checkpoint(checkpoint) == text


origins = st.text(
    st.characters(min_codepoint=0x21, exclude_categories=("Cs",), exclude_characters="\n"),
    min_size=1,
    max_size=30,
)
extensions = st.lists(
    st.text(st.characters(min_codepoint=0x20, exclude_categories=("Cs",)), min_size=1, max_size=20),
    max_size=3,
)


@given(origins, st.integers(0, 2**63 - 1), st.binary(min_size=32, max_size=32), extensions)
def test_any_checkpoint_round_trips(origin: str, size: int, root: bytes, extra: list[str]) -> None:
    checkpoint = Checkpoint(origin, size, root, tuple(extra))
    text = format_checkpoint(checkpoint)
    assert parse_checkpoint(text) == checkpoint
    lines = text.split("\n")
    assert lines[:3] == [origin, str(size), base64.b64encode(root).decode()]
    assert text.endswith("\n")
    assert len(lines) == 4 + len(extra)


ORIGIN = ledger_origin("l-0123456789abcdef")


@pytest.mark.parametrize(
    ("text", "reason", "detail"),
    [
        (SPEC_TEXT[:-1], CheckpointProblem.NO_FINAL_NEWLINE, "the last line has no newline"),
        ("", CheckpointProblem.NO_FINAL_NEWLINE, "the last line has no newline"),
        ("example.com/log\n5\n", CheckpointProblem.TOO_FEW_LINES, "2 lines"),
        ("example.com/log\n", CheckpointProblem.TOO_FEW_LINES, "1 lines"),
        ("\n5\n" + "A" * 43 + "=\n", CheckpointProblem.EMPTY_ORIGIN, "the origin line is empty"),
        ("o\n05\n" + "A" * 43 + "=\n", CheckpointProblem.BAD_SIZE, "'05'"),
        ("o\n00\n" + "A" * 43 + "=\n", CheckpointProblem.BAD_SIZE, "'00'"),
        ("o\n-1\n" + "A" * 43 + "=\n", CheckpointProblem.BAD_SIZE, "'-1'"),
        ("o\n+5\n" + "A" * 43 + "=\n", CheckpointProblem.BAD_SIZE, "'+5'"),
        ("o\n 5\n" + "A" * 43 + "=\n", CheckpointProblem.BAD_SIZE, "' 5'"),
        ("o\n5 \n" + "A" * 43 + "=\n", CheckpointProblem.BAD_SIZE, "'5 '"),
        ("o\n5\r\n" + "A" * 43 + "=\n", CheckpointProblem.BAD_SIZE, "'5\\r'"),
        ("o\n1_000\n" + "A" * 43 + "=\n", CheckpointProblem.BAD_SIZE, "'1_000'"),
        ("o\n\u0665\n" + "A" * 43 + "=\n", CheckpointProblem.BAD_SIZE, "'\u0665'"),
        ("o\n0x10\n" + "A" * 43 + "=\n", CheckpointProblem.BAD_SIZE, "'0x10'"),
        ("o\n\n" + "A" * 43 + "=\n", CheckpointProblem.BAD_SIZE, "''"),
        (f"o\n{2**63}\n" + "A" * 43 + "=\n", CheckpointProblem.BAD_SIZE, "at most 2**63-1"),
        ("o\n5\n" + "A" * 43 + "\n", CheckpointProblem.BAD_ROOT, "not base64 of 32 bytes"),
        ("o\n5\n" + "A" * 42 + "B=\n", CheckpointProblem.BAD_ROOT, "not base64 of 32 bytes"),
        ("o\n5\n" + "A" * 40 + "AA==\n", CheckpointProblem.BAD_ROOT, "not base64 of 32 bytes"),
        ("o\n5\n" + "A" * 44 + "AAAA\n", CheckpointProblem.BAD_ROOT, "not base64 of 32 bytes"),
        ("o\n5\n" + "A" * 42 + "-_\n", CheckpointProblem.BAD_ROOT, "not base64 of 32 bytes"),
        ("o\n5\n \n", CheckpointProblem.BAD_ROOT, "not base64 of 32 bytes"),
        ("o\n5\n\n", CheckpointProblem.BAD_ROOT, "not base64 of 32 bytes"),
        (SPEC_TEXT + "\n", CheckpointProblem.EMPTY_EXTENSION, "line 4 is empty"),
        (SPEC_TEXT + "ext\n\n", CheckpointProblem.EMPTY_EXTENSION, "line 5 is empty"),
    ],
)
def test_every_malformed_checkpoint_is_refused_with_its_reason(
    text: str, reason: CheckpointProblem, detail: str
) -> None:
    with pytest.raises(CheckpointError) as caught:
        parse_checkpoint(text)
    assert caught.value.reason is reason
    assert detail in caught.value.detail
    assert str(caught.value).startswith(f"{reason}: ")


def test_the_largest_size_is_2_63_minus_1() -> None:
    text = f"o\n{2**63 - 1}\n" + "A" * 43 + "=\n"
    assert parse_checkpoint(text).size == 2**63 - 1


@pytest.mark.parametrize(
    ("origin", "size", "root", "extra"),
    [
        ("", 1, bytes(32), ()),
        ("a\nb", 1, bytes(32), ()),
        ("o", -1, bytes(32), ()),
        ("o", 2**63, bytes(32), ()),
        ("o", 1, bytes(31), ()),
        ("o", 1, bytes(33), ()),
        ("o", 1, bytes(32), ("",)),
        ("o", 1, bytes(32), ("a\nb",)),
    ],
)
def test_a_checkpoint_that_could_not_be_written_cannot_be_made(
    origin: str, size: int, root: bytes, extra: tuple[str, ...]
) -> None:
    with pytest.raises(ValueError, match=r"checkpoint's origin|tree size|root hash|extension"):
        Checkpoint(origin, size, root, extra)


def test_a_ledgers_origin_names_its_genesis_ledger_id() -> None:
    assert ORIGIN == "boxmaker.local/ledger/l-0123456789abcdef"


@pytest.mark.parametrize("ledger_id", ["", "l-1 2", "l-1+2", "l/1", "l-1\n", "x" * 65])
def test_an_origin_is_only_made_of_a_ledger_id(ledger_id: str) -> None:
    with pytest.raises(ValueError, match="not a ledger id"):
        ledger_origin(ledger_id)


def test_a_signed_checkpoint_opens_and_parses_to_what_was_signed() -> None:
    key = NoteSigner(ORIGIN, Ed25519PrivateKey.from_private_bytes(bytes(range(32))))
    checkpoint = Checkpoint(ORIGIN, 1000, hashlib.sha256(b"root").digest())
    note = sign_note(format_checkpoint(checkpoint), [key])
    text, names = open_note(note, [key.verifier])
    assert names == (ORIGIN,)
    assert parse_checkpoint(text) == checkpoint
    assert note.decode().splitlines()[4].startswith(f"— {ORIGIN} ")
