"""Block hashes and the prefix-cache index: which full block holds which hash, and LRU order.

Invariant: every block hash commits to the block's own namespace: a chain starts at a root
derived from its first block's namespace and is re-rooted under the new namespace wherever it
crosses into another (from a public prefix into the request's own), so two namespaces never share
a hash; the index maps each hash to at most one block and each cached block to one hash.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import NewType

from kvfence.capability import Namespace

BlockHash = NewType("BlockHash", bytes)

_ROOT_DOMAIN = b"kvfence.prefix-root.v1\x00"
_BLOCK_DOMAIN = b"kvfence.block-hash.v1\x00"
_CROSS_DOMAIN = b"kvfence.prefix-cross.v1\x00"
_MAX_TOKEN_ID = 2**32 - 1


def namespace_root(namespace: Namespace) -> BlockHash:
    """The parent hash of a namespace's first block (domain-separated from block hashes)."""
    return BlockHash(hashlib.sha256(_ROOT_DOMAIN + namespace.value.encode()).digest())


def crossing_root(parent: BlockHash, namespace: Namespace) -> BlockHash:
    """The parent hash of the first block in `namespace` after blocks of another namespace."""
    return BlockHash(hashlib.sha256(_CROSS_DOMAIN + parent + namespace.value.encode()).digest())


def encode_tokens(token_ids: Sequence[int]) -> bytes:
    """Token ids as fixed-width (4-byte) little-endian unsigned integers."""
    if any(t < 0 or t > _MAX_TOKEN_ID for t in token_ids):
        raise ValueError("token id out of range for the block hash encoding")
    return struct.pack(f"<{len(token_ids)}I", *token_ids)


def block_hash(parent: BlockHash, token_ids: Sequence[int]) -> BlockHash:
    """SHA-256 over the parent hash and this block's token ids."""
    return BlockHash(hashlib.sha256(_BLOCK_DOMAIN + parent + encode_tokens(token_ids)).digest())


def chain_hashes(
    namespaces: Namespace | Callable[[int], Namespace],
    token_ids: Sequence[int],
    block_size: int,
    start: list[BlockHash],
) -> list[BlockHash]:
    """Extend `start` (hashes of the first full blocks) to cover every full block of token_ids;
    block i belongs to `namespaces(i)`, or every block to `namespaces` when it is one."""
    namespace_at = (lambda _: namespaces) if isinstance(namespaces, Namespace) else namespaces
    hashes = start
    full = len(token_ids) // block_size
    for i in range(len(hashes), full):
        namespace = namespace_at(i)
        if i == 0:
            parent = namespace_root(namespace)
        elif namespace_at(i - 1) != namespace:
            parent = crossing_root(hashes[i - 1], namespace)
        else:
            parent = hashes[i - 1]
        hashes.append(block_hash(parent, token_ids[i * block_size : (i + 1) * block_size]))
    return hashes


class PrefixIndex:
    """Hash -> block id for cached blocks, per-namespace membership, and LRU order of idle ones
    (all of them, and per capacity group).

    A cached block is idle when no sequence references it; only idle blocks are evictable.
    """

    __slots__ = ("_by_group", "_by_hash", "_by_namespace", "_idle")

    def __init__(self) -> None:
        self._by_hash: dict[BlockHash, int] = {}
        self._by_namespace: dict[Namespace, set[int]] = {}
        self._idle: OrderedDict[int, Namespace] = OrderedDict()
        self._by_group: dict[str, OrderedDict[int, None]] = {}  # idle blocks per group

    def get(self, h: BlockHash) -> int | None:
        return self._by_hash.get(h)

    def insert(self, h: BlockHash, block_id: int, namespace: Namespace) -> bool:
        """Index a block under h; False when h is already held by another block."""
        if h in self._by_hash:
            return False
        self._by_hash[h] = block_id
        self._by_namespace.setdefault(namespace, set()).add(block_id)
        return True

    def remove(self, h: BlockHash, block_id: int, namespace: Namespace) -> None:
        del self._by_hash[h]
        members = self._by_namespace[namespace]
        members.discard(block_id)
        if not members:
            del self._by_namespace[namespace]
        self.mark_busy(block_id, namespace)

    def mark_idle(self, block_id: int, namespace: Namespace) -> None:
        """Put a cached block at the most-recently-used end of the LRU."""
        self._idle[block_id] = namespace
        self._by_group.setdefault(namespace.group, OrderedDict())[block_id] = None

    def mark_busy(self, block_id: int, namespace: Namespace) -> None:
        if self._idle.pop(block_id, None) is None:
            return
        own = self._by_group[namespace.group]
        del own[block_id]
        if not own:
            del self._by_group[namespace.group]

    def oldest_idle(self, group: str | None = None) -> int | None:
        """The least recently used idle block, of `group` when given, else of anyone."""
        order = self._idle if group is None else self._by_group.get(group)
        if not order:
            return None
        return next(iter(order))

    def oldest_idle_of(self, group: str, count: int) -> list[int]:
        """The group's `count` least recently used idle blocks (fewer if it has fewer)."""
        order = self._by_group.get(group)
        if not order or count <= 0:
            return []
        return [block_id for block_id, _ in zip(order, range(count), strict=False)]

    def iter_idle(self) -> Iterator[tuple[int, Namespace]]:
        """Idle blocks, least recently used first (eviction skips protected groups). Do not
        change the index while iterating."""
        return iter(self._idle.items())

    def idle_count(self, group: str | None = None) -> int:
        if group is None:
            return len(self._idle)
        return len(self._by_group.get(group, ()))

    def is_idle(self, block_id: int) -> bool:
        return block_id in self._idle

    def cached_blocks(self, namespace: Namespace) -> frozenset[int]:
        return frozenset(self._by_namespace.get(namespace, ()))

    def namespaces(self) -> list[Namespace]:
        return list(self._by_namespace)

    def items(self) -> list[tuple[BlockHash, int]]:
        return list(self._by_hash.items())

    def __len__(self) -> int:
        return len(self._by_hash)
