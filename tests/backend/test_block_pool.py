"""The block pool: allocation, reference counts, zero-on-reuse, quotas and integrity checks."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    multiple,
    precondition,
    rule,
)

from backend.engine.block_pool import (
    AllocationError,
    BlockPool,
    IntegrityError,
    OutOfBlocksError,
)
from backend.engine.prefix_cache import BlockHash, block_hash, namespace_root
from kvfence.capability import Namespace, _mint

A = _mint("tenant-a")
B = _mint("tenant-b")
C = _mint("tenant-c")
BS = 2


def test_allocate_and_release_keep_counts() -> None:
    pool = BlockPool(4, BS)
    blocks = pool.allocate(A, 3)
    assert len(set(blocks)) == 3 and pool.num_used == 3 and pool.num_free == 1
    with pytest.raises(OutOfBlocksError):
        pool.allocate(B, 2)
    assert pool.num_used == 3  # a refused allocation takes nothing
    for block in blocks:
        pool.release(block, A)
    assert pool.num_free == 4 and pool.num_used == 0
    pool.check_integrity()


def test_block_reused_by_another_namespace_is_reported_for_zeroing() -> None:
    pool = BlockPool(1, BS)
    (block,) = pool.allocate(A, 1)
    assert pool.take_zero_blocks() == ()  # never filled before
    pool.release(block, A)
    pool.allocate(A, 1)
    pool.release(block, A)
    assert pool.take_zero_blocks() == ()  # same namespace again
    pool.allocate(B, 1)
    assert pool.take_zero_blocks() == (block,)
    assert pool.take_zero_blocks() == ()  # drained
    assert pool.owner(block) == B


def test_zero_on_reuse_can_be_turned_off() -> None:
    pool = BlockPool(1, BS, zero_on_reuse=False)
    (block,) = pool.allocate(A, 1)
    pool.release(block, A)
    pool.allocate(B, 1)
    assert pool.take_zero_blocks() == ()


def test_release_from_a_namespace_without_a_reference_is_refused() -> None:
    pool = BlockPool(2, BS)
    (block,) = pool.allocate(A, 1)
    with pytest.raises(ValueError):
        pool.release(block, B)


def test_integrity_check_catches_a_block_reachable_from_two_namespaces() -> None:
    pool = BlockPool(2, BS)
    (block,) = pool.allocate(A, 1)
    pool.cache(block, block_hash(namespace_root(A), [1, 2]), [1, 2])
    pool.check_integrity()
    pool.acquire(block, B)  # what only a bug (or the test double LeakyEngine) would do
    with pytest.raises(IntegrityError, match="two namespaces"):
        pool.check_integrity()


def test_integrity_check_catches_a_lost_block() -> None:
    pool = BlockPool(3, BS)
    pool.allocate(A, 1)
    pool._free.pop()  # simulate a leak
    with pytest.raises(IntegrityError):
        pool.check_integrity()


class PoolMachine(RuleBasedStateMachine):
    """Random allocate / cache / hit / release / flush across three namespaces and a quota."""

    held = Bundle("held")

    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(8, BS, quota=0.5)
        self.serial = 0
        self.hashes: list[tuple[Namespace, BlockHash, list[int]]] = []

    @rule(target=held, ns=st.sampled_from([A, B, C]))
    def allocate(self, ns: Namespace) -> object:
        try:
            (block,) = self.pool.allocate(ns, 1)
        except AllocationError:
            return multiple()  # refused: nothing is held
        zero = self.pool.take_zero_blocks()
        assert set(zero) <= {block}
        return (ns, block)

    @rule(item=held)
    def cache(self, item: tuple[Namespace, int]) -> None:
        ns, block = item
        self.serial += 1
        ids = [self.serial, self.serial]
        h = block_hash(namespace_root(ns), ids)
        try:
            self.pool.cache(block, h, ids)
        except ValueError:
            return  # already cached
        self.hashes.append((ns, h, ids))

    @precondition(lambda self: bool(self.hashes))
    @rule(target=held, data=st.data())
    def hit(self, data: st.DataObject) -> object:
        ns, h, ids = data.draw(st.sampled_from(self.hashes))
        for other in (A, B, C):
            if other != ns:
                assert self.pool.lookup(other, h, ids) is None
        block = self.pool.lookup(ns, h, ids)
        if block is None:
            return multiple()  # evicted or flushed since
        self.pool.acquire(block, ns)
        return (ns, block)

    @rule(item=consumes(held))
    def release(self, item: tuple[Namespace, int]) -> None:
        self.pool.release(item[1], item[0])

    @precondition(lambda self: self.pool.num_cached_idle > 0)
    @rule(ns=st.sampled_from([A, B, C]))
    def flush(self, ns: Namespace) -> None:
        before = {n: c for n, c in self.pool.held().items() if n != ns}
        self.pool.flush(ns)
        assert all(self.pool.lookup(n, h, ids) is None for n, h, ids in self.hashes if n == ns)
        after = {n: c for n, c in self.pool.held().items() if n != ns}
        assert before == after  # nobody else lost a block

    @invariant()
    def integrity(self) -> None:
        self.pool.check_integrity()
        assert self.pool.num_free + self.pool.num_used + self.pool.num_cached_idle == 8
        assert all(n <= 4 for n in self.pool.held().values())


PoolMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestPoolMachine = PoolMachine.TestCase
