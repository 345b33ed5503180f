"""RFC 9162 trees: our proofs check under our verifier and under an independent one (the
`tlog-scales` package's RFC 9162 verifiers), and a changed leaf, root or proof is refused."""

from __future__ import annotations

import hashlib
from functools import cache

import pytest
from tlog_scales.tlog import ConsistencyProof, ConsistencyProofInvalid, InclusionProofInvalid
from tlog_scales.tlog import InclusionProof as TheirInclusion

from kvfence.receipts.merkle import (
    EMPTY_ROOT,
    ProofError,
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    node_hash,
    root_of,
    verify_consistency,
    verify_inclusion,
)

SIZES = range(1, 34)
LEAVES = [leaf_hash(f"entry {i}".encode()) for i in range(max(SIZES))]


@cache
def subtree(lo: int, hi: int) -> bytes:
    return root_of(LEAVES[lo:hi])


def test_roots_follow_rfc_9162() -> None:
    a, b, c = LEAVES[:3]
    assert root_of([]) == EMPTY_ROOT == hashlib.sha256(b"").digest()
    assert root_of([a]) == a
    assert root_of([a, b, c]) == node_hash(node_hash(a, b), c)  # split at the largest 2^k < n


@pytest.mark.parametrize("size", SIZES)
def test_inclusion_proofs_verify_here_and_independently(size: int) -> None:
    root = root_of(LEAVES[:size])
    for index in range(size):
        path = inclusion_proof(index, size, subtree)
        verify_inclusion(LEAVES[index], index, size, path, root)
        TheirInclusion(index, size, path).check(LEAVES[index], root)


@pytest.mark.parametrize("new", SIZES)
def test_consistency_proofs_verify_here_and_independently(new: int) -> None:
    new_root = root_of(LEAVES[:new])
    for old in range(1, new + 1):
        path = consistency_proof(old, new, subtree)
        old_root = root_of(LEAVES[:old])
        verify_consistency(old, new, old_root, new_root, path)
        ConsistencyProof(old, new, path).check(old_root, new_root)


def test_a_changed_leaf_root_or_proof_is_refused() -> None:
    size, index = 21, 13
    root, path = root_of(LEAVES[:size]), inclusion_proof(index, size, subtree)
    with pytest.raises(ProofError, match="not in the tree"):
        verify_inclusion(leaf_hash(b"edited"), index, size, path, root)
    with pytest.raises(InclusionProofInvalid):
        TheirInclusion(index, size, path).check(leaf_hash(b"edited"), root)
    with pytest.raises(ProofError):
        verify_inclusion(LEAVES[index], index, size, path[:-1], root)
    with pytest.raises(ProofError, match="outside"):
        verify_inclusion(LEAVES[index], size, size, path, root)


def test_a_fork_fails_the_consistency_proof() -> None:
    """Truncated to 9 and grown again to 20 with other entries: not an extension of 12."""
    forked = LEAVES[:9] + [leaf_hash(f"other {i}".encode()) for i in range(11)]
    new_root = root_of(forked)

    def forked_subtree(lo: int, hi: int) -> bytes:
        return root_of(forked[lo:hi])

    path = consistency_proof(12, 20, forked_subtree)
    with pytest.raises(ProofError, match="forked"):
        verify_consistency(12, 20, root_of(LEAVES[:12]), new_root, path)
    with pytest.raises(ConsistencyProofInvalid):
        ConsistencyProof(12, 20, path).check(root_of(LEAVES[:12]), new_root)
    with pytest.raises(ProofError, match="shrank"):
        verify_consistency(12, 9, root_of(LEAVES[:12]), root_of(LEAVES[:9]), [])
    with pytest.raises(ProofError, match="forked"):
        verify_consistency(12, 12, root_of(LEAVES[:12]), root_of(forked[:12]), [])
