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

from backend.engine.block_pool import AllocationError, BlockPool, OutOfBlocksError
from backend.engine.pool_check import IntegrityError
from backend.engine.prefix_cache import BlockHash, block_hash, namespace_root
from kvfence.capability import Namespace, _mint
from kvfence.public import PUBLIC_GROUP

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


def test_blocks_of_a_request_scoped_namespace_are_zeroed_when_freed() -> None:
    pool = BlockPool(2, BS, zero_on_reuse=False)
    once = _mint("request-1", ephemeral=True)
    first, second = pool.allocate(once, 2)
    with pytest.raises(ValueError):
        pool.cache(first, block_hash(namespace_root(once), [1, 2]), [1, 2])  # never cached
    pool.release(first, once)
    assert pool.has_scrub and pool.take_scrub_blocks() == (first,)  # at once, not on reuse
    pool.release(second, once)
    assert pool.allocate(A, 1) == [first]  # already zeroed: nothing more to do
    assert pool.take_zero_blocks() == ()
    assert pool.allocate(A, 1) == [second]  # reused before its scrub ran: zeroed before writing
    assert pool.take_zero_blocks() == (second,) and not pool.has_scrub
    pool.check_integrity()


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
        self.pool = BlockPool(8, BS, max_share=0.5)
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


# Capacity groups: a tenant's namespaces share one ceiling; others may not evict below its floor.
A1 = _mint("acme-user-1", "acme", 0.5, 0.25)
A2 = _mint("acme-user-2", "acme", 0.5, 0.25)
G = _mint("globex", "globex", 0.5, 0.25)


def cached_blocks(pool: BlockPool, ns: Namespace, n: int) -> list[int]:
    """n blocks allocated by ns, cached and released: idle, evictable, counted."""
    blocks = pool.allocate(ns, n)
    for i, block in enumerate(blocks):
        ids = [ns.value.__hash__() % 1000, i]
        pool.cache(block, block_hash(namespace_root(ns), ids), ids)
        pool.release(block, ns)
    return blocks


def group_held(pool: BlockPool, group: str) -> int:
    return sum(n for ns, n in pool.held().items() if ns.group == group)


def test_a_tenants_namespaces_share_one_ceiling() -> None:
    pool = BlockPool(8, BS)
    pool.allocate(A1, 3)
    with pytest.raises(AllocationError):
        pool.allocate(A2, 2)  # 3 + 2 > half of 8: user 2 cannot escape user 1's ceiling
    pool.allocate(A2, 1)
    pool.check_integrity()


def test_another_tenant_cannot_evict_below_the_floor() -> None:
    pool = BlockPool(8, BS)
    cached_blocks(pool, A1, 4)  # acme at its ceiling, all idle
    cached_blocks(pool, G, 4)  # globex fills the rest
    pool.allocate(G, 2)  # globex evicts its own idle blocks first (its ceiling is 4)
    assert group_held(pool, "acme") == 4
    flood = _mint("globex-2", "globex", 1.0, 0.0)  # even asking for the whole pool...
    with pytest.raises(AllocationError):
        pool.allocate(flood, 7)
    pool.allocate(flood, 4)
    assert group_held(pool, "acme") >= 2  # ...acme keeps its floor (a quarter of 8)
    pool.check_integrity()


def test_floors_that_would_reserve_more_than_half_are_scaled_down() -> None:
    pool = BlockPool(8, BS)
    big = [_mint(f"t{i}", f"t{i}", 0.5, 0.5) for i in range(3)]
    for ns in big:
        cached_blocks(pool, ns, 2)  # 3 floors of 4 blocks each ask for 12 of 8
    newcomer = _mint("new", "new", 1.0, 0.0)
    pool.allocate(newcomer, 4)  # half the pool always stays within anyone's reach
    pool.check_integrity()


PUBLIC = _mint("public", PUBLIC_GROUP, 0.25, 0.25)  # the declared public prefixes


class GroupMachine(RuleBasedStateMachine):
    """Random allocations and releases by two tenants (one with two users), the public
    prefixes and a flooder: ceilings hold, and nobody (the public group included) is pushed
    below its floor by anyone else."""

    held = Bundle("held")
    FLOOD = _mint("flood", "flood", 1.0, 0.0)

    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(12, BS)
        self.serial = 0

    @rule(target=held, ns=st.sampled_from([A1, A2, G, FLOOD, PUBLIC]), n=st.integers(1, 4))
    def allocate(self, ns: Namespace, n: int) -> object:
        before = {g: group_held(self.pool, g) for g in ("acme", "globex", PUBLIC_GROUP)}
        try:
            blocks = self.pool.allocate(ns, n)
        except AllocationError:
            return multiple()
        # Floors of 3 blocks each (a quarter of 12); together they reserve 9, more than half
        # the pool, so each is scaled down to 6 * 3 // 9 = 2.
        floors = (("acme", 2), ("globex", 2), (PUBLIC_GROUP, 2))
        for group, floor in floors:
            if group != ns.group:
                assert group_held(self.pool, group) >= min(before[group], floor)
        return multiple(*((ns, b) for b in blocks))

    @rule(item=consumes(held), keep=st.booleans())
    def release(self, item: tuple[Namespace, int], keep: bool) -> None:
        ns, block = item
        if keep:  # cache it, so it stays held (idle) until evicted
            self.serial += 1
            ids = [self.serial, self.serial]
            self.pool.cache(block, block_hash(namespace_root(ns), ids), ids)
        self.pool.release(block, ns)

    @invariant()
    def integrity(self) -> None:
        self.pool.check_integrity()
        assert group_held(self.pool, "acme") <= 6 and group_held(self.pool, "globex") <= 6
        assert group_held(self.pool, PUBLIC_GROUP) <= 3  # counted apart from every tenant


GroupMachine.TestCase.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)
TestGroupMachine = GroupMachine.TestCase
