"""Signed notes and cosignatures: the C2SP signed-note and tlog-cosignature formats,
byte for byte, with Ed25519 (``cryptography``). Pure apart from the signing itself.

A signed note is a text ending in a newline, a blank line, then one or more signature
lines ``— <name> <base64(4-byte key id || signature)>`` (the em dash U+2014). Verifiers
are configured by (name, key id, public key); a signature whose name and key id match no
verifier is ignored, one that matches and fails rejects the whole note, and a note with
no verified signature is rejected (docs/decisions.md, "Signed checkpoints").

>>> signer = NoteSigner("example.com/log", Ed25519PrivateKey.from_private_bytes(bytes(32)))
>>> note = sign_note("hello\\n", [signer])
>>> note.decode().split("\\n")[:2]
['hello', '']
>>> open_note(note, [signer.verifier])
OpenedNote(text='hello\\n', verified_names=('example.com/log',))
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
from collections.abc import Sequence
from typing import Final, NamedTuple

import attrs
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

__all__ = [
    "COSIGNATURE_HEADER",
    "MAX_SIGNATURES",
    "Ed25519PrivateKey",
    "Ed25519PublicKey",
    "NoteError",
    "NoteProblem",
    "NoteSigner",
    "NoteVerifier",
    "OpenedNote",
    "SignatureType",
    "cosign",
    "decode_base64",
    "format_vkey",
    "is_key_name",
    "key_id",
    "open_note",
    "parse_vkey",
    "sign_note",
    "verify_cosignature",
]

EM_DASH: Final = "\u2014"
SIGNATURE_PREFIX: Final = EM_DASH + " "
MAX_SIGNATURES: Final = 100
"""Signature lines read at most (the spec asks for at least 16; Go's reference reads 100)."""
ED25519_PUBLIC_SIZE: Final = 32
ED25519_SIGNATURE_SIZE: Final = 64
COSIGNATURE_HEADER: Final = "cosignature/v1\n"
TIMESTAMP_SIZE: Final = 8
MAX_TIMESTAMP: Final = 2**63 - 1


class SignatureType(enum.IntEnum):
    """The signature type bytes of signed-note that boxmaker speaks."""

    ED25519 = 0x01
    COSIGNATURE_V1 = 0x04
    """Timestamped Ed25519 checkpoint cosignatures (tlog-cosignature)."""


class NoteProblem(enum.StrEnum):
    """Why a note, a vkey or a cosignature was refused."""

    MALFORMED = "malformed"
    """Not a signed note: no blank line before the signatures, a bad signature line, a
    control character, not UTF-8, more than :data:`MAX_SIGNATURES` signatures."""
    NOT_VERIFIED = "not_verified"
    """No signature by a known key: only unknown keys signed it."""
    BAD_SIGNATURE = "bad_signature"
    """A signature by a known key (name and key id match) that does not verify."""
    AMBIGUOUS_KEY = "ambiguous_key"
    """Two verifiers share the name and key id a signature names."""
    BAD_VKEY = "bad_vkey"
    """A verifier key that is not ``name+hex8+base64(type || key)`` or whose id is wrong."""


class NoteError(ValueError):
    """A note, vkey or cosignature refused; :attr:`reason` says why in one word."""

    def __init__(self, reason: NoteProblem, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def decode_base64(text: str) -> bytes:
    """Standard base64 (RFC 4648 section 4) in its one canonical form: padded, no other
    characters, unused bits zero. Raises ValueError.

    >>> decode_base64("AAE=")
    b'\\x00\\x01'
    >>> decode_base64("AAF=")
    Traceback (most recent call last):
    ...
    ValueError: not canonical base64
    """
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("not canonical base64") from None
    if base64.b64encode(raw).decode("ascii") != text:
        raise ValueError("not canonical base64")
    return raw


def _encode_base64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def is_key_name(name: str) -> bool:
    """A key name: non-empty, no whitespace, no ``+``.

    >>> is_key_name("example.com/log"), is_key_name("a+b"), is_key_name("a b")
    (True, False, False)
    """
    return bool(name) and "+" not in name and not any(char.isspace() for char in name)


def key_id(name: str, key_material: bytes) -> int:
    """The key id: the first four bytes, big-endian, of SHA-256(name || 0x0A ||
    key_material), where ``key_material`` is the signature type byte and the public key.

    >>> key = decode_base64("AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k")
    >>> f"{key_id('example.com/foo', key):08x}"
    '530d903a'
    """
    digest = hashlib.sha256(name.encode() + b"\n" + key_material).digest()
    return int.from_bytes(digest[:4], "big")


def _public_bytes(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(Encoding.Raw, PublicFormat.Raw)


def _check_name(name: str) -> None:
    if not is_key_name(name):
        raise ValueError(f"not a key name (empty, whitespace or '+'): {name!r}")


def _cosigned_message(text: str, timestamp: int) -> bytes:
    return f"{COSIGNATURE_HEADER}time {timestamp}\n{text}".encode()


@attrs.frozen
class NoteVerifier:
    """A known key: its name, key id, Ed25519 public key and signature type. Made with
    :meth:`for_key` (the id computed) or :func:`parse_vkey` (the id checked)."""

    name: str
    key_id: int
    public_key: Ed25519PublicKey
    signature_type: SignatureType = SignatureType.ED25519

    @classmethod
    def for_key(
        cls,
        name: str,
        public_key: Ed25519PublicKey,
        signature_type: SignatureType = SignatureType.ED25519,
    ) -> NoteVerifier:
        _check_name(name)
        material = bytes([signature_type]) + _public_bytes(public_key)
        return cls(name, key_id(name, material), public_key, signature_type)

    @property
    def vkey(self) -> str:
        return format_vkey(self.name, self.public_key, self.signature_type)

    def verify(self, text: str, signature: bytes) -> bool:
        """Whether ``signature`` (without the key id) is this key's over ``text``."""
        message = text.encode()
        if self.signature_type is SignatureType.COSIGNATURE_V1:
            if len(signature) != TIMESTAMP_SIZE + ED25519_SIGNATURE_SIZE:
                return False
            timestamp = int.from_bytes(signature[:TIMESTAMP_SIZE], "big")
            if timestamp > MAX_TIMESTAMP:
                return False
            message = _cosigned_message(text, timestamp)
            signature = signature[TIMESTAMP_SIZE:]
        if len(signature) != ED25519_SIGNATURE_SIZE:
            return False
        try:
            self.public_key.verify(signature, message)
        except InvalidSignature:
            return False
        return True


@attrs.frozen
class NoteSigner:
    """A key that signs notes as ``name`` (type 0x01) and, with :func:`cosign`, cosigns
    checkpoints (type 0x04: a key id of its own)."""

    name: str = attrs.field()
    private_key: Ed25519PrivateKey = attrs.field(repr=False)

    @name.validator
    def _name_is_a_key_name(self, _attribute: object, name: str) -> None:
        _check_name(name)

    @property
    def public_key(self) -> Ed25519PublicKey:
        return self.private_key.public_key()

    @property
    def verifier(self) -> NoteVerifier:
        return NoteVerifier.for_key(self.name, self.public_key)

    @property
    def cosignature_verifier(self) -> NoteVerifier:
        return NoteVerifier.for_key(self.name, self.public_key, SignatureType.COSIGNATURE_V1)

    @property
    def key_id(self) -> int:
        return self.verifier.key_id

    @property
    def vkey(self) -> str:
        return self.verifier.vkey


def format_vkey(
    name: str,
    public_key: Ed25519PublicKey,
    signature_type: SignatureType = SignatureType.ED25519,
) -> str:
    """``name+hex8(key id)+base64(type || public key)``.

    >>> format_vkey("EnochRoot", Ed25519PrivateKey.from_private_bytes(bytes(32)).public_key())
    'EnochRoot+af0cfe78+ATtqJ7zOtqQtYqOo0CpvDXNlMhV3HeJDpjrASKGLWdop'
    """
    _check_name(name)
    material = bytes([signature_type]) + _public_bytes(public_key)
    return f"{name}+{key_id(name, material):08x}+{_encode_base64(material)}"


def parse_vkey(text: str) -> NoteVerifier:
    """The verifier a vkey names: an Ed25519 (0x01) or a cosignature (0x04) key. The key
    id must be eight lowercase hex digits and match the name and key. Raises
    :class:`NoteError` (``bad_vkey``)."""
    # Two cuts, not a split on every '+': base64 has '+' in its alphabet.
    parts = text.split("+", 2)
    if len(parts) != 3:
        raise NoteError(NoteProblem.BAD_VKEY, "a vkey is name+keyid+key, three parts")
    name, hex_id, encoded = parts
    if not is_key_name(name):
        raise NoteError(NoteProblem.BAD_VKEY, f"not a key name: {name!r}")
    if len(hex_id) != 8 or any(char not in "0123456789abcdef" for char in hex_id):
        raise NoteError(NoteProblem.BAD_VKEY, "the key id is not 8 lowercase hex digits")
    try:
        material = decode_base64(encoded)
    except ValueError:
        raise NoteError(NoteProblem.BAD_VKEY, "the key is not canonical base64") from None
    if len(material) != 1 + ED25519_PUBLIC_SIZE:
        raise NoteError(NoteProblem.BAD_VKEY, "the key is not a type byte and 32 bytes")
    try:
        signature_type = SignatureType(material[0])
    except ValueError:
        raise NoteError(
            NoteProblem.BAD_VKEY, f"signature type 0x{material[0]:02x} is not 0x01 or 0x04"
        ) from None
    if int(hex_id, 16) != key_id(name, material):
        raise NoteError(NoteProblem.BAD_VKEY, "the key id does not match the name and key")
    public_key = Ed25519PublicKey.from_public_bytes(material[1:])
    return NoteVerifier(name, int(hex_id, 16), public_key, signature_type)


def _format_signature(name: str, key: int, signature: bytes) -> str:
    encoded = _encode_base64(key.to_bytes(4, "big") + signature)
    return f"{SIGNATURE_PREFIX}{name} {encoded}\n"


def _check_text(text: str) -> None:
    if not text.endswith("\n"):
        raise NoteError(NoteProblem.MALFORMED, "the text does not end in a newline")
    if any(char < " " and char != "\n" for char in text):
        raise NoteError(NoteProblem.MALFORMED, "a control character other than newline")


def sign_note(text: str, signers: Sequence[NoteSigner]) -> bytes:
    """The signed note: ``text``, a blank line, one signature line per signer."""
    _check_text(text)
    if not 1 <= len(signers) <= MAX_SIGNATURES:
        raise NoteError(NoteProblem.MALFORMED, f"1 to {MAX_SIGNATURES} signers, not {len(signers)}")
    message = text.encode()
    lines = [
        _format_signature(signer.name, signer.key_id, signer.private_key.sign(message))
        for signer in signers
    ]
    return (text + "\n" + "".join(lines)).encode()


class OpenedNote(NamedTuple):
    """A note whose signatures were checked: its text, and the names of the verifiers
    whose signatures verified (in the note's order, each once)."""

    text: str
    verified_names: tuple[str, ...]


@attrs.frozen
class _SignatureLine:
    name: str
    key_id: int
    signature: bytes


def _split_note(note: bytes) -> tuple[str, list[_SignatureLine]]:
    try:
        decoded = note.decode("utf-8")
    except UnicodeDecodeError:
        raise NoteError(NoteProblem.MALFORMED, "not UTF-8") from None
    if any(char < " " and char != "\n" for char in decoded):
        raise NoteError(NoteProblem.MALFORMED, "a control character other than newline")
    split = decoded.rfind("\n\n")
    if split < 0:
        raise NoteError(NoteProblem.MALFORMED, "no blank line before the signatures")
    text, block = decoded[: split + 1], decoded[split + 2 :]
    if not block.endswith("\n"):
        raise NoteError(NoteProblem.MALFORMED, "the signatures do not end in a newline")
    raw_lines = block[:-1].split("\n")
    if len(raw_lines) > MAX_SIGNATURES:
        raise NoteError(NoteProblem.MALFORMED, f"more than {MAX_SIGNATURES} signatures")
    return text, [_parse_signature_line(line) for line in raw_lines]


def _parse_signature_line(line: str) -> _SignatureLine:
    if not line.startswith(SIGNATURE_PREFIX):
        raise NoteError(NoteProblem.MALFORMED, f"not a signature line: {line[:80]!r}")
    name, space, encoded = line[len(SIGNATURE_PREFIX) :].partition(" ")
    if not space or not is_key_name(name):
        raise NoteError(NoteProblem.MALFORMED, f"a signature line's key name: {name[:80]!r}")
    try:
        raw = decode_base64(encoded)
    except ValueError:
        raise NoteError(NoteProblem.MALFORMED, "a signature that is not canonical base64") from None
    if len(raw) < 5:
        raise NoteError(NoteProblem.MALFORMED, "a signature shorter than a key id and a byte")
    return _SignatureLine(name, int.from_bytes(raw[:4], "big"), raw[4:])


def open_note(note: bytes, verifiers: Sequence[NoteVerifier]) -> OpenedNote:
    """The note's text and who verifiably signed it. Signatures by keys no verifier
    names are ignored; a known key's bad signature, a malformed note, or no verified
    signature at all raise :class:`NoteError`."""
    text, lines = _split_note(note)
    verified: list[str] = []
    seen: set[tuple[str, int]] = set()
    for line in lines:
        matching = [v for v in verifiers if (v.name, v.key_id) == (line.name, line.key_id)]
        if not matching:
            continue
        label = f"{line.name}+{line.key_id:08x}"
        if len(matching) > 1:
            raise NoteError(NoteProblem.AMBIGUOUS_KEY, f"two verifiers for {label}")
        if (line.name, line.key_id) in seen:
            continue
        seen.add((line.name, line.key_id))
        if not matching[0].verify(text, line.signature):
            raise NoteError(NoteProblem.BAD_SIGNATURE, f"the signature by {label} does not verify")
        if line.name not in verified:
            verified.append(line.name)
    if not verified:
        raise NoteError(NoteProblem.NOT_VERIFIED, "no signature by a known key")
    return OpenedNote(text, tuple(verified))


def cosign(checkpoint_text: str, signer: NoteSigner, time: int) -> str:
    """A ``cosignature/v1`` signature line over ``checkpoint_text`` (the note's text,
    final newline included, no signatures) at POSIX ``time``: the signature is the
    8-byte big-endian time and the Ed25519 signature of ``cosignature/v1\\ntime <t>\\n``
    followed by the text; the key id is the cosigner's (type 0x04)."""
    _check_text(checkpoint_text)
    if not 0 <= time <= MAX_TIMESTAMP:
        raise ValueError(f"a cosignature's time is 0 to 2**63-1, not {time}")
    signature = signer.private_key.sign(_cosigned_message(checkpoint_text, time))
    verifier = signer.cosignature_verifier
    stamped = time.to_bytes(TIMESTAMP_SIZE, "big") + signature
    return _format_signature(signer.name, verifier.key_id, stamped)


def verify_cosignature(checkpoint_text: str, line: str, verifier: NoteVerifier) -> int:
    """The time of ``line``, a cosignature by ``verifier`` (type 0x04) over
    ``checkpoint_text``. Raises :class:`NoteError`: ``malformed`` for a line that is not
    a signature line, ``not_verified`` when another key made it, ``bad_signature`` when
    it does not verify."""
    if verifier.signature_type is not SignatureType.COSIGNATURE_V1:
        raise ValueError("a cosignature verifier has signature type 0x04")
    parsed = _parse_signature_line(line.removesuffix("\n"))
    if (parsed.name, parsed.key_id) != (verifier.name, verifier.key_id):
        raise NoteError(
            NoteProblem.NOT_VERIFIED,
            f"a signature by {parsed.name}+{parsed.key_id:08x}, not by "
            f"{verifier.name}+{verifier.key_id:08x}",
        )
    if not verifier.verify(checkpoint_text, parsed.signature):
        raise NoteError(
            NoteProblem.BAD_SIGNATURE, f"the cosignature by {verifier.name} does not verify"
        )
    return int.from_bytes(parsed.signature[:TIMESTAMP_SIZE], "big")
