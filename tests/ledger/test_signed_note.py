"""Signed notes and cosignatures (ledger/signed_note.py) against the C2SP examples and
the vectors of Go's reference (golang.org/x/mod/sumdb/note, note_test.go), byte for
byte; every malformed form refused with its reason; flipped bytes; unknown keys.

No independent Python implementation from PyPI fits as a cross-check (docs/decisions.md,
"Signed checkpoints"), so Go's own test vectors stand in for one."""

from __future__ import annotations

import base64
import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from boxmaker.ledger.signed_note import (
    MAX_SIGNATURES,
    Ed25519PrivateKey,
    NoteError,
    NoteProblem,
    NoteSigner,
    NoteVerifier,
    SignatureType,
    cosign,
    decode_base64,
    format_vkey,
    key_id,
    open_note,
    parse_vkey,
    sign_note,
    verify_cosignature,
)

# c2sp.org/signed-note, "Verifier keys", "Example".
SPEC_VKEY = "example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k"
SPEC_NOTE = (
    "This is an example message.\n"
    "\n"
    "— example.com/foo Uw2QOkn8srV1yJGh2VYRlL1Tnagv1YEq6TfXppzi2ONncAlTgK7Ztg1ERYNZXsYjOBH3mFX"
    "mRKuwHjG1Yu72IneyaQM=\n"
).encode()

# golang.org/x/mod/sumdb/note, note_test.go.
PETER_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
PETER_SKEY = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
ENOCH_VKEY = "EnochRoot+af0cfe78+ATtqJ7zOtqQtYqOo0CpvDXNlMhV3HeJDpjrASKGLWdop"
GO_TEXT = (
    "If you think cryptography is the answer to your problem,\n"
    "then you don't know what your problem is.\n"
)
PETER_SIG = (
    "— PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotp"
    "RZb6KE6RyyBwJnAM=\n"
)
ENOCH_SIG = (
    "— EnochRoot rwz+eBzmZa0SO3NbfRGzPCpDckykFXSdeX+MNtCOXm2/5n2tiOHp+vAF1aGrQ5ovTG01oOTGwnWLox3"
    "3WWd1RvMc+QQ=\n"
)

# c2sp.org/tlog-cosignature: the example checkpoint's witness line, and the time its
# signed message shows.
SPEC_CHECKPOINT = (
    "example.com/behind-the-sofa\n20852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n"
)
SPEC_COSIGNATURE = (
    "— witness.example.com/w1 jWbPPwAAAABkGFDLEZMHwSRaJNiIDoe9DYn/zXcrtPHeolMI5OWXEhZCB9dlrDJs"
    "X3b2oyin1nPZqhf5nNo0xUe+mbIUBkBIfZ+qnA==\n"
)


def peter_signer() -> NoteSigner:
    # PRIVATE+KEY+<name>+<id>+<base64(type || seed)>; the base64 may hold '+' itself.
    material = decode_base64(PETER_SKEY.split("+", 4)[4])
    assert material[0] == SignatureType.ED25519
    return NoteSigner("PeterNeumann", Ed25519PrivateKey.from_private_bytes(material[1:]))


def signer(name: str, seed: int) -> NoteSigner:
    return NoteSigner(name, Ed25519PrivateKey.from_private_bytes(bytes([seed]) * 32))


def refused(note: bytes | str, verifiers: list[NoteVerifier]) -> NoteProblem:
    with pytest.raises(NoteError) as caught:
        open_note(note.encode() if isinstance(note, str) else note, verifiers)
    return caught.value.reason


# --- the specification's and Go's vectors -------------------------------------------------


def test_the_specifications_example_note_verifies_with_its_vkey() -> None:
    verifier = parse_vkey(SPEC_VKEY)
    assert (verifier.name, verifier.key_id) == ("example.com/foo", 0x530D903A)
    assert verifier.vkey == SPEC_VKEY
    assert open_note(SPEC_NOTE, [verifier]) == (
        "This is an example message.\n",
        ("example.com/foo",),
    )


def test_the_specifications_example_fails_when_any_byte_of_it_is_flipped() -> None:
    verifier = parse_vkey(SPEC_VKEY)
    signature_start = SPEC_NOTE.index(b"foo ") + 4
    for index in [0, 5, 26, signature_start, signature_start + 10, len(SPEC_NOTE) - 3]:
        mangled = bytearray(SPEC_NOTE)
        mangled[index] ^= 0x01
        with pytest.raises(NoteError):
            open_note(bytes(mangled), [verifier])


def test_go_references_key_signs_its_text_byte_for_byte() -> None:
    peter = peter_signer()
    assert peter.vkey == PETER_VKEY
    assert f"{peter.key_id:08x}" == "c74f20a3"
    assert sign_note(GO_TEXT, [peter]) == (GO_TEXT + "\n" + PETER_SIG).encode()


def test_enochs_key_is_the_zero_seed_key_of_go_references_tests() -> None:
    assert signer("EnochRoot", 0).vkey == ENOCH_VKEY


def test_go_references_open_one_of_two_signatures_known() -> None:
    note = GO_TEXT + "\n" + PETER_SIG + ENOCH_SIG
    peter, enoch = parse_vkey(PETER_VKEY), parse_vkey(ENOCH_VKEY)
    assert open_note(note.encode(), [peter]) == (GO_TEXT, ("PeterNeumann",))
    assert open_note(note.encode(), [peter, enoch]) == (GO_TEXT, ("PeterNeumann", "EnochRoot"))
    assert open_note(note.encode(), [enoch]).verified_names == ("EnochRoot",)
    assert refused(note, []) is NoteProblem.NOT_VERIFIED


def test_go_references_duplicated_verifier_is_ambiguous_only_when_used() -> None:
    peter, enoch = parse_vkey(PETER_VKEY), parse_vkey(ENOCH_VKEY)
    assert refused(GO_TEXT + "\n" + ENOCH_SIG, [enoch, peter, enoch]) is NoteProblem.AMBIGUOUS_KEY
    assert open_note((GO_TEXT + "\n" + PETER_SIG).encode(), [enoch, peter, enoch]).verified_names
    assert open_note((GO_TEXT + "\n" + PETER_SIG).encode(), [enoch, peter, enoch]) == (
        GO_TEXT,
        ("PeterNeumann",),
    )


def test_go_references_limit_of_signatures() -> None:
    peter = parse_vkey(PETER_VKEY)
    at_limit = GO_TEXT + "\n" + PETER_SIG * MAX_SIGNATURES
    assert open_note(at_limit.encode(), [peter]).verified_names == ("PeterNeumann",)
    over = GO_TEXT + "\n" + PETER_SIG * (MAX_SIGNATURES + 1)
    assert refused(over, [peter]) is NoteProblem.MALFORMED
    assert refused(over, []) is NoteProblem.MALFORMED


def test_go_references_invalid_signature_rejects_the_note() -> None:
    mangled = PETER_SIG[:60] + "ABCD" + PETER_SIG[60:]
    assert refused(GO_TEXT + "\n" + mangled, [parse_vkey(PETER_VKEY)]) is NoteProblem.BAD_SIGNATURE


def test_go_references_repeated_signatures_and_an_unknown_bad_one() -> None:
    enoch_bad = ENOCH_SIG[:60] + "ABCD" + ENOCH_SIG[60:]
    note = GO_TEXT + "\n" + PETER_SIG + PETER_SIG + ENOCH_SIG + ENOCH_SIG + enoch_bad
    assert open_note(note.encode(), [parse_vkey(PETER_VKEY)]) == (GO_TEXT, ("PeterNeumann",))


@pytest.mark.parametrize(
    "note",
    [
        GO_TEXT,
        GO_TEXT + "\n",
        GO_TEXT + "\n" + PETER_SIG[:-1],
        "\x01" + GO_TEXT + "\n" + PETER_SIG,
        GO_TEXT + "\n" + "— Bad Name x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZ"
        "SNXgKvqfqdngotpRZb6KE6RyyBwJnAM=",
        GO_TEXT + "\n" + PETER_SIG + "Unexpected line.\n",
    ],
)
def test_go_references_malformed_notes(note: str) -> None:
    assert refused(note, [parse_vkey(PETER_VKEY)]) is NoteProblem.MALFORMED


def test_go_references_note_that_is_not_utf8() -> None:
    note = b"\xff" + (GO_TEXT + "\n" + PETER_SIG).encode()
    assert refused(note, [parse_vkey(PETER_VKEY)]) is NoteProblem.MALFORMED


def test_go_references_mangled_vkeys_are_all_refused() -> None:
    vkey = PETER_VKEY
    manglings = [
        vkey[start:end]
        for start in range(len(vkey) + 1)
        for end in range(start + 1, len(vkey) + 1)
        if (start, end) != (0, len(vkey))
    ]
    manglings += [vkey[:i] + chr(ord(vkey[i]) + 1) + vkey[i + 1 :] for i in range(len(vkey))]
    manglings += [
        # Wrong length key and unknown algorithm, each with its key id adjusted.
        "PeterNeumann+cc469956+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TWBADKEY==",
        "PeterNeumann+173116ae+ZRpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",
    ]
    for mangled in manglings:
        with pytest.raises(NoteError) as caught:
            parse_vkey(mangled)
        assert caught.value.reason is NoteProblem.BAD_VKEY, mangled


@pytest.mark.parametrize(
    ("vkey", "detail"),
    [
        ("a+b", "three parts"),
        ("a b+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k", "not a key name"),
        ("+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k", "not a key name"),
        ("example.com/foo+530D903A+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k", "lowercase hex"),
        ("example.com/foo+530d903+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k", "lowercase hex"),
        ("example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2", "base64"),
        ("example.com/foo+530d903a+AAAA", "type byte and 32 bytes"),
        ("example.com/bar+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k", "does not match"),
    ],
)
def test_a_bad_vkey_is_refused_with_its_reason(vkey: str, detail: str) -> None:
    with pytest.raises(NoteError) as caught:
        parse_vkey(vkey)
    assert caught.value.reason is NoteProblem.BAD_VKEY
    assert detail in caught.value.detail


def test_a_vkey_whose_key_has_a_plus_in_its_base64_parses() -> None:
    for seed in range(64):
        vkey = signer("log.example/a", seed).vkey
        if "+" in vkey.split("+", 2)[2]:
            break
    else:
        pytest.fail("no seed of 64 gave a key with '+' in its base64")
    parsed = parse_vkey(vkey)
    assert parsed.vkey == vkey
    assert parsed == signer("log.example/a", seed).verifier


def test_a_vkey_of_an_unknown_signature_type_is_refused() -> None:
    material = b"\x02" + bytes(32)
    encoded = base64.b64encode(material).decode()
    vkey = f"x+{key_id('x', material):08x}+{encoded}"
    with pytest.raises(NoteError) as caught:
        parse_vkey(vkey)
    assert caught.value.detail == "signature type 0x02 is not 0x01 or 0x04"


def test_key_id_is_the_first_four_bytes_of_the_hash_of_name_newline_type_key() -> None:
    key = signer("log.example/a", 7)
    public = decode_base64(key.vkey.split("+", 2)[2])
    expected = hashlib.sha256(b"log.example/a\n" + public).digest()[:4]
    assert key.key_id == int.from_bytes(expected, "big")
    assert public[0] == 0x01
    assert format_vkey("log.example/a", key.public_key) == key.vkey


# --- our own notes -----------------------------------------------------------------------

LOG = signer("boxmaker.local/ledger/l-0123456789abcdef", 1)
STRANGER = signer("stranger.example/k", 2)
TEXT = "boxmaker.local/ledger/l-0123456789abcdef\n3\nAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n"


@given(
    st.lists(
        st.text(st.characters(min_codepoint=0x20, exclude_categories=("Cs",)), max_size=40),
        min_size=1,
        max_size=6,
    )
)
def test_any_text_signed_opens_to_the_same_text(lines: list[str]) -> None:
    text = "\n".join(lines) + "\n"
    assert open_note(sign_note(text, [LOG]), [LOG.verifier]) == (text, (LOG.name,))


def test_a_note_lists_each_signer_in_order_and_opens_with_either() -> None:
    note = sign_note(TEXT, [LOG, STRANGER])
    lines = note.decode().split("\n")
    assert lines[3:] == ["", f"— {LOG.name} " + lines[4].split(" ")[2], lines[5], ""]
    assert lines[5].startswith(f"— {STRANGER.name} ")
    assert open_note(note, [STRANGER.verifier]).verified_names == (STRANGER.name,)
    assert open_note(note, [LOG.verifier, STRANGER.verifier]).verified_names == (
        LOG.name,
        STRANGER.name,
    )


def test_a_signature_by_an_unknown_key_is_ignored() -> None:
    note = sign_note(TEXT, [STRANGER, LOG])
    assert open_note(note, [LOG.verifier]) == (TEXT, (LOG.name,))
    assert refused(sign_note(TEXT, [STRANGER]), [LOG.verifier]) is NoteProblem.NOT_VERIFIED


def test_a_known_name_with_another_key_id_is_an_unknown_key() -> None:
    impostor = NoteSigner(LOG.name, STRANGER.private_key)
    note = sign_note(TEXT, [impostor])
    assert refused(note, [LOG.verifier]) is NoteProblem.NOT_VERIFIED
    # Both signatures present: the impostor's is passed over, ours verifies.
    both = sign_note(TEXT, [impostor, LOG])
    assert open_note(both, [LOG.verifier]).verified_names == (LOG.name,)


def test_a_flipped_byte_in_the_text_fails_the_signature() -> None:
    note = bytearray(sign_note(TEXT, [LOG]))
    note[TEXT.index("\n3\n") + 1] = ord("4")
    assert refused(bytes(note), [LOG.verifier]) is NoteProblem.BAD_SIGNATURE


def _resign_line(note: bytes, change: int) -> bytes:
    """The note with byte ``change`` of its first signature's raw bytes flipped."""
    text, _, block = note.decode().rpartition("\n\n")
    prefix, encoded = block.rstrip("\n").rsplit(" ", 1)
    raw = bytearray(base64.b64decode(encoded))
    raw[change] ^= 0x80
    return f"{text}\n\n{prefix} {base64.b64encode(bytes(raw)).decode()}\n".encode()


def test_a_flipped_byte_in_the_signature_fails_it() -> None:
    note = sign_note(TEXT, [LOG])
    for index in (4, 20, 67):
        assert refused(_resign_line(note, index), [LOG.verifier]) is NoteProblem.BAD_SIGNATURE


def test_a_flipped_byte_in_the_key_id_makes_it_an_unknown_key() -> None:
    note = sign_note(TEXT, [LOG])
    for index in range(4):
        assert refused(_resign_line(note, index), [LOG.verifier]) is NoteProblem.NOT_VERIFIED


def test_a_truncated_or_stretched_signature_fails() -> None:
    text, _, block = sign_note(TEXT, [LOG]).decode().rpartition("\n\n")
    prefix, encoded = block.rstrip("\n").rsplit(" ", 1)
    raw = base64.b64decode(encoded)
    for changed in (raw[:-1], raw + b"\x00"):
        note = f"{text}\n\n{prefix} {base64.b64encode(changed).decode()}\n"
        assert refused(note, [LOG.verifier]) is NoteProblem.BAD_SIGNATURE


@pytest.mark.parametrize(
    ("tail", "detail"),
    [
        ("", "no blank line before the signatures"),
        ("\n", "the signatures do not end in a newline"),
        ("\n— x AAAAAAA=\nplain\n", "not a signature line: 'plain'"),
        ("\n-- x AAAAAAA=\n", "not a signature line"),
        ("\n—x AAAAAAA=\n", "not a signature line"),
        ("\n— x\n", "a signature line's key name: 'x'"),
        ("\n—  AAAAAAA=\n", "a signature line's key name: ''"),
        ("\n— a+b AAAAAAA=\n", "a signature line's key name: 'a+b'"),
        ("\n— a\u00a0b AAAAAAA=\n", "a signature line's key name"),
        ("\n— x AAAAAAA\n", "not canonical base64"),
        ("\n— x AAAAAAB=\n", "not canonical base64"),
        ("\n— x AAAA AAAA\n", "not canonical base64"),
        ("\n— x \n", "shorter than a key id and a byte"),
        ("\n— x AAAAAA==\n", "shorter than a key id and a byte"),
        ("\n— x AAAAAAA=", "the signatures do not end in a newline"),
        ("\n— x AAAAAAA=\r\n", "a control character other than newline"),
        ("\n— x\tAAAAAAA=\n", "a control character other than newline"),
    ],
)
def test_every_malformed_form_is_refused_with_its_reason(tail: str, detail: str) -> None:
    with pytest.raises(NoteError) as caught:
        open_note((TEXT + tail).encode(), [LOG.verifier])
    assert caught.value.reason is NoteProblem.MALFORMED
    assert detail in caught.value.detail


def test_the_last_blank_line_separates_text_from_signatures() -> None:
    text = "first\n\n— not a signature, part of the text\n"
    assert open_note(sign_note(text, [LOG]), [LOG.verifier]).text == text


@pytest.mark.parametrize(
    ("text", "signers", "detail"),
    [
        ("no newline", [LOG], "the text does not end in a newline"),
        ("tab\there\n", [LOG], "a control character other than newline"),
        (TEXT, [], "1 to 100 signers, not 0"),
        (TEXT, [LOG] * (MAX_SIGNATURES + 1), "1 to 100 signers, not 101"),
    ],
)
def test_sign_note_refuses_what_open_note_would(
    text: str, signers: list[NoteSigner], detail: str
) -> None:
    with pytest.raises(NoteError) as caught:
        sign_note(text, signers)
    assert (caught.value.reason, caught.value.detail) == (NoteProblem.MALFORMED, detail)


@pytest.mark.parametrize("name", ["", "a+b", "a b", "a\nb", "a\u2003b"])
def test_a_signer_needs_a_key_name(name: str) -> None:
    with pytest.raises(ValueError, match="not a key name"):
        NoteSigner(name, LOG.private_key)


# --- cosignatures ------------------------------------------------------------------------

WITNESS = signer("witness.example/w1", 9)


def test_the_specifications_cosignature_has_the_fixed_layout() -> None:
    name, encoded = SPEC_COSIGNATURE.removeprefix("— ").split()
    raw = decode_base64(encoded)
    assert name == "witness.example.com/w1"
    assert len(raw) == 4 + 8 + 64
    assert raw[:4].hex() == "8d66cf3f"
    # The time in the specification's own signed message ("time 1679315147").
    assert int.from_bytes(raw[4:12], "big") == 1679315147


def test_a_cosignature_round_trips_and_has_the_fixed_layout() -> None:
    line = cosign(SPEC_CHECKPOINT, WITNESS, 1679315147)
    assert verify_cosignature(SPEC_CHECKPOINT, line, WITNESS.cosignature_verifier) == 1679315147
    assert line.startswith(f"— {WITNESS.name} ")
    assert line.endswith("\n")
    raw = decode_base64(line.split(" ")[2].rstrip("\n"))
    public = decode_base64(WITNESS.vkey.split("+", 2)[2])[1:]
    expected_id = hashlib.sha256(b"witness.example/w1\n\x04" + public).digest()[:4]
    assert raw[:4] == expected_id
    assert raw[:4] != WITNESS.key_id.to_bytes(4, "big")
    assert raw[4:12] == (1679315147).to_bytes(8, "big")
    # The signature, checked by the library alone, over the message the spec defines.
    message = b"cosignature/v1\ntime 1679315147\n" + SPEC_CHECKPOINT.encode()
    WITNESS.public_key.verify(raw[12:], message)
    assert len(raw) == 76


def test_a_cosigners_vkey_has_type_0x04_and_parses_back() -> None:
    vkey = WITNESS.cosignature_verifier.vkey
    assert decode_base64(vkey.split("+")[2])[0] == 0x04
    parsed = parse_vkey(vkey)
    assert parsed == WITNESS.cosignature_verifier
    assert parsed.signature_type is SignatureType.COSIGNATURE_V1


def test_a_cosignature_appended_to_the_logs_note_opens_with_both_keys() -> None:
    note = sign_note(SPEC_CHECKPOINT, [LOG]) + cosign(SPEC_CHECKPOINT, WITNESS, 5).encode()
    verifiers = [LOG.verifier, WITNESS.cosignature_verifier]
    assert open_note(note, verifiers) == (SPEC_CHECKPOINT, (LOG.name, WITNESS.name))
    # The witness's note key (type 0x01) is another key id: the cosignature is unknown to it.
    assert open_note(note, [LOG.verifier, WITNESS.verifier]).verified_names == (LOG.name,)


def test_a_cosignature_over_other_text_or_time_fails() -> None:
    line = cosign(SPEC_CHECKPOINT, WITNESS, 1000)
    verifier = WITNESS.cosignature_verifier
    other = SPEC_CHECKPOINT.replace("20852163", "20852164")
    with pytest.raises(NoteError) as caught:
        verify_cosignature(other, line, verifier)
    assert caught.value.reason is NoteProblem.BAD_SIGNATURE
    later = _resign_line(("x\n\n" + line).encode(), 11).decode().split("\n\n")[1]
    with pytest.raises(NoteError) as caught:
        verify_cosignature(SPEC_CHECKPOINT, later, verifier)
    assert caught.value.reason is NoteProblem.BAD_SIGNATURE


def test_a_cosignature_by_another_key_is_not_verified() -> None:
    line = cosign(SPEC_CHECKPOINT, STRANGER, 1000)
    with pytest.raises(NoteError) as caught:
        verify_cosignature(SPEC_CHECKPOINT, line, WITNESS.cosignature_verifier)
    assert caught.value.reason is NoteProblem.NOT_VERIFIED
    with pytest.raises(NoteError) as caught:
        verify_cosignature(SPEC_CHECKPOINT, "junk", WITNESS.cosignature_verifier)
    assert caught.value.reason is NoteProblem.MALFORMED


def test_a_cosignature_with_a_time_past_2_63_fails() -> None:
    line = cosign(SPEC_CHECKPOINT, WITNESS, 2**63 - 1)
    assert verify_cosignature(SPEC_CHECKPOINT, line, WITNESS.cosignature_verifier) == 2**63 - 1
    too_late = _resign_line(("x\n\n" + line).encode(), 4).decode().split("\n\n")[1]
    with pytest.raises(NoteError) as caught:
        verify_cosignature(SPEC_CHECKPOINT, too_late, WITNESS.cosignature_verifier)
    assert caught.value.reason is NoteProblem.BAD_SIGNATURE
    with pytest.raises(ValueError, match="0 to 2\\*\\*63-1"):
        cosign(SPEC_CHECKPOINT, WITNESS, 2**63)
    with pytest.raises(ValueError, match="0 to 2\\*\\*63-1"):
        cosign(SPEC_CHECKPOINT, WITNESS, -1)


def test_verify_cosignature_needs_a_cosigners_verifier() -> None:
    line = cosign(SPEC_CHECKPOINT, WITNESS, 1)
    with pytest.raises(ValueError, match="type 0x04"):
        verify_cosignature(SPEC_CHECKPOINT, line, WITNESS.verifier)
