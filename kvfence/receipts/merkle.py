"""RFC 9162 Merkle tree hashing: leaf and node hashes, tree heads, inclusion and consistency
proofs (built from any store of complete subtree hashes) and their verification. Pure.

A tree over `n` leaves splits at the largest power of two below `n` (RFC 9162 section 2.1.1),
so every complete subtree a proof needs covers an aligned range [i * 2^l, (i + 1) * 2^l): a
store need only answer for those (`Subtree`).

Invariant: the verifiers accept exactly the proofs RFC 9162 sections 2.1.3.2 and 2.1.4.2 accept,
and raise `ProofError` with the reason otherwise.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Final

HASH_SIZE: Final = 32
EMPTY_ROOT: Final = hashlib.sha256(b"").digest()

# The hash of the complete, aligned subtree over leaves [lo, hi) (hi - lo a power of two).
Subtree = Callable[[int, int], bytes]


class ProofError(ValueError):
    """A proof does not verify: one line saying which check failed."""


def leaf_hash(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two smaller than n (n >= 2)."""
    return 1 << ((n - 1).bit_length() - 1)


def tree_hash(lo: int, hi: int, subtree: Subtree) -> bytes:
    """MTH(D[lo:hi]): the hash of leaves [lo, hi) of a tree whose complete subtrees `subtree`
    knows."""
    n = hi - lo
    if n == 0:
        return EMPTY_ROOT
    if n & (n - 1) == 0:
        return subtree(lo, hi)
    k = _split(n)
    return node_hash(tree_hash(lo, lo + k, subtree), tree_hash(lo + k, hi, subtree))


def root_of(leaves: Sequence[bytes]) -> bytes:
    """MTH over leaf hashes held in memory (tests and small trees)."""

    def subtree(lo: int, hi: int) -> bytes:
        if hi - lo == 1:
            return leaves[lo]
        mid = (lo + hi) // 2
        return node_hash(subtree(lo, mid), subtree(mid, hi))

    return tree_hash(0, len(leaves), subtree)


def inclusion_proof(index: int, size: int, subtree: Subtree) -> list[bytes]:
    """PATH(index, D[0:size]): sibling hashes from the leaf up (RFC 9162 section 2.1.3.1)."""
    if not 0 <= index < size:
        raise ValueError(f"leaf {index} is not in a tree of {size}")
    path: list[bytes] = []
    lo, hi = 0, size
    while hi - lo > 1:
        k = _split(hi - lo)
        if index < lo + k:
            path.append(tree_hash(lo + k, hi, subtree))
            hi = lo + k
        else:
            path.append(tree_hash(lo, lo + k, subtree))
            lo += k
    path.reverse()
    return path


def consistency_proof(old: int, new: int, subtree: Subtree) -> list[bytes]:
    """PROOF(old, D[0:new]) (RFC 9162 section 2.1.4.1); empty when there is nothing to prove."""
    if not 0 <= old <= new:
        raise ValueError(f"no consistency proof from {old} to {new}")
    if old in (0, new):
        return []
    proof: list[bytes] = []
    lo, hi, m, whole = 0, new, old, True
    while m != hi - lo:
        k = _split(hi - lo)
        if m <= k:
            proof.append(tree_hash(lo + k, hi, subtree))
            hi = lo + k
        else:
            proof.append(tree_hash(lo, lo + k, subtree))
            lo, m, whole = lo + k, m - k, False
    if not whole:
        proof.append(tree_hash(lo, hi, subtree))
    proof.reverse()
    return proof


def verify_inclusion(
    leaf: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes
) -> None:
    """RFC 9162 section 2.1.3.2."""
    if not 0 <= index < size:
        raise ProofError(f"leaf index {index} is outside a tree of {size}")
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if sn == 0:
            raise ProofError("inclusion proof is longer than the tree is deep")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            while not fn & 1 and fn:
                fn, sn = fn >> 1, sn >> 1
        else:
            r = node_hash(r, p)
        fn, sn = fn >> 1, sn >> 1
    if sn != 0:
        raise ProofError("inclusion proof is shorter than the tree is deep")
    if r != root:
        raise ProofError(f"leaf {index} is not in the tree of {size} with this root")


def verify_consistency(
    old: int, new: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]
) -> None:
    """RFC 9162 section 2.1.4.2, plus the trivial cases (equal trees, an empty old tree)."""
    if not 0 <= old <= new:
        raise ProofError(f"tree of {new} cannot extend a tree of {old}: the log shrank")
    if old == new:
        if proof or old_root != new_root:
            raise ProofError(f"two different trees of {old} leaves: the log forked")
        return
    if old == 0:
        if proof or old_root != EMPTY_ROOT:
            raise ProofError("an empty tree has the empty root and needs no proof")
        return
    path = list(proof)
    if not path:
        raise ProofError("consistency proof is empty")
    if old & (old - 1) == 0:
        path.insert(0, old_root)
    fn, sn = old - 1, new - 1
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise ProofError("consistency proof is longer than the tree is deep")
        if fn & 1 or fn == sn:
            fr, sr = node_hash(c, fr), node_hash(c, sr)
            while not fn & 1 and fn:
                fn, sn = fn >> 1, sn >> 1
        else:
            sr = node_hash(sr, c)
        fn, sn = fn >> 1, sn >> 1
    if sn != 0:
        raise ProofError("consistency proof is shorter than the tree is deep")
    if fr != old_root:
        raise ProofError(f"the tree of {new} does not extend the tree of {old}: the log forked")
    if sr != new_root:
        raise ProofError(f"the proof does not lead to the root of the tree of {new}")
