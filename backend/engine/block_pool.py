"""The KV block pool's bookkeeping: free list, reference counts, owners, capacity groups,
cached blocks.

Invariant: every block is exactly one of free, used (referenced) or cached-idle; a block is only
referenced from the namespace that filled it; a block that changes namespace is zeroed first,
and one freed by a request-scoped (ephemeral) namespace is zeroed at once. A capacity group (one
tenant: all its namespaces; or the public prefixes) never holds more than its ceiling, and
another group's allocation never evicts a group's cached blocks below its floor.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from backend.engine.groups import CapacityGroups
from backend.engine.pool_check import IntegrityError, check_blocks
from backend.engine.prefix_cache import BlockHash, PrefixIndex
from kvfence.capability import Namespace


class AllocationError(Exception):
    """No blocks can be given to this namespace right now."""


class OutOfBlocksError(AllocationError):
    """The pool has too few free or evictable blocks."""


class QuotaExceededError(AllocationError):
    """The namespace's capacity group (`group`) would hold more than its ceiling."""

    def __init__(self, group: str) -> None:
        super().__init__(f"capacity group #{group[:12]} is at its ceiling")
        self.group = group


class _Block:
    __slots__ = ("hash", "owner", "readers", "ref", "tokens")

    def __init__(self) -> None:
        self.owner: Namespace | None = None  # the namespace that last filled this block
        self.ref = 0
        self.readers: dict[Namespace, int] = {}
        self.hash: BlockHash | None = None
        self.tokens: tuple[int, ...] = ()


class BlockPool:
    """Fixed-size blocks handed out per namespace; cached full blocks are reusable by hash."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        max_share: float = 1.0,
        zero_on_reuse: bool = True,
    ) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.zero_on_reuse = zero_on_reuse
        self._blocks = [_Block() for _ in range(num_blocks)]
        self._free: deque[int] = deque(range(num_blocks))
        self._index = PrefixIndex()
        self._held: dict[Namespace, int] = {}  # blocks owned and used or cached, per namespace
        self.groups = CapacityGroups(num_blocks, max_share)
        self._used = 0
        self._zero: list[int] = []
        self._scrub: dict[int, None] = {}  # freed by an ephemeral namespace, not yet zeroed

    def ceiling(self, namespace: Namespace) -> int:
        """The most blocks the namespace's capacity group may hold at once."""
        return self.groups.ceiling(namespace)

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self._used

    @property
    def num_cached_idle(self) -> int:
        return self._index.idle_count()

    def held(self) -> dict[Namespace, int]:
        return dict(self._held)

    def owner(self, block_id: int) -> Namespace:
        owner = self._blocks[block_id].owner
        if owner is None:
            raise ValueError(f"block {block_id} was never filled")
        return owner

    def take_zero_blocks(self) -> tuple[int, ...]:
        """Blocks allocated across namespaces since the last call; zero them before writing."""
        zero, self._zero = tuple(self._zero), []
        return zero

    @property
    def has_scrub(self) -> bool:
        return bool(self._scrub)

    def take_scrub_blocks(self) -> tuple[int, ...]:
        """Free blocks a request-scoped namespace left behind; zero them now."""
        scrub, self._scrub = tuple(self._scrub), {}
        return scrub

    def allocate(self, namespace: Namespace, n: int) -> list[int]:
        """n fresh blocks for namespace, each with one reference; all or nothing. Room comes
        from free blocks, then the group's own idle blocks, then other groups' idle blocks
        above their floors, least recently used first."""
        group = namespace.group
        over = self.groups.held.get(group, 0) + n - self.ceiling(namespace)
        if over > self._index.idle_count(group):
            raise QuotaExceededError(group)
        own = self._index.oldest_idle_of(group, max(0, over))  # to stay under the ceiling
        short = n - len(self._free) - len(own)
        idle = self._index.iter_idle()
        victims = self.groups.victims(group, short, set(own), idle) if short > 0 else []
        if len(victims) < short:
            raise OutOfBlocksError("no free blocks")
        for block_id in (*own, *victims):
            self._evict(block_id)
        out = []
        for _ in range(n):
            block_id = self._free.popleft()
            block = self._blocks[block_id]
            if block_id in self._scrub:  # its request ended but it is not zeroed yet
                del self._scrub[block_id]
                self._zero.append(block_id)
            elif self.zero_on_reuse and block.owner is not None and block.owner != namespace:
                self._zero.append(block_id)
            block.owner = namespace
            block.ref = 1
            block.readers = {namespace: 1}
            out.append(block_id)
        self._held[namespace] = self._held.get(namespace, 0) + n
        self.groups.add(namespace, n)
        self._used += n
        return out

    def _evict(self, block_id: int | None) -> None:
        if block_id is None:
            raise IntegrityError("eviction found no idle block")
        block = self._blocks[block_id]
        assert block.hash is not None and block.owner is not None
        self._index.remove(block.hash, block_id, block.owner)
        block.hash = None
        block.tokens = ()
        self._to_free(block_id, block.owner)

    def _to_free(self, block_id: int, owner: Namespace) -> None:
        self._free.append(block_id)
        if owner.ephemeral:
            self._scrub[block_id] = None
        left = self._held[owner] - 1
        if left:
            self._held[owner] = left
        else:
            del self._held[owner]
        self.groups.remove(owner.group)

    def lookup(self, namespace: Namespace, h: BlockHash, token_ids: Sequence[int]) -> int | None:
        """The cached block for h, only if it was filled by namespace with exactly token_ids."""
        block_id = self._index.get(h)
        if block_id is None:
            return None
        block = self._blocks[block_id]
        if block.owner != namespace or block.tokens != tuple(token_ids):
            return None
        return block_id

    def acquire(self, block_id: int, reader: Namespace) -> None:
        """Add a reference to a cached block (a prefix hit)."""
        block = self._blocks[block_id]
        if block.hash is None:
            raise ValueError(f"block {block_id} is not cached")
        if block.ref == 0:
            assert block.owner is not None
            self._index.mark_busy(block_id, block.owner)
            self._used += 1
        block.ref += 1
        block.readers[reader] = block.readers.get(reader, 0) + 1

    def release(self, block_id: int, reader: Namespace) -> None:
        """Drop a reference; at zero the block becomes cached-idle (if indexed) or free."""
        block = self._blocks[block_id]
        count = block.readers.get(reader, 0)
        if count == 0:
            raise ValueError(f"block {block_id} holds no reference from #{reader.label}")
        if count == 1:
            del block.readers[reader]
        else:
            block.readers[reader] = count - 1
        block.ref -= 1
        if block.ref:
            return
        self._used -= 1
        assert block.owner is not None
        if block.hash is None:
            self._to_free(block_id, block.owner)
        else:
            self._index.mark_idle(block_id, block.owner)

    def cache(self, block_id: int, h: BlockHash, token_ids: Sequence[int]) -> bool:
        """Index a full, referenced block under h; False if h already names another block.
        An ephemeral namespace's blocks are never cached (ValueError)."""
        block = self._blocks[block_id]
        if len(token_ids) != self.block_size:
            raise ValueError("only full blocks are cached")
        if block.owner is not None and block.owner.ephemeral:
            raise ValueError("a request-scoped namespace's blocks are never cached")
        if block.ref == 0 or block.hash is not None or block.owner is None:
            raise ValueError(f"block {block_id} cannot be cached now")
        if not self._index.insert(h, block_id, block.owner):
            return False
        block.hash = h
        block.tokens = tuple(token_ids)
        return True

    def flush(self, namespace: Namespace) -> int:
        """Drop every cached block of namespace from the index; idle ones are freed at once,
        referenced ones when released. Returns how many blocks left the index."""
        dropped = self._index.cached_blocks(namespace)
        for block_id in dropped:
            block = self._blocks[block_id]
            if block.ref == 0:
                self._evict(block_id)
            else:
                assert block.hash is not None
                self._index.remove(block.hash, block_id, namespace)
                block.hash = None
                block.tokens = ()
        return len(dropped)

    def check_integrity(self) -> None:
        """Raise IntegrityError unless every invariant of the pool holds (O(num_blocks))."""
        check_blocks(
            self._blocks, self._free, self._used, self._scrub, self._index, self._held, self.groups
        )
