"""The block pool's integrity check: every invariant `BlockPool` states, recomputed from its
blocks (O(num_blocks)), for tests and simulations. A failure is a bug, never a request's fault.

Invariant: the check only reads; it never repairs the pool.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Protocol

from backend.engine.groups import CapacityGroups
from backend.engine.prefix_cache import BlockHash, PrefixIndex
from kvfence.capability import Namespace


class IntegrityError(AssertionError):
    """The pool's bookkeeping is inconsistent (a bug)."""


class BlockState(Protocol):
    """What the check reads of one block."""

    owner: Namespace | None
    ref: int
    readers: dict[Namespace, int]
    hash: BlockHash | None


def check_blocks(
    blocks: Sequence[BlockState],
    free: Collection[int],
    used: int,
    scrub: Collection[int],
    index: PrefixIndex,
    held: Mapping[Namespace, int],
    groups: CapacityGroups,
) -> None:
    """Raise IntegrityError unless free + used + cached-idle == total, every reference comes
    from the block's owner, the index and LRU agree with the blocks, and the per-namespace and
    per-group counts match what the blocks say."""
    free_set = set(free)
    _require(len(free_set) == len(free), "a block is on the free list twice")
    in_use = {i for i, b in enumerate(blocks) if b.ref > 0}
    idle = {i for i, b in enumerate(blocks) if b.ref == 0 and i not in free_set}
    _require(len(in_use) == used, "used count drifted")
    _require(len(free_set) + len(in_use) + len(idle) == len(blocks), "free + used != total")
    _require(not free_set & in_use, "a free block is referenced")
    _require(len(idle) == index.idle_count(), "idle blocks and the LRU disagree")
    counted: dict[Namespace, int] = {}
    for i, b in enumerate(blocks):
        _require(b.ref == sum(b.readers.values()), f"block {i}: ref count != references")
        _require(set(b.readers) <= {b.owner}, f"block {i} is reachable from two namespaces")
        if i in free_set:
            _require(b.hash is None, f"free block {i} is still cached")
            continue
        _require(i not in scrub, f"block {i} is in use but waits to be zeroed")
        assert b.owner is not None
        counted[b.owner] = counted.get(b.owner, 0) + 1
        _require(b.ref > 0 or b.hash is not None, f"idle block {i} is not cached")
        _require(b.ref > 0 or index.is_idle(i), f"idle block {i} missing from LRU")
        if b.hash is not None:
            _require(index.get(b.hash) == i, f"block {i}: hash not indexed")
            _require(i in index.cached_blocks(b.owner), f"block {i}: wrong namespace")
    _require(len(index) == sum(b.hash is not None for b in blocks), "stale hash")
    _require(counted == held, "per-namespace block counts drifted")
    problem = groups.check(counted)
    _require(problem is None, problem or "")


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise IntegrityError(message)
