"""The add-checkpoint protocol (ledger/witness_protocol.py) against C2SP tlog-witness:
the request body byte for byte (the spec's own example), every answer the spec names
with its status and body, a cosignature that verifies with the witness's vkey, and
round trips and proofs over random trees."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.harness.witness import ORIGIN, WITNESS_NAME, MemoryLog, seeded_key

from boxmaker.ledger.checkpoint import Checkpoint, format_checkpoint
from boxmaker.ledger.merkle import EMPTY_TREE_HASH
from boxmaker.ledger.signed_note import (
    NoteSigner,
    cosign,
    parse_vkey,
    sign_note,
    verify_cosignature,
)
from boxmaker.ledger.witness_protocol import (
    SIZE_CONTENT_TYPE,
    AddCheckpoint,
    Cosign,
    Refusal,
    TreeHead,
    WitnessProblem,
    WitnessRequestError,
    decide_add_checkpoint,
    format_add_checkpoint,
    parse_add_checkpoint,
    parse_conflict,
    pick_cosignature,
)

# c2sp.org/tlog-witness, "add-checkpoint", "Example request body".
SPEC_BODY = (
    "old 20852014\n"
    "PlRNCrwHpqhGrupue0L7gxbjbMiKA9temvuZZDDpkaw=\n"
    "jrJZDmY8Y7SyJE0MWLpLozkIVMSMZcD5kvuKxPC3swk=\n"
    "5+pKlUdi2LeF/BcMHBn+Ku6yhPGNCswZZD1X/6QgPd8=\n"
    "/6WVhPs2CwSsb5rYBH5cjHV/wSmA79abXAwhXw3Kj/0=\n"
    "\n"
    "example.com/behind-the-sofa\n"
    "20852163\n"
    "CsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n"
    "\n"
    "— example.com/behind-the-sofa Az3grlgtzPICa5OS8npVmf1Myq/5IZniMp+ZJurmRDeOoRDe4URYN7u5/"
    "Zhcyv2q1gGzGku9nTo+zyWE+xeMcTOAYQ8=\n"
    "— example.com/behind-the-sofa opLqBQsREYCgu6xQkYQwJr9fo45a62DN9EdmHXnZdXNqlcVGlCum2Wks+49/"
    "V6267UEjw6QUXTS5Rovnzv++qbSzm9Q=\n"
).encode()

LOG = MemoryLog()
LOGS = {ORIGIN: [LOG.signer.verifier]}
WITNESS = NoteSigner(WITNESS_NAME, seeded_key(9))


def body(log: MemoryLog, size: int, old: int, proof: tuple[bytes, ...] | None = None) -> bytes:
    chosen = log.proof(size, old) if proof is None else proof
    return format_add_checkpoint(AddCheckpoint(old, chosen, log.note(size)))


def refusal(request: bytes, heads: dict[str, TreeHead] | None = None) -> Refusal:
    decision = decide_add_checkpoint(request, LOGS, heads or {})
    assert isinstance(decision, Refusal), decision
    return decision


def head(size: int, log: MemoryLog = LOG) -> dict[str, TreeHead]:
    return {ORIGIN: TreeHead(size, log.root(size))}


def test_the_spec_example_parses_and_formats_back_byte_for_byte() -> None:
    request = parse_add_checkpoint(SPEC_BODY)
    assert request.old_size == 20852014
    assert len(request.proof) == 4
    assert request.proof[0] == base64.b64decode("PlRNCrwHpqhGrupue0L7gxbjbMiKA9temvuZZDDpkaw=")
    assert request.note.startswith(b"example.com/behind-the-sofa\n20852163\n")
    assert format_add_checkpoint(request) == SPEC_BODY


def test_a_request_is_the_old_line_the_proof_lines_a_blank_line_and_the_note() -> None:
    proof = (bytes(range(32)), bytes(32))
    formatted = format_add_checkpoint(AddCheckpoint(7, proof, b"NOTE"))
    assert formatted == (
        b"old 7\nAAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\n"
        b"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n\nNOTE"
    )
    assert format_add_checkpoint(AddCheckpoint(0, (), b"N")) == b"old 0\n\nN"


@pytest.mark.parametrize(
    ("request_body", "detail"),
    [
        (b"old 1\n", "no empty line"),
        (b"old 01\n\nN", "'old <size>'"),
        (b"old -1\n\nN", "'old <size>'"),
        (b"old 1 \n\nN", "'old <size>'"),
        (b"Old 1\n\nN", "'old <size>'"),
        (b"old 9223372036854775808\n\nN", "'old <size>'"),
        (b"old 1\nAAAA\n\nN", "line 2 is not the base64 of a 32-byte hash"),
        (b"old 1\n" + base64.b64encode(bytes(32))[:-1] + b"\n\nN", "line 2"),
        (b"old 1\n" + b"".join([base64.b64encode(bytes(32)) + b"\n"] * 64) + b"\nN", "63"),
    ],
)
def test_a_malformed_body_is_400(request_body: bytes, detail: str) -> None:
    with pytest.raises(WitnessRequestError, match=detail):
        parse_add_checkpoint(request_body)
    refused = refusal(request_body)
    assert (refused.status, refused.problem) == (400, WitnessProblem.MALFORMED)
    assert refused.body.startswith(b"malformed: ")


def test_sixty_three_proof_lines_are_allowed() -> None:
    lines = b"".join([base64.b64encode(bytes(32)) + b"\n"] * 63)
    assert len(parse_add_checkpoint(b"old 1\n" + lines + b"\nN").proof) == 63


def test_the_first_checkpoint_is_cosigned_and_the_cosignature_verifies_with_the_vkey() -> None:
    decision = decide_add_checkpoint(body(LOG, 5, 0), LOGS, {})
    assert isinstance(decision, Cosign)
    assert (decision.origin, decision.head) == (ORIGIN, TreeHead(5, LOG.root(5)))
    assert decision.text == LOG.text(5)
    line = cosign(decision.text, WITNESS, 1_700_000_000)
    verifier = parse_vkey(WITNESS.cosignature_verifier.vkey)
    picked = pick_cosignature(line.encode(), verifier)
    assert verify_cosignature(LOG.text(5), picked, verifier) == 1_700_000_000


def test_a_proof_from_the_witness_size_is_cosigned() -> None:
    decision = decide_add_checkpoint(body(LOG, 300, 17), LOGS, head(17))
    assert isinstance(decision, Cosign)
    assert decision.head == TreeHead(300, LOG.root(300))


def test_the_same_checkpoint_again_is_cosigned_again() -> None:
    assert isinstance(decide_add_checkpoint(body(LOG, 17, 17), LOGS, head(17)), Cosign)


def test_an_unknown_origin_is_404() -> None:
    other = MemoryLog(signer=NoteSigner("example.com/other", seeded_key(2)))
    refused = refusal(body(other, 3, 0))
    assert (refused.status, refused.problem) == (404, WitnessProblem.UNKNOWN_LOG)
    assert b"example.com/other" in refused.body


def test_a_checkpoint_signed_by_another_key_for_the_origin_is_403() -> None:
    replaced = MemoryLog(signer=NoteSigner(ORIGIN, seeded_key(3)))
    refused = refusal(body(replaced, 3, 0))
    assert (refused.status, refused.problem) == (403, WitnessProblem.NOT_SIGNED)
    assert "not_verified" in refused.detail


def test_a_bad_signature_by_the_known_key_is_403() -> None:
    text, _, line = LOG.note(3).decode().rpartition("\n\n")
    prefix, _, encoded = line.rstrip("\n").rpartition(" ")
    raw = bytearray(base64.b64decode(encoded))
    raw[10] ^= 0x01  # past the 4-byte key id: the key matches, the signature does not
    note = f"{text}\n\n{prefix} {base64.b64encode(raw).decode()}\n".encode()
    request = format_add_checkpoint(AddCheckpoint(0, (), note))
    refused = refusal(request)
    assert refused.status == 403
    assert "bad_signature" in refused.detail


def test_a_changed_size_under_a_good_signature_is_403() -> None:
    note = LOG.note(3).replace(b"\n3\n", b"\n4\n", 1)
    refused = refusal(format_add_checkpoint(AddCheckpoint(0, (), note)))
    assert (refused.status, refused.problem) == (403, WitnessProblem.NOT_SIGNED)


def test_a_note_without_signature_lines_is_400() -> None:
    refused = refusal(format_add_checkpoint(AddCheckpoint(0, (), LOG.text(3).encode())))
    assert (refused.status, refused.problem) == (400, WitnessProblem.MALFORMED)


def test_a_signed_text_that_is_no_checkpoint_is_400() -> None:
    note = sign_note(f"{ORIGIN}\nnot a size\n", [LOG.signer])
    refused = refusal(format_add_checkpoint(AddCheckpoint(0, (), note)))
    assert (refused.status, refused.problem) == (400, WitnessProblem.MALFORMED)
    assert "too_few_lines" in refused.detail


def test_an_old_size_above_the_size_is_400() -> None:
    refused = refusal(body(LOG, 3, 4, proof=()), head(4))
    assert (refused.status, refused.problem) == (400, WitnessProblem.MALFORMED)
    assert refused.detail == "old size 4 above the size 3"


@pytest.mark.parametrize(("old", "known"), [(3, 10), (0, 10), (10, 3), (5, None)])
def test_an_old_size_not_the_witness_size_is_409_with_its_size(old: int, known: int | None) -> None:
    heads = head(known) if known is not None else {}
    refused = refusal(body(LOG, 20, old), heads)
    assert (refused.status, refused.problem) == (409, WitnessProblem.CONFLICT)
    assert refused.content_type == SIZE_CONTENT_TYPE == "text/x.tlog.size"
    assert refused.body == f"{known or 0}\n".encode()
    assert parse_conflict(refused.body) == (known or 0)


@pytest.mark.parametrize("answer", [b"", b"5", b"05\n", b"-1\n", b"5\n\n", b" 5\n"])
def test_a_409_body_that_is_not_a_size_is_refused(answer: bytes) -> None:
    with pytest.raises(WitnessRequestError):
        parse_conflict(answer)


def test_size_zero_must_have_the_empty_tree_root() -> None:
    assert isinstance(decide_add_checkpoint(body(LOG, 0, 0), LOGS, {}), Cosign)
    assert LOG.root(0) == EMPTY_TREE_HASH
    wrong = Checkpoint(ORIGIN, 0, bytes(32))
    note = sign_note(format_checkpoint(wrong), [LOG.signer])
    refused = refusal(format_add_checkpoint(AddCheckpoint(0, (), note)))
    assert (refused.status, refused.problem) == (422, WitnessProblem.NOT_EMPTY_TREE)


def test_a_proof_from_size_zero_must_be_empty() -> None:
    refused = refusal(body(LOG, 5, 0, proof=(bytes(32),)))
    assert (refused.status, refused.problem) == (422, WitnessProblem.BAD_PROOF)


def test_a_proof_that_does_not_hold_is_422() -> None:
    proof = list(LOG.proof(40, 17))
    proof[0] = bytes(32)
    refused = refusal(body(LOG, 40, 17, proof=tuple(proof)), head(17))
    assert (refused.status, refused.problem) == (422, WitnessProblem.BAD_PROOF)
    assert refused.detail.startswith("no consistency from size 17 to 40: proof_failed")


def test_a_fork_at_the_witness_size_is_422() -> None:
    forked = MemoryLog(signer=LOG.signer, tag="forked")
    refused = refusal(body(forked, 17, 17), head(17))
    assert (refused.status, refused.problem) == (422, WitnessProblem.FORK)


def test_a_fork_past_the_witness_size_is_422() -> None:
    forked = MemoryLog(signer=LOG.signer, tag="forked")
    refused = refusal(body(forked, 40, 17), head(17))
    assert (refused.status, refused.problem) == (422, WitnessProblem.BAD_PROOF)


def test_pick_cosignature_ignores_lines_by_other_keys() -> None:
    other = NoteSigner("witness.test/other", seeded_key(4))
    lines = cosign(LOG.text(3), other, 5) + cosign(LOG.text(3), WITNESS, 6)
    picked = pick_cosignature(lines.encode(), WITNESS.cosignature_verifier)
    assert verify_cosignature(LOG.text(3), picked, WITNESS.cosignature_verifier) == 6
    with pytest.raises(WitnessRequestError, match=r"no cosignature by witness\.test/w1"):
        pick_cosignature(cosign(LOG.text(3), other, 5).encode(), WITNESS.cosignature_verifier)


hashes = st.binary(min_size=32, max_size=32)


@given(
    old=st.integers(0, 2**63 - 1),
    proof=st.lists(hashes, max_size=63),
    note=st.binary(max_size=300),
)
def test_a_request_round_trips(old: int, proof: list[bytes], note: bytes) -> None:
    request = AddCheckpoint(old, tuple(proof), note)
    assert parse_add_checkpoint(format_add_checkpoint(request)) == request


@given(data=st.data())
def test_every_extension_is_cosigned_and_every_fork_refused(data: st.DataObject) -> None:
    size = data.draw(st.integers(1, 600))
    old = data.draw(st.integers(1, size))
    decision = decide_add_checkpoint(body(LOG, size, old), LOGS, head(old))
    assert isinstance(decision, Cosign)
    forked = MemoryLog(signer=LOG.signer, tag="forked")
    refused = refusal(body(forked, size, old), head(old))
    assert refused.status == 422
