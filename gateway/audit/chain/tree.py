"""The Merkle tree over an audit chain's entries (RFC 9162 hashing; leaf i is entry seq i, its
JSON line without the newline), kept in `FILE.tree`: every complete subtree's hash, 32 bytes
each, in the order they complete (a leaf, then each subtree it completes), so any proof is a
few reads. Only the chain's writer appends; any process may read.

Invariant: the file holds the hashes of exactly `size` leaves (a torn tail is cut at open), and
a reader is given proofs only for sizes the writer has flushed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import orjson

from gateway.audit.chain.format import rotated_paths
from kvfence.receipts.merkle import (
    EMPTY_ROOT,
    HASH_SIZE,
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    node_hash,
    tree_hash,
)

SUFFIX: Final = ".tree"


def tree_path(path: Path) -> Path:
    return path.with_name(path.name + SUFFIX)


def stored_index(level: int, n: int) -> int:
    """Where the n-th hash of `level` sits among all stored hashes."""
    for _ in range(level):
        n = 2 * n + 1
    index = 0
    while n > 0:
        index += n
        n >>= 1
    return index + level


def stored_count(leaves: int) -> int:
    """How many hashes a tree of `leaves` stores."""
    if leaves == 0:
        return 0
    count, i = stored_index(0, leaves - 1) + 1, leaves - 1
    while i & 1:
        count, i = count + 1, i >> 1
    return count


def _leaves_in(hashes: int) -> int:
    """The largest tree whose stored hashes fit in `hashes` (a torn tail holds a part of one)."""
    lo, hi = 0, hashes
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if stored_count(mid) <= hashes else (lo, mid - 1)
    return lo


class TreeFile:
    """A chain's tree: `writable` for its writer thread (appends buffer until `flush`), read-only
    for every other reader (proofs of flushed sizes)."""

    def __init__(self, path: Path, writable: bool = False) -> None:
        self.path = path
        flags = (os.O_RDWR | os.O_CREAT) if writable else os.O_RDONLY
        self._fd = os.open(path, flags, 0o600)
        self._pending = bytearray()
        self._edge: dict[int, bytes] = {}  # level -> the right edge's complete subtree there
        hashes = os.fstat(self._fd).st_size // HASH_SIZE
        self.size = self.flushed = _leaves_in(hashes)
        if writable:
            self.truncate(self.size)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def hash_at(self, level: int, index: int) -> bytes:
        offset = stored_index(level, index) * HASH_SIZE
        data = os.pread(self._fd, HASH_SIZE, offset)
        if len(data) != HASH_SIZE:
            raise OSError(f"{self.path}: no hash at level {level} index {index} (file cut)")
        return data

    def subtree(self, lo: int, hi: int) -> bytes:
        level = (hi - lo).bit_length() - 1
        return self.hash_at(level, lo >> level)

    def root(self, size: int) -> bytes:
        self._readable(size)
        return tree_hash(0, size, self.subtree) if size else EMPTY_ROOT

    def inclusion(self, index: int, size: int) -> list[bytes]:
        self._readable(size)
        return inclusion_proof(index, size, self.subtree)

    def consistency(self, old: int, new: int) -> list[bytes]:
        self._readable(new)
        return consistency_proof(old, new, self.subtree)

    def _readable(self, size: int) -> None:
        if size > self.flushed:
            raise ValueError(f"the tree holds {self.flushed} flushed leaves, not {size}")

    # The writer's side.

    def truncate(self, size: int) -> None:
        """Keep the first `size` leaves; rebuild the right edge from the file."""
        os.ftruncate(self._fd, stored_count(size) * HASH_SIZE)
        self.size = self.flushed = size
        self._pending.clear()
        self._edge.clear()
        start = 0
        for level in range(size.bit_length() - 1, -1, -1):
            if size >> level & 1:
                self._edge[level] = self.hash_at(level, start >> level)
                start += 1 << level

    def append(self, line: bytes) -> bytes:
        """Add the leaf for entry `line`; returns its leaf hash."""
        leaf = h = leaf_hash(line)
        n, level = self.size, 0
        self._pending += h
        while n >> level & 1:
            h = node_hash(self._edge.pop(level), h)
            level += 1
            self._pending += h
        self._edge[level] = h
        self.size += 1
        return leaf

    def head(self) -> bytes:
        """The root of all `size` leaves, from the right edge (no reads)."""
        root = None
        for level in sorted(self._edge):
            root = self._edge[level] if root is None else node_hash(self._edge[level], root)
        return EMPTY_ROOT if root is None else root

    def flush(self) -> None:
        if self._pending:
            offset = stored_count(self.flushed) * HASH_SIZE
            written = os.pwrite(self._fd, bytes(self._pending), offset)
            if written != len(self._pending):
                raise OSError(f"{self.path}: short write")
            self._pending.clear()
        self.flushed = self.size


def chain_lines(path: Path, start: int, active_only: bool = False) -> Iterator[bytes]:
    """The lines of the chain at `path` (rotations, then the active file) from entry `start`."""
    for file in [path] if active_only else [*rotated_paths(path), path]:
        with open(file, "rb") as fh:
            lines = fh.read().split(b"\n")[:-1]
        if not lines:
            continue
        first = orjson.loads(lines[0]).get("seq", 0)
        if first + len(lines) <= start:
            continue
        yield from lines[max(0, start - first) :]
