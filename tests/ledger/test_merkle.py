"""The tree against RFC 6962 computed from scratch (a plain recursive MTH, PATH and PROOF
over the leaves), against Certificate Transparency's published vectors, and against
Go's tlog tests (sumdb/tlog/tlog_test.go) where they port: every size up to 300 with
every inclusion and consistency proof, and random sizes up to 2**48 through a lazily
computed reader."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Sequence

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from boxmaker.ledger.merkle import (
    EMPTY_TREE_HASH,
    Frontier,
    Hash,
    ListHashes,
    ProofError,
    check_record,
    check_tree,
    leaf_hash,
    node_hash,
    prove_record,
    prove_tree,
    split_stored_hash_index,
    stored_hash_count,
    stored_hash_index,
    stored_hashes,
    stored_hashes_for_leaf_hash,
    subtree_indexes,
    tree_hash,
)

MAX_SIZE = 300
TAMPER_MAX_SIZE = 70


def _split(n: int) -> int:
    """RFC 6962's k: the largest power of 2 smaller than n (n >= 2)."""
    k = 1
    while k * 2 < n:
        k *= 2
    return k


class Reference:
    """RFC 6962, section 2.1, as written, over leaf hashes given by ``leaf(i)``; MTH of
    a range is remembered, so every proof costs O(log n) once the ranges are known."""

    def __init__(self, leaf: Callable[[int], Hash], uniform_from: Callable[[int, int], bool]):
        self.leaf = leaf
        self.uniform = uniform_from
        self.mth = functools.cache(self._mth)
        self._uniform_mth = functools.cache(self._mth_of_same)

    def _mth_of_same(self, length: int) -> Hash:
        """MTH of ``length`` copies of the common leaf."""
        if length == 1:
            return COMMON_LEAF
        k = _split(length)
        return node_hash(self._uniform_mth(k), self._uniform_mth(length - k))

    def _mth(self, lo: int, hi: int) -> Hash:
        if hi - lo == 0:
            return hashlib.sha256(b"").digest()
        if self.uniform(lo, hi):
            return self._uniform_mth(hi - lo)
        if hi - lo == 1:
            return self.leaf(lo)
        k = _split(hi - lo)
        return node_hash(self.mth(lo, lo + k), self.mth(lo + k, hi))

    def path(self, m: int, lo: int, hi: int) -> list[Hash]:
        if hi - lo == 1:
            return []
        k = _split(hi - lo)
        if m < k:
            return [*self.path(m, lo, lo + k), self.mth(lo + k, hi)]
        return [*self.path(m - k, lo + k, hi), self.mth(lo, lo + k)]

    def subproof(self, m: int, lo: int, hi: int, whole: bool) -> list[Hash]:
        n = hi - lo
        if m == n:
            return [] if whole else [self.mth(lo, hi)]
        k = _split(n)
        if m <= k:
            return [*self.subproof(m, lo, lo + k, whole), self.mth(lo + k, hi)]
        return [*self.subproof(m - k, lo + k, hi, False), self.mth(lo, lo + k)]

    def stored(self, index: int) -> Hash:
        level, n = split_stored_hash_index(index)
        return self.mth(n << level, (n + 1) << level)


COMMON_LEAF = leaf_hash(b"the same line")


class ReferenceReader:
    """A HashReader that computes each stored hash from the reference, and checks what
    Go's test storage checks: indexes asked in increasing order."""

    def __init__(self, reference: Reference) -> None:
        self.reference = reference
        self.reads = 0

    def read_hashes(self, indexes: Sequence[int]) -> list[Hash]:
        assert list(indexes) == sorted(set(indexes)), indexes
        self.reads += 1
        return [self.reference.stored(index) for index in indexes]


def _line(i: int) -> bytes:
    return b"leaf %d" % i  # Go's TestTree leaves


@functools.cache
def _small_tree() -> tuple[Reference, list[Hash], list[Frontier]]:
    """Leaves 0..MAX_SIZE-1, every hash stored by stored_hashes (Go's way, reading
    from what is stored so far), and the frontier after each size."""
    reference = Reference(lambda i: leaf_hash(_line(i)), lambda lo, hi: False)
    storage: list[Hash] = []
    frontiers = [Frontier()]
    for n in range(MAX_SIZE):
        storage += stored_hashes(n, _line(n), ListHashes(storage))
        frontier = Frontier(edge=list(frontiers[-1].edge), size=n)
        assert frontier.append(leaf_hash(_line(n))) == storage[stored_hash_index(0, n) :]
        frontiers.append(frontier)
    return reference, storage, frontiers


# --- published vectors --------------------------------------------------------------

# Certificate Transparency's reference tree (RFC 6962's test data, as the CT and
# transparency-dev/merkle test suites publish it): leaves, the root at each size 1..8,
# and some proofs in the tree of size 8.
CT_LEAVES = [
    bytes.fromhex(h)
    for h in (
        "",
        "00",
        "10",
        "2021",
        "3031",
        "40414243",
        "5051525354555657",
        "606162636465666768696a6b6c6d6e6f",
    )
]
CT_ROOTS = [
    bytes.fromhex(h)
    for h in (
        "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
        "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
        "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
        "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
        "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
        "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
        "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
    )
]
CT_INCLUSION = {
    (0, 8): (
        "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
        "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
        "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
    ),
    (5, 8): (
        "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
        "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
        "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    ),
}
CT_CONSISTENCY = {
    (2, 8): (
        "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
        "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
    ),
    (6, 8): (
        "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
        "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
        "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    ),
}


def _ct_storage() -> ListHashes:
    storage: list[Hash] = []
    frontier = Frontier()
    for data in CT_LEAVES:
        storage += frontier.append(leaf_hash(data))
    return ListHashes(storage)


def test_the_certificate_transparency_roots() -> None:
    storage = _ct_storage()
    assert tree_hash(0, storage) == EMPTY_TREE_HASH == hashlib.sha256(b"").digest()
    assert EMPTY_TREE_HASH.hex() == (
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    )
    frontier = Frontier()
    for size, (data, root) in enumerate(zip(CT_LEAVES, CT_ROOTS, strict=True), start=1):
        frontier.append(leaf_hash(data))
        assert tree_hash(size, storage) == root
        assert frontier.root() == root


def test_the_certificate_transparency_proofs() -> None:
    storage = _ct_storage()
    for (index, size), expected in CT_INCLUSION.items():
        proof = prove_record(size, index, storage)
        assert [h.hex() for h in proof] == list(expected)
        check_record(proof, size, CT_ROOTS[size - 1], index, leaf_hash(CT_LEAVES[index]))
    for (old, size), expected in CT_CONSISTENCY.items():
        proof = prove_tree(size, old, storage)
        assert [h.hex() for h in proof] == list(expected)
        check_tree(proof, size, CT_ROOTS[size - 1], old, CT_ROOTS[old - 1])


def test_the_hashes_have_rfc_6962s_prefixes() -> None:
    assert leaf_hash(b"") == hashlib.sha256(b"\x00").digest() == CT_ROOTS[0]
    left, right = bytes(range(32)), bytes(range(32, 64))
    assert node_hash(left, right) == hashlib.sha256(b"\x01" + left + right).digest()


# --- the stored hash index (Go: TestSplitStoredHashIndex) ---------------------------


def _go_stored_hash_index(level: int, n: int) -> int:
    """Go's StoredHashIndex loop, as written there."""
    for _ in range(level):
        n = 2 * n + 1
    index = 0
    while n > 0:
        index += n
        n >>= 1
    return index + level


def test_stored_hash_index_is_gos_and_split_inverts_it() -> None:
    for level in range(10):
        for n in range(100):
            index = stored_hash_index(level, n)
            assert index == _go_stored_hash_index(level, n)
            assert split_stored_hash_index(index) == (level, n)


@given(level=st.integers(0, 62), n=st.integers(0, 2**40))
@settings(max_examples=200)
def test_stored_hash_index_at_large_coordinates(level: int, n: int) -> None:
    index = stored_hash_index(level, n)
    assert index == _go_stored_hash_index(level, n)
    assert split_stored_hash_index(index) == (level, n)


def test_the_stored_hashes_are_dense() -> None:
    """Every index below a size's count names one hash; the next leaf's comes right
    after (so the count is that index)."""
    seen = [split_stored_hash_index(index) for index in range(stored_hash_count(1000))]
    assert len(set(seen)) == len(seen)
    for size in range(1, 1000):
        assert stored_hash_count(size) == stored_hash_index(0, size)
    assert [stored_hash_count(n) for n in range(9)] == [0, 1, 3, 4, 7, 8, 10, 11, 15]


# --- every size up to MAX_SIZE, against the reference --------------------------------


def test_every_size_roots_and_stored_hashes() -> None:
    """Go's TestTree: the stored hashes are what the reference's subtrees hash to, the
    count matches, and the root (read, or the frontier's) is the reference MTH."""
    reference, storage, frontiers = _small_tree()
    assert storage == [reference.stored(index) for index in range(len(storage))]
    reader = ListHashes(storage)
    for size in range(MAX_SIZE + 1):
        root = reference.mth(0, size)
        assert stored_hash_count(size) == stored_hash_index(0, size)
        assert tree_hash(size, reader) == root
        assert frontiers[size].root() == root
        assert frontiers[size].size == size
        assert Frontier.at(size, reader) == frontiers[size]
    assert stored_hash_count(MAX_SIZE) == len(storage)


def test_every_inclusion_proof_in_every_size() -> None:
    reference, storage, _ = _small_tree()
    reader = ListHashes(storage)
    for size in range(1, MAX_SIZE + 1):
        root = reference.mth(0, size)
        for index in range(size):
            proof = prove_record(size, index, reader)
            assert proof == reference.path(index, 0, size)
            check_record(proof, size, root, index, reference.leaf(index))


def test_every_consistency_proof_in_every_size() -> None:
    reference, storage, _ = _small_tree()
    reader = ListHashes(storage)
    for size in range(1, MAX_SIZE + 1):
        root = reference.mth(0, size)
        for old in range(1, size + 1):
            proof = prove_tree(size, old, reader)
            assert proof == reference.subproof(old, 0, size, True)
            check_tree(proof, size, root, old, reference.mth(0, old))


def _flipped(proof: list[Hash], at: int) -> list[Hash]:
    changed = list(proof)
    changed[at] = bytes([changed[at][0] ^ 1]) + changed[at][1:]
    return changed


def _fails(reason: str, function: Callable[..., object], *arguments: object) -> str:
    with pytest.raises(ProofError) as caught:
        function(*arguments)
    assert caught.value.reason == reason
    return str(caught.value)


def test_a_changed_inclusion_proof_leaf_index_or_size_fails() -> None:
    reference, storage, _ = _small_tree()
    reader = ListHashes(storage)
    for size in range(1, TAMPER_MAX_SIZE + 1):
        root = reference.mth(0, size)
        for index in range(size):
            proof = prove_record(size, index, reader)
            leaf = reference.leaf(index)
            for at in range(len(proof)):
                assert _fails(
                    "proof_failed",
                    check_record,
                    _flipped(proof, at),
                    size,
                    root,
                    index,
                    leaf,
                ) == ("proof_failed: the proof does not lead to the root")
            wrong_leaf = reference.leaf(index + 1)
            _fails("proof_failed", check_record, proof, size, root, index, wrong_leaf)
            _fails("proof_failed", check_record, proof, size, root[::-1], index, leaf)
            _fails("proof_failed", check_record, [*proof, root], size, root, index, leaf)
            if proof:
                _fails("proof_failed", check_record, proof[:-1], size, root, index, leaf)
            for other in {index - 1, index + 1} & set(range(size)):
                _fails("proof_failed", check_record, proof, size, root, other, leaf)
            # The size is bound by the root: the proof does not hold for another size's
            # root (for the same root a bigger size can share the path's shape).
            bigger = reference.mth(0, size + 1)
            _fails("proof_failed", check_record, proof, size + 1, bigger, index, leaf)
            if index < size - 1:
                smaller = reference.mth(0, size - 1)
                _fails("proof_failed", check_record, proof, size - 1, smaller, index, leaf)


def test_a_changed_consistency_proof_or_size_fails() -> None:
    reference, storage, _ = _small_tree()
    reader = ListHashes(storage)
    for size in range(1, TAMPER_MAX_SIZE + 1):
        root = reference.mth(0, size)
        for old in range(1, size + 1):
            proof = prove_tree(size, old, reader)
            old_root = reference.mth(0, old)
            for at in range(len(proof)):
                _fails(
                    "proof_failed",
                    check_tree,
                    _flipped(proof, at),
                    size,
                    root,
                    old,
                    old_root,
                )
            _fails("proof_failed", check_tree, proof, size, root, old, root[::-1])
            _fails("proof_failed", check_tree, proof, size, old_root[::-1], old, old_root)
            _fails("proof_failed", check_tree, [*proof, root], size, root, old, old_root)
            if proof:
                _fails("proof_failed", check_tree, proof[:-1], size, root, old, old_root)
            if old < size:
                # A proof of a bigger tree shown for the tree of size `old` itself.
                _fails("proof_failed", check_tree, proof, old, old_root, old, old_root)
                _fails("proof_failed", check_tree, proof, size, root, old + 1, old_root)
            if old > 1:
                _fails("proof_failed", check_tree, proof, size, root, old - 1, old_root)


def test_the_failure_messages() -> None:
    reference, storage, _ = _small_tree()
    reader = ListHashes(storage)
    root7, leaf3 = reference.mth(0, 7), reference.leaf(3)
    proof = prove_record(7, 3, reader)
    assert _fails("proof_failed", check_record, proof[:-1], 7, root7, 3, leaf3) == (
        "proof_failed: the proof is too short"
    )
    assert _fails("proof_failed", check_record, [*proof, leaf3], 7, root7, 3, leaf3) == (
        "proof_failed: the proof is too long"
    )
    tree_proof = prove_tree(7, 3, reader)
    root3 = reference.mth(0, 3)
    assert _fails("proof_failed", check_tree, tree_proof[:1], 7, root7, 3, root3) == (
        "proof_failed: the proof is too short"
    )
    assert _fails("proof_failed", check_tree, [*tree_proof, root3], 7, root7, 3, root3) == (
        "proof_failed: the proof has the wrong length"
    )
    assert _fails("proof_failed", check_tree, tree_proof, 7, root3, 3, root3) == (
        "proof_failed: the proof does not lead to both roots"
    )
    # The common subtree is one hash: two where one belongs is the wrong length.
    subtree_proof = prove_tree(7, 6, reader)
    assert subtree_proof[0] == reference.mth(4, 6)
    assert _fails(
        "proof_failed",
        check_tree,
        [root3, *subtree_proof],
        7,
        root7,
        6,
        reference.mth(0, 6),
    ) == ("proof_failed: the proof has the wrong length")
    # Equal sizes: the proof is empty and both roots are the one root.
    check_tree([], 5, reference.mth(0, 5), 5, reference.mth(0, 5))
    _fails("proof_failed", check_tree, [], 5, reference.mth(0, 5), 5, root3)


def test_inputs_no_proof_is_made_or_checked_for() -> None:
    reader = _ct_storage()
    root, leaf, short = CT_ROOTS[7], leaf_hash(CT_LEAVES[5]), bytes(31)
    proof = prove_record(8, 5, reader)
    bad: list[tuple[object, ...]] = [
        (prove_record, 8, 8, reader),
        (prove_record, 8, -1, reader),
        (prove_record, 0, 0, reader),
        (check_record, proof, 8, root, 8, leaf),
        (check_record, proof, 8, root, -1, leaf),
        (check_record, proof, 8, short, 5, leaf),
        (check_record, proof, 8, root, 5, short),
        (check_record, [short, *proof[1:]], 8, root, 5, leaf),
        (check_record, [root + b"\x00", *proof[1:]], 8, root, 5, leaf),
        (prove_tree, 8, 0, reader),
        (prove_tree, 5, 6, reader),
        (check_tree, [], 8, root, 0, EMPTY_TREE_HASH),
        (check_tree, [], 5, root, 6, root),
        (check_tree, [], 8, short, 8, root),
        (check_tree, [], 8, root, 8, short),
        (check_tree, [short], 8, root, 6, CT_ROOTS[5]),
        (tree_hash, -1, reader),
    ]
    messages = [_fails("bad_inputs", *call) for call in bad]
    assert messages[0] == "bad_inputs: leaf 8 is not in a tree of size 8"
    assert messages[2] == "bad_inputs: leaf 0 is not in a tree of size 0"
    assert messages[5] == "bad_inputs: a hash of 31 bytes, not 32"
    assert messages[8] == "bad_inputs: a hash of 33 bytes, not 32"
    assert messages[9] == "bad_inputs: no proof from size 0 to size 8"
    assert messages[16] == "bad_inputs: a tree has no size -1"
    # The smallest valid inputs are accepted.
    assert prove_record(1, 0, reader) == []
    check_record([], 1, CT_ROOTS[0], 0, leaf_hash(CT_LEAVES[0]))
    assert prove_tree(1, 1, reader) == []
    check_tree([], 1, CT_ROOTS[0], 1, CT_ROOTS[0])


def test_a_reader_that_answers_short_is_refused() -> None:
    class Short:
        def read_hashes(self, indexes: Sequence[int]) -> list[Hash]:
            return [COMMON_LEAF] * (len(indexes) - 1)

    with pytest.raises(ValueError, match=r"^read_hashes\(2 indexes\) gave 1 hashes$"):
        tree_hash(3, Short())
    with pytest.raises(ValueError, match="gave"):
        prove_record(3, 0, Short())
    with pytest.raises(ValueError, match="gave"):
        Frontier.at(3, Short())
    with pytest.raises(ValueError, match="gave"):
        stored_hashes(3, b"x", Short())


def test_nothing_is_read_where_nothing_is_needed() -> None:
    class Refuses:
        def read_hashes(self, indexes: Sequence[int]) -> list[Hash]:
            raise AssertionError(f"read {indexes}")

    assert tree_hash(0, Refuses()) == EMPTY_TREE_HASH
    assert Frontier.at(0, Refuses()) == Frontier()
    assert stored_hashes(0, b"x", Refuses()) == [leaf_hash(b"x")]
    assert stored_hashes(2, b"x", Refuses()) == [leaf_hash(b"x")]
    assert prove_record(1, 0, Refuses()) == []
    assert prove_tree(1, 1, Refuses()) == []


def test_a_frontier_must_match_its_size() -> None:
    with pytest.raises(ValueError, match=r"^a tree of size 3 has 2 edge hashes, not 1$"):
        Frontier(edge=[COMMON_LEAF], size=3)
    with pytest.raises(ValueError, match="size -1"):
        Frontier(edge=[], size=-1)
    with pytest.raises(ValueError, match=r"^a tree has no size -1$"):
        Frontier.at(-1, ListHashes([]))
    assert Frontier(edge=[COMMON_LEAF, COMMON_LEAF], size=3).size == 3


def test_subtree_indexes_are_the_complete_subtrees() -> None:
    assert subtree_indexes(0, 0) == []
    assert subtree_indexes(0, 13) == [
        stored_hash_index(3, 0),
        stored_hash_index(2, 2),
        stored_hash_index(0, 12),
    ]
    assert subtree_indexes(4, 7) == [stored_hash_index(1, 2), stored_hash_index(0, 6)]


# --- random large sizes, through a lazily computed reader ------------------------------


@st.composite
def _large_tree(draw: st.DrawFn) -> tuple[int, int, int, Reference]:
    """A size up to 2**48, a leaf in it and an old size, and a reference whose leaves
    are all one line except a few drawn ones (the leaf among them), so any subtree's
    hash is computed in O(log n)."""
    size = draw(st.integers(1, 2**48))
    index = draw(st.integers(0, size - 1))
    old = draw(st.integers(1, size))
    others = draw(st.lists(st.integers(0, size - 1), max_size=4))
    special = sorted({index, old - 1, *others})

    def leaf(i: int) -> Hash:
        return leaf_hash(b"line %d" % i) if i in special else COMMON_LEAF

    def uniform(lo: int, hi: int) -> bool:
        return not any(lo <= s < hi for s in special)

    return size, index, old, Reference(leaf, uniform)


@given(_large_tree())
@settings(max_examples=60)
def test_large_trees_against_the_reference(tree: tuple[int, int, int, Reference]) -> None:
    size, index, old, reference = tree
    reader = ReferenceReader(reference)
    root = reference.mth(0, size)
    assert tree_hash(size, reader) == root

    proof = prove_record(size, index, reader)
    assert proof == reference.path(index, 0, size)
    check_record(proof, size, root, index, reference.leaf(index))
    for at in range(len(proof)):
        _fails(
            "proof_failed",
            check_record,
            _flipped(proof, at),
            size,
            root,
            index,
            reference.leaf(index),
        )
    _fails("proof_failed", check_record, proof, size, root, index, leaf_hash(b"another"))

    consistency = prove_tree(size, old, reader)
    assert consistency == reference.subproof(old, 0, size, True)
    old_root = reference.mth(0, old)
    check_tree(consistency, size, root, old, old_root)
    for at in range(len(consistency)):
        _fails("proof_failed", check_tree, _flipped(consistency, at), size, root, old, old_root)

    # A restart: the frontier from the stored hashes, in one read of log2(size) + 1.
    reader.reads = 0
    frontier = Frontier.at(size, reader)
    assert reader.reads == 1
    assert len(frontier.edge) == size.bit_count()
    assert frontier.root() == root
    new_leaf = leaf_hash(b"the next line")
    assert frontier.append(new_leaf) == stored_hashes_for_leaf_hash(size, new_leaf, reader)
    grown = Reference(
        lambda i: new_leaf if i == size else reference.leaf(i),
        lambda lo, hi: hi <= size and reference.uniform(lo, hi),
    )
    assert frontier.root() == grown.mth(0, size + 1)
    assert frontier.size == size + 1
