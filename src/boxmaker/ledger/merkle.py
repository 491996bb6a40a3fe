"""The ledger's Merkle tree (RFC 6962 / RFC 9162), pure: no files, no clock.

A port of Go's ``golang.org/x/mod/sumdb/tlog`` (tlog.go), so its proofs are those of
Certificate Transparency and of every tlog-tiles log (docs/decisions.md, "The ledger's
tree"). Leaf ``i`` is the ledger's line ``i`` (seq ``i``), its exact bytes without the
newline; an outsider given a line hashes it with no other knowledge.

- leaf hash = SHA-256(0x00 || line), node hash = SHA-256(0x01 || left || right);
- the tree of size N covers leaves 0..N-1; the empty tree's hash is SHA-256("");
- every hash of a complete subtree is *stored* once, at a dense index
  (:func:`stored_hash_index`: level L's n-th hash comes right after level L+1's
  (2n+1)-th), and read back through a :class:`HashReader` (the tile store,
  :mod:`boxmaker.ledger.tiles`, or a list in tests);
- :class:`Frontier` is the right edge of the tree in memory (one hash per 1 bit of the
  size): it appends a leaf without reading anything and gives the root at once.

>>> tree = Frontier()
>>> stored = [tree.append(leaf_hash(line)) for line in (b"a", b"b", b"c")]
>>> [len(hashes) for hashes in stored]  # leaf 1 completes the subtree [0, 2)
[1, 2, 1]
>>> hashes = ListHashes([h for batch in stored for h in batch])
>>> tree_hash(3, hashes) == tree.root()
True
>>> proof = prove_record(3, 1, hashes)
>>> check_record(proof, 3, tree.root(), 1, leaf_hash(b"b"))
>>> check_record(proof, 3, tree.root(), 1, leaf_hash(b"x"))
Traceback (most recent call last):
...
boxmaker.ledger.merkle.ProofError: proof_failed: the proof does not lead to the root
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from typing import Final, Literal, Protocol, TypeAlias

import attrs

__all__ = [
    "EMPTY_TREE_HASH",
    "HASH_SIZE",
    "Frontier",
    "Hash",
    "HashReader",
    "ListHashes",
    "ProofError",
    "check_record",
    "check_tree",
    "leaf_hash",
    "node_hash",
    "prove_record",
    "prove_tree",
    "split_stored_hash_index",
    "stored_hash_count",
    "stored_hash_index",
    "stored_hashes",
    "stored_hashes_for_leaf_hash",
    "subtree_indexes",
    "tree_hash",
]

Hash: TypeAlias = bytes
"""A SHA-256 digest, 32 bytes."""

HASH_SIZE: Final = 32
EMPTY_TREE_HASH: Final[Hash] = hashlib.sha256(b"").digest()
_LEAF_PREFIX: Final = b"\x00"
_NODE_PREFIX: Final = b"\x01"

ProofReason: TypeAlias = Literal["bad_inputs", "proof_failed"]


class ProofError(Exception):
    """A proof that does not hold (``proof_failed``), or inputs no proof can be made or
    checked for (``bad_inputs``: an index outside the tree, a size out of order, a hash
    that is not 32 bytes). The message starts with the reason."""

    def __init__(self, reason: ProofReason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason: ProofReason = reason


class HashReader(Protocol):
    """Reads stored hashes by their :func:`stored_hash_index`. Returns one hash per
    index, in the order asked (callers here ask in increasing order), or raises."""

    def read_hashes(self, indexes: Sequence[int]) -> list[Hash]: ...


@attrs.frozen
class ListHashes:
    """A :class:`HashReader` over every stored hash in a list (tests, small trees)."""

    hashes: Sequence[Hash]

    def read_hashes(self, indexes: Sequence[int]) -> list[Hash]:
        return [self.hashes[index] for index in indexes]


def leaf_hash(data: bytes) -> Hash:
    """SHA-256(0x00 || data): the hash of one leaf (a ledger line's exact bytes)."""
    return hashlib.sha256(_LEAF_PREFIX + data).digest()


def node_hash(left: Hash, right: Hash) -> Hash:
    """SHA-256(0x01 || left || right): an interior node."""
    return hashlib.sha256(_NODE_PREFIX + left + right).digest()


def _trailing_ones(n: int) -> int:
    """How many low 1 bits ``n`` has: the subtrees that leaf ``n`` completes."""
    return ((n + 1) & -(n + 1)).bit_length() - 1


def _max_pow2(n: int) -> tuple[int, int]:
    """(k, log2 k) for k the largest power of 2 smaller than ``n`` (n >= 2)."""
    level = (n - 1).bit_length() - 1
    return 1 << level, level


def stored_hash_index(level: int, n: int) -> int:
    """The dense storage index of the n-th hash at ``level`` (level 0: the leaves).

    >>> [stored_hash_index(0, n) for n in range(5)], stored_hash_index(1, 0)
    ([0, 1, 3, 4, 7], 2)
    """
    # Level L's n-th hash is written right after level L+1's (2n+1)-th: walk down to
    # level 0, where the n-th hash sits at n + n/2 + n/4 + ... = 2n - popcount(n).
    leaf = (n << level) + (1 << level) - 1
    return 2 * leaf - leaf.bit_count() + level


def split_stored_hash_index(index: int) -> tuple[int, int]:
    """The inverse of :func:`stored_hash_index`: (level, n).

    >>> split_stored_hash_index(stored_hash_index(3, 17))
    (3, 17)
    """
    # stored_hash_index(0, n) <= 2n, so the leaf whose append stored this hash is in
    # [index/2, index/2 + log2(index)].
    n = index // 2
    index_n = stored_hash_index(0, n)
    while True:
        # Leaf n stores 1 + trailing_ones(n) hashes.
        following = index_n + 1 + _trailing_ones(n)
        if following > index:
            break
        n += 1
        index_n = following
    level = index - index_n
    return level, n >> level


def stored_hash_count(size: int) -> int:
    """How many hashes a tree of ``size`` leaves has stored.

    >>> [stored_hash_count(n) for n in range(5)]
    [0, 1, 3, 4, 7]
    """
    if size == 0:
        return 0
    return stored_hash_index(0, size - 1) + 1 + _trailing_ones(size - 1)


def stored_hashes(n: int, leaf_data: bytes, reader: HashReader) -> list[Hash]:
    """The hashes to store, from index ``stored_hash_index(0, n)`` on, when leaf ``n``
    is appended: its leaf hash, then one per subtree it completes (reading up to
    log2(n) earlier hashes)."""
    return stored_hashes_for_leaf_hash(n, leaf_hash(leaf_data), reader)


def stored_hashes_for_leaf_hash(n: int, leaf: Hash, reader: HashReader) -> list[Hash]:
    """:func:`stored_hashes` given the leaf's hash instead of its bytes."""
    completed = _trailing_ones(n)
    # The left siblings, in increasing index order: highest level first.
    indexes = [stored_hash_index(level, (n >> level) - 1) for level in reversed(range(completed))]
    siblings = _read(reader, indexes)
    hashes = [leaf]
    for sibling in reversed(siblings):
        hashes.append(node_hash(sibling, hashes[-1]))
    return hashes


def subtree_indexes(lo: int, hi: int) -> list[int]:
    """The stored indexes of the complete subtrees that make up leaves [lo, hi), largest
    first (for [0, size): the tree's right edge, what :class:`Frontier` holds)."""
    need: list[int] = []
    while lo < hi:
        k, level = _max_pow2(hi - lo + 1)
        need.append(stored_hash_index(level, lo >> level))
        lo += k
    return need


def _subtree_hash(lo: int, hi: int, hashes: Iterator[Hash]) -> Hash:
    """The hash of leaves [lo, hi) from the next of ``hashes``: those that
    :func:`subtree_indexes` names for that range."""
    parts = []
    while lo < hi:
        lo += _max_pow2(hi - lo + 1)[0]
        parts.append(next(hashes))
    return _fold(parts)


def _fold(parts: Sequence[Hash]) -> Hash:
    """Join complete subtrees, largest (leftmost) first, from the right."""
    result = parts[-1]
    for left in reversed(parts[:-1]):
        result = node_hash(left, result)
    return result


def _read(reader: HashReader, indexes: list[int]) -> list[Hash]:
    if not indexes:
        return []
    hashes = reader.read_hashes(indexes)
    if len(hashes) != len(indexes):
        raise ValueError(f"read_hashes({len(indexes)} indexes) gave {len(hashes)} hashes")
    return hashes


def tree_hash(size: int, reader: HashReader) -> Hash:
    """The root of the tree of ``size`` leaves (one read of at most 1 + log2 N hashes)."""
    if size < 0:
        raise ProofError("bad_inputs", f"a tree has no size {size}")
    if size == 0:
        return EMPTY_TREE_HASH
    return _fold(_read(reader, subtree_indexes(0, size)))


def _leaf_proof_indexes(lo: int, hi: int, n: int, need: list[int]) -> None:
    if lo + 1 == hi:
        return
    k, _ = _max_pow2(hi - lo)
    if n < lo + k:
        _leaf_proof_indexes(lo, lo + k, n, need)
        need.extend(subtree_indexes(lo + k, hi))
    else:
        need.extend(subtree_indexes(lo, lo + k))
        _leaf_proof_indexes(lo + k, hi, n, need)


def _leaf_proof(lo: int, hi: int, n: int, hashes: Iterator[Hash]) -> list[Hash]:
    """RFC 6962's audit path of leaf n in leaves [lo, hi), nearest the leaf first."""
    if lo + 1 == hi:
        # The verifier has the leaf's hash: it is not sent.
        return []
    k, _ = _max_pow2(hi - lo)
    if n < lo + k:
        proof = _leaf_proof(lo, lo + k, n, hashes)
        sibling = _subtree_hash(lo + k, hi, hashes)
    else:
        sibling = _subtree_hash(lo, lo + k, hashes)
        proof = _leaf_proof(lo + k, hi, n, hashes)
    proof.append(sibling)
    return proof


def prove_record(size: int, index: int, reader: HashReader) -> list[Hash]:
    """The inclusion proof of leaf ``index`` in the tree of ``size`` leaves."""
    if not 0 <= index < size:
        raise ProofError("bad_inputs", f"leaf {index} is not in a tree of size {size}")
    need: list[int] = []
    _leaf_proof_indexes(0, size, index, need)
    return _leaf_proof(0, size, index, iter(_read(reader, need)))


def _check_hashes(*hashes: Hash) -> None:
    for value in hashes:
        if len(value) != HASH_SIZE:
            raise ProofError("bad_inputs", f"a hash of {len(value)} bytes, not {HASH_SIZE}")


def _run_record_proof(proof: list[Hash], lo: int, hi: int, n: int, leaf: Hash) -> Hash:
    """The root that ``proof`` implies for leaves [lo, hi) if leaf n's hash is ``leaf``;
    consumes the proof from its end."""
    if lo + 1 == hi:
        return leaf
    if not proof:
        raise ProofError("proof_failed", "the proof is too short")
    sibling = proof.pop()
    k, _ = _max_pow2(hi - lo)
    if n < lo + k:
        return node_hash(_run_record_proof(proof, lo, lo + k, n, leaf), sibling)
    return node_hash(sibling, _run_record_proof(proof, lo + k, hi, n, leaf))


def check_record(proof: Sequence[Hash], size: int, root: Hash, index: int, leaf: Hash) -> None:
    """Raise :class:`ProofError` unless ``proof`` shows that the tree of ``size`` leaves
    with ``root`` has ``leaf`` (a leaf hash) at ``index``."""
    if not 0 <= index < size:
        raise ProofError("bad_inputs", f"leaf {index} is not in a tree of size {size}")
    _check_hashes(root, leaf, *proof)
    remaining = list(proof)
    implied = _run_record_proof(remaining, 0, size, index, leaf)
    if remaining:
        raise ProofError("proof_failed", "the proof is too long")
    if implied != root:
        raise ProofError("proof_failed", "the proof does not lead to the root")


def _tree_proof_indexes(lo: int, hi: int, n: int, need: list[int]) -> None:
    if n == hi:
        if lo != 0:
            need.extend(subtree_indexes(lo, hi))
        return
    k, _ = _max_pow2(hi - lo)
    if n <= lo + k:
        _tree_proof_indexes(lo, lo + k, n, need)
        need.extend(subtree_indexes(lo + k, hi))
    else:
        need.extend(subtree_indexes(lo, lo + k))
        _tree_proof_indexes(lo + k, hi, n, need)


def _tree_proof(lo: int, hi: int, n: int, hashes: Iterator[Hash]) -> list[Hash]:
    """RFC 6962's consistency proof for the old size n, within leaves [lo, hi)."""
    if n == hi:
        # The old tree itself is known to the verifier: not sent.
        return [] if lo == 0 else [_subtree_hash(lo, hi, hashes)]
    k, _ = _max_pow2(hi - lo)
    if n <= lo + k:
        proof = _tree_proof(lo, lo + k, n, hashes)
        other = _subtree_hash(lo + k, hi, hashes)
    else:
        other = _subtree_hash(lo, lo + k, hashes)
        proof = _tree_proof(lo + k, hi, n, hashes)
    proof.append(other)
    return proof


def prove_tree(size: int, old_size: int, reader: HashReader) -> list[Hash]:
    """The consistency proof that the tree of ``size`` leaves extends the one of
    ``old_size`` (1 <= old_size <= size)."""
    if not 1 <= old_size <= size:
        raise ProofError("bad_inputs", f"no proof from size {old_size} to size {size}")
    need: list[int] = []
    _tree_proof_indexes(0, size, old_size, need)
    return _tree_proof(0, size, old_size, iter(_read(reader, need)))


def _run_tree_proof(
    proof: list[Hash], lo: int, hi: int, n: int, old_root: Hash
) -> tuple[Hash, Hash]:
    """(old, new): the hashes ``proof`` implies for leaves [lo, min(hi, n)) and [lo, hi);
    consumes the proof from its end."""
    if n == hi:
        if lo == 0:
            return old_root, old_root
        if len(proof) != 1:
            raise ProofError("proof_failed", "the proof has the wrong length")
        common = proof.pop()
        return common, common
    if not proof:
        raise ProofError("proof_failed", "the proof is too short")
    other = proof.pop()
    k, _ = _max_pow2(hi - lo)
    if n <= lo + k:
        old, new = _run_tree_proof(proof, lo, lo + k, n, old_root)
        return old, node_hash(new, other)
    old, new = _run_tree_proof(proof, lo + k, hi, n, old_root)
    return node_hash(other, old), node_hash(other, new)


def check_tree(proof: Sequence[Hash], size: int, root: Hash, old_size: int, old_root: Hash) -> None:
    """Raise :class:`ProofError` unless ``proof`` shows that the tree of ``size`` leaves
    with ``root`` extends the tree of ``old_size`` leaves with ``old_root``."""
    if not 1 <= old_size <= size:
        raise ProofError("bad_inputs", f"no proof from size {old_size} to size {size}")
    _check_hashes(root, old_root, *proof)
    remaining = list(proof)
    old, new = _run_tree_proof(remaining, 0, size, old_size, old_root)
    if remaining:
        raise ProofError("proof_failed", "the proof has the wrong length")
    if old != old_root or new != root:
        raise ProofError("proof_failed", "the proof does not lead to both roots")


@attrs.define
class Frontier:
    """The tree's right edge in memory (RFC 9162's compact range from 0): the roots of
    the complete subtrees that make up the tree, largest first, one per 1 bit of
    ``size``. :meth:`append` costs two hashes on average and reads nothing.

    >>> Frontier().root() == EMPTY_TREE_HASH
    True
    """

    _edge: list[Hash] = attrs.field(factory=list, alias="edge")
    _size: int = attrs.field(default=0, alias="size")

    def __attrs_post_init__(self) -> None:
        if self._size < 0 or len(self._edge) != self._size.bit_count():
            raise ValueError(
                f"a tree of size {self._size} has {self._size.bit_count()} edge hashes, "
                f"not {len(self._edge)}"
            )

    @classmethod
    def at(cls, size: int, reader: HashReader) -> Frontier:
        """The frontier of the stored tree of ``size`` leaves: one read of at most
        log2(size) + 1 hashes."""
        if size < 0:
            raise ValueError(f"a tree has no size {size}")
        return cls(edge=_read(reader, subtree_indexes(0, size)), size=size)

    @property
    def size(self) -> int:
        return self._size

    @property
    def edge(self) -> tuple[Hash, ...]:
        return tuple(self._edge)

    def append(self, leaf: Hash) -> list[Hash]:
        """Add leaf ``size``'s hash; return the hashes to store for it (as
        :func:`stored_hashes_for_leaf_hash` would)."""
        stored = [leaf]
        top = leaf
        for _ in range(_trailing_ones(self._size)):
            top = node_hash(self._edge.pop(), top)
            stored.append(top)
        self._edge.append(top)
        self._size += 1
        return stored

    def root(self) -> Hash:
        """The tree's hash (RFC 6962's MTH of every leaf so far)."""
        if not self._edge:
            return EMPTY_TREE_HASH
        return _fold(self._edge)
