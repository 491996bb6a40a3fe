"""Proof documents (boxmaker/ledger/proofs.py): a sound one passes, each change an
attacker could make is refused with its own reason (docs/protocol.md, "Proofs")."""

from __future__ import annotations

import base64
import functools

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.harness.proof_ledgers import BuiltLedger, approved_call, denied_call, start

from boxmaker.ledger.checkpoint import Checkpoint, format_checkpoint
from boxmaker.ledger.proofs import (
    CONSISTENCY_FORMAT,
    PROOF_FORMAT,
    ConsistencyDocument,
    ProofCheckError,
    ProofDocument,
    ProofProblem,
    ProvedRecord,
    check_consistency,
    check_proof,
    dump_document,
    load_consistency,
    load_proof,
    make_consistency,
    make_proof,
    note_checkpoint,
)
from boxmaker.ledger.signed_note import Ed25519PrivateKey, NoteSigner, cosign, sign_note

ORIGIN = "boxmaker.local/ledger/l-" + "0" * 16
DENIED = "c-" + "d" * 16
APPROVED = "c-" + "a" * 16


@functools.cache
def signer(seed: int = 1, name: str = ORIGIN) -> NoteSigner:
    return NoteSigner(name, Ed25519PrivateKey.from_private_bytes(bytes([seed]) * 32))


def ledger_with_calls() -> tuple[BuiltLedger, str, Checkpoint]:
    built = BuiltLedger.new()
    start(built)
    denied_call(built, DENIED)
    approved_call(built, APPROVED)
    note, checkpoint = built.checkpoint(signer())
    return built, note, checkpoint


def proof_of(seqs: list[int]) -> ProofDocument:
    built, note, checkpoint = ledger_with_calls()
    lines = [(seq, built.lines[seq]) for seq in seqs]
    return make_proof(note, checkpoint, signer().vkey, lines, built.reader)


APPROVED_SEQS = [3, 4, 5]


def refused(document: ProofDocument, pinned: str | None = None) -> ProofCheckError:
    with pytest.raises(ProofCheckError) as caught:
        check_proof(document, pinned)
    return caught.value


def with_record(document: ProofDocument, index: int, **changes: object) -> ProofDocument:
    records = list(document.records)
    records[index] = attrs.evolve(records[index], **changes)  # type: ignore[arg-type]
    return attrs.evolve(document, records=records)


# --- sound proofs ----------------------------------------------------------------------


def test_a_sound_proof_passes_pinned_and_not() -> None:
    document = proof_of(APPROVED_SEQS)
    checked = check_proof(document, pinned_vkey=signer().vkey)
    assert checked.pinned
    assert (checked.checkpoint.size, checked.checkpoint.origin) == (6, ORIGIN)
    assert checked.key_name == ORIGIN
    assert [line.seq for line in checked.lines] == APPROVED_SEQS
    assert [line.fields["kind"] for line in checked.lines] == ["decision", "approval", "result"]
    assert {line.fields["call"] for line in checked.lines} == {APPROVED}
    assert not check_proof(document).pinned


def test_the_document_round_trips_through_its_json() -> None:
    document = proof_of([2])
    data = dump_document(document)
    assert load_proof(data) == document
    assert list(__import__("orjson").loads(data)) == [
        "format",
        "origin",
        "vkey",
        "checkpoint",
        "records",
    ]
    assert check_proof(load_proof(data)).lines[0].fields["verdict"] == "deny"


def test_a_checkpoint_a_witness_cosigned_still_checks() -> None:
    document = proof_of([2])
    witness = NoteSigner("witness.example", Ed25519PrivateKey.from_private_bytes(bytes(32)))
    text = document.checkpoint[: document.checkpoint.rfind("\n\n") + 1]
    cosigned = document.checkpoint + cosign(text, witness, 1_700_000_000)
    assert check_proof(attrs.evolve(document, checkpoint=cosigned), signer().vkey).lines


# --- each change refused with its reason --------------------------------------------------


def test_a_changed_line_is_not_in_the_checkpoint() -> None:
    document = proof_of(APPROVED_SEQS)
    line = document.records[0].line.replace('"notes.txt"', '"secret.txt"')
    problem = refused(with_record(document, 0, line=line))
    assert (problem.reason, problem.seq) == (ProofProblem.BAD_PROOF, 3)
    assert "not the one the checkpoint of size 6 holds" in problem.detail


def test_a_line_whose_own_seq_differs_is_refused() -> None:
    document = proof_of([2])
    problem = refused(with_record(document, 0, seq=3))
    assert (problem.reason, problem.seq) == (ProofProblem.BAD_LINE, 3)
    assert problem.detail == "the line's own seq is 2"
    line = document.records[0].line.replace('"seq":2', '"seq":3')
    moved = with_record(document, 0, seq=3, line=line)
    assert refused(moved).reason is ProofProblem.BAD_PROOF


def test_a_line_that_is_not_a_json_object_is_refused() -> None:
    problem = refused(with_record(proof_of([2]), 0, line="[2]"))
    assert (problem.reason, problem.detail) == (
        ProofProblem.BAD_LINE,
        "the line is not a JSON object",
    )


def test_a_changed_proof_hash_is_refused() -> None:
    document = proof_of([2])
    path = list(document.records[0].proof)
    raw = bytearray(base64.b64decode(path[0]))
    raw[0] ^= 1
    path[0] = base64.b64encode(bytes(raw)).decode()
    assert refused(with_record(document, 0, proof=path)).reason is ProofProblem.BAD_PROOF
    short = with_record(document, 0, proof=document.records[0].proof[:-1])
    assert "too short" in refused(short).detail
    long = with_record(document, 0, proof=[*document.records[0].proof, path[0]])
    assert "too long" in refused(long).detail
    bad = with_record(document, 0, proof=["AAAA"])
    assert refused(bad).detail == "hash 0 is not base64 of 32 bytes"


def test_a_seq_beyond_the_checkpoint_is_not_covered() -> None:
    problem = refused(with_record(proof_of([2]), 0, seq=6))
    assert (problem.reason, problem.seq) == (ProofProblem.NOT_COVERED, 6)


def test_a_changed_checkpoint_size_or_root_breaks_the_signature() -> None:
    document = proof_of([2])
    size_changed = document.checkpoint.replace("\n6\n", "\n7\n", 1)
    problem = refused(attrs.evolve(document, checkpoint=size_changed))
    assert problem.reason is ProofProblem.NOT_SIGNED
    assert "does not verify" in problem.detail
    root_line = document.checkpoint.split("\n")[2]
    other_root = base64.b64encode(bytes(32)).decode()
    root_changed = document.checkpoint.replace(root_line, other_root)
    assert (
        refused(attrs.evolve(document, checkpoint=root_changed)).reason is ProofProblem.NOT_SIGNED
    )


def test_a_checkpoint_the_key_signed_over_another_tree_does_not_prove_the_line() -> None:
    document = proof_of([2])
    other = Checkpoint(ORIGIN, 6, bytes(32))
    note = sign_note(format_checkpoint(other), [signer()]).decode()
    problem = refused(attrs.evolve(document, checkpoint=note), signer().vkey)
    assert (problem.reason, problem.seq) == (ProofProblem.BAD_PROOF, 2)


def test_a_changed_signature_is_refused() -> None:
    document = proof_of([2])
    text, signature_line = document.checkpoint.rsplit("\n\n", 1)
    name, encoded = signature_line.removesuffix("\n").rsplit(" ", 1)
    raw = bytearray(base64.b64decode(encoded))
    raw[-1] ^= 1
    note = f"{text}\n\n{name} {base64.b64encode(bytes(raw)).decode()}\n"
    problem = refused(attrs.evolve(document, checkpoint=note))
    assert problem.reason is ProofProblem.NOT_SIGNED
    assert "does not verify" in problem.detail


def test_a_key_swapped_for_another_fails_unpinned_and_pinned() -> None:
    document = proof_of([2])
    other = signer(2)
    swapped = attrs.evolve(document, vkey=other.vkey)
    unpinned = refused(swapped)
    assert unpinned.reason is ProofProblem.NOT_SIGNED
    assert "no signature by a known key" in unpinned.detail
    pinned = refused(swapped, signer().vkey)
    assert pinned.reason is ProofProblem.OTHER_KEY
    assert f"is not the pinned key {ORIGIN}+{signer().key_id:08x}" in pinned.detail


def test_a_key_swapped_and_the_checkpoint_signed_again_passes_only_unpinned() -> None:
    """Whoever holds another key can sign anything: only pinning the owner's key tells."""
    built, _, checkpoint = ledger_with_calls()
    forger = signer(3)
    note = sign_note(format_checkpoint(checkpoint), [forger]).decode()
    forged = make_proof(note, checkpoint, forger.vkey, [(2, built.lines[2])], built.reader)
    assert not check_proof(forged).pinned
    assert refused(forged, signer().vkey).reason is ProofProblem.OTHER_KEY


def test_origins_that_disagree_are_refused() -> None:
    document = proof_of([2])
    problem = refused(attrs.evolve(document, origin="boxmaker.local/ledger/l-other"))
    assert problem.reason is ProofProblem.ORIGIN_MISMATCH
    renamed = signer(1, "boxmaker.local/ledger/l-other")
    problem = refused(attrs.evolve(document, vkey=renamed.vkey))
    assert problem.reason is ProofProblem.ORIGIN_MISMATCH
    assert "the key is named 'boxmaker.local/ledger/l-other'" in problem.detail


def test_bad_documents_and_keys_are_refused() -> None:
    document = proof_of([2])
    assert refused(attrs.evolve(document, records=[])).reason is ProofProblem.NO_RECORDS
    assert refused(attrs.evolve(document, vkey="nonsense")).reason is ProofProblem.BAD_VKEY
    assert refused(document, "nonsense").reason is ProofProblem.BAD_VKEY
    cosigner = attrs.evolve(document, vkey=signer().cosignature_verifier.vkey)
    assert refused(cosigner).detail == "the key is not an Ed25519 (0x01) key"
    assert refused(attrs.evolve(document, format="x")).reason is ProofProblem.NOT_A_DOCUMENT
    not_note = refused(attrs.evolve(document, checkpoint="no signatures\n"))
    assert not_note.reason is ProofProblem.NOT_SIGNED


@pytest.mark.parametrize(
    ("data", "detail"),
    [
        (b"{", "not JSON"),
        (b"[]", "not a JSON object"),
        (b'{"format":"boxmaker-proof/2"}', "the format is 'boxmaker-proof/2'"),
        (b'{"format":"boxmaker-proof/1","origin":"o"}', "required field missing"),
    ],
)
def test_load_refuses_what_is_not_a_proof(data: bytes, detail: str) -> None:
    with pytest.raises(ProofCheckError) as caught:
        load_proof(data)
    assert caught.value.reason is ProofProblem.NOT_A_DOCUMENT
    assert detail in caught.value.detail


def test_load_refuses_an_extra_field() -> None:
    data = dump_document(proof_of([2])).replace(b'"format"', b'"extra":1,"format"', 1)
    with pytest.raises(ProofCheckError, match="extra"):
        load_proof(data)


# --- any size, any seq -------------------------------------------------------------------


def json_lines(size: int) -> BuiltLedger:
    return BuiltLedger.from_lines([b'{"seq":%d}' % seq for seq in range(size)])


@settings(max_examples=60, deadline=None)
@given(data=st.data(), size=st.integers(1, 300) | st.integers(301, 3000))
def test_every_seq_of_any_size_proves_and_a_flipped_hash_does_not(
    data: st.DataObject, size: int
) -> None:
    built = json_lines(size)
    checkpoint = Checkpoint(ORIGIN, size, built.frontier.root())
    note = sign_note(format_checkpoint(checkpoint), [signer()]).decode()
    seqs = data.draw(st.lists(st.integers(0, size - 1), min_size=1, max_size=4))
    lines = [(seq, built.lines[seq]) for seq in seqs]
    document = make_proof(note, checkpoint, signer().vkey, lines, built.reader)
    assert [line.seq for line in check_proof(document, signer().vkey).lines] == seqs
    index = data.draw(st.integers(0, len(seqs) - 1))
    if document.records[index].proof:
        path = list(document.records[index].proof)
        at = data.draw(st.integers(0, len(path) - 1))
        raw = bytearray(base64.b64decode(path[at]))
        raw[data.draw(st.integers(0, 31))] ^= 1 << data.draw(st.integers(0, 7))
        path[at] = base64.b64encode(bytes(raw)).decode()
        problem = refused(with_record(document, index, proof=path))
        assert (problem.reason, problem.seq) == (ProofProblem.BAD_PROOF, seqs[index])


# --- consistency -------------------------------------------------------------------------


def signed(built: BuiltLedger, key: NoteSigner | None = None) -> tuple[str, Checkpoint]:
    checkpoint = Checkpoint(ORIGIN, len(built.lines), built.frontier.root())
    return sign_note(format_checkpoint(checkpoint), [key or signer()]).decode(), checkpoint


def consistency_of(old: BuiltLedger, new: BuiltLedger) -> ConsistencyDocument:
    old_note, old_checkpoint = signed(old)
    new_note, new_checkpoint = signed(new)
    return make_consistency(
        old_note, old_checkpoint.size, new_note, new_checkpoint, signer().vkey, new.reader
    )


@settings(max_examples=60, deadline=None)
@given(sizes=st.tuples(st.integers(1, 600), st.integers(0, 600)))
def test_a_grown_ledger_is_consistent_at_any_sizes(sizes: tuple[int, int]) -> None:
    old_size, growth = sizes
    new = json_lines(old_size + growth)
    old = json_lines(old_size)
    document = consistency_of(old, new)
    checked = check_consistency(load_consistency(dump_document(document)), signer().vkey)
    assert (checked.old.size, checked.new.size, checked.pinned) == (
        old_size,
        old_size + growth,
        True,
    )


def test_a_forked_ledger_is_not_a_prefix() -> None:
    base = [b'{"seq":%d}' % seq for seq in range(10)]
    mine = BuiltLedger.from_lines([*base, b'{"seq":10,"mine":1}', b'{"seq":11}'])
    fork = BuiltLedger.from_lines([*base, b'{"seq":10,"fork":1}'])
    with pytest.raises(ProofCheckError) as caught:
        check_consistency(consistency_of(fork, mine))
    assert caught.value.reason is ProofProblem.NOT_A_PREFIX
    assert "the ledger of size 12 does not extend the one of size 11" in caught.value.detail


def test_a_shrunk_ledger_and_an_old_note_by_another_key_are_refused() -> None:
    small, large = json_lines(5), json_lines(9)
    with pytest.raises(ProofCheckError) as caught:
        check_consistency(consistency_of(large, small))
    assert caught.value.reason is ProofProblem.SHRUNK
    document = consistency_of(small, large)
    other_note, _ = signed(small, signer(2))
    with pytest.raises(ProofCheckError) as caught:
        check_consistency(attrs.evolve(document, old=other_note), signer().vkey)
    assert caught.value.reason is ProofProblem.NOT_SIGNED
    assert caught.value.detail.startswith("the old checkpoint is not signed by")


def test_a_changed_consistency_path_and_the_empty_tree() -> None:
    document = consistency_of(json_lines(5), json_lines(9))
    broken = attrs.evolve(document, proof=list(reversed(document.proof)))
    with pytest.raises(ProofCheckError) as caught:
        check_consistency(broken)
    assert caught.value.reason is ProofProblem.NOT_A_PREFIX
    empty_note = sign_note(format_checkpoint(Checkpoint(ORIGIN, 0, bytes(32))), [signer()])
    from_empty = attrs.evolve(document, old=empty_note.decode(), proof=[])
    assert check_consistency(from_empty).old.size == 0
    with pytest.raises(ProofCheckError, match="a path from the empty tree"):
        check_consistency(attrs.evolve(from_empty, proof=document.proof))
    assert document.format == CONSISTENCY_FORMAT != PROOF_FORMAT


def test_note_checkpoint_reads_the_text_only() -> None:
    _, note, checkpoint = ledger_with_calls()
    assert note_checkpoint(note) == checkpoint
    assert note_checkpoint("no blank line\n") is None
    assert note_checkpoint("not\na\ncheckpoint\n\n— x AAAA\n") is None


def test_records_are_documented_in_order() -> None:
    assert [field.name for field in attrs.fields(ProvedRecord)] == ["seq", "line", "proof"]
