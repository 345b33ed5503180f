"""Block hashes are namespace-scoped chains; the pool's cache hits only on namespace and tokens."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backend.engine.block_pool import BlockPool, QuotaExceededError
from backend.engine.prefix_cache import (
    BlockHash,
    block_hash,
    chain_hashes,
    encode_tokens,
    namespace_root,
)
from kvfence.capability import Namespace, _mint

A = _mint("tenant-a")
B = _mint("tenant-b")
BS = 4

tokens = st.lists(st.integers(0, 2**32 - 1), min_size=BS, max_size=BS)


def test_encoding_is_fixed_width_little_endian() -> None:
    assert encode_tokens([1, 256]) == b"\x01\x00\x00\x00\x00\x01\x00\x00"
    with pytest.raises(ValueError):
        encode_tokens([2**32])
    with pytest.raises(ValueError):
        encode_tokens([-1])


def test_root_is_domain_separated_from_a_plain_digest() -> None:
    assert namespace_root(A) != hashlib.sha256(A.value.encode()).digest()
    assert namespace_root(A) != namespace_root(B)


@given(tokens)
def test_same_tokens_in_two_namespaces_never_share_a_hash(ids: list[int]) -> None:
    assert block_hash(namespace_root(A), ids) != block_hash(namespace_root(B), ids)
    assert block_hash(namespace_root(A), ids) == block_hash(namespace_root(A), ids)


@given(st.lists(st.integers(0, 1000), min_size=3 * BS, max_size=3 * BS))
def test_every_block_chains_through_its_parent(ids: list[int]) -> None:
    a = chain_hashes(A, ids, BS, [])
    b = chain_hashes(B, ids, BS, [])
    assert len(a) == 3 and not set(a) & set(b)
    assert a[1] == block_hash(a[0], ids[BS : 2 * BS])
    # extending an existing chain hashes only the new blocks and agrees with a fresh chain
    assert chain_hashes(A, ids, BS, a[:1]) == a


def test_partial_blocks_get_no_hash() -> None:
    assert chain_hashes(A, [1] * (2 * BS - 1), BS, []) == chain_hashes(A, [1] * BS, BS, [])


def _cached_block(pool: BlockPool, namespace: Namespace, ids: list[int]) -> tuple[int, BlockHash]:
    (block,) = pool.allocate(namespace, 1)
    h = block_hash(namespace_root(namespace), ids)
    assert pool.cache(block, h, ids)
    return block, h


def test_hit_requires_the_same_namespace_and_tokens() -> None:
    pool = BlockPool(8, BS)
    block, h = _cached_block(pool, A, [1, 2, 3, 4])
    assert pool.lookup(A, h, [1, 2, 3, 4]) == block
    assert pool.lookup(B, h, [1, 2, 3, 4]) is None
    # a digest collision with different tokens is not a hit
    assert pool.lookup(A, h, [1, 2, 3, 5]) is None


def test_only_full_blocks_are_cached() -> None:
    pool = BlockPool(8, BS)
    (block,) = pool.allocate(A, 1)
    with pytest.raises(ValueError):
        pool.cache(block, block_hash(namespace_root(A), [1, 2]), [1, 2])


def test_duplicate_hash_keeps_the_first_block() -> None:
    pool = BlockPool(8, BS)
    first, h = _cached_block(pool, A, [1, 2, 3, 4])
    (second,) = pool.allocate(A, 1)
    assert not pool.cache(second, h, [1, 2, 3, 4])
    pool.release(second, A)
    assert pool.num_free == 7  # the duplicate went back to the free list, not the cache
    assert pool.lookup(A, h, [1, 2, 3, 4]) == first


def test_lru_evicts_the_least_recently_released_block() -> None:
    pool = BlockPool(3, BS)
    old, h_old = _cached_block(pool, A, [1, 1, 1, 1])
    new, h_new = _cached_block(pool, A, [2, 2, 2, 2])
    pool.release(old, A)
    pool.release(new, A)
    pool.allocate(B, 2)  # one free block, then the LRU one
    assert pool.lookup(A, h_old, [1, 1, 1, 1]) is None
    assert pool.lookup(A, h_new, [2, 2, 2, 2]) == new
    pool.check_integrity()


def test_a_hit_refreshes_lru_position() -> None:
    pool = BlockPool(2, BS)
    old, h_old = _cached_block(pool, A, [1, 1, 1, 1])
    new, h_new = _cached_block(pool, A, [2, 2, 2, 2])
    pool.release(old, A)
    pool.release(new, A)
    pool.acquire(old, A)
    pool.release(old, A)
    pool.allocate(A, 1)
    assert pool.lookup(A, h_old, [1, 1, 1, 1]) == old
    assert pool.lookup(A, h_new, [2, 2, 2, 2]) is None


def test_flush_drops_one_namespace_only() -> None:
    pool = BlockPool(8, BS)
    a_idle, h_a_idle = _cached_block(pool, A, [1, 1, 1, 1])
    a_busy, h_a_busy = _cached_block(pool, A, [2, 2, 2, 2])
    b_idle, h_b = _cached_block(pool, B, [1, 1, 1, 1])
    pool.release(a_idle, A)
    pool.release(b_idle, B)
    assert pool.flush(A) == 2
    pool.check_integrity()
    assert pool.lookup(A, h_a_idle, [1, 1, 1, 1]) is None
    assert pool.lookup(A, h_a_busy, [2, 2, 2, 2]) is None
    assert pool.lookup(B, h_b, [1, 1, 1, 1]) == b_idle
    assert pool.num_cached_idle == 1
    # the referenced block is freed, not re-cached, when its reader lets go
    pool.release(a_busy, A)
    assert pool.num_cached_idle == 1 and pool.num_free == 7
    assert pool.flush(A) == 0
    pool.check_integrity()


def test_namespace_over_quota_evicts_its_own_cache_first() -> None:
    pool = BlockPool(4, BS, max_share=0.5)
    a1, h1 = _cached_block(pool, A, [1, 1, 1, 1])
    a2, h2 = _cached_block(pool, A, [2, 2, 2, 2])
    b1, hb = _cached_block(pool, B, [3, 3, 3, 3])
    pool.release(b1, B)
    pool.release(a1, A)
    pool.release(a2, A)
    # A holds 2 of its 2 allowed blocks (cached); a new block must come from A's own cache even
    # though B's cached block is older in the LRU.
    pool.allocate(A, 1)
    assert pool.lookup(A, h1, [1, 1, 1, 1]) is None
    assert pool.lookup(A, h2, [2, 2, 2, 2]) == a2
    assert pool.lookup(B, hb, [3, 3, 3, 3]) == b1
    pool.check_integrity()


def test_namespace_at_quota_with_nothing_to_evict_is_refused() -> None:
    pool = BlockPool(4, BS, max_share=0.5)
    pool.allocate(A, 2)
    with pytest.raises(QuotaExceededError):
        pool.allocate(A, 1)
    assert pool.allocate(B, 2)
    pool.check_integrity()
